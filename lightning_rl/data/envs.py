"""Building gymnasium vector envs from an env id or a factory."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal

import gymnasium as gym
from gymnasium.vector import AutoresetMode

EnvSpec = str | Callable[[], gym.Env]
Vectorization = Literal["auto", "sync", "async", "vector_entry_point"]
VECTORIZATIONS = ("auto", "sync", "async", "vector_entry_point")


def _check_id(env_id: str) -> gym.envs.registration.EnvSpec:
    try:
        return gym.spec(env_id)
    except gym.error.Error as err:  # NameNotFound, VersionNotFound, ...
        raise ValueError(f"unknown env id {env_id!r}: {err}") from None


def make_env(env: EnvSpec) -> gym.Env:
    """One env from a registered id or a zero-argument callable returning a ``gymnasium.Env``."""
    if isinstance(env, str):
        _check_id(env)
        return gym.make(env)
    if callable(env):
        made = env()
        if not isinstance(made, gym.Env):
            raise TypeError(f"env factory {env!r} returned {type(made).__name__}, not a gymnasium.Env")
        return made
    raise TypeError(f"env must be a registered env id or a callable returning a gymnasium.Env, got {env!r}")


def env_spaces(env: EnvSpec) -> tuple[gym.Space, gym.Space]:
    """(observation_space, action_space) of one env, made and closed at once."""
    probe = make_env(env)
    try:
        return probe.observation_space, probe.action_space
    finally:
        probe.close()


def resolve_vectorization(env: EnvSpec, vectorization: str) -> str:
    """``"auto"`` picks the env's own batched implementation when it registers one, else ``"sync"``."""
    if vectorization not in VECTORIZATIONS:
        raise ValueError(f"vectorization must be one of {VECTORIZATIONS}, got {vectorization!r}")
    if vectorization != "auto":
        if vectorization == "vector_entry_point" and (
            not isinstance(env, str) or _check_id(env).vector_entry_point is None
        ):
            raise ValueError(f"env {env!r} registers no vector_entry_point")
        return vectorization
    if isinstance(env, str) and _check_id(env).vector_entry_point is not None:
        return "vector_entry_point"
    return "sync"


def make_vector_env(env: EnvSpec, num_envs: int, vectorization: str = "auto") -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env`` as one vector env with next-step autoreset.

    The vector env is wrapped in gymnasium's ``RecordEpisodeStatistics`` so episode returns
    and lengths are those of the raw env, before any reward normalization.
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    mode = resolve_vectorization(env, vectorization)
    if mode == "vector_entry_point":
        venv = gym.make_vec(env, num_envs=num_envs, vectorization_mode="vector_entry_point")
    else:
        # functools.partial, not a lambda: the vector env stays picklable for checkpoints.
        make_one: Callable[[], gym.Env] = partial(gym.make, env) if isinstance(env, str) else env
        if isinstance(env, str):
            _check_id(env)
        cls = gym.vector.SyncVectorEnv if mode == "sync" else gym.vector.AsyncVectorEnv
        venv = cls([make_one] * num_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
    if venv.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP) != AutoresetMode.NEXT_STEP:
        raise ValueError(f"{env!r}: lightning_rl needs next-step autoreset, got {venv.metadata['autoreset_mode']}")
    return gym.wrappers.vector.RecordEpisodeStatistics(venv, buffer_length=100_000)
