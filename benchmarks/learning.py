"""Learning robustness across seeds: every configuration of the learning table, several seeds each.

The configurations are those of ``tests/test_learning*.py`` (the learning table of docs/algorithms.md):

* ``ppo_cartpole``: PPO on CartPole-v1 at rl-zoo's settings, 100k env steps;
* ``a2c_cartpole``: A2C on CartPole-v1 at rl-zoo's settings (the defaults), 500k env steps;
* ``ppo_pendulum``: PPO on Pendulum-v1 at rl-zoo's settings without gSDE, 300k env steps;
* ``dqn_cartpole``: DQN on CartPole-v1, the defaults (double Q, dueling, 3-step, the learning
  rate decayed linearly to 0 at the budget), 60k env steps;
* ``dqn_cartpole_constant_lr``: the same with a constant learning rate (the defaults before they
  decayed it; not run by default, ``--algos dqn_cartpole_constant_lr``);
* ``sac_pendulum``: SAC on Pendulum-v1, the defaults, 20k env steps;
* ``impala_cartpole``: IMPALA on CartPole-v1, the defaults (2 sampler worker processes), 500k env steps;
* ``appo_cartpole``: APPO on CartPole-v1, the defaults (2 sampler worker processes), 500k env steps;
* ``ddppo_cartpole``: DD-PPO, PPO on CartPole-v1 under DDP on 2 CPU ranks (gloo), 4 envs per rank,
  100k global env steps (the settings of ``tests/test_ddp.py``'s learning test);
* MuJoCo (``mujoco`` extra; not run by default, hours to days on 2 cores: name them in
  ``--algos``): ``ppo_hopper``, ``ppo_halfcheetah``, ``ppo_walker2d`` at 1M env steps and
  ``sac_*`` and ``td3_*`` of the same three envs at 300k, each with the settings of the shipped
  config ``examples/configs/{ppo,sac,td3}_mujoco.yaml`` (rl-zoo's); "solved" is a greedy return
  of 1000. ``benchmarks/continuous_control.py`` runs the same settings beside Stable-Baselines3.

The async runs (IMPALA, APPO) are not deterministic: the order in which the workers' fragments
reach the learner depends on timing. Each takes three processes (the learner and two samplers),
so it runs alone: a run starts only while the processes of the runs in flight, its own included,
fit in ``--workers`` (or when nothing else runs).

A DD-PPO run is two processes (Lightning's DDP launcher starts the second rank as a copy of the
run's command, on a free port of its own); like an async run it counts as that many against
``--workers``. Its env steps and curve are global (both ranks), its evaluation the mean over ranks,
and rank 0 reports it.

Each (configuration, seed) run is its own Python process (at most ``--workers`` at a time, one
torch thread each) that builds the module with ``seed``, fits it with a quiet Trainer (no
logger, checkpoints or progress bar) and the module's own greedy evaluation as Lightning
validation (``evaluation_interval=1``, 10 episodes, ``iterations_per_epoch`` chosen for about
40 evaluations over the budget), recorded at the env-step count. After ``fit`` it plays 20
greedy episodes with ``lightning_rl.evaluate(model, num_episodes=20, seed=seed + 10_000)``.

Reported per configuration: that final greedy return (mean ± std over seeds, and per seed);
steps-to-threshold, the first env step at which a greedy evaluation during training reached the
threshold (CartPole 475, Pendulum -200; "k/n solved", mean over the solved seeds); the seeds whose
final greedy return reached the target return, where a configuration has one; and the wall time
of ``fit`` per run. The targets: DQN's defaults end at greedy >= 475 after 60k env steps, IMPALA's
and APPO's at greedy >= 400 after 500k, each on at least 4 seeds of 5 (80% of the seeds); the
table says whether each was met.

Outputs: a Markdown table, then one JSON object as the last stdout line (every figure, no
curves); the curves as a PNG (one panel per configuration: mean and min-max band over seeds,
thin per-seed lines, dashed threshold) and every run, curves included, as JSON next to it
(same stem). ``--from-json`` re-prints the table from that file without running anything (and
re-draws the PNG when ``--out`` is given).

A run that crashes, or outlives ``--run-timeout``, stops the benchmark: the others are killed,
the configuration, seed and the tail of the run's output are printed, and the exit status is 1;
runs finished so far are kept in ``<stem>.partial.json``. Ctrl-C or SIGTERM kills every run
(they live in their own sessions and also die with this process on Linux).

Usage::

    python benchmarks/learning.py                                       # all configurations, seeds 0-4
    python benchmarks/learning.py --algos impala_cartpole,appo_cartpole --seeds 10,11,12,13,14
    python benchmarks/learning.py --algos dqn_cartpole --seeds 0,1,2,3,4
    python benchmarks/learning.py --compile --out docs/learning_seeds_compiled.png   # compiled updates
    python benchmarks/learning.py --scale 0.02 --seeds 0,1 --out /tmp/smoke.png   # smoke check
    python benchmarks/learning.py --from-json docs/learning_seeds.json
"""

