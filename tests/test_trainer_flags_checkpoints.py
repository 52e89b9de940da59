"""The Trainer's checkpoint flags (issue 42, items 1, 5, 9, 10): ``fit(ckpt_path="last")`` from a
new Trainer, ``ModelCheckpoint(every_n_train_steps=N)``, ``trainer.predict``,
``load_from_checkpoint`` and SAC under ``max_steps``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from lightning_rl import DQN, PPO, SAC, Algorithm
from lightning_rl.callbacks.interrupt import Interrupted
from lightning_rl.checkpoint import CheckpointError
from tests.conftest import quiet_trainer

# 32 env steps an iteration, one optimizer step
SMALL = dict(env="CartPole-v1", num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=32, num_sgd_iter=1,
             iterations_per_epoch=2, seed=0)


class Counters(pl.Callback):
    """The global (iterations, env steps) after each iteration; raises ``Interrupted`` (what
    Ctrl-C raises during fit) after iteration ``interrupt_at``."""

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.after: list[tuple[int, int]] = []
        self.interrupt_at = interrupt_at

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        c = pl_module.global_counters
        self.after.append((c["num_iterations"], c["num_env_steps_sampled"]))
        if c["num_iterations"] == self.interrupt_at:
            raise Interrupted()


def logged_trainer(tmp_path, counters: Counters) -> pl.Trainer:
    """A Trainer with a logger: each one writes to the next version folder."""
    return quiet_trainer(max_epochs=-1, enable_checkpointing=True, logger=CSVLogger(tmp_path), callbacks=[counters])


def test_ckpt_path_last_from_a_new_trainer_resumes_the_finished_run(tmp_path):
    """Item 1: a finished fit leaves version_0/checkpoints/last.ckpt; a new Trainer (its logger
    at version_1) with ckpt_path="last" resumes it: counters continue, not a new run from 0."""
    first = Counters()
    logged_trainer(tmp_path, first).fit(PPO(**SMALL, total_env_steps=3 * 32))
    assert first.after == [(1, 32), (2, 64), (3, 96)]
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"

    second = Counters()
    trainer = logged_trainer(tmp_path, second)
    trainer.fit(PPO(**SMALL, total_env_steps=5 * 32), ckpt_path="last")
    assert trainer.ckpt_path == str(last)
    assert second.after == [(4, 128), (5, 160)]
    resumed_last = tmp_path / "lightning_logs" / "version_1" / "checkpoints" / "last.ckpt"  # the new run's folder
    assert torch.load(resumed_last, weights_only=True)["lightning_rl"]["global_counters"]["num_iterations"] == 5


def test_ckpt_path_last_from_a_new_trainer_resumes_the_interrupted_run(tmp_path):
    """Item 1: Ctrl-C at iteration 2 leaves version_0/checkpoints/interrupted.ckpt (and no
    last.ckpt); a new Trainer with ckpt_path="last" resumes it."""
    first = Counters(interrupt_at=2)
    with pytest.raises(SystemExit):
        logged_trainer(tmp_path, first).fit(PPO(**SMALL, total_env_steps=5 * 32))
    folder = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["interrupted.ckpt"]

    second = Counters()
    trainer = logged_trainer(tmp_path, second)
    trainer.fit(PPO(**SMALL, total_env_steps=5 * 32), ckpt_path="last")
    assert trainer.ckpt_path == str(folder / "interrupted.ckpt")
    assert second.after == [(3, 96), (4, 128), (5, 160)]


def test_every_n_train_steps_saves_at_the_first_iteration_end_past_each_multiple(tmp_path):
    """Item 5: 3 optimizer steps an iteration (num_sgd_iter=3), every_n_train_steps=4: global steps
    3, 6, ..., 24 at iteration ends; saved at the first past each multiple of 4 (6, 9, 12, 18, 21,
    24; 18 passes 16 alone), where Lightning saved only at 12 and 24, with a warning about
    manual optimization that does not apply."""
    checkpoints = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}-{step}", every_n_train_steps=4,
                                  save_top_k=-1)
    model = PPO(**{**SMALL, "num_sgd_iter": 3, "iterations_per_epoch": 8}, total_env_steps=8 * 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = quiet_trainer(max_epochs=1, enable_checkpointing=True, callbacks=[checkpoints])
        trainer.fit(model)
    assert trainer.global_step == 24
    saved = sorted(torch.load(p, weights_only=True)["global_step"] for p in tmp_path.glob("epoch=*.ckpt"))
    assert saved == [6, 9, 12, 18, 21, 24]
    assert not [w for w in caught if "every_n_train_steps" in str(w.message)]


def test_trainer_predict_returns_greedy_actions_or_says_what_to_pass(tmp_path):
    """Item 9: trainer.predict on batches of observations returns model.predict's greedy actions;
    without observations it says, in one line, what to pass."""
    model = PPO(**SMALL)
    obs = np.stack([model.observation_space.sample() for _ in range(10)])
    trainer = quiet_trainer()
    batches = trainer.predict(model, dataloaders=DataLoader(TensorDataset(torch.as_tensor(obs)), batch_size=4))
    assert [len(b) for b in batches] == [4, 4, 2]
    assert torch.cat(batches).tolist() == model.predict(obs, deterministic=True)[0].tolist()
    with pytest.raises(ValueError, match=r"^trainer.predict\(model\) needs observations: .*model.predict\(obs") as err:
        trainer.predict(model)
    assert "\n" not in str(err.value)


def test_load_from_checkpoint_names_the_file_and_what_it_holds_and_keeps_the_global_rng(tmp_path):
    """Item 9: another algorithm's file and a truncated file are CheckpointErrors naming the file
    (and what it holds); Algorithm.load_from_checkpoint builds the algorithm the file records;
    loading leaves torch's global random state as it was."""
    model = PPO(**SMALL, total_env_steps=32)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model)
    path = tmp_path / "ppo.ckpt"
    trainer.save_checkpoint(path)

    with pytest.raises(CheckpointError, match=rf"^checkpoint '{path}' holds a PPO, not a DQN: load it with "
                                              r"PPO.load_from_checkpoint or Algorithm.load_from_checkpoint$"):
        DQN.load_from_checkpoint(path)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(path.read_bytes()[:4096])
    with pytest.raises(CheckpointError, match=rf"^checkpoint '{truncated}' is corrupt or truncated"):
        PPO.load_from_checkpoint(truncated)

    torch.manual_seed(123)
    state = torch.get_rng_state()
    loaded = Algorithm.load_from_checkpoint(path)
    assert torch.equal(torch.get_rng_state(), state)
    assert type(loaded) is PPO
    for name, weights in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], weights), name


def test_sac_counts_one_optimizer_step_per_update_under_max_steps():
    """Item 10: SAC steps three optimizers per update (temperature, critics, actor); max_steps=12
    is 12 updates (num_grad_updates), not 4."""
    model = SAC(env="Pendulum-v1", num_envs=1, learning_starts=8, train_batch_size=8, hiddens=(8,), seed=0,
                total_env_steps=1000)
    trainer = quiet_trainer(max_steps=12)
    trainer.fit(model)
    assert trainer.global_step == 12 == model.counters["num_grad_updates"]
