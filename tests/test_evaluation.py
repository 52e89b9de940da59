"""Evaluation as Lightning validation: greedy episodes on separate envs, usable by callbacks."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

from lightning_rl import DQN, PPO, SAC, evaluate
from tests.conftest import quiet_trainer
from tests.test_truncation import time_limited


def test_evaluate_plays_one_episode_per_env():
    model = PPO(env=time_limited, seed=0)
    assert evaluate(model, num_episodes=3, seed=0) == [5.0, 5.0, 5.0]


def test_evaluate_is_deterministic_and_greedy():
    model = PPO(env="CartPole-v1", seed=0)
    assert evaluate(model, num_episodes=4, seed=1) == evaluate(model, num_episodes=4, seed=1)
    sac = SAC(seed=0)
    assert evaluate(sac, num_episodes=2, seed=1) == evaluate(sac, num_episodes=2, seed=1)


def test_no_validation_without_evaluation_interval():
    model = PPO(num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, seed=0, iterations_per_epoch=2,
                total_env_steps=None)
    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(model)
    assert "val/episode_return_mean" not in trainer.callback_metrics


def test_validation_logs_and_drives_checkpoint_and_early_stopping(tmp_path):
    model = PPO(num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, seed=0, iterations_per_epoch=2,
                total_env_steps=None, evaluation_interval=2, evaluation_num_episodes=3)
    ckpt = ModelCheckpoint(dirpath=tmp_path, monitor="val/episode_return_mean", mode="max")
    stop = EarlyStopping(monitor="val/episode_return_mean", mode="max", stopping_threshold=1.0, patience=100)
    trainer = quiet_trainer(max_epochs=6, callbacks=[ckpt, stop], enable_checkpointing=True, num_sanity_val_steps=0)
    trainer.fit(model)
    assert trainer.callback_metrics["val/episode_return_mean"] >= 8  # CartPole lasts at least 8 steps
    assert trainer.current_epoch == 2  # every CartPole return beats 1.0: stopped at the first evaluation
    assert Path(ckpt.best_model_path).is_file() and ckpt.best_model_score >= 8


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_evaluation_interval_is_rejected_when_the_module_is_built(bad):
    with pytest.raises(ValueError, match="evaluation_interval must be positive"):
        DQN(evaluation_interval=bad, total_env_steps=None, learning_starts=10, iterations_per_epoch=1)
