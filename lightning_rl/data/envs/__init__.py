"""Building gymnasium vector envs from an env id or a factory, and stepping and closing them
so that a failing env worker process is an error that names it, never a hang."""

from __future__ import annotations

import importlib
import multiprocessing.connection
import os
import pickle
import signal
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from lightning_rl.data.envs.atari import is_atari_id, make_atari, register_ale
from lightning_rl.data.envs.envpool_env import envpool_task, make_envpool
from lightning_rl.data.envs.spaces import flatten_vector_env
from lightning_rl.extras import missing_dependency_error

Vectorization = Literal["auto", "sync", "async", "vector_entry_point", "envpool"]
VECTORIZATIONS = ("auto", "sync", "async", "vector_entry_point", "envpool")


class GymMake:
    """``gymnasium.make(env_id, **kwargs)`` as a picklable zero-argument factory with a readable
    repr: what a registered id with ``env_kwargs`` becomes, so every place that makes envs (and
    every async worker) makes the same env. The vector-env code knows it is an id, so
    ``vectorization="auto"`` still finds a registered ``vector_entry_point``."""

    def __init__(self, env_id: str, kwargs: dict[str, Any] | None = None) -> None:
        self.env_id = env_id
        self.kwargs = dict(kwargs or {})

    def __call__(self, **overrides: Any) -> gym.Env:
        return gym_make(self.env_id, **{**self.kwargs, **overrides})

    def __repr__(self) -> str:
        return f"GymMake({self.env_id!r}, {self.kwargs!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GymMake) and (self.env_id, self.kwargs) == (other.env_id, other.kwargs)

    __hash__ = None  # type: ignore[assignment]  # kwargs are mutable


EnvSpec = str | Callable[[], gym.Env]