from __future__ import annotations

import argparse
import ctypes
import inspect
import json
import logging
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PARENT_PID_ENV = "LIGHTNING_RL_LEARNING_PARENT_PID"  # set for the run processes only


def die_with_parent() -> None:
    """In a run process (Linux): the kernel kills it when the benchmark process dies, however
    that one ends. Called before the slow imports, so there is no window while they load."""
    parent = os.environ.get(PARENT_PID_ENV)
    if parent is None:
        return
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if int(os.environ.get("LOCAL_RANK", "0")) > 0:
        return  # a DDP rank that rank 0 started: rank 0 is its parent, and it dies with that one
    if os.getppid() != int(parent):  # the parent died before prctl
        os._exit(1)


if __name__ == "__main__":
    die_with_parent()

warnings.filterwarnings("ignore")
os.environ.setdefault("PYTHONWARNINGS", "ignore")

import numpy as np  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402

import lightning_rl  # noqa: E402
from lightning_rl import A2C, APPO, DQN, IMPALA, PPO, SAC, TD3, RLModule, evaluate  # noqa: E402

TARGET_EVALUATIONS = 40  # greedy evaluations per run over the budget
EVAL_EPISODES = 10  # per evaluation during training
FINAL_EPISODES = 20  # the greedy evaluation after training
FINAL_SEED_OFFSET = 10_000  # final evaluation env seed = run seed + this (validation uses + 100_000)


