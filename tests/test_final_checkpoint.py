"""The end of a fit is always checkpointed: ``last.ckpt`` holds the final weights and counters,
whatever the ModelCheckpoint's monitor and cadence (the CLI's configs: tests/test_cli.py)."""

from __future__ import annotations

import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_rl import PPO
from tests.conftest import quiet_trainer


def test_a_budget_that_ends_between_validations_leaves_last_ckpt(tmp_path):
    """Validation (and so the monitoring ModelCheckpoint) every 2nd epoch of 2 iterations; the
    budget of 5 iterations runs out in the 3rd epoch, which is not validated."""
    model = PPO(env="CartPole-v1", num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=32, num_sgd_iter=1,
                iterations_per_epoch=2, evaluation_interval=2, evaluation_num_episodes=1, total_env_steps=5 * 32,
                seed=0)
    best = ModelCheckpoint(dirpath=tmp_path, monitor="val/episode_return_mean", mode="max")
    trainer = quiet_trainer(enable_checkpointing=True, callbacks=[best], num_sanity_val_steps=0,
                            default_root_dir=tmp_path)
    trainer.fit(model)
    assert model.counters["num_iterations"] == 5
    saved = {p.name: torch.load(p, weights_only=True) for p in tmp_path.glob("*.ckpt")}
    assert len(saved) == 2 and best.best_model_path.endswith("epoch=1-step=128.ckpt")  # validated after 4 iterations
    last = saved["last.ckpt"]
    assert last["lightning_rl"]["global_counters"] == model.global_counters
    for name, weights in model.state_dict().items():
        assert torch.equal(last["state_dict"][name], weights), name
    assert best.last_model_path == str(tmp_path / "last.ckpt")  # what ckpt_path="last" resumes

    # enable_checkpointing=False: no ModelCheckpoint, no file
    quiet_trainer(default_root_dir=tmp_path / "none").fit(PPO(**{**model.hparams, "total_env_steps": 32}))
    assert not list((tmp_path / "none").rglob("*.ckpt"))
