"""The study of ``lightning-rl tune`` in its storage, and the loop that runs its trials: one
process asks the study for a trial, fits it and tells the study the outcome, until the study has
``--n-trials`` finished trials or ``--timeout`` is spent; ``--workers N`` runs N such processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from lightning_rl.tune_config import TRIAL_CONFIG, Search, fail, format_settings, with_settings, write_config
from lightning_rl.tune_spaces import suggest

# a worker's trials: a Ctrl-C'd or SIGTERM'd worker saves its run's checkpoint before it exits
WORKER_EXIT_WAIT_S = 120.0


def sampler_seed(seed: int | None, worker_index: int | None, trials_so_far: int) -> int | None:
    """The seed of a process's sampler: ``--seed``, the worker's index and the trials the study
    already has, mixed, so that neither a resumed study nor a second worker repeats the settings
    another process drew from the same ``--seed``."""
    if seed is None:
        return None
    import numpy as np

    return int(np.random.SeedSequence([seed, worker_index or 0, trials_so_far]).generate_state(1)[0])


def make_sampler(seed: int | None) -> Any:
    """TPE (multivariate, with the constant liar, for trials running at once in several processes)."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)


def open_study(search: Search) -> Any:
    """The study in its storage, created if new (``load_if_exists``: resumed and shared), with a
    sampler seeded by :func:`sampler_seed`."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    options = search.options
    engine = {"connect_args": {"timeout": 60}} if options.storage.startswith("sqlite") else None
    budget = search.config["model"]["init_args"].get("total_env_steps")
    warmup = int(budget) // 3 if isinstance(budget, int | float) else 0
    pruner = make_pruner(options.pruner, warmup)
    # two processes creating one SQLite file's tables (and Alembic's version row) at once: one fails, then
    # finds them made
    for attempt in range(10):
        try:
            search.storage = storage = optuna.storages.RDBStorage(options.storage, engine_kwargs=engine)
            study = optuna.create_study(storage=storage, study_name=search.study_name, direction=options.direction,
                                        pruner=pruner, load_if_exists=True)
            break
        except SQLAlchemyError:
            if attempt == 9:
                raise
            time.sleep(0.5 + attempt)
    trials_so_far = len(study.get_trials(deepcopy=False))
    study.sampler = make_sampler(sampler_seed(options.seed, options.worker_index, trials_so_far))
    if study.direction.name.lower() != options.direction:
        fail(f"study {search.study_name!r} in {options.storage} maximizes or minimizes otherwise "
             f"({study.direction.name.lower()}); give --direction {study.direction.name.lower()} or another "
             "--study-name")
    return study


def make_pruner(name: str, warmup_steps: int) -> Any:
    """``median``: prune a trial below the median of earlier trials at the same env steps (after 5
    trials and a third of the budget); ``halving``: successive halving; ``none``."""
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=warmup_steps)
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


HOST = socket.gethostname()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fail_stale(search: Search, study: Any) -> None:
    """Trials left running by a process of this machine that has ended (killed, a lost power):
    failed, marked interrupted (not counted) and queued again with the same settings."""
    import optuna
    from optuna.trial import TrialState

    storage = search.storage
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        host, _, pid = str(trial.user_attrs.get("worker", "")).rpartition(":")
        if host != HOST or not pid.isdigit() or _alive(int(pid)):
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(
            storage.get_study_id_from_name(search.study_name), trial.number)
        try:
            storage.set_trial_user_attr(trial_id, "interrupted", True)
            storage.set_trial_user_attr(trial_id, "error", f"its process ({pid}) ended during the trial")
            if not storage.set_trial_state_values(trial_id, TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another process got there first
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})


def counted(study: Any) -> int:
    """Trials toward ``--n-trials``: finished (done, pruned, failed) and running ones; an
    interrupted trial is not counted (it is queued again)."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)
    return sum(1 for t in study.get_trials(deepcopy=False, states=states) if not t.user_attrs.get("interrupted"))