@dataclass(frozen=True)
class Config:
    """One learning configuration: what to build, its budget and its solve threshold."""

    label: str
    algo: type[RLModule]
    budget: int  # env steps at --scale 1
    threshold: float  # greedy evaluation return that counts as solved
    settings: dict[str, Any] = field(default_factory=dict)
    est_s: float = 0.0  # rough wall time of one run at --scale 1 on a free core (orders the runs)
    target_return: float | None = None  # final greedy return a seed must end at, where there is a target
    required: float | None = None  # fraction of seeds that must reach ``target_return``
    processes: int = 1  # processes one run keeps busy (async: the learner and its sampler workers)
    devices: int = 1  # DDP ranks (CPU, gloo)

    def params(self) -> dict[str, Any]:
        """The settings over the class defaults."""
        params = {
            name: p.default for name, p in inspect.signature(self.algo.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        return {**params, **self.settings}

    def steps_per_iteration(self) -> int:
        """Global env steps trained per training iteration (an async batch: whole fragments, rounded
        up; under DDP every rank's)."""
        params = self.params()
        per_env = params["rollout_fragment_length"] if "rollout_fragment_length" in params else params["train_freq"]
        fragment = int(params["num_envs"]) * int(per_env)
        if "num_workers" in params:
            return math.ceil(int(params["train_batch_size"]) / fragment) * fragment * self.devices
        return fragment * self.devices


CONFIGS: dict[str, Config] = {
    "ppo_cartpole": Config(
        "PPO CartPole-v1, rl-zoo", PPO, 100_000, 475.0,
        dict(env="CartPole-v1", num_envs=8, rollout_fragment_length=32, num_sgd_iter=20, sgd_minibatch_size=256,
             lr=1e-3, lr_schedule="linear", clip_param_schedule="linear", gamma=0.98, lambda_=0.8),
        est_s=60,
    ),
    "a2c_cartpole": Config(
        "A2C CartPole-v1, rl-zoo", A2C, 500_000, 475.0,
        dict(env="CartPole-v1", num_envs=8, rollout_fragment_length=5), est_s=200,
    ),
    "ppo_pendulum": Config(
        "PPO Pendulum-v1, rl-zoo without gSDE", PPO, 300_000, -200.0,
        dict(env="Pendulum-v1", num_envs=4, rollout_fragment_length=1024, num_sgd_iter=10, sgd_minibatch_size=64,
             lr=1e-3, gamma=0.9, lambda_=0.95),
        est_s=270,
    ),
    "dqn_cartpole": Config(
        "DQN CartPole-v1, defaults", DQN, 60_000, 475.0, dict(env="CartPole-v1"), est_s=300,
        target_return=475.0, required=0.8,
    ),
    "dqn_cartpole_constant_lr": Config(
        "DQN CartPole-v1, defaults but a constant lr", DQN, 60_000, 475.0,
        dict(env="CartPole-v1", lr_schedule="constant"), est_s=300, target_return=475.0, required=0.8,
    ),
    "sac_pendulum": Config("SAC Pendulum-v1, defaults", SAC, 20_000, -200.0, dict(env="Pendulum-v1"), est_s=500),
    "impala_cartpole": Config(
        "IMPALA CartPole-v1, defaults, 2 workers", IMPALA, 500_000, 475.0, dict(env="CartPole-v1"), est_s=45,
        target_return=400.0, required=0.8, processes=3,
    ),
    "appo_cartpole": Config(
        "APPO CartPole-v1, defaults, 2 workers", APPO, 500_000, 475.0, dict(env="CartPole-v1"), est_s=45,
        target_return=400.0, required=0.8, processes=3,
    ),
    "ddppo_cartpole": Config(
        "DD-PPO CartPole-v1, 2 CPU ranks", PPO, 100_000, 475.0,
        dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, num_sgd_iter=20, sgd_minibatch_size=128,
             lr=1e-3, lr_schedule="linear", clip_param_schedule="linear", gamma=0.98, lambda_=0.8),
        est_s=120, processes=2, devices=2,
    ),
}


MUJOCO_ENVS = {"hopper": "Hopper-v5", "halfcheetah": "HalfCheetah-v5", "walker2d": "Walker2d-v5"}
MUJOCO_BUDGETS = {"ppo": 1_000_000, "sac": 300_000, "td3": 300_000}  # issue 38's table
MUJOCO_SECONDS = {"ppo": 1500, "sac": 4000, "td3": 4000}  # one run on a free core, evaluations included
SET_BY_BUILD = {"seed", "total_env_steps", "iterations_per_epoch", "evaluation_interval", "evaluation_num_episodes"}


def mujoco_settings(algo: str) -> dict[str, Any]:
    """The shipped config's ``init_args`` (``examples/configs/<algo>_mujoco.yaml``), less what
    ``build`` sets for every run."""
    import yaml

    path = Path(__file__).resolve().parent.parent / "examples" / "configs" / f"{algo}_mujoco.yaml"
    init_args = yaml.safe_load(path.read_text())["model"]["init_args"]
    return {k: tuple(v) if isinstance(v, list) else v for k, v in init_args.items() if k not in SET_BY_BUILD}


CONFIGS.update({
    f"{algo}_{name}": Config(
        f"{algo.upper()} {env}, rl-zoo (shipped config)", cls, MUJOCO_BUDGETS[algo], 1000.0,
        {**mujoco_settings(algo), "env": env}, est_s=MUJOCO_SECONDS[algo],
    )
    for algo, cls in (("ppo", PPO), ("sac", SAC), ("td3", TD3)) for name, env in MUJOCO_ENVS.items()
})
OPT_IN = {"dqn_cartpole_constant_lr", *(f"{a}_{n}" for a in MUJOCO_BUDGETS for n in MUJOCO_ENVS)}


def budget(config: Config, scale: float) -> int:
    return max(config.steps_per_iteration(), int(config.budget * scale))


def iterations_per_epoch(config: Config, scale: float) -> int:
    """Iterations between greedy evaluations, for about ``TARGET_EVALUATIONS`` per run."""
    iterations = budget(config, scale) / config.steps_per_iteration()
    return max(1, round(iterations / TARGET_EVALUATIONS))


def build(name: str, seed: int, scale: float, compile: bool = False) -> RLModule:
    """The configuration ``name`` with ``seed`` and greedy evaluation every epoch; ``compile``
    runs its updates as compiled graphs (the ``compile`` hyperparameter)."""
    config = CONFIGS[name]
    return config.algo(
        **config.settings, seed=seed, compile=compile, total_env_steps=budget(config, scale),
        iterations_per_epoch=iterations_per_epoch(config, scale), evaluation_interval=1,
        evaluation_num_episodes=EVAL_EPISODES, num_cpu_threads=1,
    )


def silence() -> None:
    """Quiet Lightning's banners ("GPU available", tips) and all warnings."""
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


# --------------------------------------------------------------------------- one run (child process)
class GreedyCurve(pl.Callback):
    """Records (env steps, greedy evaluation return) after every validation run."""

    def __init__(self) -> None:
        self.points: list[tuple[int, float]] = []

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics["val/episode_return_mean"]  # under DDP the mean over ranks
        self.points.append((int(pl_module.global_counters["num_env_steps_sampled"]), float(value)))


def run_one(name: str, seed: int, scale: float, result_path: Path, compile: bool = False) -> None:
    """Fit one configuration with one seed; write the curve and the final evaluation as JSON."""
    silence()
    torch.set_num_threads(1)
    start = time.perf_counter()
    model = build(name, seed, scale, compile)
    curve = GreedyCurve()
    devices = CONFIGS[name].devices
    # DDP: Lightning starts rank 1 as a copy of this process's command line (with its rank in the env)
    strategy = dict(strategy="ddp", devices=devices) if devices > 1 else dict(devices=1)
    with tempfile.TemporaryDirectory(prefix="lightning_rl_learning_") as root:
        trainer = pl.Trainer(
            accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, callbacks=[curve], default_root_dir=root, **strategy,
        )
        fit_start = time.perf_counter()
        trainer.fit(model)
        fit_s = time.perf_counter() - fit_start
    if trainer.global_rank != 0:
        return  # rank 0 reports the run
    returns = evaluate(model, num_episodes=FINAL_EPISODES, seed=seed + FINAL_SEED_OFFSET)
    result = {
        "config": name, "seed": seed, "compile": compile,
        "env_steps": int(model.global_counters["num_env_steps_sampled"]),
        "iterations_per_epoch": iterations_per_epoch(CONFIGS[name], scale), "curve": curve.points,
        "final_returns": returns, "final_mean": float(np.mean(returns)), "final_std": float(np.std(returns)),
        "fit_s": fit_s, "wall_s": time.perf_counter() - start,
    }
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(result_path)


# --------------------------------------------------------------------------- the pool (parent process)
class RunFailed(RuntimeError):
    """A run exited non-zero, without a result, or past its timeout."""


@dataclass
class Running:
    name: str
    seed: int
    proc: subprocess.Popen
    log_path: Path
    result_path: Path
    start: float


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no output: {e})"


