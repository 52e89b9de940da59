"""The inputs of a ``lightning-rl tune`` search, resolved before any trial: the fit config as YAML
data, what a trial changes in it (:func:`with_settings`), the files it is written to, and the
one-line errors of the command. Imports nothing heavy."""

from __future__ import annotations

import sys
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from lightning_rl.tune_spaces import Space

TRIAL_CONFIG = "trial.yaml"  # a trial's config, in its run folder


def fail(message: str) -> NoReturn:
    """``lightning-rl tune: error: MESSAGE`` on one line of stderr, exit code 2 (as the CLI's own)."""
    print(f"lightning-rl tune: error: {' '.join(str(message).split())}", file=sys.stderr)
    raise SystemExit(2)


@dataclass
class Search:
    """What a search runs, resolved before any trial: the config (with the command line's fixed
    settings), the space, where everything goes, and ``fit``: the ``lightning-rl fit`` command
    (``lightning_rl.cli.cli``) each trial runs, handed in by the command line that starts the search."""

    options: Namespace
    config: dict[str, Any]
    algorithm: str
    space_name: str
    space: Space
    study_name: str
    root_dir: Path
    report_every: int | None
    fit: Callable[..., Any]
    storage: Any = None  # the study's optuna storage, once opened


def load_config(path: Path) -> dict[str, Any]:
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        fail(f"-c {path}: cannot read it as a YAML config: {' '.join(str(err).split())}")
    model = config.get("model") if isinstance(config, dict) else None
    if isinstance(model, str):
        config["model"] = model = {"class_path": model}
    if not isinstance(model, dict) or not isinstance(model.get("class_path"), str):
        fail(f"-c {path}: the config must name its algorithm (model: {{class_path: lightning_rl.PPO, init_args: ...}})")
    return config


def with_settings(config: dict[str, Any], settings: dict[str, Any], run_dir: Path | None = None) -> dict[str, Any]:
    """``config`` with ``settings`` in ``model.init_args`` and, given ``run_dir``, the Trainer's
    folder (``default_root_dir``, and each configured logger's ``save_dir``) set to it."""
    import copy

    config = copy.deepcopy(config)
    model = config["model"]
    model["init_args"] = {**(model.get("init_args") or {}), **settings}
    if run_dir is not None:
        trainer = config.get("trainer") or {}
        config["trainer"] = {**trainer, "default_root_dir": str(run_dir)}
        loggers = trainer.get("logger")
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            if isinstance(logger, dict) and "save_dir" in (logger.get("init_args") or {}):
                logger["init_args"]["save_dir"] = str(run_dir)
    return config


def write_config(config: dict[str, Any], path: Path, header: str) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"# {line}\n" for line in header.splitlines())
    path.write_text(lines + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def settings_of(algorithm_path: str) -> tuple[str, frozenset[str]]:
    """The algorithm a config's ``model.class_path`` names, and the settings it takes."""
    import importlib
    import inspect

    module, _, name = algorithm_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        cls = None
    if not inspect.isclass(cls):
        fail(f"model.class_path {algorithm_path!r}: no such class")
    return cls.__name__, frozenset(p for p in inspect.signature(cls.__init__).parameters if p != "self")


def format_settings(settings: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in settings.items())
