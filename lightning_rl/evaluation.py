"""Deterministic evaluation episodes on separate envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.batch import DEFAULT_POLICY_ID
from lightning_rl.data.envs import EnvSpec, close_vector_env, make_vector_env, reset_vector_env, step_vector_env


@torch.no_grad()
def evaluate(
    module: torch.nn.Module,
    env: EnvSpec | None = None,
    num_episodes: int = 10,
    seed: int | None = None,
    explore: bool = False,
    policy_id: str = DEFAULT_POLICY_ID,
    vectorization: str = "auto",
) -> list[float]:
    """Returns of ``num_episodes`` episodes, one per env of a fresh vector env, greedy by default.

    Each env plays exactly one episode, so short episodes are not over-represented.
    ``env`` defaults to the module's own (``module.env_spec``).
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    envs = make_vector_env(env if env is not None else module.env_spec, num_episodes, vectorization)
    space = envs.single_action_space
    try:
        obs, _ = reset_vector_env(envs, seed=seed)
        returns = np.zeros(num_episodes)
        finished = np.zeros(num_episodes, dtype=bool)
        while not finished.all():
            actions = module.compute_actions(obs, policy_id=policy_id, explore=explore)
            if isinstance(space, gym.spaces.Box):
                actions = np.clip(actions, space.low, space.high)
            obs, rewards, terminateds, truncateds, _ = step_vector_env(envs, actions)
            returns += np.where(finished, 0.0, rewards)
            finished |= terminateds | truncateds
    finally:
        close_vector_env(envs)
    return returns.tolist()
