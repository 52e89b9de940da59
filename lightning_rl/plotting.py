"""Learning curves from training logs: episode return against env steps.

Reads the metrics that training writes, from either logger Lightning ships:

- ``CSVLogger``: ``metrics.csv`` (column ``step`` is the global env-step count);
- ``TensorBoardLogger``: ``events.out.tfevents.*`` files (needs ``pip install tensorboard``).

A *run* is one ``metrics.csv`` file, or one directory holding event files. Each log dir
given may hold one run or several (e.g. ``runs/`` with ``seed0/version_0``,
``seed1/version_0``, ...), and every run under it that logged the metric is drawn. A run
that did not log it (say the version dir of a ``lightning-rl validate`` run, which has only
``val/…`` metrics) or has fewer than 2 points of it is skipped with a warning naming the
run and what it has; when no run is left, it is a ``ValueError`` — never empty axes.

An *experiment* is one line: runs of the same algorithm with the same settings, seeds
excepted, read from each run's ``hparams.yaml`` (which Lightning's loggers write, the algorithm
included); settings that do not change what is learned (threads, evaluation, ``compile``) are
not told apart either. Runs without ``hparams.yaml`` form one experiment of their own. The runs
of one line are taken as seeds: their curves are interpolated onto a common env-step grid and
drawn as the mean with a min–max (or ±std) band; with several lines each is labelled with the
algorithm and the settings that differ. With ``labels`` (one per log dir) each distinct label
is its own line instead, pooling the runs of the log dirs that carry it.

Runs of different envs (the ``env`` of their ``hparams.yaml``) are drawn on panels of their own,
one per env, each titled by its env, so a CartPole return and a Pendulum return never share an
axis; a line's label then tells the algorithms of one env apart. With one env there is one axis.

A run that was interrupted and resumed lives in two version folders (``version_0``, then
``version_1`` resumed from a checkpoint of it): the resumed one is joined to the run it
continues, into one run (its points from where the resumed run's begin). The run it
continues is the one whose folder holds the checkpoint the CLI's ``config.yaml`` names
(``ckpt_path``); otherwise (the Python API) the run with the same settings and seed, apart from
what a resume may change (the budget), whose env steps it continues: its first point comes
after that run's first and at most two logging intervals after that run's last.

Runs of different lengths (one stopped early, or still running): the mean and band cover
only the env-step range that *every* run of the line covers, so at each step they are
taken over all the runs and the legend's "mean of n runs" holds everywhere (a mean over
whichever runs remain would jump when a run drops out). Nothing is cut away, though: the
part of each run outside that common range is drawn as a thin line of the same colour, and
a warning gives each run's first and last env step and the common range. Runs of one line
that share no range cannot be pooled: a ``ValueError`` (give them different labels).
:func:`collect_curves` returns exactly what is drawn.

Drawing needs matplotlib (``pip install matplotlib``, or the ``plot`` extra).

``docs/learning_curve.png`` (PPO on CartPole-v1 with the rl-zoo settings, 3 seeds) was
made with this script, ``train.py``::

    import sys
    import pytorch_lightning as pl
    from pytorch_lightning.loggers import CSVLogger
    from lightning_rl import PPO

    seed = int(sys.argv[1])
    model = PPO(env="CartPole-v1", num_envs=8, rollout_fragment_length=32, num_sgd_iter=20, sgd_minibatch_size=256,
                lr=1e-3, lr_schedule="linear", clip_param_schedule="linear", gamma=0.98, lambda_=0.8,
                total_env_steps=100_000, seed=seed)
    trainer = pl.Trainer(logger=CSVLogger("/tmp/lc/runs", name=f"seed{seed}"), log_every_n_steps=1,
                         enable_progress_bar=False, enable_checkpointing=False, accelerator="cpu")
    trainer.fit(model)

run for the three seeds, then drawn (mean and min–max band) with::

    for s in 0 1 2; do python train.py $s & done; wait
    python -m lightning_rl.plotting /tmp/lc/runs --out docs/learning_curve.png --labels PPO \\
        --title "PPO on CartPole-v1 (rl-zoo settings)"

(``lightning-rl plot`` takes the same arguments). All three seeds reach a return of 500
by about 90k env steps.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Literal

import numpy as np

from lightning_rl.extras import missing_dependency

DEFAULT_METRIC = "rollout/episode_return_mean"
EVENT_GLOB = "events.out.tfevents.*"
CSV_NAME = "metrics.csv"
MAX_GRID_POINTS = 500

Source = Literal["auto", "csv", "tensorboard"]
Band = Literal["minmax", "std", "none"]
PathLikeStr = str | PathLike[str]

__all__ = ["DEFAULT_METRIC", "Curve", "collect_curves", "find_runs", "load_curve", "main", "plot_curves"]


# ----------------------------------------------------------------------------- finding runs
def find_runs(log_dir: PathLikeStr, source: Source = "auto") -> list[Path]:
    """The runs under ``log_dir``, sorted: ``metrics.csv`` files and/or directories of event files.

    ``log_dir`` may also be a ``metrics.csv`` or an event file itself. With ``source="auto"``
    a directory holding both a ``metrics.csv`` and event files (a CSV and a TensorBoard
    logger sharing a version dir) counts once, as its CSV; ``"csv"`` / ``"tensorboard"``
    only look for that kind. Raises ``FileNotFoundError`` naming ``log_dir`` when it does
    not exist or holds no log files.
    """
    if source not in ("auto", "csv", "tensorboard"):
        raise ValueError(f"source must be 'auto', 'csv' or 'tensorboard', got {source!r}")
    path = Path(log_dir)
    if not path.exists():
        raise FileNotFoundError(f"log dir {str(path)!r} does not exist")
    if path.is_file():
        if path.name == CSV_NAME and source != "tensorboard":
            return [path]
        if path.name.startswith("events.out.tfevents.") and source != "csv":
            return [path]
        raise FileNotFoundError(f"{str(path)!r} is not a {_kind(source)} log file")
    csv_files = sorted(path.rglob(CSV_NAME)) if source != "tensorboard" else []
    event_dirs = sorted({f.parent for f in path.rglob(EVENT_GLOB) if f.is_file()}) if source != "csv" else []
    csv_dirs = {f.parent for f in csv_files}
    runs = csv_files + [d for d in event_dirs if d not in csv_dirs]
    if not runs:
        raise FileNotFoundError(
            f"no {_kind(source)} log files found under {str(path)!r} "
            f"(looked for {CSV_NAME if source != 'tensorboard' else ''}"
            f"{' and ' if source == 'auto' else ''}{EVENT_GLOB if source != 'csv' else ''})"
        )
    return sorted(runs)


def _kind(source: Source) -> str:
    return {"auto": "CSV or TensorBoard", "csv": "CSV", "tensorboard": "TensorBoard"}[source]


# ----------------------------------------------------------------------------- reading one run
def load_curve(
    log_dir: PathLikeStr, metric: str = DEFAULT_METRIC, source: Source = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of ``metric`` in the single run under ``log_dir``.

    ``steps`` are the loggers' x axis (global env steps), increasing; where a step was
    logged twice the last value wins; empty and NaN entries are dropped. ``log_dir`` is a
    CSV logger dir (``metrics.csv`` anywhere under it), a TensorBoard dir (event files
    anywhere under it) or one of those files. Raises ``FileNotFoundError`` when no log
    file is found, ``ValueError`` when ``log_dir`` holds several runs (use
    :func:`plot_curves`, which pools them, or point at one) or when ``metric`` was not
    logged (the message lists the metrics that were), and ``ImportError`` when event
    files need tensorboard and it is not installed.
    """
    runs = find_runs(log_dir, source)
    if len(runs) > 1:
        listed = "\n  ".join(str(r) for r in runs)
        raise ValueError(f"{str(log_dir)!r} holds {len(runs)} runs; pass one of them:\n  {listed}")
    return _read_run(runs[0], metric)


