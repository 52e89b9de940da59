"""The lines of a learning-curve plot (``plotting.py``), from the runs of the logs
(``plotting_logs.py``): each run resumed from another's checkpoint joined to it, runs grouped
into experiments (algorithm and settings, seeds excepted) and panels (envs), and each line's runs
pooled as seeds on a common env-step grid (``Curve``, ``collect_curves``)."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Literal

import numpy as np

from lightning_rl.plotting_logs import (
    DEFAULT_METRIC,
    PathLikeStr,
    Source,
    _MetricMissing,
    _read_run,
    _Run,
    find_runs,
    run_dir,
)

__all__ = ["Curve", "collect_curves"]

MAX_GRID_POINTS = 500

Band = Literal["minmax", "std", "none"]


# ----------------------------------------------------------------------------- pooling seeds
MIN_POINTS = 2  # fewer points than this draw no line


@dataclass(frozen=True, eq=False)
class Curve:
    """One line of the plot: the runs pooled under ``label`` as seeds of one experiment.

    ``values[i]`` is run ``runs[i]`` on the env-step grid ``steps`` (interpolated), so
    :attr:`mean` and :meth:`band` are taken over every run at every step. A line of one run
    is that run's own points. When the runs cover different env-step ranges, ``steps``
    spans only the range they all cover, and ``outside`` holds the rest of each run as
    ``(run, steps, values)`` pieces (before and/or after that range, each including the
    run's value at the range's edge, so its thin line continues the run's part of the mean).
    """

    label: str
    runs: tuple[Path, ...]
    steps: np.ndarray
    values: np.ndarray
    outside: tuple[tuple[Path, np.ndarray, np.ndarray], ...] = ()
    #: each run's log files, one per version folder: the run itself, then the runs resumed from it
    parts: tuple[tuple[Path, ...], ...] = ()
    #: the env of the runs (``hparams.yaml``), the panel the line is drawn on; ``None`` when it was
    #: not logged or the runs of a label differ in it
    env: str | None = None

    @property
    def mean(self) -> np.ndarray:
        """The mean over the runs at each of ``steps``."""
        return self.values.mean(axis=0)

    def band(self, kind: Band = "minmax") -> tuple[np.ndarray, np.ndarray] | None:
        """``(low, high)`` around :attr:`mean`: min and max, or mean ± std; ``None`` for ``"none"``."""
        if kind == "none":
            return None
        if kind == "minmax":
            return self.values.min(axis=0), self.values.max(axis=0)
        if kind == "std":
            mean, std = self.mean, self.values.std(axis=0)
            return mean - std, mean + std
        raise ValueError(f"band must be 'minmax', 'std' or 'none', got {kind!r}")


def collect_curves(
    log_dirs: PathLikeStr | Sequence[PathLikeStr],
    metric: str = DEFAULT_METRIC,
    labels: Sequence[str] | None = None,
    source: Source = "auto",
) -> list[Curve]:
    """The lines :func:`plot_curves` draws: one :class:`Curve` per experiment (see the module
    docstring), or per distinct label when ``labels`` are given.

    A run resumed from another's checkpoint is first joined to it (:attr:`Curve.parts`). Every
    (joined) run with at least 2 points of ``metric`` is used. Warns (``UserWarning``) for each
    run skipped, naming it and the metrics it has, for a label left with no run, and for a line
    whose runs cover different env-step ranges (see the module docstring). Raises
    ``ValueError`` when no run has ``metric`` to draw, when the runs of one line share no
    env-step range, or on bad ``labels``; ``FileNotFoundError`` when a log dir holds no log files.
    """
    log_dirs = _as_list(log_dirs)
    if labels is not None and len(labels) != len(log_dirs):
        raise ValueError(f"got {len(labels)} labels for {len(log_dirs)} log dirs; give one label per log dir")
    by_label: dict[str, list[_Run]] = {}
    missing: list[Path] = []
    too_short: list[Path] = []
    others: set[str] = set()
    for i, log_dir in enumerate(log_dirs):
        runs = by_label.setdefault(labels[i] if labels is not None else "", [])
        for run in find_runs(log_dir, source):
            try:
                steps, values = _read_run(run, metric)
            except _MetricMissing as err:
                missing.append(run)
                others.update(err.available)
                names = ", ".join(err.available) or "(none)"
                warnings.warn(f"skipping {str(run)!r}: it has no metric {metric!r}; its metrics: {names}",
                              UserWarning, stacklevel=2)
                continue
            runs.append(_Run.read(run, steps, values))
    lines: list[tuple[str | None, str, list[_Run]]] = []  # (env, label, runs)
    for label, runs in by_label.items():
        kept = []
        for run in _join_resumed(runs):
            if len(run.steps) >= MIN_POINTS:
                kept.append(run)
                continue
            too_short.append(run.path)
            at = f" (at env step {run.steps[0]})" if len(run.steps) else ""
            warnings.warn(f"skipping {str(run.path)!r}: it has {len(run.steps)} point(s) of {metric!r}{at}, "
                          f"fewer than the {MIN_POINTS} a curve needs", UserWarning, stacklevel=2)
        if labels is not None:
            lines.append((_common_env(kept), label, kept))
            continue
        by_env: dict[str | None, list[_Run]] = {}
        for run in kept:
            by_env.setdefault(run.env, []).append(run)
        for env, env_runs in by_env.items():  # each env a panel, its experiments its lines
            lines += [(env, name, group) for name, group in _by_experiment(env_runs, len(by_env) > 1).items()]
    if not any(runs for _, _, runs in lines):
        dirs = ", ".join(repr(str(d)) for d in log_dirs)
        why = []
        if missing:
            why.append(f"{len(missing)} run(s) do not log it (they log: {', '.join(sorted(others)) or 'nothing'})")
        if too_short:
            why.append(f"{len(too_short)} run(s) have fewer than {MIN_POINTS} points of it")
        raise ValueError(f"no run under {dirs} has metric {metric!r} to plot: {'; '.join(why)}")
    curves = []
    for env, label, runs in lines:
        if runs:
            curves.append(_pool(label, runs, env))
        else:
            warnings.warn(f"no line for label {label!r}: none of its runs has {metric!r} to plot",
                          UserWarning, stacklevel=2)
    return curves


# ----------------------------------------------------------------------------- experiments and resumed runs
# Settings that do not change what is learned: runs differing only in them are one experiment.
NOT_CONFIG = frozenset({"seed", "num_cpu_threads", "cpu_affinity", "compile", "evaluation_interval",
                        "evaluation_num_episodes", "evaluation_max_episode_steps"})
# What a resumed run may set anew (the budget), besides those: it continues its run all the same.
RESUMABLE = NOT_CONFIG - {"seed"} | {"total_env_steps"}


def _common_env(runs: Sequence[_Run]) -> str | None:
    envs = {run.env for run in runs}
    return envs.pop() if len(envs) == 1 else None


def _join_resumed(runs: list[_Run]) -> list[_Run]:
    """Each run that resumed from a checkpoint of another run joined to it, in one run: the
    earlier run's points before the resumed run's first one, then the resumed run's.

    The run it resumed from is the one whose folder holds the checkpoint its ``config.yaml``
    names (the CLI's runs), else the run of the same settings and seed (all but those a resume
    may change: ``RESUMABLE``) whose env steps it continues: it starts after that run's first
    point and at most two logging intervals after its last (of several, the one whose last
    point is nearest). Runs without ``hparams.yaml`` are never joined."""
    parent: dict[int, _Run] = {}
    for run in runs:
        source = _resumed_by_path(run, runs) or _resumed_by_steps(run, runs)
        if source is not None and source is not run:
            parent[id(run)] = source
    chosen: dict[int, _Run] = {}  # the run resumed from each run (the earliest-starting one, if several)
    for run in sorted(runs, key=_start):
        if id(run) in parent and _ends(run, parent):
            chosen.setdefault(id(parent[id(run)]), run)
    consumed = {id(run) for run in chosen.values()}
    joined = []
    for run in runs:
        if id(run) in consumed:
            continue  # drawn within the run it resumed
        steps, values, parts, current = run.steps, run.values, list(run.parts), run
        while id(current) in chosen:
            current = chosen[id(current)]
            if len(current.steps):
                keep = steps < current.steps[0]
                steps = np.concatenate([steps[keep], current.steps])
                values = np.concatenate([values[keep], current.values])
            parts.append(current.path)
        joined.append(_Run(run.path, steps, values, run.hparams, run.ckpt_path, tuple(parts)))
    return joined


def _start(run: _Run) -> tuple[float, str]:
    return (float(run.steps[0]) if len(run.steps) else math.inf, str(run.path))


def _ends(run: _Run, parent: dict[int, _Run]) -> bool:
    """Whether ``run``'s chain of runs resumed from ends at a first run (no cycle)."""
    seen = {id(run)}
    while id(run) in parent:
        run = parent[id(run)]
        if id(run) in seen:
            return False
        seen.add(id(run))
    return True


def _resumed_by_path(run: _Run, runs: list[_Run]) -> _Run | None:
    if not run.ckpt_path:
        return None
    ckpt = Path(run.ckpt_path)
    here = run_dir(run.path).resolve()
    places = [ckpt] if ckpt.is_absolute() else [Path.cwd() / ckpt, *(base / ckpt for base in here.parents)]
    for other in runs:
        folder = run_dir(other.path).resolve()
        if other is not run and any(p.resolve().is_relative_to(folder) for p in places):
            return other
    return None


def _resumed_by_steps(run: _Run, runs: list[_Run]) -> _Run | None:
    settings = run.settings(RESUMABLE)
    if settings is None or not len(run.steps):
        return None
    start = run.steps[0]
    candidates = []
    for other in runs:
        if other is run or not len(other.steps) or other.settings(RESUMABLE) != settings:
            continue
        gap = 2 * max(_interval(other.steps), _interval(run.steps))
        if other.steps[0] < start <= other.steps[-1] + gap:
            candidates.append(other)
    # the one whose last point is nearest: of a chain of resumes, or beside a rerun, the run it continues
    return min(candidates, key=lambda o: (abs(start - o.steps[-1]), -o.steps[0], str(o.path)), default=None)


def _interval(steps: np.ndarray) -> float:
    """A run's typical env steps between logged points (its first point's, for one point)."""
    return float(np.median(np.diff(steps))) if len(steps) > 1 else float(steps[0]) if len(steps) else 0.0


def _by_experiment(runs: list[_Run], name_alone: bool = False) -> dict[str, list[_Run]]:
    """Runs grouped by algorithm and settings, seeds excepted (``NOT_CONFIG``); each group's
    label names the algorithm and the settings that differ between its groups of that algorithm
    (one group: no label, or with ``name_alone`` its algorithm's). Runs without ``hparams.yaml``
    form one group of their own."""
    groups: dict[str | None, list[_Run]] = {}
    for run in runs:
        groups.setdefault(run.settings(NOT_CONFIG), []).append(run)
    if len(groups) == 1:
        (key,) = groups
        alone = str(json.loads(key).get("algorithm", "")).rsplit(".", 1)[-1] if name_alone and key else ""
        return {alone: runs}
    settings = {key: json.loads(key) for key in groups if key is not None}
    by_algorithm: dict[str, list[dict]] = {}
    for values in settings.values():
        by_algorithm.setdefault(str(values.get("algorithm", "")).rsplit(".", 1)[-1], []).append(values)
    out: dict[str, list[_Run]] = {}
    for key, group in groups.items():
        if key is None:
            label = "(no hparams.yaml)"
        else:
            values = settings[key]
            algorithm = str(values.get("algorithm", "")).rsplit(".", 1)[-1]
            siblings = by_algorithm[algorithm]
            differing = sorted(k for k in {k for v in siblings for k in v}
                               if len({json.dumps(v.get(k), default=str) for v in siblings}) > 1)
            shown = [f"{k}={values.get(k)}" for k in differing[:3]] + (["..."] if len(differing) > 3 else [])
            label = " ".join(filter(None, [algorithm, ", ".join(shown)])) or "runs"
        while label in out:
            label += "'"
        out[label] = group
    return out


def _as_list(log_dirs: PathLikeStr | Sequence[PathLikeStr]) -> list[PathLikeStr]:
    if isinstance(log_dirs, str | PathLike):
        log_dirs = [log_dirs]
    log_dirs = list(log_dirs)
    if not log_dirs:
        raise ValueError("plotting needs at least one log dir")
    return log_dirs


def _pool(label: str, joined: Sequence[_Run], env: str | None = None) -> Curve:
    """The runs of one line on the env-step grid they all cover, plus what lies outside it."""
    parts = tuple(run.parts for run in joined)
    runs = [(run.path, run.steps, run.values) for run in joined]
    if len(runs) == 1:
        run, steps, values = runs[0]
        return Curve(label, (run,), steps, values[None, :], (), parts, env)
    name = f"the {len(runs)} runs" + (f" of {label!r}" if label else "")
    spans = ", ".join(f"{str(run)!r} [{s[0]}, {s[-1]}]" for run, s, _ in runs)
    lo = max(int(s[0]) for _, s, _ in runs)
    hi = min(int(s[-1]) for _, s, _ in runs)
    if lo >= hi:
        raise ValueError(f"{name} share no env-step range, so they cannot be pooled as seeds "
                         f"(env steps {spans}); give them different labels or plot them apart")
    grid = np.unique(np.concatenate([s[(s >= lo) & (s <= hi)] for _, s, _ in runs]))
    if len(grid) > MAX_GRID_POINTS:
        grid = np.linspace(lo, hi, MAX_GRID_POINTS)
    values = np.stack([np.interp(grid, s, v) for _, s, v in runs])
    outside = []
    for run, s, v in runs:
        if s[0] < lo:
            before = s < lo
            outside.append((run, np.append(s[before], lo), np.append(v[before], np.interp(lo, s, v))))
        if s[-1] > hi:
            after = s > hi
            outside.append((run, np.insert(s[after], 0, hi), np.insert(v[after], 0, np.interp(hi, s, v))))
    if outside:
        warnings.warn(f"{name} cover different env-step ranges (first and last env step: {spans}); the mean and "
                      f"band are drawn over the range they all cover, [{lo}, {hi}], and the rest of each run "
                      f"as a thin line", UserWarning, stacklevel=3)
    return Curve(label, tuple(run for run, _, _ in runs), grid, values, tuple(outside), parts, env)
