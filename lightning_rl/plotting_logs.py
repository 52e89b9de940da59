"""Reading training logs for learning curves (``plotting.py``): the runs under a log dir (a CSV
logger's ``metrics.csv``, or a directory of TensorBoard event files), one run's ``(steps, values)``
of a metric, and what its version folder says of it (``hparams.yaml``, the CLI's ``config.yaml``)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Literal

import numpy as np

__all__ = ["CSV_NAME", "DEFAULT_METRIC", "EVENT_GLOB", "find_runs", "load_curve", "run_dir"]

DEFAULT_METRIC = "rollout/episode_return_mean"
EVENT_GLOB = "events.out.tfevents.*"
CSV_NAME = "metrics.csv"

Source = Literal["auto", "csv", "tensorboard"]
PathLikeStr = str | PathLike[str]


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


# ----------------------------------------------------------------------------- a run's folder
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