def start_run(name: str, seed: int, scale: float, workdir: Path, compile: bool) -> Running:
    log_path = workdir / f"{name}-{seed}.log"
    result_path = workdir / f"{name}-{seed}.json"
    cmd = [
        sys.executable, os.path.abspath(__file__), "--run-one", f"{name}:{seed}", "--scale", repr(scale),
        "--result", str(result_path), *(["--compile"] if compile else []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", PARENT_PID_ENV: str(os.getpid())}
    if CONFIGS[name].devices > 1:  # a DDP run's own rendezvous port, so that two at a time do not collide
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with open(log_path, "wb") as log:
        # Own session: Ctrl-C reaches only this process, which then kills the runs itself.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    return Running(name, seed, proc, log_path, result_path, time.perf_counter())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_all(running: list[Running]) -> None:
    """Terminate, then kill, every run still alive; reap them all."""
    for r in running:
        if r.proc.poll() is None:
            r.proc.terminate()
    deadline = time.monotonic() + 5.0
    for r in running:
        try:
            r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait()


def run_all(jobs: Sequence[tuple[str, int]], scale: float, workers: int, run_timeout: float,
            partial_path: Path, compile: bool = False) -> list[dict[str, Any]]:
    """Every (configuration, seed) run, at most ``workers`` at a time; results in job order."""
    results: dict[tuple[str, int], dict[str, Any]] = {}
    pending = deque(jobs)
    running: list[Running] = []
    with tempfile.TemporaryDirectory(prefix="lightning_rl_learning_") as tmp:
        workdir = Path(tmp)
        try:
            while pending or running:
                busy = sum(CONFIGS[r.name].processes for r in running)
                while pending and (not running or busy + CONFIGS[pending[0][0]].processes <= workers):
                    running.append(start_run(*pending.popleft(), scale, workdir, compile))
                    busy += CONFIGS[running[-1].name].processes
                time.sleep(0.2)
                for r in list(running):
                    rc = r.proc.poll()
                    if rc is None:
                        if time.perf_counter() - r.start > run_timeout:
                            raise RunFailed(f"{r.name} seed {r.seed} ran past --run-timeout {run_timeout:g} s\n"
                                            f"{tail(r.log_path)}")
                        continue
                    running.remove(r)
                    if rc != 0 or not r.result_path.exists():
                        raise RunFailed(f"{r.name} seed {r.seed} failed (exit status {rc}); its last output:\n"
                                        f"{tail(r.log_path)}")
                    result = json.loads(r.result_path.read_text())
                    results[(r.name, r.seed)] = result
                    print(progress_line(result), flush=True)
                    write_json(partial_path, [results[j] for j in jobs if j in results], complete=False)
        finally:
            stop_all(running)
    return [results[j] for j in jobs]


# --------------------------------------------------------------------------- reporting
def steps_to_threshold(curve: Sequence[Sequence[float]], threshold: float) -> int | None:
    """First env step whose greedy evaluation reached ``threshold``; ``None`` if none did."""
    return next((int(step) for step, ret in curve if ret >= threshold), None)


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(mean: float | None, std: float | None, digits: int = 1) -> str:
    return "-" if mean is None else f"{mean:,.{digits}f} ± {std:,.{digits}f}"


def progress_line(result: dict[str, Any]) -> str:
    config = CONFIGS[result["config"]]
    reached = steps_to_threshold(result["curve"], config.threshold)
    solve = f"greedy {config.threshold:g} at {reached:,} steps" if reached is not None else "threshold not reached"
    return (f"[{result['config']} seed {result['seed']}] {result['env_steps']:,} steps, fit {result['fit_s']:.0f} s; "
            f"final greedy {result['final_mean']:.1f} ± {result['final_std']:.1f} ({FINAL_EPISODES} ep); {solve}")


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration: final greedy return, steps-to-threshold and wall time over seeds."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(r["config"] for r in runs):
        config = CONFIGS[name]
        mine = sorted((r for r in runs if r["config"] == name), key=lambda r: r["seed"])
        finals = [r["final_mean"] for r in mine]
        reached = [steps_to_threshold(r["curve"], config.threshold) for r in mine]
        solved = [s for s in reached if s is not None]
        final_mean, final_std = mean_std(finals)
        steps_mean, steps_std = mean_std([float(s) for s in solved])
        fit_mean, fit_std = mean_std([r["fit_s"] for r in mine])
        target = None if config.required is None else math.ceil(config.required * len(mine))
        ended = None if config.target_return is None else sum(f >= config.target_return for f in finals)
        out[name] = {
            "label": config.label, "env": config.settings["env"], "env_steps": mine[0]["env_steps"],
            "threshold": config.threshold, "seeds": [r["seed"] for r in mine],
            "final_return": final_mean, "final_return_std": final_std, "final_return_per_seed": finals,
            "solved": len(solved), "runs": len(mine), "steps_to_threshold": steps_mean,
            "steps_to_threshold_std": steps_std, "steps_to_threshold_per_seed": reached,
            "fit_s": fit_mean, "fit_s_std": fit_std, "fit_s_per_seed": [r["fit_s"] for r in mine],
            "target_return": config.target_return, "ended_at_target": ended, "required": target,
            "target_met": None if target is None else ended >= target,
        }
    return out


def markdown_table(summary: dict[str, Any]) -> str:
    rows = [
        "| configuration | env steps | final greedy return (20 ep), mean ± std over seeds | per seed | solved "
        "(greedy ≥ threshold) | steps to threshold (solved seeds) | target | fit s per run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary.values():
        per_seed = ", ".join(f"{v:.0f}" for v in s["final_return_per_seed"])
        solved = f"{s['solved']}/{s['runs']} (≥ {s['threshold']:g})"
        target = "-"
        if s["required"] is not None:
            target = (f"{s['ended_at_target']}/{s['runs']} end ≥ {s['target_return']:g}, {s['required']} required: "
                      f"{'met' if s['target_met'] else 'NOT met'}")
        rows.append(
            f"| {s['label']} | {s['env_steps']:,} | {fmt(s['final_return'], s['final_return_std'])} | {per_seed} | "
            f"{solved} | {fmt(s['steps_to_threshold'], s['steps_to_threshold_std'], 0)} | {target} | "
            f"{fmt(s['fit_s'], s['fit_s_std'], 0)} |"
        )
    return "\n".join(rows)


def plot(runs: Sequence[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    """One panel per configuration: greedy return vs env steps over seeds, threshold dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names):
        s = summary[name]
        curves = [np.asarray(r["curve"], dtype=float).reshape(-1, 2) for r in runs if r["config"] == name]
        grid = np.unique(np.concatenate([c[:, 0] for c in curves]))
        # Seeds share evaluation steps unless a budget cut differs; interpolate onto their union.
        values = np.array([
            np.where((grid >= c[0, 0]) & (grid <= c[-1, 0]), np.interp(grid, c[:, 0], c[:, 1]), np.nan)
            if len(c) else np.full(len(grid), np.nan) for c in curves
        ])
        for c in curves:
            ax.plot(c[:, 0], c[:, 1], color="tab:blue", lw=0.7, alpha=0.35)
        if len(grid):
            ax.fill_between(grid, np.nanmin(values, 0), np.nanmax(values, 0), color="tab:blue", alpha=0.2,
                            label="min–max over seeds")
            ax.plot(grid, np.nanmean(values, 0), color="tab:blue", lw=2, label=f"mean of {len(curves)} seeds")
        ax.axhline(s["threshold"], color="black", ls="--", lw=1, label=f"threshold {s['threshold']:g}")
        ax.set_title(f"{s['label']}\n{s['solved']}/{s['runs']} solved", fontsize=10)
        ax.set_xlabel("env steps")
        ax.set_ylabel(f"greedy return ({EVAL_EPISODES} ep)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def versions() -> dict[str, Any]:
    return {
        "python": platform.python_version(), "torch": torch.__version__, "pytorch_lightning": pl.__version__,
        "lightning_rl": lightning_rl.__version__, "numpy": np.__version__, "cpus": os.cpu_count(),
    }


def write_json(path: Path, runs: Sequence[dict[str, Any]], complete: bool, **extra: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(json_safe({"benchmark": "learning", "complete": complete, **extra, "runs": runs})))
    tmp.replace(path)


def report(runs: Sequence[dict[str, Any]], meta: dict[str, Any], png: Path | None, curves_json: str) -> None:
    """Print the Markdown table and, last, one JSON line; draw the PNG when given a path."""
    summary = summarize(runs)
    print("\n" + markdown_table(summary) + "\n", flush=True)
    if png is not None:
        plot(runs, summary, png)
        print(f"curves: {png}", flush=True)
    line = {**meta, "curves_json": curves_json, "configs": summary,
            "runs": [{k: v for k, v in r.items() if k != "curve"} for r in runs]}
    sys.stdout.write(json.dumps(json_safe(line)) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_algos = ",".join(n for n in CONFIGS if n not in OPT_IN)
    p.add_argument("--algos", default=default_algos, help=f"comma-separated subset of {','.join(CONFIGS)}")
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (default 0,1,2,3,4)")
    p.add_argument("--workers", type=int, default=2, help="processes at a time, one torch thread each (an async run "
                   "takes 3)")
    p.add_argument("--out", default=None, help="PNG of the curves (default docs/learning_seeds.png); the runs go "
                   "to the same path with .json")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every env-step budget (0.02: smoke check)")
    p.add_argument("--run-timeout", type=float, default=3 * 3600.0, help="seconds one run may take (default 3 h)")
    p.add_argument("--compile", action="store_true", help="every run with compile=True (compiled update steps)")
    p.add_argument("--from-json", default=None, help="re-print the table of a finished benchmark; no runs")
    p.add_argument("--run-one", default=None, help=argparse.SUPPRESS)  # NAME:SEED, in a child process
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = [a for a in args.algos if a not in CONFIGS]
    if unknown or not args.algos:
        p.error(f"unknown --algos {unknown}; choose from {','.join(CONFIGS)}")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not args.seeds or len(set(args.seeds)) != len(args.seeds):
        p.error("--seeds must name at least one seed, each once")
    if args.workers < 1 or args.scale <= 0 or args.run_timeout <= 0:
        p.error("--workers, --scale and --run-timeout must be positive")
    return args


def kept(partial_path: Path) -> str:
    return f"\nruns finished so far: {partial_path}" if partial_path.exists() else "\nno run had finished"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_one is not None:
        name, seed = args.run_one.rsplit(":", 1)
        run_one(name, int(seed), args.scale, Path(args.result), args.compile)
        return 0
    if args.from_json is not None:
        data = json.loads(Path(args.from_json).read_text())
        meta = {k: v for k, v in data.items() if k != "runs"}
        report(data["runs"], meta, Path(args.out) if args.out else None, args.from_json)
        return 0

    png = Path(args.out or "docs/learning_seeds.png")
    curves_path, partial_path = png.with_suffix(".json"), png.with_suffix(".partial.json")
    # SIGTERM unwinds like Ctrl-C, so the runs are killed on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    meta = {
        "benchmark": "learning", "compile": args.compile, "scale": args.scale, "seeds": args.seeds,
        "workers": args.workers,
        "versions": versions(), "load_avg_start": list(load) if load else None,
        "budgets": {n: budget(CONFIGS[n], args.scale) for n in args.algos},
        "iterations_per_epoch": {n: iterations_per_epoch(CONFIGS[n], args.scale) for n in args.algos},
        "settings": {n: {"algo": CONFIGS[n].algo.__name__, **CONFIGS[n].settings} for n in args.algos},
    }
    print(f"{meta['versions']}; {len(args.algos) * len(args.seeds)} runs, {args.workers} at a time; "
          f"budgets {meta['budgets']}; load average {load}", flush=True)
    # Longest runs first, so the last ones to finish are short.
    order = sorted(args.algos, key=lambda n: -CONFIGS[n].est_s)
    jobs = [(name, seed) for name in order for seed in args.seeds]
    estimate = sum(CONFIGS[name].est_s * min(CONFIGS[name].processes, args.workers) for name, _ in jobs) / min(
        args.workers, len(jobs))
    print(f"rough wall time at --scale 1 with {args.workers} free cores: {estimate / 60:.0f} min", flush=True)
    start = time.perf_counter()
    try:
        runs = run_all(jobs, args.scale, args.workers, args.run_timeout, partial_path, args.compile)
    except RunFailed as e:
        print(f"\nBENCHMARK FAILED: run {e}{kept(partial_path)}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: every run was stopped{kept(partial_path)}", file=sys.stderr, flush=True)
        return 130
    runs = sorted(runs, key=lambda r: (args.algos.index(r["config"]), r["seed"]))
    meta["total_wall_s"] = time.perf_counter() - start
    write_json(curves_path, runs, complete=True, **meta)
    partial_path.unlink(missing_ok=True)
    report(runs, meta, png, str(curves_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
