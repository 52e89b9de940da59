"""Loggers receive learner info, episode returns and counters; x axis is env steps."""

from __future__ import annotations

import csv

import pytest
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

from lightning_rl import PPO
from tests.conftest import quiet_trainer

EXPECTED = [
    "learner/default_policy/learner_stats/pg_loss",
    "learner/default_policy/learner_stats/vf_loss",
    "learner/default_policy/learner_stats/entropy",
    "learner/default_policy/learner_stats/kl",
    "rollout/episode_return_mean",
    "counters/num_env_steps_sampled",
    "perf/env_steps_per_s",
    "perf/sample_time_ms",
    "perf/learn_time_ms",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    model = PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=64, seed=0, total_env_steps=4 * 64 * 6)
    loggers = [TensorBoardLogger(root, name="tb"), CSVLogger(root, name="csv")]
    quiet_trainer(logger=loggers, log_every_n_steps=1).fit(model)
    return root


def test_csv_has_learner_info_returns_and_counters(run_dir):
    (metrics_file,) = run_dir.glob("csv/version_0/metrics.csv")
    rows = list(csv.DictReader(metrics_file.open()))
    assert len(rows) == 6
    for key in EXPECTED:
        assert any(row.get(key) for row in rows), f"{key} missing from {metrics_file}"
    steps = [int(float(row["step"])) for row in rows]
    assert steps == [256 * i for i in range(1, 7)]  # the x axis counts env steps
    returns = [float(row["rollout/episode_return_mean"]) for row in rows if row["rollout/episode_return_mean"]]
    assert all(8 <= r <= 500 for r in returns)
    assert float(rows[-1]["counters/num_env_steps_sampled"]) == 1536


def test_tensorboard_event_file_has_the_same_tags(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (event_file,) = run_dir.glob("tb/version_0/events.out.tfevents.*")
    acc = EventAccumulator(str(event_file))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for key in EXPECTED:
        assert key in tags, f"{key} missing from {event_file}"
    counter = acc.Scalars("counters/num_env_steps_sampled")
    assert [e.step for e in counter] == [int(e.value) for e in counter]


def test_validation_metrics_share_the_env_step_axis(tmp_path):
    model = PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, seed=0, total_env_steps=4 * 128 * 3,
                iterations_per_epoch=4, evaluation_interval=1, evaluation_num_episodes=2)
    quiet_trainer(logger=CSVLogger(tmp_path, name="csv"), log_every_n_steps=1, num_sanity_val_steps=0).fit(model)
    rows = list(csv.DictReader(next(tmp_path.glob("csv/version_0/metrics.csv")).open()))
    val_steps = [int(float(r["step"])) for r in rows if r.get("val/episode_return_mean")]
    train_steps = [int(float(r["step"])) for r in rows if r.get("counters/num_env_steps_sampled")]
    assert val_steps == [512, 1024, 1536]  # evaluated at the end of each epoch of 4 x 128 env steps
    assert set(val_steps) <= set(train_steps)  # one x axis for training and validation curves
