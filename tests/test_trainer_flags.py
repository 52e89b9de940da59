"""Issue 42: every Trainer flag a Lightning user reaches for works, or is refused in one line
(docs/guides/trainer-flags.md). Items 4, 6, 7 and 8, the refusals, and a cheap row for flags
that already worked; checkpoints (items 1, 5, 9, 10) are in test_trainer_flags_checkpoints.py,
seeding and process strategies (items 2, 3) in test_trainer_flags_processes.py."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
from pytorch_lightning.callbacks import LearningRateMonitor, StochasticWeightAveraging, Timer
from pytorch_lightning.loggers import CSVLogger

from lightning_rl import A2C, A3C, APEX, APPO, DQN, IMPALA, PPO, SAC, TD3
from tests.conftest import quiet_trainer

pytestmark = pytest.mark.timeout(300)

ITERATION = 32  # env steps of one tiny PPO iteration: 2 envs x 16 steps


def tiny_ppo(**settings: Any) -> PPO:
    """A PPO iteration of 32 CartPole env steps, 2 iterations an epoch, one greedy episode per evaluation."""
    defaults = dict(seed=0, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=1,
                    hiddens=(8,), iterations_per_epoch=2, total_env_steps=8 * ITERATION, evaluation_num_episodes=1,
                    evaluation_max_episode_steps=50)
    return PPO(**{**defaults, **settings})


class Validations(pl.Callback):
    """The global env steps at each validation of a fit (the sanity check left out)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.steps.append(pl_module.global_counters["num_env_steps_sampled"])


# ----------------------------------------------------------------------------- item 4: validation cadence
@pytest.mark.parametrize("settings, flags, validated_at, warns", [
    # the Trainer's cadence wins over evaluation_interval, and the conflict is one warning
    (dict(evaluation_interval=1), dict(check_val_every_n_epoch=2), [4, 8], "check_val_every_n_epoch=2"),
    # the Trainer's cadence alone validates
    ({}, dict(check_val_every_n_epoch=2), [4, 8], None),
    ({}, dict(val_check_interval=0.5), [1, 2, 3, 4, 5, 6, 7, 8], None),
    # validation by iterations across epochs, as Lightning documents it (and Lightning's
    # validation as the budget stops the fit)
    (dict(evaluation_interval=1), dict(check_val_every_n_epoch=None, val_check_interval=3), [3, 6, 8],
     "check_val_every_n_epoch=None"),
    ({}, dict(check_val_every_n_epoch=None, val_check_interval=3), [3, 6, 8], None),
    # evaluation_interval alone, and neither: as before
    (dict(evaluation_interval=2), {}, [4, 8], None),
    ({}, {}, [], None),
], ids=["cv2-over-interval1", "cv2-alone", "vci-half-alone", "cvNone-vci3-over-interval1", "cvNone-vci3-alone",
        "interval2-alone", "none"])
def test_the_trainer_s_validation_flags_win_and_a_conflict_is_one_warning(settings, flags, validated_at, warns):
    """Validations happen at the iterations the Trainer's flags say (``validated_at``, in
    iterations of 32 env steps), with or without ``evaluation_interval``; a module setting the
    Trainer overrides is named in one warning line."""
    seen = Validations()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(callbacks=[seen], num_sanity_val_steps=0, **flags).fit(tiny_ppo(**settings))
    assert seen.steps == [i * ITERATION for i in validated_at]
    named = [str(w.message) for w in caught if "evaluation_interval" in str(w.message)]
    if warns is None:
        assert not named
    else:
        assert len(named) == 1 and warns in named[0] and "\n" not in named[0], named


# ----------------------------------------------------------------------------- refusals (item 6 and the rule)
@pytest.mark.parametrize("flags, says", [
    (dict(gradient_clip_val=1.0), "set the maximum gradient norm with the module's grad_clip"),
    (dict(accumulate_grad_batches=2), "raise the module's batch settings"),
    (dict(callbacks=[StochasticWeightAveraging(swa_lrs=0.01)]), "use the module's lr_schedule"),
    (dict(overfit_batches=2), "use limit_train_batches"),
    (dict(precision="16-true"), "precision '32-true' or 'bf16-mixed', got '16-true'"),
], ids=["gradient_clip_val", "accumulate_grad_batches", "StochasticWeightAveraging", "overfit_batches",
        "precision-16-true"])
def test_a_flag_the_algorithms_cannot_honour_is_refused_in_one_line_before_training(flags, says):
    model = tiny_ppo()
    with pytest.raises(ValueError) as raised:
        quiet_trainer(**flags).fit(model)
    message = str(raised.value)
    assert says in message and "\n" not in message, message
    assert model.counters["num_iterations"] == 0


def test_refused_fit_flags_do_not_stop_validate():
    """``gradient_clip_val`` concerns training only: ``trainer.validate`` on the same Trainer runs."""
    trainer = quiet_trainer(gradient_clip_val=1.0)
    (metrics,) = trainer.validate(tiny_ppo())
    assert "val/episode_return_mean" in metrics


