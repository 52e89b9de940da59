"""Non-finite data and losses: a clear error naming the field, the env and the step (or the loss
term and the iteration), raised before the weights are stepped; checkpoints stay finite."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_rl import A2C, DQN, PPO
from lightning_rl.nonfinite import NonFiniteLossError
from tests.conftest import fit_iterations, quiet_trainer


class BadValueEnv(gym.Env):
    """Reward 1 (observations in [-1, 1]) until its ``at``-th step, which returns ``value`` in ``field``."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, field: str = "reward", at: int = 50, value: float = float("nan")) -> None:
        self.field, self.at, self.value, self.t = field, at, value, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps_in_episode = 0
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action):
        self.t += 1
        self.steps_in_episode += 1
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        reward = 1.0
        if self.t == self.at:
            if self.field == "reward":
                reward = self.value
            else:
                obs[1] = self.value
        return obs, reward, False, self.steps_in_episode >= 1000, {}  # no autoreset step before `at`


def bad_env(field="reward", at=50, value=float("nan")):
    return lambda: BadValueEnv(field, at, value)


SMALL_PPO = dict(num_envs=1, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=1, seed=0,
                 total_env_steps=None, vectorization="sync")
SMALL_DQN = dict(seed=0, learning_starts=16, train_freq=16, num_gradient_steps=2, train_batch_size=16,
                 buffer_size=500, hiddens=(16,), total_env_steps=None, vectorization="sync")


@pytest.mark.parametrize(("field", "value"), [("reward", float("nan")), ("observation", float("inf"))])
@pytest.mark.parametrize(("cls", "kwargs"), [(PPO, SMALL_PPO), (DQN, SMALL_DQN)])
def test_non_finite_env_data_names_the_field_env_and_step(cls, kwargs, field, value):
    model = cls(**{**kwargs, "env": bad_env(field, at=40, value=value)})
    with pytest.raises(ValueError, match=rf"env 0 of 1 .* returned a non-finite {field} at its env step 40: .*"
                                         r"check_finite=False"):
        fit_iterations(model, 10)


def test_check_finite_false_lets_it_through_and_the_loss_check_stops_before_stepping():
    seen = []

    class Spy(A2C):
        def training_step(self, batch, batch_idx):
            seen.append([p.detach().clone() for p in self.parameters()])
            return super().training_step(batch, batch_idx)

    model = Spy(env=bad_env("reward", at=20), num_envs=1, rollout_fragment_length=16, seed=0, total_env_steps=None,
                vectorization="sync", check_finite=False)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at iteration 1 \(env step 16\): .*vf_loss = nan"
                                                 r".*weights were not stepped"):
        fit_iterations(model, 5)
    for before, after in zip(seen[-1], model.parameters()):
        assert torch.equal(before, after)  # the failing iteration stepped nothing
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_dqn_nan_reward_stops_with_the_loss_name_and_weights_stay_finite():
    model = DQN(**{**SMALL_DQN, "env": bad_env("reward", at=20), "check_finite": False})
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at iteration \d+ .*loss = nan"):
        fit_iterations(model, 30)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_last_good_checkpoint_is_never_overwritten_with_nan_weights(tmp_path):
    # NaN at env step 200 = in the 13th iteration (epoch 4 of 3 iterations): 4 good epochs were checkpointed
    model = PPO(**{**SMALL_PPO, "env": bad_env("reward", at=200), "check_finite": False, "iterations_per_epoch": 3})
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    with pytest.raises(NonFiniteLossError):
        quiet_trainer(max_epochs=20, callbacks=[ckpt], enable_checkpointing=True).fit(model)
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)["state_dict"]
    assert state and all(torch.isfinite(t).all() for t in state.values())
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["lightning_rl"]["global_counters"][
        "num_iterations"] == 12
