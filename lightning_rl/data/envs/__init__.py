"""Envs: env specs and one env (``make.py``), vector envs built, stepped, reset and closed
(``vector.py``), their episode statistics (``episodes.py``), env worker faults and bad
observations reported by name (``faults.py``); Atari, envpool, PettingZoo, observation spaces
and env state in modules of their own."""

from lightning_rl.data.envs.episodes import EpisodeStatistics
from lightning_rl.data.envs.faults import (
    CLOSE_TIMEOUT_S,
    check_observation,
    describe_exit_code,
    observation_problem,
    stop_processes,
)
from lightning_rl.data.envs.make import (
    VECTORIZATIONS,
    EnvSpec,
    GymMake,
    Vectorization,
    check_env,
    env_id_of,
    env_spec,
    gym_make,
    make_env,
    resolve_env,
    resolve_vectorization,
)
from lightning_rl.data.envs.vector import (
    async_env_of,
    close_vector_env,
    env_spaces,
    make_vector_env,
    reset_vector_env,
    step_vector_env,
)

__all__ = [
    "CLOSE_TIMEOUT_S",
    "VECTORIZATIONS",
    "EnvSpec",
    "EpisodeStatistics",
    "GymMake",
    "Vectorization",
    "async_env_of",
    "check_env",
    "check_observation",
    "close_vector_env",
    "describe_exit_code",
    "env_id_of",
    "env_spaces",
    "env_spec",
    "gym_make",
    "make_env",
    "make_vector_env",
    "observation_problem",
    "reset_vector_env",
    "resolve_env",
    "resolve_vectorization",
    "step_vector_env",
    "stop_processes",
]