# ----------------------------------------------------------------------------- item 7: one x axis
def test_learning_rate_monitor_logs_at_env_steps(tmp_path: Path):
    """What a callback writes through the logger (``LearningRateMonitor``) has the env-step x
    axis of every other metric: the learning rate at the start of each iteration, at the env
    steps sampled before it."""
    logger = CSVLogger(tmp_path, name="run")
    trainer = quiet_trainer(logger=logger, log_every_n_steps=1, max_epochs=-1,
                            callbacks=[LearningRateMonitor(logging_interval="step")])
    trainer.fit(tiny_ppo(total_env_steps=4 * ITERATION, lr=1e-3))
    rows = list(csv.DictReader((Path(logger.log_dir) / "metrics.csv").open()))
    lr_steps = [int(r["step"]) for r in rows if r.get("lr-Adam")]
    counted = {int(r["step"]) for r in rows if r.get("counters/num_env_steps_sampled")}
    assert lr_steps == [0, ITERATION, 2 * ITERATION, 3 * ITERATION]
    assert counted == {ITERATION, 2 * ITERATION, 3 * ITERATION, 4 * ITERATION}


# ----------------------------------------------------------------------------- item 8: fast_dev_run
DEV_RUNS = {  # every algorithm at its own defaults but the network's size and the workers
    "PPO": lambda: PPO(seed=0, num_envs=2, hiddens=(8,)),
    "A2C": lambda: A2C(seed=0, num_envs=2, hiddens=(8,)),
    "DQN": lambda: DQN(seed=0, hiddens=(8,)),  # learning_starts=1000 by default
    "SAC": lambda: SAC(seed=0, hiddens=(8,), train_batch_size=16),  # train_freq=1, n_step=1: one row per step
    "TD3": lambda: TD3(seed=0, hiddens=(8,), train_batch_size=16),
    "IMPALA": lambda: IMPALA(seed=0, num_workers=0, num_envs=2, rollout_fragment_length=8, train_batch_size=16),
    "APPO": lambda: APPO(seed=0, num_workers=0, num_envs=2, rollout_fragment_length=8, train_batch_size=16),
    "APEX": lambda: APEX(seed=0, num_workers=0, num_envs=2, hiddens=(8,), train_batch_size=16),
    "A3C": lambda: A3C(seed=0, num_workers=0, num_envs=2, hiddens=(8,)),
}


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("name", list(DEV_RUNS))
def test_fast_dev_run_n_runs_n_iterations_each_with_a_gradient_step(name, n):
    """``fast_dev_run=N``: N iterations (not N optimizer steps, which is one PPO iteration), and
    the replay methods learn from the first one (``learning_starts`` waived), so every
    algorithm's loss and optimizer step run."""
    model = DEV_RUNS[name]()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = pl.Trainer(fast_dev_run=n, accelerator="cpu", enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model)
    assert model.counters["num_iterations"] == n
    assert model.counters["num_grad_updates"] >= n
    assert any(not p.equal(b) for p, b in zip(model.parameters(), before))


def test_fast_dev_run_waives_learning_starts_only_during_the_dev_run():
    model = DQN(seed=0, hiddens=(8,), total_env_steps=128, train_freq=16)
    quiet_trainer(max_epochs=-1).fit(model)
    assert model.counters["num_grad_updates"] == 0  # 128 env steps < learning_starts=1000


# ----------------------------------------------------------------------------- flags that already worked
def test_max_time_stops_a_run_without_budget():
    model = tiny_ppo(total_env_steps=None)
    quiet_trainer(max_time={"seconds": 1}).fit(model)
    assert model.counters["num_iterations"] > 0


def test_a_timer_callback_stops_a_run_before_its_budget():
    model = tiny_ppo(total_env_steps=10_000_000)
    quiet_trainer(callbacks=[Timer(duration={"seconds": 1})]).fit(model)
    assert 0 < model.counters["num_env_steps_sampled"] < 10_000_000


@pytest.mark.parametrize("flags, iterations", [
    (dict(max_epochs=3), 6),  # an explicit epoch cap stands under a larger budget
    (dict(min_epochs=6), 12),  # Lightning's min_epochs outlasts the budget
    (dict(max_steps=3), 3),  # optimizer steps (trainer.global_step): one per iteration at num_sgd_iter=1
    (dict(deterministic=True, benchmark=False), 8),
    (dict(detect_anomaly=True), 8),
    (dict(inference_mode=False), 8),
], ids=["max_epochs", "min_epochs", "max_steps", "deterministic", "detect_anomaly", "inference_mode"])
def test_loop_flags_do_what_lightning_documents(flags, iterations):
    model = tiny_ppo(sgd_minibatch_size=32)
    quiet_trainer(**flags).fit(model)
    assert model.counters["num_iterations"] == iterations
