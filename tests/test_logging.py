"""Loggers receive learner info, episode returns and counters; x axis is env steps."""

from __future__ import annotations

import csv
import re

import pytest
import pytorch_lightning as pl
from pytorch_lightning.callbacks import TQDMProgressBar
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

from lightning_rl import PPO
from lightning_rl.callbacks import EnvStepProgressBar
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


def csv_rows(root) -> list[dict[str, str]]:
    (metrics_file,) = root.glob("csv/version_0/metrics.csv")
    return [row for row in csv.DictReader(metrics_file.open()) if row.get("counters/num_env_steps_sampled")]


def tiny_ppo(iterations: int | None, **kwargs) -> PPO:
    """PPO of 8 env steps an iteration (cheap iterations, so a run of hundreds is a few seconds)."""
    return PPO(env="CartPole-v1", num_envs=2, rollout_fragment_length=4, num_sgd_iter=1, sgd_minibatch_size=8,
               seed=0, total_env_steps=iterations and 8 * iterations, iterations_per_epoch=10, **kwargs)


def test_default_cadence_logs_at_least_100_points_without_logging_every_iteration(tmp_path):
    # Lightning's default (50) would give 4 points over these 200 iterations; the run's length picks
    # every 200 // 100 = 2 iterations (and the first, logged while an iteration's size is unknown).
    trainer = quiet_trainer(logger=CSVLogger(tmp_path, name="csv"))
    trainer.fit(tiny_ppo(200))
    assert trainer.log_every_n_steps == 2
    steps = [int(float(row["step"])) for row in csv_rows(tmp_path)]
    assert len(steps) == 101
    assert steps[:3] == [8, 16, 32] and steps[-1] == 1600


def test_explicit_log_every_n_steps_is_kept(tmp_path):
    trainer = quiet_trainer(logger=CSVLogger(tmp_path, name="csv"), log_every_n_steps=7)
    trainer.fit(tiny_ppo(30))
    assert trainer.log_every_n_steps == 7
    steps = [int(float(row["step"])) for row in csv_rows(tmp_path)]
    assert steps == [8 * i for i in (7, 14, 21, 28, 30)]  # and the last iteration, where fit stops


class StopAfter(pl.Callback):
    def __init__(self, iterations: int) -> None:
        self.left = iterations

    def on_train_batch_end(self, trainer, *_) -> None:
        self.left -= 1
        trainer.should_stop = self.left <= 0


def test_default_cadence_follows_the_trainer_limits_without_a_budget(tmp_path):
    trainer = quiet_trainer(logger=CSVLogger(tmp_path, name="csv"), max_steps=200, callbacks=[StopAfter(3)])
    trainer.fit(tiny_ppo(None))
    assert trainer.log_every_n_steps == 2  # max_steps=200 iterations // 100 (decided at the second)


def bar_counts(text: str, total: str) -> list[int]:
    return [int(n) for n in re.findall(rf"(\d+)/{total} env steps", text.replace("\r", "\n"))]


def test_progress_bar_counts_env_steps_toward_the_budget_across_epochs(tmp_path, capsys):
    model = PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=64, seed=0, total_env_steps=1500,
                iterations_per_epoch=2)
    trainer = quiet_trainer(enable_progress_bar=True, default_root_dir=tmp_path)
    trainer.fit(model)
    bar = trainer.progress_bar_callback
    assert isinstance(bar, EnvStepProgressBar)
    assert bar.train_progress_bar.n == 1536 and bar.train_progress_bar.total == 1536  # the last iteration overshoots
    out = capsys.readouterr().out
    counts = bar_counts(out, "1500")
    assert counts == sorted(counts) and counts[-1] == 1280 and 512 in counts  # one bar: no restart at epoch ends
    assert "1536/1536 env steps" in out
    last = out.replace("\r", "\n").strip().splitlines()[-1]
    assert "return=" in last and "steps/s" in last and "v_num" not in last and "env_steps=" not in last
    assert re.search(r"\[\d+:\d+<\d+:\d+", last), last  # elapsed<ETA, from tqdm's known total