def _read_run(run: Path, metric: str) -> tuple[np.ndarray, np.ndarray]:
    if run.name == CSV_NAME:
        pairs = _read_csv(run, metric)
    else:
        pairs = _read_tensorboard(run, metric)
    by_step: dict[int, float] = {}
    for step, value in pairs:
        if not math.isnan(value):
            by_step[step] = value  # the last value logged at a step wins
    steps = np.array(sorted(by_step), dtype=np.int64)
    values = np.array([by_step[s] for s in steps], dtype=np.float64)
    return steps, values


class _MetricMissing(ValueError):
    """``metric`` was not logged in a run; ``available`` is what was."""

    def __init__(self, metric: str, where: Path, available: Sequence[str]) -> None:
        self.available = sorted(available)
        names = ", ".join(self.available) or "(none)"
        super().__init__(f"metric {metric!r} not found in {str(where)!r}; available metrics: {names}")


def _read_csv(path: Path, metric: str) -> list[tuple[int, float]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        if "step" not in fields:
            raise ValueError(f"{str(path)!r} has no 'step' column; columns: {', '.join(fields) or '(none)'}")
        if metric not in fields:
            raise _MetricMissing(metric, path, [c for c in fields if c not in ("step", "epoch")])
        pairs = []
        for row in reader:
            value, step = row.get(metric), row.get("step")
            if value in (None, "") or step in (None, ""):
                continue
            pairs.append((int(float(step)), float(value)))
    return pairs


def _event_accumulator():
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as err:
        raise ImportError(
            "reading TensorBoard event files needs tensorboard: pip install tensorboard "
            "(or log with CSVLogger and point at its metrics.csv)"
        ) from err
    return EventAccumulator


def _read_tensorboard(run: Path, metric: str) -> list[tuple[int, float]]:
    accumulator_cls = _event_accumulator()
    acc = accumulator_cls(str(run), size_guidance={"scalars": 0})  # 0 = keep every point
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    if metric not in tags:
        raise _MetricMissing(metric, run, tags)
    return [(int(e.step), float(e.value)) for e in acc.Scalars(metric)]


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


@dataclass(eq=False)
class _Run:
    """One run's points of the metric, its settings (``hparams.yaml``) and, for a run the CLI
    resumed, the checkpoint it started from (``ckpt_path`` in ``config.yaml``)."""

    path: Path
    steps: np.ndarray
    values: np.ndarray
    hparams: dict | None = None
    ckpt_path: str | None = None
    parts: tuple[Path, ...] = ()

    @classmethod
    def read(cls, path: Path, steps: np.ndarray, values: np.ndarray) -> _Run:
        folder = run_dir(path)
        config = _read_yaml(folder / "config.yaml")
        ckpt_path = config.get("ckpt_path") if isinstance(config, dict) else None
        hparams = _read_yaml(folder / "hparams.yaml")
        return cls(path, steps, values, hparams if isinstance(hparams, dict) and hparams else None,
                   ckpt_path if isinstance(ckpt_path, str) else None, (path,))

    @property
    def env(self) -> str | None:
        """The env the run trained on, as its ``hparams.yaml`` names it (``None``: not logged)."""
        env = self.hparams.get("env") if self.hparams is not None else None
        return None if env is None else str(env)

    def settings(self, ignore: frozenset[str]) -> str | None:
        """The settings that make the experiment, as one comparable string (``None``: unknown)."""
        if self.hparams is None:
            return None
        kept = {k: v for k, v in self.hparams.items() if k not in ignore and not k.startswith("_")}
        return json.dumps(kept, sort_keys=True, default=str)


def _common_env(runs: Sequence[_Run]) -> str | None:
    envs = {run.env for run in runs}
    return envs.pop() if len(envs) == 1 else None


def run_dir(run: Path) -> Path:
    """The folder of a run (a logger's version folder): where ``hparams.yaml`` is."""
    return run.parent if run.is_file() else run


def _read_yaml(path: Path) -> object:
    """``path`` read as YAML, ``None`` if it is missing or unreadable. Python tags (the
    ``!!python/tuple`` of a tuple hyperparameter) become plain lists, dicts or strings."""
    if not path.is_file():
        return None
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def plain(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> object:
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        return loader.construct_scalar(node)

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", plain)
    try:
        return yaml.load(path.read_text(), Loader=Loader)  # a SafeLoader: builds no Python objects
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return None


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


# ----------------------------------------------------------------------------- drawing
def plot_curves(
    log_dirs: PathLikeStr | Sequence[PathLikeStr],
    out: PathLikeStr,
    metric: str = DEFAULT_METRIC,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    band: Band = "minmax",
    source: Source = "auto",
) -> Path:
    """Draw ``metric`` against env steps from ``log_dirs`` into the image ``out`` (PNG); returns its path.

    Without ``labels`` each experiment (algorithm and settings) found under ``log_dirs`` is a
    line, its runs the seeds (see the module docstring); runs of different envs are drawn on
    panels of their own, one per env, titled by it (``title`` then heads the figure). With
    ``labels`` (one per log dir) each distinct label is one line, pooling the runs under
    the log dirs that carry it. A line of several runs is their mean on a common env-step
    grid with a ``band`` of ``"minmax"`` (default), ``"std"`` (mean ± one std) or
    ``"none"``; a line of one run is that run. The lines are :func:`collect_curves`'s,
    with its warnings and errors.
    """
    if band not in ("minmax", "std", "none"):
        raise ValueError(f"band must be 'minmax', 'std' or 'none', got {band!r}")
    figure_cls, canvas_cls, ticker = _matplotlib()
    curves = collect_curves(log_dirs, metric, labels, source)

    panels: dict[str | None, list[Curve]] = {}  # one per env
    for curve in curves:
        panels.setdefault(curve.env, []).append(curve)
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig = figure_cls(figsize=(7.0 if cols == 1 else 5.6 * cols, 4.2 * rows), dpi=100)
    canvas_cls(fig)
    heading = title if title is not None else metric
    for i, (env, group) in enumerate(panels.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        _draw_panel(ax, group, band)
        ax.xaxis.set_major_formatter(ticker.EngFormatter())  # 100 k rather than 100000
        ax.set_xlabel("env steps")
        ax.set_ylabel(metric)
        ax.set_title(heading if len(panels) == 1 else env if env is not None else "env not logged, or mixed")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
    if len(panels) > 1:
        fig.suptitle(heading)
    fig.tight_layout()

    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, format=None if out_path.suffix else "png")
    return out_path


def _draw_panel(ax, curves: Sequence[Curve], band: Band) -> None:
    """The lines of ``curves`` on ``ax``: each run, or the mean of several with its band and thin ends."""
    band_labelled = outside_labelled = False
    for curve in curves:
        n = len(curve.runs)
        if n == 1:
            ax.plot(curve.steps, curve.values[0], linewidth=1.6, label=curve.label or None)
            continue
        name = f"{curve.label} (mean of {n} runs)" if curve.label else f"mean of {n} runs"
        (line,) = ax.plot(curve.steps, curve.mean, linewidth=1.8, label=name)
        for _, steps, values in curve.outside:
            outside_name = None if outside_labelled else "single runs, outside the shared range"
            ax.plot(steps, values, linewidth=0.8, alpha=0.7, color=line.get_color(), label=outside_name)
            outside_labelled = True
        low_high = curve.band(band)
        if low_high is None:
            continue
        band_name = None if band_labelled else ("min–max" if band == "minmax" else "± std")
        ax.fill_between(curve.steps, *low_high, color=line.get_color(), alpha=0.2, linewidth=0, label=band_name)
        band_labelled = True


def _matplotlib():
    try:
        from matplotlib import ticker
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            "plotting needs matplotlib: pip install matplotlib (or pip install 'lightning-rl[plot]')"
        ) from err
    return Figure, FigureCanvasAgg, ticker


# ----------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``plot`` subcommand's arguments (for wiring into a CLI's subparsers)."""
    parser.add_argument("log_dir", nargs="+", help="CSV or TensorBoard log dirs (runs of one algorithm and settings, "
                        "seeds excepted, are one line; a resumed run continues its own; each env "
                        "is a panel of its own)")
    parser.add_argument("--out", default="curve.png", help="image to write (default: curve.png)")
    parser.add_argument("--metric", default=DEFAULT_METRIC, help=f"metric to draw (default: {DEFAULT_METRIC})")
    parser.add_argument("--labels", nargs="+", default=None,
                        help="one label per log dir; each distinct label is its own line")
    parser.add_argument("--title", default=None, help="plot title (default: the metric); with several envs "
                        "it heads the figure and each panel is titled by its env")
    parser.add_argument("--band", choices=("minmax", "std", "none"), default="minmax",
                        help="band around the mean of several runs (default: minmax)")
    parser.add_argument("--source", choices=("auto", "csv", "tensorboard"), default="auto",
                        help="which logs to read when a dir holds both (default: auto = CSV first)")
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    """Run the parsed ``plot`` arguments; prints where the image was written. Returns an exit code.

    The warnings of :func:`collect_curves` (runs skipped, ranges that differ) go to stderr
    as ``lightning-rl plot: warning: ...`` lines, errors as one ``error:`` line (exit 1).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = plot_curves(args.log_dir, args.out, metric=args.metric, labels=args.labels, title=args.title,
                              band=args.band, source=args.source)
        except (FileNotFoundError, ValueError, ImportError) as err:
            failure: Exception | None = err
        else:
            failure = None
    for warning in caught:
        print(f"lightning-rl plot: warning: {warning.message}", file=sys.stderr)
    if failure is not None:
        print(f"lightning-rl plot: error: {missing_dependency(failure) or failure}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``lightning-rl plot <log_dir>... --out curve.png [--metric M] [--labels ...]`` (argv without ``plot``)."""
    parser = add_arguments(argparse.ArgumentParser(prog="lightning-rl plot", description=__doc__.split("\n")[0]))
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
