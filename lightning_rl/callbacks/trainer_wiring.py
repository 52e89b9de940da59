"""What lightning_rl sets on a Trainer, in one place, for the Python API and the CLI alike."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol
from weakref import WeakKeyDictionary

import pytorch_lightning as pl
from pytorch_lightning.callbacks import RichProgressBar, StochasticWeightAveraging, Timer, TQDMProgressBar
from pytorch_lightning.loggers import Logger
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

from lightning_rl.callbacks.episodes import RolloutMetricsCallback
from lightning_rl.callbacks.final_checkpoint import FinalCheckpoint, PreviousRuns, StepCadence
from lightning_rl.callbacks.interrupt import InterruptCheckpoint
from lightning_rl.callbacks.known_warnings import KnownWarnings
from lightning_rl.callbacks.learner_info import LearnerInfoCallback, LogCadence
from lightning_rl.callbacks.metrics import MetricsWriter
from lightning_rl.callbacks.progress import EnvStepProgressBar
from lightning_rl.checkpoint import CheckedCheckpointIO
from lightning_rl.data.base import EnvDataModule
from lightning_rl.distributed import check_launcher, check_strategy

if TYPE_CHECKING:
    import torch

    from lightning_rl.process import ProcessSettings


class Wired(Protocol):
    """What the wiring reads of the algorithm it attaches to a Trainer (every ``Algorithm`` is one;
    named here so that this module imports no algorithm, not even for type hints)."""

    device: torch.device
    total_env_steps: int | None
    evaluation_interval: int | None
    global_counters: dict[str, int]
    budget_counter: str
    process_settings: ProcessSettings
    resume_command: list[str] | None
    validates_in_fit: bool

    @property
    def active_datamodule(self) -> pl.LightningDataModule | None: ...

    def budget_spent(self) -> bool: ...


# Lightning's advertisements, logged (at INFO) by every Trainer: the packages they name are not
# needed, and lightning_rl's own logging (the logger a run gets, its checkpoints) is complete.
LIGHTNING_TIPS = (
    "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]",
    "💡 Tip: For seamless cloud uploads and versioning, try installing [litmodels]",
)


class _LightningTips(logging.Filter):
    """Drops exactly the records of ``LIGHTNING_TIPS`` from Lightning's rank-zero logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(LIGHTNING_TIPS))


def quiet_lightning_tips() -> None:
    """Installs the filter on the logger Lightning's ``rank_zero_info`` writes to (once)."""
    logger = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    if not any(isinstance(f, _LightningTips) for f in logger.filters):
        logger.addFilter(_LightningTips())


quiet_lightning_tips()  # before any Trainer is made: Trainer.__init__ logs them


