"""``lightning-rl tune --backend ray``: the trials of a study as Ray Tune trials, on any node of a
Ray cluster with the CPUs and GPUs each asks for, sampled by Optuna (Ray's ``OptunaSearch``, TPE)
and stopped early by ASHA on the reported metric (``time_attr``: env steps).

Each trial is the same ``fit`` as with the Optuna backend (:func:`lightning_rl.tune_trial.run_trial`),
run in a Ray actor; its folder is ``<root-dir>/trial_NNNN`` on the node that ran it (one folder
for all on a shared file system). The sampler starts from the trials already in ``--storage``,
and every trial Ray ran is written back there when the search ends, so the table, ``best.yaml``
and the plots are those of the Optuna backend, and a study can go on with either backend.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from lightning_rl.tune_config import TRIAL_CONFIG, with_settings, write_config
from lightning_rl.tune_spaces import suggest
from lightning_rl.tune_study import counted, make_sampler, sampler_seed

if TYPE_CHECKING:
    from lightning_rl.tune_config import Search

TRIAL = "lightning_rl_trial"  # the key of a Ray trial's config that holds what it runs


class StoppingASHA(ASHAScheduler):
    """ASHA on env steps that remembers the trials it stopped before ``max_t``: a trial that ends
    short of the budget without being among them was cut short (Ctrl-C), not pruned."""

    def __init__(self, max_t: int) -> None:
        super().__init__(time_attr="env_steps", max_t=max_t, grace_period=max(1, max_t // 9), reduction_factor=3)
        self.budget = max_t
        self.stopped: set[int] = set()

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        action = super().on_trial_result(tune_controller, trial, result)
        if action == TrialScheduler.STOP and result.get("env_steps", 0) < self.budget:
            self.stopped.add(trial.config[TRIAL]["number"])
        return action


class _RayReports:
    """What :class:`~lightning_rl.tune_trial.TrialReporter` reports to, inside a Ray trial: Ray
    Tune's ``report`` (the scheduler stops a trial itself; no pruning decision here)."""

    def __init__(self, metric: str, node: str) -> None:
        self.metric, self.node = metric, node

    def report(self, value: float, step: int) -> None:
        from ray import tune

        tune.report({self.metric: value, "env_steps": step, "node": self.node})

    def should_prune(self) -> bool:
        return False

    def set_user_attr(self, key: str, value: Any) -> None:
        pass


class _DefineTrial:
    """OptunaSearch's define-by-run space (a picklable callable: Ray saves the searcher): samples a
    trial's settings and returns what the Ray trial runs, as the ``TRIAL`` entry of its config."""

    def __init__(self, search: Search, root: Path, offset: int) -> None:
        self.space, self.config, self.root, self.offset = search.space, search.config, root, offset
        self.study_name, self.metric = search.study_name, search.options.metric

    def __call__(self, trial: Any) -> dict[str, Any]:
        settings = suggest(trial, self.space)
        number = self.offset + trial.number  # the number the stored study gives it
        run_dir = self.root / f"trial_{number:04d}"
        trial.set_user_attr("settings", settings)
        header = (f"trial {number} of study {self.study_name!r} (lightning-rl tune --backend ray)\n"
                  f"rerun it: lightning-rl fit -c {run_dir / TRIAL_CONFIG}")
        return {TRIAL: {"config": with_settings(self.config, settings, run_dir), "path": str(run_dir / TRIAL_CONFIG),
                        "header": header, "metric": self.metric, "number": number, "sampled": trial.number,
                        "settings": settings}}


def ray_trial(config: dict[str, Any], fit: Any) -> None:
    """A Ray Tune trial: write the trial's config on this node and ``fit`` it (the CLI's, passed
    by reference), reporting every evaluation."""
    import ray

    from lightning_rl.tune_trial import run_trial

    trial = config[TRIAL]
    path = write_config(trial["config"], Path(trial["path"]), trial["header"])
    reports = _RayReports(trial["metric"], ray.get_runtime_context().get_node_id())
    run_trial(fit, path, reports, trial["metric"])


def trial_name(trial: Any) -> str:
    """A Ray trial's name and folder: its number in the study (Ray's default spells out its config)."""
    return f"trial_{trial.config[TRIAL]['number']:04d}"


