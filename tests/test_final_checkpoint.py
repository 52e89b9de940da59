"""The end of a fit is always checkpointed: ``last.ckpt`` holds the final weights and counters,
whatever the ModelCheckpoint's monitor and cadence (the CLI's configs: tests/test_cli.py)."""

from __future__ import annotations

import pytorch_lightning as pl
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


class Counters(pl.Callback):
    """The weights as ``fit`` starts training, and the counters after each iteration."""

    def __init__(self) -> None:
        self.start_weights: dict[str, torch.Tensor] = {}
        self.after: list[tuple[int, int]] = []

    def on_train_start(self, trainer, pl_module) -> None:
        self.start_weights = {k: v.clone() for k, v in pl_module.state_dict().items()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        c = pl_module.global_counters
        self.after.append((c["num_iterations"], c["num_env_steps_sampled"]))


def test_a_new_trainer_resumes_last_ckpt_with_ckpt_path_last(tmp_path):
    """A fit of 3 iterations (96 env steps, ending mid-epoch); a new Trainer with the same
    ``default_root_dir`` and ``ckpt_path="last"`` starts from its ``last.ckpt`` (its weights) and
    runs iterations 4 and 5 of a 160-step budget, not 5 from scratch."""
    settings = dict(env="CartPole-v1", num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=32, num_sgd_iter=1,
                    iterations_per_epoch=2, seed=0)
    first, seen = PPO(**settings, total_env_steps=3 * 32), Counters()
    quiet_trainer(max_epochs=-1, enable_checkpointing=True, default_root_dir=tmp_path, callbacks=[seen]).fit(first)
    assert seen.after == [(1, 32), (2, 64), (3, 96)]
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["lightning_rl"]["global_counters"] == first.global_counters

    resumed, seen = PPO(**settings, total_env_steps=5 * 32), Counters()
    trainer = quiet_trainer(max_epochs=-1, enable_checkpointing=True, default_root_dir=tmp_path, callbacks=[seen])
    trainer.fit(resumed, ckpt_path="last")
    assert trainer.ckpt_path == str(last)
    for name, weights in first.state_dict().items():
        assert torch.equal(seen.start_weights[name], weights), name
    assert seen.after == [(4, 128), (5, 160)]  # the first run's counters, continued
    assert resumed.global_counters["num_iterations"] == 5 and resumed.global_counters["num_env_steps_sampled"] == 160
    assert torch.load(last, weights_only=True)["lightning_rl"]["global_counters"] == resumed.global_counters