def run_one(search: Search, study: Any, say: Any) -> None:
    """Ask the study for a trial, fit it, tell the study how it went."""
    import optuna
    from optuna.trial import TrialState

    from lightning_rl.tune_trial import TrialError, TrialInterrupted, run_trial

    trial = study.ask()
    start = time.monotonic()
    try:
        settings = suggest(trial, search.space)
        run_dir = search.root_dir / f"trial_{trial.number:04d}"
        path = write_config(with_settings(search.config, settings, run_dir), run_dir / TRIAL_CONFIG,
                            f"trial {trial.number} of study {search.study_name!r} (lightning-rl tune)\n"
                            f"rerun it: lightning-rl fit -c {run_dir / TRIAL_CONFIG}")
        for key, value in (("worker", f"{HOST}:{os.getpid()}"), ("settings", settings), ("config", str(path))):
            trial.set_user_attr(key, value)
        say(f"trial {trial.number} started: {format_settings(settings)} ({run_dir})")
        value, _ = run_trial(search.fit, path, trial, search.options.metric, search.report_every,
                             search.options.average_last)
    except optuna.TrialPruned as err:
        study.tell(trial, state=TrialState.PRUNED)
        outcome = f"pruned: {err}"
    except (TrialInterrupted, KeyboardInterrupt):
        trial.set_user_attr("interrupted", True)
        trial.set_user_attr("error", "interrupted")
        study.tell(trial, state=TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        say(f"trial {trial.number} interrupted: it runs again, with the same settings, when the study resumes")
        raise
    except Exception as err:
        error = " ".join(str(err).split()) if isinstance(err, TrialError) else f"{type(err).__name__}: " + \
            " ".join(str(err).split())
        if not isinstance(err, TrialError):  # a bug's traceback, beside the trial's config
            import traceback

            path = search.root_dir / f"trial_{trial.number:04d}" / "error.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(traceback.format_exception(err)), encoding="utf-8")
            error += f" (traceback: {path})"
        trial.set_user_attr("error", error[:2000])
        study.tell(trial, state=TrialState.FAIL)
        outcome = f"failed: {error[:300]}"
    else:
        study.tell(trial, value)
        outcome = f"done: {search.options.metric} {value:.6g}"
    say(f"trial {trial.number} {outcome} ({time.monotonic() - start:.0f} s) | {progress(study)}")


def progress(study: Any) -> str:
    from lightning_rl.tune_results import state_counts

    counts = state_counts(study.get_trials(deepcopy=False))
    line = (f"{counts['finished']} finished ({counts['done']} done, {counts['pruned']} pruned, "
            f"{counts['failed']} failed)")
    try:
        return f"{line}, best {study.best_value:.6g} (trial {study.best_trial.number})"
    except ValueError:
        return line


def run_trials(search: Search, study: Any) -> int:
    """The trial loop of one process, until ``--n-trials`` or ``--timeout``. Returns the exit code."""
    from lightning_rl.tune_trial import TrialInterrupted

    options = search.options
    prefix = "" if options.worker_index is None else f"[worker {options.worker_index}] "

    def say(text: str) -> None:
        print(prefix + text, flush=True)

    start = time.monotonic()
    handler = signal.getsignal(signal.SIGINT)
    try:
        while options.timeout is None or time.monotonic() - start < options.timeout:
            _fail_stale(search, study)
            if options.n_trials is not None and counted(study) >= options.n_trials:
                break
            run_one(search, study, say)
            signal.signal(signal.SIGINT, handler)  # Lightning leaves Ctrl-C ignored after a KeyboardInterrupt
    except KeyboardInterrupt:
        return 130
    except TrialInterrupted as err:
        return err.code
    return 0


def run_workers(search: Search, argv: list[str]) -> int:
    """``--workers N``: N ``tune`` processes on the study, each with the trial loop; waits for them,
    and leaves none running when it returns. The workers have a session of their own, so Ctrl-C
    reaches this process alone, which passes it (and SIGTERM) on once to each; on Linux a worker
    whose parent dies is sent SIGTERM."""
    options = search.options
    procs: list[subprocess.Popen] = []

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    code = 0
    try:
        for index in range(options.workers):  # a worker's sampler is seeded by --seed and its index
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "lightning_rl.cli", "tune", *argv, "--workers", "1", "--study-name",
                 search.study_name, "--storage", options.storage, "--root-dir", str(search.root_dir),
                 "--worker-index", str(index)], start_new_session=True, preexec_fn=_die_with_parent))
        for proc in procs:
            proc.wait()
        codes = [proc.returncode for proc in procs]
        code = next((c for c in codes if c in (130, 143)), 0) or next((c for c in codes if c), 0)
    except (KeyboardInterrupt, SystemExit) as stopped:
        code = 130 if isinstance(stopped, KeyboardInterrupt) else int(stopped.code or 0)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if code == 130 else signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _reap(procs)
    return code


def _die_with_parent() -> None:
    """In a worker, before it runs: SIGTERM when the process that started it ends (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _reap(procs: list[subprocess.Popen]) -> None:
    """Wait for the workers to end their trials (a second Ctrl-C stops waiting), then kill any left."""
    deadline = time.monotonic() + WORKER_EXIT_WAIT_S
    try:
        for proc in procs:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        pass
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
