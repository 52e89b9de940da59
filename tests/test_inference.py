"""Inference outside Lightning: predict() with Stable-Baselines3's signature, exploring actions
through the same path as the samplers, and TorchScript export."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_rl import DQN, PPO, SAC, TD3, evaluate


@pytest.mark.parametrize(("cls", "env"), [(PPO, "CartPole-v1"), (PPO, "Pendulum-v1"), (DQN, "CartPole-v1"),
                                          (SAC, "Pendulum-v1"), (TD3, "Pendulum-v1")])
def test_predict_single_and_batched_and_export(cls, env, tmp_path):
    model = cls(env=env, seed=0)
    batch = np.stack([model.observation_space.sample() for _ in range(7)]).astype(np.float32)
    actions, state = model.predict(batch, deterministic=True)
    assert state is None  # feed-forward policies carry no state
    assert isinstance(actions, np.ndarray) and actions.shape[0] == 7
    single, _ = model.predict(batch[3], deterministic=True)
    np.testing.assert_allclose(single, actions[3], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model.predict(batch, deterministic=True)[0], actions)  # greedy is repeatable

    path = tmp_path / "policy.pt"
    model.export_policy(path)
    scripted = torch.jit.load(str(path))
    for n in (1, 5, 11):  # any batch size, not just the traced one
        obs = np.stack([model.observation_space.sample() for _ in range(n)]).astype(np.float32)
        out = scripted(torch.from_numpy(obs)).numpy()
        np.testing.assert_allclose(out, model.predict(obs, deterministic=True)[0], rtol=1e-5, atol=1e-6)


def test_predict_takes_the_sb3_arguments():
    model = PPO(env="CartPole-v1", seed=0)
    obs = np.zeros((3, 4), dtype=np.float32)
    action, state = model.predict(obs, state=None, episode_start=np.ones(3, dtype=bool), deterministic=True)
    assert action.shape == (3,) and state is None


def test_predict_explores_by_default_like_sb3():
    model = PPO(env="CartPole-v1", seed=0)
    obs = np.zeros((500, 4), dtype=np.float32)
    assert len(np.unique(model.predict(obs)[0])) == 2  # deterministic=False is SB3's default
    assert len(np.unique(model.predict(obs, deterministic=True)[0])) == 1


def test_dqn_exploring_inference_uses_the_scheduled_epsilon():
    model = DQN(env="CartPole-v1", seed=0, epsilon_start=1.0, epsilon_end=0.0, epsilon_timesteps=1000)
    obs = np.zeros((2000, 4), dtype=np.float32)
    greedy = model.compute_actions(obs, explore=False)
    assert len(np.unique(greedy)) == 1
    # epsilon = 1 at the start: uniform random actions, in every exploring entry point
    for actions in (model.compute_actions(obs, explore=True), model.predict(obs)[0]):
        assert abs((actions != greedy).mean() - 0.5) < 0.05
    model.global_counters["num_env_steps_sampled"] = 500  # epsilon = 0.5: half random, of which half differ
    assert abs((model.predict(obs)[0] != greedy).mean() - 0.25) < 0.05
    model.global_counters["num_env_steps_sampled"] = 1000  # epsilon = 0: greedy even when exploring
    np.testing.assert_array_equal(model.predict(obs)[0], greedy)


def test_dqn_evaluate_explore_uses_epsilon():
    model = DQN(env="CartPole-v1", seed=0, epsilon_start=1.0)
    greedy = evaluate(model, num_episodes=20, seed=0)
    random = evaluate(model, num_episodes=20, seed=0, explore=True)
    assert greedy != random  # an untrained greedy policy repeats one action; epsilon=1 does not
