"""Several training iterations in one Lightning training step (``iterations_per_step``) and the
eager update's direct path: the same results as one iteration per step and Lightning's own
backward and optimizer step, to the bit (docs/design.md, "Training iterations")."""

from __future__ import annotations

import math

import pytest
import pytorch_lightning as pl
import torch

from lightning_rl import A2C, DQN, PPO, SAC
from lightning_rl.data.base import IterationStream
from lightning_rl.update import hooks_free
from tests.conftest import quiet_trainer

MAKERS = {
    # 23 iterations of 20 env steps: the budget runs out inside a training step
    "a2c": lambda k, **kw: A2C(env="CartPole-v1", num_envs=4, seed=1, iterations_per_epoch=10,
                               iterations_per_step=k, **{"total_env_steps": 4 * 5 * 23, **kw}),
    "ppo": lambda k, **kw: PPO(env="CartPole-v1", num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16,
                               num_sgd_iter=2, hiddens=(16,), seed=1, iterations_per_epoch=6, iterations_per_step=k,
                               **{"total_env_steps": 2 * 16 * 9, **kw}),
    # one env step and one gradient step per iteration, learning from the 51st; an episode ends at 200
    "sac": lambda k, **kw: SAC(env="Pendulum-v1", seed=1, hiddens=(16,), train_batch_size=16, buffer_size=1000,
                               iterations_per_step=k, **{"total_env_steps": 230, "iterations_per_epoch": 100,
                                                         "learning_starts": 50, **kw}),
    "dqn": lambda k, **kw: DQN(env="CartPole-v1", num_envs=2, seed=1, hiddens=(16,), learning_starts=32,
                               train_freq=8, num_gradient_steps=4, train_batch_size=16, buffer_size=1000,
                               iterations_per_epoch=6, iterations_per_step=k, **{"total_env_steps": 2 * 8 * 23, **kw}),
}


class Seen(pl.Callback):
    """What callbacks see after each training step: the episodes that ended, the iterations'
    batches and the steps."""

    def __init__(self) -> None:
        self.returns: list[float] = []
        self.batches = 0
        self.steps: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.returns += batch.info["episode_returns"]
        self.batches += len(batch.batches) if isinstance(batch, IterationStream) else 1
        self.steps.append(trainer.global_step)


def fit(model: pl.LightningModule, **trainer_kwargs) -> tuple[pl.LightningModule, pl.Trainer, Seen]:
    seen = Seen()
    trainer = quiet_trainer(callbacks=[seen], **trainer_kwargs)
    trainer.fit(model)
    return model, trainer, seen


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.parametrize("k", [3, 4])
@pytest.mark.parametrize("algo", ["a2c", "ppo", "sac", "dqn"])
def test_several_iterations_per_step_learn_exactly_as_one_per_step(algo, k):
    """Epochs of 10 (A2C), 6 (PPO, DQN) or 100 (SAC) iterations cut into steps of 3 or 4 (the last one shorter),
    the budget spent inside a step: the same weights to the bit, counters, optimizer steps and
    finished episodes as one iteration per step; each epoch has ceil(iterations / k) steps."""
    single, t1, seen1 = fit(MAKERS[algo](1))
    streamed, tk, seenk = fit(MAKERS[algo](k))
    assert same_weights(single, streamed)
    assert streamed.counters == single.counters
    assert tk.global_step == t1.global_step > 0
    assert seenk.returns == seen1.returns and len(seen1.returns) > 0
    assert seenk.batches == seen1.batches == single.counters["num_iterations"]
    assert tk.num_training_batches == math.ceil(streamed.iterations_per_epoch / k)
    assert len(seenk.steps) < len(seen1.steps)


def test_max_steps_stops_inside_a_step_where_one_per_step_stops():
    """Trainer(max_steps=13) with 5 iterations per step: 13 updates, as with one per step."""
    single, t1, _ = fit(MAKERS["a2c"](1, total_env_steps=None), max_steps=13)
    streamed, t5, seen = fit(MAKERS["a2c"](5, total_env_steps=None), max_steps=13)
    assert t5.global_step == t1.global_step == 13
    assert same_weights(single, streamed)
    assert seen.steps == [5, 10, 13]


