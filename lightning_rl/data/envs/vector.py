"""Vector envs: ``make_vector_env`` builds ``num_envs`` copies of an env (gymnasium's sync or
async vector env, the env's own, or envpool's) with next-step autoreset, and ``step_vector_env``,
``reset_vector_env`` and ``close_vector_env`` step, reset and close them so that a failing env
worker process is an error that names it, never a hang (``faults.py``)."""

from __future__ import annotations

import multiprocessing.connection
import os
import time
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from lightning_rl.data.envs.envpool_env import make_envpool
from lightning_rl.data.envs.episodes import EpisodeStatistics
from lightning_rl.data.envs.faults import (
    _PIPE_ERRORS,
    CLOSE_TIMEOUT_S,
    _env_name,
    _raise_bad_observation,
    _worker_failure,
    _WorkerEnvFactory,
    check_observation,
    stop_processes,
)
from lightning_rl.data.envs.make import (
    EnvSpec,
    GymMake,
    _check_id,
    env_id_of,
    gym_make,
    make_env,
    resolve_vectorization,
)
from lightning_rl.data.envs.spaces import flatten_vector_env

__all__ = ["async_env_of", "close_vector_env", "env_spaces", "make_vector_env", "reset_vector_env", "step_vector_env"]


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


def async_env_of(envs: gym.vector.VectorEnv) -> gym.vector.AsyncVectorEnv | None:
    """The ``AsyncVectorEnv`` under ``envs``' wrappers, or ``None`` when the envs run in-process."""
    base = envs.unwrapped
    return base if isinstance(base, gym.vector.AsyncVectorEnv) else None


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