def run_ray(search: Search, study: Any) -> int:
    """The search under Ray Tune; the trials Ray ran are added to ``study``. Returns the exit code."""
    import optuna
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    options = search.options
    root = search.root_dir.resolve()
    remaining = None if options.n_trials is None else options.n_trials - counted(study)
    if remaining is not None and remaining <= 0:
        return 0
    # the sampler's own study, in memory, starts from the stored trials (TPE learns from them)
    memory = optuna.storages.InMemoryStorage()
    known = optuna.create_study(storage=memory, study_name=search.study_name, direction=options.direction)
    finished = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                        optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL))
    known.add_trials(finished)
    study_seed = sampler_seed(options.seed, None, len(study.get_trials(deepcopy=False)))
    first = len(study.get_trials(deepcopy=False))  # the stored numbers the new trials will get

    mode = "max" if options.direction == "maximize" else "min"
    budget = search.config["model"]["init_args"].get("total_env_steps")
    max_t = int(budget) if isinstance(budget, int | float) else 10 ** 12
    scheduler = StoppingASHA(max_t)
    define = _DefineTrial(search, root, first - len(finished))
    searcher = OptunaSearch(space=define, metric=options.metric, mode=mode, storage=memory,
                            study_name=search.study_name, sampler=make_sampler(study_seed))
    resources = {"cpu": options.cpus_per_trial, "gpu": options.gpus_per_trial}
    started = not ray.is_initialized()
    if started:
        ray.init(address=options.ray_address or os.environ.get("RAY_ADDRESS"), include_dashboard=False,
                 log_to_driver=True)
    try:
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(ray_trial, fit=search.fit), resources),
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, metric=options.metric, mode=mode,
                                        num_samples=-1 if remaining is None else remaining,
                                        time_budget_s=options.timeout, trial_name_creator=trial_name,
                                        trial_dirname_creator=trial_name),
            run_config=tune.RunConfig(name=search.study_name, storage_path=str(root / "ray"),
                                      failure_config=tune.FailureConfig(max_failures=0)),
        )
        results = tuner.fit()
    finally:
        if started:
            ray.shutdown()
    stored = sorted((_stored_trial(result, known, options.metric, max_t, scheduler.stopped) for result in results),
                    key=lambda item: item[0])
    study.add_trials([trial for _, trial in stored])
    return 130 if any(trial.user_attrs.get("interrupted") for _, trial in stored) else 0


def _stored_trial(result: Any, known: Any, metric: str, max_t: int, pruned: set[int]) -> tuple[int, Any]:
    """A Ray trial's result as an Optuna trial of the stored study: done, pruned (stopped by ASHA
    before the budget: its number in ``pruned``), failed (with its error) or, ended short of the
    budget otherwise (Ctrl-C), failed as interrupted (not counted toward ``--n-trials``); its
    evaluations at their env steps."""
    import optuna
    from optuna.trial import TrialState

    trial = result.config[TRIAL]
    sampled = known.get_trials(deepcopy=False)[trial["sampled"]]
    history = result.metrics_dataframe
    steps: dict[int, float] = {}
    if history is not None and metric in history and "env_steps" in history:
        steps = {int(s): float(v) for s, v in zip(history["env_steps"], history[metric], strict=True)
                 if not math.isnan(v)}
    last = max(steps) if steps else None
    attrs = {"settings": trial["settings"], "config": trial["path"], "backend": "ray",
             "node": (result.metrics or {}).get("node")}
    if last is not None:
        attrs["env_steps"] = last
    if result.error is not None or last is None:
        state, value = TrialState.FAIL, None
        attrs["error"] = _error_line(str(result.error or f"{metric} was never reported"))
    elif last < max_t and trial["number"] in pruned:
        state, value = TrialState.PRUNED, None
    elif last < max_t:
        state, value = TrialState.FAIL, None
        attrs.update(interrupted=True, error="interrupted")
    else:
        state, value = TrialState.COMPLETE, steps[last]
    return trial["number"], optuna.trial.create_trial(
        state=state, value=value, params=sampled.params, distributions=sampled.distributions, user_attrs=attrs,
        intermediate_values=steps)


def _error_line(text: str) -> str:
    """The line that says what went wrong in a Ray trial's error (its traceback included)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "TrialError: " in line:
            return line.split("TrialError: ", 1)[1][:2000]
    return (lines[-1] if lines else "failed")[:2000]
