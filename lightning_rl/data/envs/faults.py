"""Faults of env worker processes and bad observations, reported as errors that name the env:
the env factory and wrapper every async env worker runs (default signal handling, errors that
reach the training process with their traceback), what a failed worker is told apart by (its
exit code, its error), stopping worker processes, and the check of an observation against its
space. ``vector.py`` steps, resets and closes the envs with them."""

from __future__ import annotations

import os
import pickle
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["CLOSE_TIMEOUT_S", "check_observation", "describe_exit_code", "observation_problem", "stop_processes"]

# gymnasium's AsyncVectorEnv leaves three holes that turn a failing env worker into a hang or
# into a bare pipe error, so this module and vector.py fill them (nothing in gymnasium does):
# - workers are forked from the training process and inherit its Python signal handlers;
#   Lightning's SIGTERM handler swallows SIGTERM, so `Process.terminate()` (gymnasium's
#   `close(terminate=True)`, and multiprocessing's join of daemon children at interpreter exit)
#   never ends them and the interpreter waits for them forever;
# - Lightning does not run `teardown` when fit fails, so nothing closes the envs;
# - a worker killed by a signal surfaces as EOFError / ConnectionResetError / BrokenPipeError
#   from the pipe, naming neither the env nor the exit code.

#: Seconds a worker gets to exit after SIGTERM (or to answer ``close``) before it is SIGKILLed.
CLOSE_TIMEOUT_S = 5.0
#: Seconds to wait for a worker whose pipe broke to be reported as exited (its pipe closes a
#: moment before the kernel reports its exit).
_DEATH_GRACE_S = 2.0
# Attribute of an exception raised in a worker that carries the worker's traceback to the
# training process (exceptions pickle their __dict__, not their __traceback__).
_WORKER_TRACEBACK = "_lightning_rl_worker_traceback"
_PIPE_ERRORS = (EOFError, OSError)  # OSError covers BrokenPipeError and ConnectionResetError


class _WorkerEnvFactory:
    """The env factory of an async worker: makes the env the way the user asked, after giving
    the worker process default signal handling.

    In a worker, SIGTERM ends the process again (not a forked copy of the trainer's handler)
    and SIGINT is ignored: Ctrl-C belongs to the training process, which then closes the
    workers. In the training process itself (gymnasium's probe env) nothing changes.
    """

    def __init__(self, make_one: Callable[[], gym.Env], parent_pid: int, env_name: str | None = None) -> None:
        self.make_one = make_one
        self.parent_pid = parent_pid
        self.env_name = env_name

    def __call__(self) -> gym.Env:
        if os.getpid() == self.parent_pid:
            return self.make_one()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        env = self.make_one()
        return _ReportErrors(env, self.env_name) if isinstance(env, gym.Env) else env


class _ReportErrors(gym.Wrapper):
    """Lets an exception from ``step``/``reset`` reach the training process intact, and checks
    the observations of every reset and of the first step against the observation space
    (the worker writes them into shared memory, which would cast or reshape them silently).

    gymnasium ships the exception through a pickling queue and re-raises
    ``type(err)(err)`` in the parent: the traceback is lost, an exception that cannot make
    that trip is lost with it (and the parent then waits on the queue forever). Here it
    carries its formatted traceback, and one that cannot travel is replaced by a
    ``RuntimeError`` with the same text.
    """

    def __init__(self, env: gym.Env, env_name: str | None = None) -> None:
        super().__init__(env)
        self.env_name = env_name
        self._stepped = False

    def step(self, action: Any) -> Any:
        try:
            out = self.env.step(action)
            if not self._stepped:
                self._stepped = True
                check_observation(self.env_name or repr(self.env), self.observation_space, out[0], "at its first step")
            return out
        except Exception as err:
            raise _travelling(err) from None

    def reset(self, **kwargs: Any) -> Any:
        try:
            out = self.env.reset(**kwargs)
            check_observation(self.env_name or repr(self.env), self.observation_space, out[0], "at reset")
            return out
        except Exception as err:
            raise _travelling(err) from None


def _travelling(err: Exception) -> Exception:
    trace = traceback.format_exc()
    try:
        setattr(err, _WORKER_TRACEBACK, trace)
        type(err)(pickle.loads(pickle.dumps(err)))  # what the queue and gymnasium will do
        return err
    except Exception:
        plain = RuntimeError(f"{type(err).__qualname__}: {err}")
        setattr(plain, _WORKER_TRACEBACK, trace)
        return plain


def describe_exit_code(code: int) -> str:
    """``"exit code -9 (killed by SIGKILL)"``; a negative code is the signal that ended the process."""
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"exit code {code} (killed by {name})"