def test_progress_bar_without_a_budget_counts_without_a_total(tmp_path, capsys):
    model = PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=64, seed=0, total_env_steps=None,
                iterations_per_epoch=2)
    quiet_trainer(enable_progress_bar=True, default_root_dir=tmp_path, max_epochs=2).fit(model)
    last = capsys.readouterr().out.replace("\r", "\n").strip().splitlines()[-1]
    assert re.match(r"Epoch 1: 1024 env steps \[", last), last


def test_a_users_progress_bar_is_kept_and_a_plain_one_keeps_its_settings(tmp_path):
    class MyBar(TQDMProgressBar):
        pass

    mine = MyBar()
    trainer = quiet_trainer(enable_progress_bar=True, default_root_dir=tmp_path, callbacks=[mine], max_steps=1)
    trainer.fit(tiny_ppo(None))
    assert trainer.progress_bar_callback is mine
    trainer = quiet_trainer(enable_progress_bar=True, default_root_dir=tmp_path, max_steps=1,
                            callbacks=[TQDMProgressBar(refresh_rate=3)])
    trainer.fit(tiny_ppo(None))
    assert type(trainer.progress_bar_callback) is EnvStepProgressBar and trainer.progress_bar_callback.refresh_rate == 3


def test_lightnings_rich_default_bar_becomes_the_env_step_bar_too(tmp_path):
    """With ``rich`` installed (the test extra's twine brings it) Lightning's default progress bar
    is a ``RichProgressBar``: it becomes the env-step bar as the plain tqdm one does (refreshed every
    iteration, as tqdm's default; a Rich bar's refresh rate counts something else; its ``leave`` is
    no public attribute, so the env-step bar keeps its own default)."""
    from pytorch_lightning.callbacks import RichProgressBar
    from pytorch_lightning.utilities.imports import _RICH_AVAILABLE

    assert _RICH_AVAILABLE
    trainer = quiet_trainer(enable_progress_bar=True, default_root_dir=tmp_path, max_steps=1)
    assert type(trainer.progress_bar_callback) is RichProgressBar  # Lightning's default here
    trainer.fit(tiny_ppo(None))
    assert type(trainer.progress_bar_callback) is EnvStepProgressBar
    trainer = quiet_trainer(enable_progress_bar=True, default_root_dir=tmp_path, max_steps=1,
                            callbacks=[RichProgressBar(leave=True)])
    trainer.fit(tiny_ppo(None))
    bar = trainer.progress_bar_callback
    assert type(bar) is EnvStepProgressBar and bar.refresh_rate == 1


def test_learner_info_is_logged_on_the_iterations_lightning_writes_fresh_and_resumed(tmp_path):
    """``should_log`` reads public loop progress; it agrees with Lightning's own logger cadence
    (its private ``should_update_logs``, the oracle) on every iteration, and after a resume."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    from lightning_rl.callbacks.metrics import should_log

    class Compare(pl.Callback):
        def __init__(self):
            self.rows = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            last = batch_idx + 1 >= trainer.num_training_batches
            self.rows.append((trainer.global_step, should_log(trainer, batch_idx),
                              trainer._logger_connector.should_update_logs or last))

    def ppo():
        return PPO(env="CartPole-v1", num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8, num_sgd_iter=1,
                   hiddens=(8,), seed=0, iterations_per_epoch=5, total_env_steps=None)

    fresh, resumed = Compare(), Compare()
    saves = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    quiet_trainer(max_epochs=4, log_every_n_steps=3, enable_checkpointing=True,
                  callbacks=[fresh, saves]).fit(ppo())
    quiet_trainer(max_epochs=4, log_every_n_steps=3, callbacks=[resumed]).fit(
        ppo(), ckpt_path=tmp_path / "epoch=1.ckpt")
    assert len(fresh.rows) == 20 and len(resumed.rows) == 10
    for rows in (fresh.rows, resumed.rows):
        assert [ours for _, ours, _ in rows] == [lightning for _, _, lightning in rows], rows
    assert [ours for _, ours, _ in fresh.rows[10:]] == [ours for _, ours, _ in resumed.rows]
    assert sum(ours for _, ours, _ in fresh.rows) == 4 + 6 - 1  # 4 epoch ends, 6 third iterations, 15 both
