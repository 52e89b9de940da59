"""What ``lightning-rl tune`` leaves to read once it stops (at the end or at Ctrl-C): a table of
the best trials, ``best.yaml`` (the config with the best trial's settings, which ``lightning-rl
fit -c`` runs as is) and, with matplotlib (the ``plot`` extra), plots of the study. Everything is
read from the study's storage, so it covers the trials of every process that shared it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_rl.extras import install_command

if TYPE_CHECKING:
    from lightning_rl.tune_config import Search

BEST_CONFIG = "best.yaml"


def state_counts(trials: list[Any]) -> dict[str, int]:
    """Trials by outcome: ``done``, ``pruned``, ``failed`` (interrupted ones apart), ``interrupted``,
    ``running``, and ``finished`` (the first three: what ``--n-trials`` counts)."""
    names = {"COMPLETE": "done", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running"}
    counts = dict.fromkeys(("done", "pruned", "failed", "interrupted", "running"), 0)
    for trial in trials:
        name = names.get(trial.state.name)
        if name == "failed" and trial.user_attrs.get("interrupted"):
            name = "interrupted"
        if name is not None:
            counts[name] += 1
    counts["finished"] = counts["done"] + counts["pruned"] + counts["failed"]
    return counts


def trial_settings(trial: Any) -> dict[str, Any]:
    """The settings a trial ran with (lists as lists, ``same_as`` settings included)."""
    return dict(trial.user_attrs.get("settings") or trial.params)


def last_reported(trial: Any) -> tuple[int | None, float | None]:
    """A trial's last reported (env steps, metric)."""
    if not trial.intermediate_values:
        return None, None
    step = max(trial.intermediate_values)
    return step, trial.intermediate_values[step]


