"""One trial of ``lightning-rl tune``: an ordinary ``lightning-rl fit -c <trial folder>/trial.yaml``
run in this process, with :class:`TrialReporter` among the Trainer's callbacks to report the
metric to the Optuna trial at every evaluation and stop the fit when the pruner says so."""

from __future__ import annotations

import io
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

FIT_ERROR = "lightning-rl fit: error: "


class TrialError(RuntimeError):
    """A trial that ran but gave no usable result (an invalid combination of settings, a NaN
    metric, no evaluation): the reason, on one line."""


class TrialInterrupted(Exception):
    """Ctrl-C or SIGTERM during a trial; ``code`` is the exit code the command then ends with."""

    def __init__(self, code: int) -> None:
        super().__init__(f"interrupted (exit code {code})")
        self.code = code


def env_steps(trainer: Any, module: Any) -> int:
    """The run's env steps over all ranks (the step the metric is reported at)."""
    counters = getattr(module, "global_counters", None) or {}
    return int(counters.get("num_env_steps_sampled", trainer.global_step))


class TrialReporter(pl.Callback):
    """Reports ``metric`` to an Optuna trial after every evaluation of a fit, at the run's env
    steps, and stops the fit (``trainer.should_stop``, as ``EarlyStopping`` does) when the trial's
    pruner says so; the caller raises ``optuna.TrialPruned`` once ``fit`` has returned, so the
    pruned run still ends with its checkpoint and closed logs.

    Args:
        trial: the ``optuna.Trial`` (anything with ``report``, ``should_prune`` and
            ``set_user_attr``).
        metric: the logged metric (``val/episode_return_mean``: the greedy evaluation's mean return).
        report_every: report at env steps rounded down to a multiple of this, once per multiple, so
            that trials whose iterations differ in size (a sampled ``rollout_fragment_length``)
            report at steps the pruner can compare; ``None``: at the exact env steps.
    """

    def __init__(self, trial: Any, metric: str, report_every: int | None = None) -> None:
        self.trial = trial
        self.metric = metric
        self.report_every = report_every
        self.history: list[tuple[int, float]] = []  # (env steps, metric) of every evaluation
        self.reported: set[int] = set()
        self.pruned_at: int | None = None

    def _read(self, trainer: Any, module: Any) -> tuple[int, float] | None:
        value = trainer.callback_metrics.get(self.metric)
        if value is None:
            return None
        return env_steps(trainer, module), float(value)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        prune = False
        read = self._read(trainer, pl_module) if trainer.is_global_zero else None
        if read is not None:
            steps, value = read
            self.history.append(read)
            self.trial.set_user_attr("env_steps", steps)
            step = steps if not self.report_every else steps // self.report_every * self.report_every
            if math.isfinite(value) and step not in self.reported:
                self.reported.add(step)
                self.trial.report(value, step)
                prune = bool(self.trial.should_prune())
            if prune:
                self.pruned_at = steps
        if trainer.strategy.reduce_boolean_decision(prune, all=False):
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """The metric at the end of fit, where the last evaluation came before it (or a metric
        logged in training, ``rollout/episode_return_mean``): the trial's result, not reported."""
        read = self._read(trainer, pl_module) if trainer.is_global_zero else None
        if read is not None and (not self.history or self.history[-1][0] < read[0]):
            self.history.append(read)
            self.trial.set_user_attr("env_steps", read[0])


class _StderrTail(io.TextIOBase):
    """``sys.stderr`` passed through, its last characters kept: a fit's one-line error
    (``lightning-rl fit: error: ...``) is printed, not raised."""

    def __init__(self, stream: Any, keep: int = 8000) -> None:
        self.stream, self.keep, self.text = stream, keep, ""

    def write(self, text: str) -> int:
        self.text = (self.text + text)[-self.keep:]
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")

    def error_line(self) -> str | None:
        lines = [line for line in self.text.splitlines() if line.startswith(FIT_ERROR)]
        return lines[-1].removeprefix(FIT_ERROR) if lines else None


def run_trial(fit: Callable[..., Any], config_path: Path, trial: Any, metric: str,
              report_every: int | None = None, average_last: int = 1) -> tuple[float, int]:
    """``lightning-rl fit -c config_path`` in this process (``fit``: the CLI's ``cli``, called as the
    command line calls it), reported to ``trial``. Returns the trial's value, the mean of the
    metric at its last ``average_last`` evaluations (a policy's greedy return swings from one
    evaluation to the next; one final reading picks the luckiest trial, not the best settings),
    and the env steps of the last one.

    Raises:
        optuna.TrialPruned: the pruner stopped the run.
        TrialError: the fit refused its settings (the CLI's one-line error), or the metric was
            never logged or is not finite.
        TrialInterrupted: Ctrl-C or SIGTERM (the run's ``interrupted.ckpt`` is saved).
    """
    import optuna

    from lightning_rl.callbacks.interrupt import SIGINT_EXIT_CODE, SIGTERM_EXIT_CODE

    reporter = TrialReporter(trial, metric, report_every)
    tail = _StderrTail(sys.stderr)
    sys.stderr, argv = tail, sys.argv
    # the command line of the trial, as `lightning-rl fit` sees its own (the resume command of an
    # interrupted run names it; Lightning warns of arguments given besides other ones in sys.argv)
    sys.argv = [argv[0] if argv else "lightning-rl", "fit", "-c", str(config_path)]
    try:
        fit(None, trainer_defaults={"callbacks": [reporter]})
    except KeyboardInterrupt:
        raise TrialInterrupted(SIGINT_EXIT_CODE) from None
    except SystemExit as exit:
        # Lightning ends a fit it caught a KeyboardInterrupt in with sys.exit(1)
        if exit.code in (SIGINT_EXIT_CODE, SIGTERM_EXIT_CODE) or isinstance(exit.__context__, KeyboardInterrupt):
            raise TrialInterrupted(SIGINT_EXIT_CODE if exit.code == 1 else int(exit.code)) from None
        raise TrialError(tail.error_line() or f"fit exited with code {exit.code}") from None
    finally:
        sys.stderr, sys.argv = tail.stream, argv
    if reporter.pruned_at is not None:
        steps, value = reporter.history[-1]
        raise optuna.TrialPruned(f"pruned at {steps} env steps ({metric}={value:.6g})")
    if not reporter.history:
        raise TrialError(f"{metric} was never logged: the config must evaluate (model.init_args.evaluation_interval)"
                         " or --metric must name a metric the run logs")
    for steps, value in reporter.history[-average_last:]:
        if not math.isfinite(value):
            raise TrialError(f"{metric} is {value} at {steps} env steps")
    last = [value for _, value in reporter.history[-average_last:]]
    return sum(last) / len(last), reporter.history[-1][0]