@pytest.mark.parametrize("algo", ["a2c", "sac"])
def test_resume_with_several_iterations_per_step_is_exact(tmp_path, algo):
    """Two epochs of 10 iterations in steps of 4, 4 and 2, against the first epoch, saved and
    resumed: the same weights and counters to the bit (SAC: its replay buffer saved too)."""
    def make() -> pl.LightningModule:
        return MAKERS[algo](4, total_env_steps=None,
                            **({"learning_starts": 5, "iterations_per_epoch": 10} if algo == "sac" else {}))

    full = make()
    quiet_trainer(max_epochs=2).fit(full)
    first = make()
    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path)
    trainer.fit(first)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    resumed = make()
    quiet_trainer(max_epochs=2, default_root_dir=tmp_path).fit(resumed, ckpt_path=tmp_path / "mid.ckpt")
    assert same_weights(full, resumed) and not same_weights(first, resumed)
    assert full.counters == resumed.counters
    # an optimizer step per iteration for A2C; SAC's start once its replay has learning_starts steps
    assert full.counters["num_iterations"] == 2 * 10 and full.trainer.global_step == (20 if algo == "a2c" else 16)


@pytest.mark.parametrize("flag", [{"limit_train_batches": 3}, {"val_check_interval": 2, "limit_val_batches": 0},
                                  {"fast_dev_run": 2}])
def test_trainer_flags_that_count_batches_keep_counting_iterations(flag):
    """fast_dev_run, limit_train_batches and an int val_check_interval count iterations, as
    documented for every algorithm: under them a step runs one iteration."""
    model, _, seen = fit(MAKERS["a2c"](4, total_env_steps=None), max_epochs=1, **flag)
    assert model.active_datamodule is None or model.default_datamodule.iterations_per_step == 1
    expected = {"limit_train_batches": 3, "val_check_interval": 10, "fast_dev_run": 2}[next(iter(flag))]
    assert model.counters["num_iterations"] == seen.batches == len(seen.steps) == expected


def test_a_callback_reading_a_batch_attribute_of_a_stream_is_told_what_to_read():
    class Reads(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            batch.policy_batches  # noqa: B018

    with pytest.raises(AttributeError, match=r"IterationStream .*iterations_per_step=4.*\.batches"):
        quiet_trainer(callbacks=[Reads()]).fit(MAKERS["a2c"](4))


def test_a2c_runs_ten_iterations_per_step_by_default():
    assert A2C(env="CartPole-v1").iterations_per_step == 10
    assert PPO(env="CartPole-v1").iterations_per_step == 1
    with pytest.raises(ValueError, match="iterations_per_step must be positive"):
        A2C(env="CartPole-v1", iterations_per_step=0)


class StepHooks(pl.Callback):
    """Counts Lightning's backward and optimizer-step hooks."""

    def __init__(self) -> None:
        self.calls = {"on_before_backward": 0, "on_after_backward": 0, "on_before_optimizer_step": 0}

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.calls["on_before_backward"] += 1

    def on_after_backward(self, trainer, pl_module) -> None:
        self.calls["on_after_backward"] += 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.calls["on_before_optimizer_step"] += 1


def test_the_eager_step_calls_torch_directly_only_where_no_hook_would_run():
    """Without hooks the eager step backpropagates and steps torch's optimizer itself (Lightning
    still counts the optimizer steps); with a callback overriding a hook of Lightning's backward
    or step, every update goes through Lightning and calls it; both give the same weights."""
    direct, t_direct, _ = fit(MAKERS["ppo"](1))
    assert hooks_free(direct)
    hooks = StepHooks()
    model = MAKERS["ppo"](1)
    trainer = quiet_trainer(callbacks=[hooks])
    trainer.fit(model)
    assert not hooks_free(model)
    updates = model.counters["num_grad_updates"]
    assert hooks.calls == dict.fromkeys(hooks.calls, updates) and updates > 0
    assert trainer.global_step == t_direct.global_step == updates
    assert same_weights(direct, model)


def test_bf16_mixed_precision_keeps_lightning_s_backward():
    model = MAKERS["ppo"](1, total_env_steps=2 * 16 * 2)
    trainer = quiet_trainer(precision="bf16-mixed")
    trainer.fit(model)
    assert not hooks_free(model)
    assert trainer.global_step == model.counters["num_grad_updates"] > 0
