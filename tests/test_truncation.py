"""Truncation is bootstrapped through the whole pipeline (SB3's infinite-horizon check).

A never-ending env with reward 1 per step, cut by a 5-step time limit, has value
1 / (1 - gamma) = 10 at gamma 0.9 — but only if truncation bootstraps from the value of the
final observation. Treating the cut as termination would give about 2.6.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from lightning_rl import A2C, PPO, RolloutDataModule
from lightning_rl.data.settings import EnvSettings
from tests.conftest import fit_iterations


class ConstantRewardEnv(gym.Env):
    """One observation, reward 1 every step, never terminates."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, terminate_at: int | None = None) -> None:
        self.terminate_at = terminate_at
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        terminated = self.terminate_at is not None and self.t >= self.terminate_at
        return np.zeros(1, dtype=np.float32), 1.0, terminated, False, {}


def time_limited():
    return gym.wrappers.TimeLimit(ConstantRewardEnv(), max_episode_steps=5)


def terminating():
    return ConstantRewardEnv(terminate_at=5)


def learned_value(env, algo=A2C) -> float:
    kwargs = dict(env=env, num_envs=4, rollout_fragment_length=16, gamma=0.9, lr=3e-3, seed=0, total_env_steps=None)
    if algo is A2C:
        kwargs["optimizer"] = "adam"
    else:
        kwargs.update(num_sgd_iter=4, sgd_minibatch_size=32)
    model = algo(**kwargs)
    fit_iterations(model, 400)
    with torch.no_grad():
        return model.policies["default_policy"].value(torch.zeros(1, 1)).item()


def test_truncation_bootstraps_to_infinite_horizon_value():
    assert abs(learned_value(time_limited) - 10.0) < 0.5


def test_ppo_truncation_bootstraps_too():
    assert abs(learned_value(time_limited, PPO) - 10.0) < 0.5


def test_termination_does_not_bootstrap():
    value = learned_value(terminating)
    assert abs(value - (5 - sum(0.9**k for k in range(1, 6))) / 0.5) < 0.3  # about 2.63


def test_reset_rows_are_not_trained_on():
    """With a 5-step limit, every 6th env step is an autoreset step and is dropped."""
    model = A2C(env=time_limited, num_envs=2, rollout_fragment_length=12, seed=0, total_env_steps=None)
    dm = RolloutDataModule(EnvSettings(time_limited, num_envs=2, seed=0), rollout_fragment_length=12)
    dm.connect(model)
    dm.setup("fit")
    batch = model.postprocess(dm.sample()).policy_batches["default_policy"]
    assert batch.count == 2 * 10  # 12 steps per env: 5 + reset + 5 + reset
    assert batch["rewards"].eq(1).all()  # reset rows carry reward 0; none are left
    assert batch["truncateds"].sum() == 4 and not batch["terminateds"].any()
    torch.testing.assert_close(batch["advantages"] + batch["vf_preds"], batch["value_targets"])
    dm.teardown("fit")