def gym_make(env_id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make``, except that an ALE id gets the standard Atari preprocessing
    (``atari.make_atari``; its steps are switched by ``kwargs``) and ALE's banner is not printed
    (once per env process otherwise). An optional dependency the env lacks (Box2D, MuJoCo, ...) is
    an ``ImportError`` naming the env and the extra that installs it."""
    try:
        if is_atari_id(env_id):
            _quiet_ale()
            return make_atari(env_id, **kwargs)
        return gym.make(env_id, **kwargs)
    except (ImportError, gym.error.DependencyNotInstalled) as err:
        missing = missing_dependency_error(err, f"env {env_id!r}")
        if missing is None:
            raise
        raise missing from err


def _quiet_ale() -> None:
    """ALE's logger at warnings and errors only: its info is the ``A.L.E: Arcade Learning
    Environment`` / ``[Powered by Stella]`` banner that every env process would print."""
    try:
        import ale_py
    except ImportError:
        return  # make_atari says what to install
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Warning)


def env_id_of(env: Any) -> str | None:
    """The registered id behind ``env`` (a string or a ``GymMake``), else ``None``."""
    if isinstance(env, str):
        return env
    return env.env_id if isinstance(env, GymMake) else None


def _check_id(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registry entry of ``env_id``; ``"module:Id-v0"`` imports ``module`` first (it
    registers the env), as ``gymnasium.make`` does. Errors name the env and what failed."""
    module, _, name = env_id.rpartition(":")
    if is_atari_id(name):
        register_ale(env_id)
    if module:
        try:
            importlib.import_module(module)
        except Exception as err:  # ModuleNotFoundError, or the module's own error while importing
            why = str(err) if isinstance(err, ImportError) else f"{type(err).__name__}: {err}"
            raise ValueError(f"env {env_id!r}: importing {module} failed: {why}") from err
    try:
        return gym.spec(name)
    except gym.error.Error as err:  # NameNotFound, VersionNotFound, ...
        where = f" (importing {module} did not register it)" if module else ""
        raise ValueError(f"unknown env id {env_id!r}{where}: {err}") from None


def env_spec(env: EnvSpec, env_kwargs: dict[str, Any] | None = None, vectorization: str = "auto") -> EnvSpec:
    """One env spec from ``env`` and its keyword arguments: an id with kwargs becomes a
    ``GymMake``, a callable with kwargs a ``functools.partial``; without kwargs ``env`` is
    returned as it is. A string naming a factory by import path is resolved first (see
    ``resolve_env``). With ``vectorization="envpool"`` the id is checked against envpool's
    (``resolve_vectorization``), not gymnasium's registry."""
    env = resolve_env(env)
    if vectorization == "envpool":
        resolve_vectorization(env, vectorization)
    if env_kwargs is None:
        return env
    if not isinstance(env_kwargs, dict) or not all(isinstance(k, str) for k in env_kwargs):
        raise TypeError(f"env_kwargs must be a dict with string keys, got {env_kwargs!r}")
    if isinstance(env, str):
        if vectorization != "envpool":
            _check_id(env)
        return GymMake(env, env_kwargs)
    if callable(env):
        return partial(env, **env_kwargs)
    raise TypeError(f"env must be a registered env id or a callable returning a gymnasium.Env, got {env!r}")


def check_env(env: EnvSpec, env_kwargs: dict[str, Any] | None = None, vectorization: str = "auto") -> None:
    """Raise ``ValueError``/``ImportError``/``TypeError`` naming the env if ``env`` cannot be
    resolved: an unknown id, a module that does not import. Makes no env."""
    spec = env_spec(env, env_kwargs, vectorization)
    env_id = env_id_of(spec)
    if env_id is not None and vectorization != "envpool":
        _check_id(env_id)


def resolve_env(env: EnvSpec) -> EnvSpec:
    """A string that is no registered env id but the import path of a callable
    (``"mpe2.simple_spread_v3.parallel_env"``) becomes that callable: how YAML and the CLI
    name an env factory (and the checkpoint keeps the string, which reloads). Anything else
    is returned as it is."""
    if not isinstance(env, str) or ":" in env or env in gym.registry:
        return env
    module_name, _, attr = env.rpartition(".")
    if not module_name:
        return env
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not (module_name + ".").startswith(err.name + "."):
            # the module exists but needs something that is not installed: say so
            raise ImportError(f"env {env!r}: importing {module_name} failed: {err}") from err
        return env  # no such module: the string is an env id (an unknown one is reported later)
    factory = getattr(module, attr, None)
    return factory if callable(factory) else env


def make_env(env: EnvSpec) -> gym.Env:
    """One env from a registered id (or a ``GymMake``) or a zero-argument callable returning a
    ``gymnasium.Env``."""
    env_id = env_id_of(env)
    if env_id is not None:
        _check_id(env_id)
        return gym_make(env_id) if isinstance(env, str) else env()
    if callable(env):
        made = env()
        if not isinstance(made, gym.Env):
            raise TypeError(f"env factory {env!r} returned {type(made).__name__}, not a gymnasium.Env")
        return made
    raise TypeError(f"env must be a registered env id or a callable returning a gymnasium.Env, got {env!r}")


def env_spaces(env: EnvSpec, vectorization: str = "auto") -> tuple[gym.Space, gym.Space]:
    """(observation_space, action_space) of one env, made and closed at once (with
    ``vectorization="envpool"``, envpool's: read from its spec, no env is made)."""
    if vectorization == "envpool":
        venv = make_vector_env(env, 1, vectorization)
        try:
            return venv.single_observation_space, venv.single_action_space
        finally:
            venv.close()
    probe = make_env(env)
    try:
        return probe.observation_space, probe.action_space
    finally:
        probe.close()


def resolve_vectorization(env: EnvSpec, vectorization: str) -> str:
    """``"auto"`` picks the env's own batched implementation when it registers one, else
    ``"sync"``; never ``"envpool"``, which is asked for by name and takes the ids envpool
    provides (``envpool_env.envpool_task``)."""
    if vectorization not in VECTORIZATIONS:
        raise ValueError(f"vectorization must be one of {VECTORIZATIONS}, got {vectorization!r}")
    env_id = env_id_of(env)
    if vectorization == "envpool":
        if env_id is None:
            raise ValueError(f"vectorization='envpool' builds its envs from an env id (envpool's own), not from "
                             f"{env!r}; use 'sync' or 'async' for env factories")
        envpool_task(env_id)
        return vectorization
    if vectorization != "auto":
        if vectorization == "vector_entry_point" and (env_id is None or _check_id(env_id).vector_entry_point is None):
            raise ValueError(f"env {env!r} registers no vector_entry_point")
        return vectorization
    # ALE's own vector env preprocesses otherwise and autoresets in the same step: not for Atari
    if env_id is not None and _check_id(env_id).vector_entry_point is not None and not is_atari_id(env_id):
        return "vector_entry_point"
    return "sync"


def make_vector_env(env: EnvSpec, num_envs: int, vectorization: str = "auto") -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env`` as one vector env with next-step autoreset (gymnasium's
    ``SyncVectorEnv`` or ``AsyncVectorEnv``, the env's own vector env, or envpool's).

    The vector env is wrapped in ``EpisodeStatistics`` so episode returns and lengths are
    those of the raw env, before any reward normalization.
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    mode = resolve_vectorization(env, vectorization)
    env_id = env_id_of(env)
    if env_id is not None and mode != "envpool":
        _check_id(env_id)  # imports the module of a "module:Id-v0" id
    if mode == "envpool":  # envpool's C++ envs (data/envs/envpool_env.py)
        venv = make_envpool(env_id, env.kwargs if isinstance(env, GymMake) else None, num_envs)
    elif mode == "vector_entry_point":
        kwargs = env.kwargs if isinstance(env, GymMake) else {}
        venv = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
    else:
        # functools.partial, not a lambda: the vector env stays picklable for checkpoints.
        make_one: Callable[[], gym.Env] = partial(gym_make, env) if isinstance(env, str) else env
        if mode == "sync":
            venv = gym.vector.SyncVectorEnv([make_one] * num_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
        else:
            worker_env = _WorkerEnvFactory(make_one, os.getpid(), repr(env))
            venv = gym.vector.AsyncVectorEnv([worker_env] * num_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
    if venv.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP) != AutoresetMode.NEXT_STEP:
        raise ValueError(f"{env!r}: lightning_rl needs next-step autoreset, got {venv.metadata['autoreset_mode']}")
    venv = flatten_vector_env(venv)  # Dict/Tuple observations -> one float32 vector (data/envs/spaces.py)
    return EpisodeStatistics(venv, buffer_length=100_000, env_name=repr(env),
                             game_scores=bool(venv.metadata.get("game_scores")))


class EpisodeStatistics(gym.vector.VectorWrapper):
    """Each sub-env's episode return and length under next-step autoreset, kept as gymnasium's
    ``vector.RecordEpisodeStatistics`` keeps them (same attributes: ``episode_count``,
    ``return_queue``, ``length_queue``; returns summed in float64) in a few numpy operations
    per step. At 8 CartPoles gymnasium's wrapper cost half as much as the envs' own step,
    paid at every env step. It adds nothing to ``info``. ``env_name`` names the env in errors.

    ``game_scores`` (an env wrapped in ``atari.GameScore`` says so in its metadata): the episodes
    counted are whole games with their raw scores (``atari.GameScore``), not the lives and
    clipped rewards the learner sees. ``last_ended``: ``{env: return}`` of the episodes that
    ended at the last step.
    """

    def __init__(self, env: gym.vector.VectorEnv, buffer_length: int = 100, env_name: str | None = None,
                 game_scores: bool = False) -> None:
        super().__init__(env)
        self.env_name = env_name
        self.game_scores = game_scores
        self.episode_count = 0
        self.episode_returns = np.zeros(self.num_envs)
        self.episode_lengths = np.zeros(self.num_envs, dtype=np.int64)
        self.prev_dones = np.zeros(self.num_envs, dtype=bool)
        self.return_queue: deque[np.float64] = deque(maxlen=buffer_length)
        self.length_queue: deque[np.int64] = deque(maxlen=buffer_length)
        self.last_ended: dict[int, float] = {}

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        mask = None if options is None else options.get("reset_mask")
        obs, info = super().reset(seed=seed, options=options)
        restart = slice(None) if mask is None else np.asarray(mask, dtype=bool)
        self.episode_returns[restart] = 0.0
        self.episode_lengths[restart] = 0
        self.prev_dones[restart] = False
        return obs, info

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rewards, terminateds, truncateds, info = self.env.step(actions)
        prev = self.prev_dones
        if prev.any():  # these envs only reset this step: a new episode starts, this step not in it
            self.episode_returns[prev] = 0.0
            self.episode_lengths[prev] = 0
            self.episode_returns += np.where(prev, 0.0, rewards)
            self.episode_lengths += ~prev
        else:
            self.episode_returns += rewards
            self.episode_lengths += 1
        self.prev_dones = dones = terminateds | truncateds
        self.last_ended = {}
        if self.game_scores:
            ended = np.flatnonzero(info.get("_game_score", ())) if "game_score" in info else ()
            returns, lengths = info.get("game_score"), info.get("game_length")
        else:
            ended = np.flatnonzero(dones) if dones.any() else ()
            returns, lengths = self.episode_returns, self.episode_lengths
        if len(ended):
            self.episode_count += len(ended)
            self.return_queue.extend(np.asarray(returns, dtype=np.float64)[ended])
            self.length_queue.extend(np.asarray(lengths, dtype=np.int64)[ended])
            self.last_ended = {int(i): float(returns[i]) for i in ended}
        return obs, rewards, terminateds, truncateds, info


# ----------------------------------------------------------------------------- worker faults
# gymnasium's AsyncVectorEnv leaves three holes that turn a failing env worker into a hang or
# into a bare pipe error, so the functions below fill them (nothing in gymnasium does):
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


def async_env_of(envs: gym.vector.VectorEnv) -> gym.vector.AsyncVectorEnv | None:
    """The ``AsyncVectorEnv`` under ``envs``' wrappers, or ``None`` when the envs run in-process."""
    base = envs.unwrapped
    return base if isinstance(base, gym.vector.AsyncVectorEnv) else None


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


def step_vector_env(
    envs: gym.vector.VectorEnv, actions: Any
) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """``envs.step(actions)``, where a failed env worker process is a ``RuntimeError`` that
    names the env (index and worker pid) and either the env's own error or the worker's exit
    code; every worker of ``envs`` is terminated before it is raised."""
    try:
        return envs.step(actions)
    except Exception as err:
        _raise_worker_failure(envs, err)
        _raise_bad_observation(envs, err, "at a step")
        raise


def reset_vector_env(
    envs: gym.vector.VectorEnv, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
) -> tuple[Any, dict[str, Any]]:
    """``envs.reset(seed=seed, options=options)`` with the failure handling of ``step_vector_env``;
    the observations are checked against the observation space (see ``observation_problem``)."""
    try:
        obs, info = envs.reset(seed=seed, options=options)
    except Exception as err:
        _raise_worker_failure(envs, err)
        _raise_bad_observation(envs, err, "at reset")
        raise
    check_observation(_env_name(envs), envs.observation_space, obs, "at reset")  # a vector_entry_point's own batch
    return obs, info


def close_vector_env(
    envs: gym.vector.VectorEnv | None, terminate: bool = False, timeout: float = CLOSE_TIMEOUT_S
) -> None:
    """Close ``envs``; for async envs, no worker process is alive afterwards.

    ``terminate=False`` asks each worker to close its env and exit, waiting up to ``timeout``
    seconds (a pending step is let finish); ``terminate=True`` (failed or interrupted runs)
    sends SIGTERM at once. Workers still alive ``timeout`` seconds after SIGTERM are
    SIGKILLed. Safe to call twice and on broken envs: for async envs, and for any envs when
    ``terminate=True``, closing never raises (an unexpected error is a warning), so it cannot
    mask the error being handled.
    """
    if envs is None:
        return
    venv = async_env_of(envs)
    if venv is None:
        if not terminate:
            envs.close()
            return
        try:
            envs.close()
        except Exception as err:
            warnings.warn(f"closing the envs failed: {type(err).__name__}: {err}", stacklevel=2)
        return
    if not venv.closed:
        # Not gymnasium's close_extras: it joins the workers with no timeout, after a
        # terminate() that a worker with a forked SIGTERM handler ignores.
        if not terminate:
            _ask_workers_to_close(venv, timeout)
        stop_processes(venv.processes, timeout)
        for pipe in venv.parent_pipes:
            if pipe is not None:
                pipe.close()
        venv.closed = True  # gymnasium's close (and __del__) is a no-op from now on
    try:
        envs.close()  # the wrappers' own clean-up, if any
    except Exception as err:
        warnings.warn(f"closing the async envs' wrappers failed: {type(err).__name__}: {err}", stacklevel=2)


def _ask_workers_to_close(venv: gym.vector.AsyncVectorEnv, timeout: float) -> None:
    """Send gymnasium's ``close`` command and drain the pipes until each worker has exited
    (its pipe reads EOF) or ``timeout`` passed. Draining lets a pending call finish first."""
    open_pipes = []
    for pipe in venv.parent_pipes:
        if pipe is None or pipe.closed:  # None: gymnasium dropped a worker whose env raised
            continue
        try:
            pipe.send(("close", None))
            open_pipes.append(pipe)
        except _PIPE_ERRORS:
            pass
    deadline = time.monotonic() + timeout
    while open_pipes and (left := deadline - time.monotonic()) > 0:
        for pipe in multiprocessing.connection.wait(open_pipes, timeout=left):
            try:
                pipe.recv()  # a pending call's answer, then close's
            except _PIPE_ERRORS:  # EOF: the worker closed its env and exited
                open_pipes.remove(pipe)
    for process in venv.processes:
        try:
            process.join(max(0.0, deadline - time.monotonic()))
        except (AssertionError, ValueError):  # not our child (a forked copy of us) or released
            pass


def _raise_worker_failure(envs: gym.vector.VectorEnv, err: Exception) -> None:
    """If ``err`` means an async worker failed, terminate all workers and raise the failure."""
    venv = async_env_of(envs)
    if venv is None or venv.closed:
        return
    failure = _worker_failure(venv, err)
    if failure is None:  # raised in this process (bad actions, ...): the workers are fine
        return
    close_vector_env(envs, terminate=True)
    raise failure from err


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
