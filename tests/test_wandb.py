"""Weights & Biases (offline) gets the same metrics as the CSV logger, with env steps as the x axis.

wandb is in the ``test`` extra (not a dependency of lightning_rl), so CI runs this test: it is not skipped.
"""

from __future__ import annotations

import csv

from pytorch_lightning.loggers import CSVLogger

from lightning_rl import PPO
from tests.conftest import quiet_trainer

BATCH = 4 * 64
ITERATIONS = 3


def test_wandb_offline_run_has_the_csv_metrics(tmp_path, monkeypatch):
    import wandb
    from pytorch_lightning.loggers import WandbLogger

    for name, value in {
        "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"), "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_DATA_DIR": str(tmp_path / "data"),
    }.items():
        monkeypatch.setenv(name, value)

    model = PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=64, seed=0, total_env_steps=BATCH * ITERATIONS)
    wandb_logger = WandbLogger(project="lightning_rl_test", save_dir=str(tmp_path), offline=True)
    csv_logger = CSVLogger(tmp_path, name="csv")
    try:
        quiet_trainer(logger=[wandb_logger, csv_logger], log_every_n_steps=1).fit(model)
        summary = dict(wandb_logger.experiment.summary)
    finally:
        wandb.finish()
        wandb.teardown()

    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list(run_dir.glob("*.wandb")), f"no .wandb file in {run_dir}"

    for key in ("rollout/episode_return_mean", "learner/default_policy/learner_stats/pg_loss"):
        assert key in summary, f"{key} did not reach the W&B run"
    assert summary["trainer/global_step"] == BATCH * ITERATIONS  # the x axis is env steps there too

    (metrics_file,) = (tmp_path / "csv").glob("version_0/metrics.csv")
    with metrics_file.open(newline="") as f:
        csv_names = set(csv.DictReader(f).fieldnames or []) - {"step", "epoch"}
    wandb_names = {k for k in summary if not k.startswith("_")} - {"trainer/global_step", "epoch"}
    assert csv_names == wandb_names