class TrainerWiring(pl.Callback):
    """The Trainer settings an algorithm owns and the process around its fit.

    ``Algorithm.configure_callbacks`` calls ``callbacks``: the first hook Lightning calls on
    the module, before it restores a checkpoint and before callbacks' ``setup`` read the
    validation cadence (``attached``, called as ``trainer.fit`` attaches the module, comes
    earlier still: it lifts Lightning's default epoch cap under an env-step budget). The
    callback itself then pins threads and CPUs for the fit (restored after it, also when it
    fails), checks the strategy, stops a resumed run whose budget is spent, says why a
    callback stopped a run before its budget, and closes the envs of a failed fit."""

    def __init__(self) -> None:
        self._stops_before: dict[int, object] = {}
        self._env_step_loggers: list[tuple[Logger, Any]] = []

    @staticmethod
    def attached(module: Wired, trainer: pl.Trainer) -> None:
        """``module`` is being attached to ``trainer`` (``trainer.fit``/``validate``/``test``, before
        Lightning reads its loop limits). With an env-step budget the budget is the limit: no
        epoch limit, where Lightning would set 1000 with a warning to set ``max_epochs`` (an
        explicit ``max_epochs``, ``max_steps`` or ``max_time`` stands). ``fast_dev_run=N`` runs N
        iterations: Lightning's cap of N optimizer steps (``global_step``) is lifted, an iteration
        taking several. A rank forked by Lightning (``strategy="ddp_fork"``) is refused here.
        ``fit(ckpt_path="last")`` is offered the files of the run's earlier Trainers (``PreviousRuns``)."""
        check_launcher(trainer)
        PreviousRuns.withdraw(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            PreviousRuns.offer(trainer)
        if trainer.fast_dev_run:
            trainer.fit_loop.epoch_loop.max_steps = -1  # limit_train_batches=N, max_epochs=1 stay
        elif module.total_env_steps and trainer.fit_loop.max_epochs is None and trainer.max_steps == -1:
            trainer.fit_loop.max_epochs = -1

    @staticmethod
    def callbacks(module: Wired, trainer: pl.Trainer | None) -> list[pl.Callback]:
        """The callbacks to add to ``trainer`` for ``module`` (those it already has left out).

        Also, on ``trainer``: the fit flags the algorithms cannot honour are refused
        (``check_fit_flags``), checkpoints are read through ``CheckedCheckpointIO``, validation
        runs as ``validation_cadence`` says, Lightning's default progress bar becomes
        ``EnvStepProgressBar`` (the run's env steps, not the epoch's batches). No private
        Lightning attribute is read."""
        if trainer is not None:
            PreviousRuns.withdraw(trainer)  # fit's ckpt_path is resolved
        present = {type(cb) for cb in trainer.callbacks} if trainer is not None else set()
        added: list[pl.Callback] = [
            cb() for cb in (LearnerInfoCallback, RolloutMetricsCallback, MetricsWriter, LogCadence, TrainerWiring,
                            FinalCheckpoint, StepCadence, KnownWarnings) if cb not in present
        ]
        if trainer is None:
            return added
        check_fit_flags(module, trainer)
        strategy = trainer.strategy
        if not isinstance(strategy.checkpoint_io, CheckedCheckpointIO):
            strategy.checkpoint_io = CheckedCheckpointIO(strategy.checkpoint_io, module)
        module.validates_in_fit = validation_cadence(module, trainer)
        if InterruptCheckpoint not in present:  # in the run's checkpoint folder; the CLI sets resume_command
            added.append(InterruptCheckpoint(resume_command=module.resume_command))
        # Swapped in the Trainer's list, not returned (that prints an "override" notice).
        for i, cb in enumerate(trainer.callbacks):
            if type(cb) in (TQDMProgressBar, RichProgressBar):  # Lightning's default: Rich when rich is installed
                trainer.callbacks[i] = EnvStepProgressBar.like(cb)
        return added

    def setup(self, trainer: pl.Trainer, pl_module: Wired, stage: str) -> None:
        self._env_step_loggers = log_at_env_steps(trainer.loggers, pl_module)

    def teardown(self, trainer: pl.Trainer, pl_module: Wired, stage: str) -> None:
        restore_loggers(self._env_step_loggers)
        self._env_step_loggers = []

    def on_fit_start(self, trainer: pl.Trainer, pl_module: Wired) -> None:
        pl_module.process_settings.apply(trainer.local_rank, trainer.num_devices, pl_module.device.type == "cpu")
        check_strategy(trainer)
        check_precision(trainer)

    def on_train_start(self, trainer: pl.Trainer, pl_module: Wired) -> None:
        self._stops_before = {id(cb): _stop_reason(cb) for cb in trainer.callbacks}
        # Resuming a run whose budget is spent trains nothing (Lightning would start another epoch).
        if pl_module.budget_spent():
            rank_zero_info(
                f"{type(pl_module).__name__} already sampled {pl_module.global_counters[pl_module.budget_counter]} of "
                f"total_env_steps={pl_module.total_env_steps}: nothing to train (raise total_env_steps to continue)"
            )
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: Wired) -> None:
        # A callback (EarlyStopping) ended the run before its budget: say which, and why.
        if not trainer.should_stop or pl_module.budget_spent():
            return
        if any(isinstance(cb, Timer) and cb.time_remaining() is not None and cb.time_remaining() <= 0
               for cb in trainer.callbacks):
            return  # Lightning's Timer says so itself
        stopped_by = [cb for cb in trainer.callbacks
                      if _stop_reason(cb) is not None and _stop_reason(cb) != self._stops_before.get(id(cb))]
        why = "; ".join(f"{type(cb).__name__}: {_stop_reason(cb)}" for cb in stopped_by) or \
            "trainer.should_stop was set (by a callback or the module)"
        steps = pl_module.global_counters[pl_module.budget_counter]
        of = f" of total_env_steps={pl_module.total_env_steps:,}" if pl_module.total_env_steps else ""
        rank_zero_info(f"{type(pl_module).__name__} stopped early, at {steps:,} env steps{of}: {why}")

    def on_fit_end(self, trainer: pl.Trainer, pl_module: Wired) -> None:
        pl_module.process_settings.restore()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # A failed or interrupted fit skips on_fit_end and teardown: give the process its threads
        # and CPUs back and close the envs (terminating env worker processes).
        restore_loggers(self._env_step_loggers)
        self._env_step_loggers = []
        process_settings = getattr(pl_module, "process_settings", None)
        if process_settings is None:
            return
        process_settings.restore()
        dm = pl_module.active_datamodule
        if isinstance(dm, EnvDataModule) and dm is not trainer.datamodule:  # Lightning tells its own
            dm.on_exception(exception)


def _stop_reason(callback: pl.Callback) -> str | None:
    """Why ``callback`` stopped the run, as it says (``EarlyStopping.stopping_reason_message``)."""
    reason = getattr(callback, "stopping_reason_message", None)
    return reason.removesuffix(" Signaling Trainer to stop.").strip() if isinstance(reason, str) else None