def ranked(study: Any, top: int) -> list[Any]:
    """The best ``top`` trials: the done ones by their result, then the pruned ones by their last
    report, best first."""
    sign = -1.0 if study.direction.name == "MAXIMIZE" else 1.0
    trials = study.get_trials(deepcopy=False)
    done = sorted((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: sign * t.value)
    pruned = sorted((t for t in trials if t.state.name == "PRUNED" and last_reported(t)[1] is not None),
                    key=lambda t: sign * last_reported(t)[1])
    return (done + pruned)[:top]


def table(study: Any, search: Search) -> str:
    """The best trials (number, metric, env steps, state, settings) and the failed ones' errors."""
    from lightning_rl.tune_config import format_settings

    metric = search.options.metric
    trials = study.get_trials(deepcopy=False)
    counts = state_counts(trials)
    lines = [f"study {search.study_name!r} ({search.options.storage}): {counts['finished']} finished "
             f"({counts['done']} done, {counts['pruned']} pruned, {counts['failed']} failed)"
             + (f", {counts['interrupted']} interrupted" if counts["interrupted"] else "")
             + (f", {counts['running']} running" if counts["running"] else "")]
    rows = [("trial", metric, "env steps", "state", "settings")]
    for trial in ranked(study, search.options.top):
        value = trial.value if trial.state.name == "COMPLETE" else last_reported(trial)[1]
        steps = trial.user_attrs.get("env_steps", last_reported(trial)[0])
        rows.append((str(trial.number), f"{value:.6g}", "" if steps is None else str(steps), trial.state.name,
                     format_settings(trial_settings(trial))))
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines.append(f"best trials ({search.options.direction.removesuffix('e')}ing {metric}):")
        lines += ["  " + "  ".join(cell.rjust(w) if i in (0, 1, 2) else cell.ljust(w)
                                   for i, (cell, w) in enumerate(zip(row[:4], widths, strict=True))) + "  " + row[4]
                  for row in rows]
    failed = [t for t in trials if t.state.name == "FAIL" and not t.user_attrs.get("interrupted")]
    for trial in failed[:5]:
        lines.append(f"  trial {trial.number} failed: {str(trial.user_attrs.get('error', 'no error recorded'))[:300]}")
    if len(failed) > 5:
        lines.append(f"  ... and {len(failed) - 5} more failed trials")
    return "\n".join(lines)


def write_best(study: Any, search: Search) -> Path | None:
    """``<root-dir>/best.yaml``: the config the study ran (the command line's fixed settings
    included) with the best trial's settings; ``None`` while no trial is done."""
    from lightning_rl.tune_config import with_settings, write_config

    try:
        best = study.best_trial
    except ValueError:
        return None
    path = search.root_dir / BEST_CONFIG
    k = search.options.average_last
    averaged = f" (mean of its last {k} evaluations)" if k > 1 and search.options.backend == "optuna" else ""
    header = (f"the best trial ({best.number}) of study {search.study_name!r}: {search.options.metric} = "
              f"{best.value:.6g}{averaged} (lightning-rl tune)\nrun it: lightning-rl fit -c {path}")
    return write_config(with_settings(search.config, trial_settings(best)), path, header)


def write_plots(study: Any, search: Search) -> list[Path]:
    """``history.png`` (each trial's result and the best so far), ``curves.png`` (the reported
    metric of the best trials over env steps) and ``importances.png`` (Optuna's fANOVA importance
    of each setting, once two trials are done). Raises ``ImportError`` without matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    metric = search.options.metric
    trials = study.get_trials(deepcopy=False)
    maximize = study.direction.name == "MAXIMIZE"
    written: list[Path] = []

    def save(figure: Figure, name: str) -> None:
        FigureCanvasAgg(figure)
        figure.tight_layout()
        path = search.root_dir / name
        figure.savefig(path, dpi=100)
        written.append(path)

    done = [t for t in trials if t.state.name == "COMPLETE"]
    pruned = [t for t in trials if t.state.name == "PRUNED" and last_reported(t)[1] is not None]
    if done or pruned:
        figure = Figure(figsize=(7, 4))
        axes = figure.add_subplot()
        axes.scatter([t.number for t in done], [t.value for t in done], label="done")
        if pruned:
            axes.scatter([t.number for t in pruned], [last_reported(t)[1] for t in pruned], marker="x",
                         label="pruned (last report)")
        best, xs, ys = None, [], []
        for trial in sorted(done, key=lambda t: t.number):
            if best is None or (trial.value > best if maximize else trial.value < best):
                best = trial.value
            xs.append(trial.number)
            ys.append(best)
        axes.step(xs, ys, where="post", label="best so far")
        axes.set(xlabel="trial", ylabel=metric, title=f"study {search.study_name}")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.legend()
        save(figure, "history.png")
    best_trials = [t for t in ranked(study, 5) if t.intermediate_values]
    if best_trials:
        figure = Figure(figsize=(7, 4))
        axes = figure.add_subplot()
        for trial in best_trials:
            steps = sorted(trial.intermediate_values)
            axes.plot(steps, [trial.intermediate_values[s] for s in steps], marker=".", label=f"trial {trial.number}")
        axes.set(xlabel="env steps", ylabel=metric, title="the best trials")
        axes.legend()
        save(figure, "curves.png")
    if len(done) >= 2:
        import optuna

        try:
            importances = optuna.importance.get_param_importances(study)
        except (RuntimeError, ValueError):  # too few distinct values to tell
            importances = {}
        except ImportError:  # Optuna before 5.0 computes fANOVA with scikit-learn
            print("no importances.png: this Optuna computes them with scikit-learn, which is not installed "
                  "(Optuna 5 does without)")
            importances = {}
        if importances:
            figure = Figure(figsize=(7, 0.8 + 0.35 * len(importances)))
            axes = figure.add_subplot()
            names = list(importances)[::-1]
            axes.barh(names, [importances[n] for n in names])
            axes.set(xlabel="importance (fANOVA)", title=f"settings' importance for {metric}")
            save(figure, "importances.png")
    return written


def summarize(study: Any, search: Search) -> bool:
    """Print the table, write ``best.yaml`` and the plots; returns whether a trial is done."""
    print(table(study, search), flush=True)
    best = write_best(study, search)
    if best is None:
        print(f"lightning-rl tune: no trial is done yet, so there is no {BEST_CONFIG}", file=sys.stderr)
        return False
    print(f"wrote {best} (lightning-rl fit -c {best})")
    try:
        plots = write_plots(study, search)
    except ImportError:
        print(f"no plots: matplotlib is not installed (the plot extra): {install_command('plot')}")
    else:
        if plots:
            print("wrote " + ", ".join(str(p) for p in plots))
    return True
