"""Inference outside Lightning: predict() on numpy observations and TorchScript export."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_rl import DQN, PPO, SAC


@pytest.mark.parametrize(("cls", "env"), [(PPO, "CartPole-v1"), (PPO, "Pendulum-v1"), (DQN, "CartPole-v1"),
                                          (SAC, "Pendulum-v1")])
def test_predict_single_and_batched_and_export(cls, env, tmp_path):
    model = cls(env=env, seed=0)
    rng = np.random.default_rng(0)
    batch = np.stack([model.observation_space.sample() for _ in range(7)]).astype(np.float32)
    actions = model.predict(batch)
    assert isinstance(actions, np.ndarray) and actions.shape[0] == 7
    single = model.predict(batch[3])
    np.testing.assert_allclose(single, actions[3], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model.predict(batch), actions)  # deterministic=True is greedy

    path = tmp_path / "policy.pt"
    model.export_policy(path)
    scripted = torch.jit.load(str(path))
    for n in (1, 5, 11):  # any batch size, not just the traced one
        obs = np.stack([model.observation_space.sample() for _ in range(n)]).astype(np.float32)
        out = scripted(torch.from_numpy(obs)).numpy()
        np.testing.assert_allclose(out, model.predict(obs), rtol=1e-5, atol=1e-6)
    assert rng is not None


def test_predict_explores_when_not_deterministic():
    model = PPO(env="CartPole-v1", seed=0)
    obs = np.zeros((500, 4), dtype=np.float32)
    assert len(np.unique(model.predict(obs, deterministic=False))) == 2
    assert len(np.unique(model.predict(obs))) == 1