def check_fit_flags(module: Wired, trainer: pl.Trainer) -> None:
    """Refuses ``fit`` with a Trainer flag the algorithms cannot honour, in one line saying what
    to use instead, before anything runs (``check_precision`` follows at ``on_fit_start``)."""
    if trainer.state.fn != TrainerFn.FITTING:
        return
    name = type(module).__name__
    if trainer.gradient_clip_val is not None:
        raise ValueError(
            f"Trainer(gradient_clip_val={trainer.gradient_clip_val}): the algorithms step their optimizers themselves "
            "(manual optimization), so Lightning cannot clip their gradients; set the maximum gradient norm with the "
            f"module's grad_clip ({name}(grad_clip={trainer.gradient_clip_val}))"
        )
    if trainer.accumulate_grad_batches != 1:
        raise ValueError(
            f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}): each iteration's updates are the "
            "algorithm's own (manual optimization); to update on more env steps at once, raise the module's batch "
            "settings (num_envs, rollout_fragment_length, sgd_minibatch_size, train_batch_size)"
        )
    if trainer.overfit_batches:
        raise ValueError(
            f"Trainer(overfit_batches={trainer.overfit_batches}): every iteration samples new env steps, so there is "
            "no batch to train on again; use limit_train_batches (iterations per epoch) or fast_dev_run"
        )
    if any(isinstance(cb, StochasticWeightAveraging) for cb in trainer.callbacks):
        raise ValueError(
            "StochasticWeightAveraging: the algorithms set their learning rate every iteration and train to an "
            "env-step budget, so its swa_lrs and epoch window cannot apply; use the module's lr_schedule for the "
            "learning rate"
        )


# The check_val_every_n_epoch validation_cadence set from evaluation_interval on each Trainer: a Trainer
# fitted again is not taken to have been given that value.
_CADENCE_SET: WeakKeyDictionary[pl.Trainer, int] = WeakKeyDictionary()


def validation_cadence(module: Wired, trainer: pl.Trainer) -> bool:
    """Sets when ``fit`` validates; returns whether it does. The Trainer's flags win where they
    are set (``check_val_every_n_epoch`` other than its default 1, ``val_check_interval`` other
    than 1.0): they validate without ``evaluation_interval``, and an ``evaluation_interval`` they
    override is named in one warning. Otherwise validation runs every ``evaluation_interval``
    epochs, and without it not at all."""
    every, interval = trainer.check_val_every_n_epoch, module.evaluation_interval
    # a time-based val_check_interval leaves the attribute unset
    interval_given = getattr(trainer, "val_check_interval", None) != 1.0
    if every != 1 and not (trainer in _CADENCE_SET and _CADENCE_SET[trainer] == every):
        if interval is not None and interval != every:
            rank_zero_warn(f"Trainer(check_val_every_n_epoch={every}) sets when validation runs: "
                           f"{type(module).__name__}(evaluation_interval={interval}) is not used", category=UserWarning)
        return True
    trainer.check_val_every_n_epoch = 1 if interval is None else interval
    _CADENCE_SET[trainer] = trainer.check_val_every_n_epoch
    return interval is not None or interval_given


def log_at_env_steps(loggers: list[Logger], module: Wired) -> list[tuple[Logger, Any]]:
    """Makes ``loggers`` write every metric at the module's global env steps: the x axis of the
    module's own metrics (which log it as ``step``), now also that of what a callback such as
    ``LearningRateMonitor`` or ``DeviceStatsMonitor`` hands a logger at Lightning's batch count.
    Returns what ``restore_loggers`` undoes."""
    patched = []
    for logger in loggers:
        previous = vars(logger).get("log_metrics")
        log = logger.log_metrics

        def at_env_steps(metrics: dict[str, float], step: int | None = None, _log: Any = log) -> None:
            _log(metrics, step=int(module.global_counters["num_env_steps_sampled"]))

        logger.log_metrics = at_env_steps  # type: ignore[method-assign]
        patched.append((logger, previous))
    return patched


def restore_loggers(patched: list[tuple[Logger, Any]]) -> None:
    for logger, previous in reversed(patched):
        if previous is None:
            vars(logger).pop("log_metrics", None)
        else:
            logger.log_metrics = previous


SUPPORTED_PRECISION = ("32-true", "bf16-mixed")


def check_precision(trainer: pl.Trainer) -> None:
    """The learner trains in 32-bit or with bf16 autocast (``Trainer(precision="bf16-mixed")``:
    convolutions and matrix products in bfloat16, weights, optimizer state and gradient
    clipping in 32 bits); float16 needs a gradient scaler the learner's own clipping and
    compiled step do not apply. Acting stays float32 and the output heads compute in float32
    (``Float32Linear``), so under bf16 PPO's ratio starts an update off 1 only by the trunk's
    rounding (90th percentile about 1% for a trained Pong policy): a clip range decayed below
    that clips by rounding (docs/guides/compile.md)."""
    if trainer.precision not in SUPPORTED_PRECISION:
        raise ValueError(f"lightning_rl trains with precision {' or '.join(map(repr, SUPPORTED_PRECISION))}, got "
                         f"{trainer.precision!r}")