# ----------------------------------------------------------------------------- bad observations
def observation_problem(space: gym.Space, obs: Any) -> str | None:
    """What makes ``obs`` unfit for ``space``, as ``"shape (3,) and dtype float64"``, or None.

    The shape must be the space's. The dtype must cast to the space's without changing kind
    (numpy's ``same_kind``): float64 for a float32 ``Box`` is cast like gymnasium's vector
    envs cast it, but a float for an integer space (``Discrete``, an int ``Box``) is an error,
    since casting would truncate. ``Dict`` and ``Tuple`` spaces are checked item by item;
    other spaces are not checked.
    """
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(obs, dict):
            return f"a {type(obs).__name__}, not a dict"
        for key, sub in space.spaces.items():
            problem = observation_problem(sub, obs[key]) if key in obs else "missing"
            if problem:
                return f"[{key!r}] {problem}"
        return None
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(obs, tuple | list) or len(obs) != len(space.spaces):
            return f"a {type(obs).__name__} of {len(obs) if hasattr(obs, '__len__') else '?'} items"
        for i, (sub, item) in enumerate(zip(space.spaces, obs, strict=True)):
            problem = observation_problem(sub, item)
            if problem:
                return f"[{i}] {problem}"
        return None
    if not isinstance(space, gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
        return None
    try:
        array = np.asarray(obs)
    except Exception:  # ragged nested lists and the like
        return f"a {type(obs).__name__} that is no array"
    if array.shape != space.shape or not np.can_cast(array.dtype, space.dtype, "same_kind"):
        return f"shape {array.shape} and dtype {array.dtype}"
    return None


def check_observation(env_name: str, space: gym.Space, obs: Any, when: str) -> None:
    """Raise ``ValueError`` naming the env, the space and what it returned if ``obs`` does not fit ``space``."""
    problem = observation_problem(space, obs)
    if problem is not None:
        raise ValueError(_bad_observation(env_name, space, problem, when))


def _bad_observation(env_name: str, space: gym.Space, problem: str, when: str) -> str:
    dtype = getattr(space, "dtype", None)
    return (
        f"env {env_name} returned an observation of {problem} {when}, but its observation_space is {space}"
        + (f" (shape {space.shape}, dtype {dtype})" if dtype is not None else "")
        + ". The shape must match, and the dtype must cast to the space's without changing kind "
        "(float64 for float32 is fine; a float for an integer space is not)"
    )


def _env_name(envs: gym.vector.VectorEnv) -> str:
    name = getattr(envs, "env_name", None)
    if name:
        return name
    spec = getattr(envs.unwrapped, "spec", None)
    return repr(spec.id) if spec is not None else type(envs.unwrapped).__name__


def _raise_bad_observation(envs: gym.vector.VectorEnv, err: Exception, when: str) -> None:
    """After a numpy error in a sync vector env: if a sub-env's raw observation does not fit
    the space (what makes gymnasium's concatenation fail), raise that, naming the env."""
    base = envs.unwrapped
    if not isinstance(err, ValueError | TypeError) or not isinstance(base, gym.vector.SyncVectorEnv):
        return
    space = base.single_observation_space
    for i, obs in enumerate(getattr(base, "_env_obs", ())):
        problem = observation_problem(space, obs)
        if problem is not None:
            name = f"{i} of {base.num_envs} ({_env_name(envs)})"
            raise ValueError(_bad_observation(name, space, problem, when)) from err


def _worker_failure(venv: gym.vector.AsyncVectorEnv, err: Exception) -> RuntimeError | None:
    # gymnasium marks the workers whose env raised by dropping their pipe.
    raised = [i for i, pipe in enumerate(venv.parent_pipes) if pipe is None]
    if raised:
        original = err.args[0] if len(err.args) == 1 and isinstance(err.args[0], BaseException) else err
        who = ", ".join(f"env {i} (worker pid {venv.processes[i].pid})" for i in raised)
        message = f"{who} raised {type(original).__name__}: {original}"
        trace = getattr(original, _WORKER_TRACEBACK, None)
        if trace:
            message += f"\n\nTraceback in the env worker process:\n{trace}"
        return RuntimeError(message)
    if not isinstance(err, _PIPE_ERRORS):
        return None
    deadline = time.monotonic() + _DEATH_GRACE_S
    while not (dead := _exited(venv.processes)) and time.monotonic() < deadline:
        time.sleep(0.01)
    if not dead:
        return RuntimeError(
            f"lost the connection to the async env workers ({type(err).__name__}: {err}), although none has exited"
        )
    who = "; ".join(f"env {i} (worker pid {p.pid}) {describe_exit_code(p.exitcode)}" for i, p in dead)
    return RuntimeError(f"an async env worker process died: {who}")


def _exited(processes: Sequence[Any]) -> list[tuple[int, Any]]:
    dead = []
    for i, process in enumerate(processes):
        try:
            if process.exitcode is not None:
                dead.append((i, process))
        except (AssertionError, ValueError):  # not our child (a forked copy of us) or released
            pass
    return dead


def stop_processes(processes: Sequence[Any], timeout: float) -> None:
    """SIGTERM the live processes, SIGKILL those still alive ``timeout`` seconds later, reap all."""
    alive = []
    for process in processes:
        try:
            if process.is_alive():
                alive.append(process)
        except (AssertionError, ValueError):  # not our child (a forked copy of us) or released
            pass
    if not alive:
        return
    for process in alive:
        process.terminate()
    deadline = time.monotonic() + timeout
    for process in alive:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in alive:
        if process.is_alive():
            process.kill()
            process.join(timeout)
