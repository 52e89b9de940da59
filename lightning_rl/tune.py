"""``lightning-rl tune``: a hyperparameter search over a ``fit`` config with Optuna.

    lightning-rl tune -c examples/configs/ppo_pendulum.yaml --search-space ppo --n-trials 30 \\
        --model.total_env_steps 100000 --seed 0
    lightning-rl tune -c my.yaml --search-space space.yaml --workers 2 --storage sqlite:///study.db

Each trial is an ordinary ``fit`` of the config with the sampled settings: its config is written
to ``<root-dir>/trial_NNNN/trial.yaml`` (``lightning-rl fit -c`` that file reruns it) and its logs
and checkpoints go under the same folder. The metric (``val/episode_return_mean``, the greedy
evaluation's mean return, maximized) is reported to Optuna at every evaluation, at the run's env
steps, for the pruner. The study lives in ``--storage`` (SQLite by default, any SQLAlchemy URL),
so a killed ``tune`` resumes it and several ``tune`` processes share it; ``--n-trials`` counts the
study's finished trials, whoever ran them. At the end (and at Ctrl-C): a table of the best trials,
``best.yaml`` (the config with the best settings, for ``lightning-rl fit -c``) and plots.

A bad space, a setting the algorithm does not take or a config that never evaluates is a one-line
error before any trial runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from lightning_rl.tune_config import Search, fail, load_config, settings_of, with_settings
from lightning_rl.tune_spaces import SpaceError, as_number, check_names, load_space

DESCRIPTION = ("Search the settings of a fit config with Optuna: each trial is a fit of the config with sampled "
               "settings (its config in <root-dir>/trial_NNNN/trial.yaml), the study is kept in --storage (resumed "
               "and shared), and the end (or Ctrl-C) prints the best trials and writes best.yaml. --model.SETTING "
               "VALUE and --trainer.ARGUMENT VALUE set a value in every trial.")
DEFAULT_METRIC = "val/episode_return_mean"
DEFAULT_STORAGE = "sqlite:///study.db"
PRUNERS = ("median", "halving", "none")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(message)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``tune`` subcommand's arguments. ``--model.SETTING VALUE`` and ``--trainer.ARGUMENT
    VALUE`` given besides them are set in every trial's config (a shorter budget, no progress bar)."""
    parser.add_argument("-c", "--config", required=True, type=Path, help="the fit config (YAML) each trial runs")
    parser.add_argument("--search-space", required=True,
                        help="a YAML file of settings and distributions, or a built-in space: ppo, a2c, dqn, sac, "
                             "td3, impala, appo")
    parser.add_argument("--n-trials", type=int, default=None,
                        help="stop once the study has this many finished trials (done, pruned or failed), counting "
                             "those of earlier runs and other processes (default: no limit)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="start no trial after this many seconds (default: no limit)")
    parser.add_argument("--workers", type=int, default=1,
                        help="tune processes to run at once on this machine, sharing the study (default: 1)")
    parser.add_argument("--storage", default=DEFAULT_STORAGE,
                        help=f"the study's database, an SQLAlchemy URL (default: {DEFAULT_STORAGE}, in the current "
                             "directory)")
    parser.add_argument("--study-name", default=None, help="default: <config name>-<search space name>")
    parser.add_argument("--seed", type=int, default=None,
                        help="seeds the sampler (TPE), with the worker's index and the trials the study has so far")
    parser.add_argument("--metric", default=DEFAULT_METRIC, help=f"the metric to optimize (default: {DEFAULT_METRIC})")
    parser.add_argument("--direction", choices=("maximize", "minimize"), default="maximize")
    parser.add_argument("--pruner", choices=PRUNERS, default="median",
                        help="median (MedianPruner), halving (SuccessiveHalvingPruner) or none (default: median)")
    parser.add_argument("--report-every", default="auto",
                        help="report the metric at env steps rounded down to multiples of this (auto: a twentieth "
                             "of total_env_steps; 0: the exact steps)")
    parser.add_argument("--average-last", type=int, default=3,
                        help="a trial's value: the mean of the metric at its last K evaluations, so that one lucky "
                             "or unlucky final evaluation does not pick the best trial (default: 3; 1: the last)")
    parser.add_argument("--root-dir", type=Path, default=None,
                        help="the trials' run folders, best.yaml and plots (default: tune/<study name>)")
    parser.add_argument("--top", type=int, default=10, help="rows of the table of best trials (default: 10)")
    parser.add_argument("--backend", choices=("optuna", "ray"), default="optuna",
                        help="optuna: trials in this process (or --workers processes); ray: trials as Ray Tune trials "
                             "on a Ray cluster, stopped early by ASHA (the ray extra; default: optuna)")
    parser.add_argument("--ray-address", default=None,
                        help="--backend ray: the cluster to join (default: RAY_ADDRESS, else a local Ray)")
    parser.add_argument("--cpus-per-trial", type=float, default=1.0, help="--backend ray: CPUs a trial asks for")
    parser.add_argument("--gpus-per-trial", type=float, default=0.0, help="--backend ray: GPUs a trial asks for")
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def _fixed_settings(extra: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``--model.SETTING VALUE`` and ``--trainer.ARGUMENT VALUE`` pairs, values read as YAML."""
    import yaml

    model: dict[str, Any] = {}
    trainer: dict[str, Any] = {}
    rest = list(extra)
    while rest:
        option = rest.pop(0)
        name, eq, value = option.partition("=")
        if not eq:
            if not rest:
                fail(f"{option}: expected a value")
            value = rest.pop(0)
        if name.startswith("--model."):
            model[name.removeprefix("--model.").removeprefix("init_args.")] = as_number(yaml.safe_load(value))
        elif name.startswith("--trainer."):
            trainer[name.removeprefix("--trainer.")] = as_number(yaml.safe_load(value))
        else:
            fail(f"unrecognized arguments: {option} (lightning-rl tune --help)")
    return model, trainer


def prepare(argv: list[str], fit: Callable[..., Any]) -> Search:
    """The command line checked and resolved; a one-line error (exit 2) for anything wrong."""
    options, extra = add_arguments(_Parser(prog="lightning-rl tune", description=DESCRIPTION, allow_abbrev=False)) \
        .parse_known_args(argv)
    config = load_config(options.config)
    algorithm, settings = settings_of(config["model"]["class_path"])
    fixed, trainer = _fixed_settings(extra)
    try:
        for name in fixed:
            check_names({name: None}, algorithm, settings, f"--model.{name}")  # type: ignore[dict-item]
        space_name, space, _ = load_space(options.search_space)
        check_names(space, algorithm, settings, f"--search-space {options.search_space}")
    except SpaceError as err:
        fail(str(err))
    config = with_settings(config, fixed)
    config["trainer"] = {**(config.get("trainer") or {}), **trainer}
    devices, strategy = config["trainer"].get("devices"), str(config["trainer"].get("strategy") or "")
    if "ddp" in strategy or (isinstance(devices, int) and devices > 1) or (isinstance(devices, list)
                                                                          and len(devices) > 1):
        fail("a trial runs in the tune process: DDP (trainer.strategy, trainer.devices > 1) is not supported; "
             "run several tune processes on one storage instead (--workers)")
    if options.backend == "ray" and options.workers > 1:
        fail("--workers runs tune processes of the optuna backend; with --backend ray, Ray runs as many trials at "
             "once as the cluster has resources for (--cpus-per-trial, --gpus-per-trial)")
    for flag, value in (("--n-trials", options.n_trials), ("--workers", options.workers), ("--top", options.top)):
        if value is not None and value < 1:
            fail(f"{flag} must be at least 1, got {value}")
    trainer_validates = any(config["trainer"].get(k) is not None for k in ("check_val_every_n_epoch",
                                                                           "val_check_interval"))
    if options.metric.startswith("val/") and config["model"]["init_args"].get("evaluation_interval") is None \
            and not trainer_validates:
        fail(f"--metric {options.metric} is logged by evaluations, which the config does not run: set "
             "model.init_args.evaluation_interval (or give --model.evaluation_interval 1)")
    budget = config["model"]["init_args"].get("total_env_steps")
    if options.report_every == "auto":  # a twentieth of the budget, its first digit kept: 100k -> 5000
        twentieth = int(budget) // 20 if isinstance(budget, int | float) and budget >= 20 else 0
        report_every = int(str(twentieth)[0]) * 10 ** (len(str(twentieth)) - 1) if twentieth else None
    else:
        try:
            report_every = int(options.report_every) or None
        except ValueError:
            fail(f"--report-every: expected an integer or auto, got {options.report_every!r}")
    if options.average_last < 1:
        fail(f"--average-last: expected an integer >= 1, got {options.average_last}")
    study_name = options.study_name or f"{options.config.stem}-{space_name}"
    return Search(options, config, algorithm, space_name, space, study_name,
                  options.root_dir or Path("tune") / study_name, report_every, fit)


def main(argv: list[str], fit: Callable[..., Any]) -> int:
    """``lightning-rl tune -c CONFIG --search-space SPACE [...]`` (``argv`` without ``tune``); ``fit``
    runs a trial's ``lightning-rl fit -c trial.yaml`` (the CLI's ``cli``, which ``lightning_rl.cli``
    hands in: this module does not import the command line that imports it)."""
    search = prepare(argv, fit)
    options = search.options
    from lightning_rl.tune_study import open_study, run_trials, run_workers

    study = open_study(search)
    if options.backend == "ray":
        from lightning_rl.tune_ray import run_ray

        code = run_ray(search, study)
    elif options.workers > 1:
        print(f"study {search.study_name!r} in {options.storage}: {options.workers} worker processes", flush=True)
        code = run_workers(search, argv)
    else:
        code = run_trials(search, study)
    if options.worker_index is not None:
        return code
    from lightning_rl.tune_results import summarize

    done = summarize(study, search)
    return code or (0 if done else 1)
