"""MuJoCo continuous control: lightning_rl against Stable-Baselines3 at rl-zoo's settings.

Both sides train PPO, SAC and TD3 with the settings of the shipped configs
``examples/configs/{ppo,sac,td3}_mujoco.yaml`` (rl-baselines3-zoo's MuJoCo entries; ours reads
the configs, SB3's side is written out below with the same numbers):

* PPO: 1 env, 2048 steps per iteration, 10 epochs of minibatches of 64, lr 3e-4, gamma 0.99,
  GAE lambda 0.95, clip 0.2, no entropy bonus, value loss coefficient 0.5, grad-norm clip 0.5,
  MLP [64, 64] tanh; observations standardized and rewards scaled by running statistics, both
  clipped at +-10 (ours: ``normalize_observations`` / ``normalize_rewards`` in the policy; SB3:
  ``VecNormalize(norm_obs=True, norm_reward=True, clip_obs=10, clip_reward=10, gamma=0.99)``).
* SAC: 1 env, lr 3e-4, buffer 1M, ``learning_starts`` 10k uniform random steps, batch 256,
  tau 0.005, gamma 0.99, one gradient step per env step, automatic entropy tuning from alpha 1
  towards -dim(A), MLP [256, 256] ReLU.
* TD3: 1 env, lr 1e-3, buffer 1M, ``learning_starts`` 10k, batch 256, tau 0.005, gamma 0.99, one
  gradient step per env step, policy delay 2, target policy noise 0.2 clipped at 0.5, Gaussian
  exploration noise of std 0.1, MLP [400, 300] ReLU.

Every (env, algorithm, seed, side) run is its own Python process (``--workers`` at a time, 1 by
default; one torch thread each), started in the order env, algorithm, seed, ours then SB3. Ours
runs with ``compile=True`` (``--compile off``: eager) and no evaluation during the fit; SB3 on
a ``DummyVecEnv`` of one ``Monitor``-wrapped env seeded with the run's seed.

Columns of the table (one row per env x algorithm):

* ``ours`` / ``SB3``: the final greedy return, mean ± std over seeds of each run's mean over 10
  episodes played after training with deterministic actions on a fresh env seeded
  ``seed + 10000``. Ours: ``lightning_rl.evaluate(model, num_episodes=10, seed=...)`` (10 envs,
  one episode each; PPO's running statistics live in the policy and do not change during
  evaluation). SB3: ``evaluate_policy(model, env, n_eval_episodes=10, deterministic=True)`` on a
  fresh ``DummyVecEnv``; for PPO wrapped in a ``VecNormalize`` carrying the trained observation
  statistics, frozen (``training=False``) and returning raw rewards (``norm_reward=False``).
* ``ratio``: ours' mean over SB3's (target >= 0.9); "—" where SB3's mean is not positive.
* ``steps/s`` ours / SB3: env steps sampled divided by the wall time of ``trainer.fit`` /
  ``model.learn`` (mean over seeds); ours' fit includes dynamo's trace and inductor's compile of
  the update steps (a few seconds with a warm inductor cache, tens of seconds on a cold one).
  Building the model and env and the final evaluation are outside that time.
* ``speed``: ours' steps/s over SB3's (target >= 1.5).
* ``published``: rl-baselines3-zoo's ``benchmark.md`` figure (one trained agent, the v3 envs,
  deterministic evaluation, 1M env steps for all three algorithms: PPO Hopper 2410, HalfCheetah
  5819, Walker2d 3479; SAC 2326, 9535, 3863; TD3 3606, 9656, 4718), shown only where the run's
  budget equals that figure's; "—" where none exists for the budget.
* ``flags``: seeds marked ``NaN`` (a non-finite evaluation return, or the run stopped on a
  non-finite value), ``failed`` (the run stopped on another error, in the JSON) or ``collapsed``
  (the seed's greedy return is below a quarter of the larger of the two sides' means on that row,
  when that mean is positive), as ``ours s1 collapsed``. NaN and failed seeds are left out of the
  means; collapsed ones count.

Usage::

    python benchmarks/continuous_control.py --envs Hopper-v5 --algos ppo --ppo-steps 200000 --seeds 0,1,2
    python benchmarks/continuous_control.py                                    # the full table (days on 2 cores)
    python benchmarks/continuous_control.py --algos sac,td3 --sac-steps 20000 --td3-steps 20000 --seeds 0
    python benchmarks/continuous_control.py --from-json a.json,b.json          # one table from saved runs

``--save PATH`` writes every finished run as JSON after each one (so a stopped benchmark keeps
its runs); ``--from-json`` merges such files and prints their table without running anything.
``--learning-starts N`` replaces SAC's and TD3's 10k random steps on both sides (small checks).
``--wait-lock PATH`` waits, before each run starts, while PATH exists. Every run keeps its
training curve (``curve``: ``[env step at the episode's end, return]`` per training episode,
exploring; ours from the iterations' episode reports, SB3's from its ``Monitor``); a second table
prints the mean training return in each quarter of the budget, and ``--plot PATH`` draws the
curves (matplotlib).

The last stdout line is one JSON object: settings, versions, load average at start and end, one
entry per row with every figure, and every run.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from learning import PARENT_PID_ENV, die_with_parent, json_safe  # benchmarks/learning.py

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "examples" / "configs"
ALGOS = ("ppo", "sac", "td3")
ENVS = ("Hopper-v5", "HalfCheetah-v5", "Walker2d-v5")
DEFAULT_STEPS = {"ppo": 1_000_000, "sac": 300_000, "td3": 300_000}
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 10_000
RATIO_TARGET, SPEED_TARGET = 0.9, 1.5
COLLAPSE_FRACTION = 0.25
# rl-baselines3-zoo benchmark.md (v3 envs, one agent each, deterministic evaluation): (budget, return)
PUBLISHED = {
    ("ppo", "Hopper"): (1_000_000, 2410.4), ("ppo", "HalfCheetah"): (1_000_000, 5819.1),
    ("ppo", "Walker2d"): (1_000_000, 3478.8),
    ("sac", "Hopper"): (1_000_000, 2325.5), ("sac", "HalfCheetah"): (1_000_000, 9535.5),
    ("sac", "Walker2d"): (1_000_000, 3863.2),
    ("td3", "Hopper"): (1_000_000, 3606.4), ("td3", "HalfCheetah"): (1_000_000, 9655.7),
    ("td3", "Walker2d"): (1_000_000, 4717.8),
}
PUBLISHED_SOURCE = "rl-zoo benchmark.md (v3, 1M)"


def silence() -> None:
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


def config_settings(algo: str) -> tuple[str, dict[str, Any]]:
    """The shipped config's class name and init_args."""
    import yaml

    config = yaml.safe_load((CONFIG_DIR / f"{algo}_mujoco.yaml").read_text())["model"]
    return config["class_path"].rsplit(".", 1)[-1], dict(config["init_args"])


# --------------------------------------------------------------------------- one run (child process)
class EpisodeCurve:
    """The training episodes of a one-env run as ``[env step at the episode's end, return]``
    points (the env step is the sum of the episode lengths so far)."""

    def __init__(self) -> None:
        self.points: list[list[float]] = []
        self.steps = 0

    def add(self, returns: Sequence[float], lengths: Sequence[int]) -> None:
        for value, length in zip(returns, lengths, strict=True):
            self.steps += int(length)
            self.points.append([self.steps, float(value)])

    def callback(self) -> Any:
        """A Lightning callback adding the episodes each training iteration reports."""
        import pytorch_lightning as pl

        from lightning_rl.callbacks.episodes import iteration_infos

        curve = self

        class Recorder(pl.Callback):
            def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, index: int) -> None:
                for info in iteration_infos(batch):
                    curve.add(info.get("episode_returns", []), info.get("episode_lengths", []))

        return Recorder()


def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import pytorch_lightning as pl
    import torch

    import lightning_rl
    from lightning_rl import evaluate

    torch.set_num_threads(1)
    class_name, settings = config_settings(spec["algo"])
    settings.update(env=spec["env"], seed=spec["seed"], total_env_steps=spec["steps"], evaluation_interval=None,
                    compile=spec["compile"], num_cpu_threads=1)
    if spec.get("learning_starts") is not None and "learning_starts" in settings:
        settings["learning_starts"] = spec["learning_starts"]
    model = getattr(lightning_rl, class_name)(**settings)
    curve = EpisodeCurve()
    with tempfile.TemporaryDirectory(prefix="lightning_rl_mujoco_") as root:
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                             default_root_dir=root, callbacks=[curve.callback()])
        start = time.perf_counter()
        trainer.fit(model)
        fit_s = time.perf_counter() - start
    env_steps = int(model.counters["num_env_steps_sampled"])
    torch.set_num_threads(1)
    returns = [float(r) for r in evaluate(model, num_episodes=EVAL_EPISODES, seed=spec["seed"] + EVAL_SEED_OFFSET)]
    return {"env_steps": env_steps, "fit_s": fit_s, "returns": returns, "eval_mean": float(np.mean(returns)),
            "curve": curve.points}


def run_sb3(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch
    from stable_baselines3 import PPO, SAC, TD3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    algo, env_id, seed = spec["algo"], spec["env"], spec["seed"]
    _, c = config_settings(algo)  # the same numbers as ours
    learning_starts = spec.get("learning_starts")
    venv = make_vec_env(env_id, n_envs=1, seed=seed)
    monitor = venv.envs[0]  # the Monitor: raw training returns, under VecNormalize too
    act = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[c["activation"]]
    common = dict(seed=seed, device="cpu", verbose=0, gamma=c["gamma"], learning_rate=c["lr"])
    if algo == "ppo":
        venv = VecNormalize(venv, norm_obs=True, norm_reward=True, clip_obs=c["observation_clip"],
                            clip_reward=c["reward_clip"], gamma=c["gamma"])
        model = PPO("MlpPolicy", venv, n_steps=c["rollout_fragment_length"], batch_size=c["sgd_minibatch_size"],
                    n_epochs=c["num_sgd_iter"], gae_lambda=c["lambda_"], clip_range=c["clip_param"],
                    ent_coef=c["entropy_coeff"], vf_coef=c["vf_loss_coeff"], max_grad_norm=c["grad_clip"],
                    policy_kwargs={"net_arch": list(c["hiddens"]), "activation_fn": act}, **common)
    else:
        off = dict(buffer_size=c["buffer_size"], batch_size=c["train_batch_size"], tau=c["tau"],
                   train_freq=c["train_freq"], gradient_steps=c["num_gradient_steps"],
                   learning_starts=c["learning_starts"] if learning_starts is None else learning_starts,
                   policy_kwargs={"net_arch": list(c["hiddens"]), "activation_fn": act})
        if algo == "sac":
            model = SAC("MlpPolicy", venv, ent_coef=f"auto_{c['initial_alpha']}", target_entropy="auto", **off,
                        **common)
        else:
            n = venv.action_space.shape[0]
            # ours adds noise of std 0.1 in the [-1, 1] scale; Hopper/HalfCheetah/Walker2d act in [-1, 1]
            noise = NormalActionNoise(np.zeros(n), c["action_noise_sigma"] * np.ones(n))
            model = TD3("MlpPolicy", venv, action_noise=noise, policy_delay=c["policy_delay"],
                        target_policy_noise=c["target_policy_noise"], target_noise_clip=c["target_noise_clip"],
                        **off, **common)
    start = time.perf_counter()
    model.learn(total_timesteps=spec["steps"])
    fit_s = time.perf_counter() - start
    env_steps = int(model.num_timesteps)
    torch.set_num_threads(1)
    eval_env = make_vec_env(env_id, n_envs=1, seed=seed + EVAL_SEED_OFFSET)
    if algo == "ppo":
        eval_env = VecNormalize(eval_env, training=False, norm_obs=True, norm_reward=False,
                                clip_obs=c["observation_clip"], gamma=c["gamma"])
        eval_env.obs_rms = model.get_env().obs_rms.copy()
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True,
                                 return_episode_rewards=True)
    eval_env.close()
    model.get_env().close()
    returns = [float(r) for r in returns]
    curve = EpisodeCurve()
    curve.add(monitor.get_episode_rewards(), monitor.get_episode_lengths())
    return {"env_steps": env_steps, "fit_s": fit_s, "returns": returns, "eval_mean": float(np.mean(returns)),
            "curve": curve.points}


def run_child(spec_json: str, result_path: str) -> None:
    silence()
    spec = json.loads(spec_json)
    try:
        result = (run_ours if spec["side"] == "ours" else run_sb3)(spec)
        result["error"] = None
    except Exception as e:  # a non-finite loss or another failure: reported in the table, not fatal
        result = {"env_steps": None, "fit_s": None, "returns": [], "eval_mean": None,
                  "error": f"{type(e).__name__}: {e}"[:500]}
    tmp = Path(result_path).with_suffix(".tmp")
    tmp.write_text(json.dumps({**spec, **json_safe(result)}))
    tmp.replace(result_path)


# --------------------------------------------------------------------------- the runs (parent process)
def start(spec: dict[str, Any], workdir: Path, index: int) -> tuple[dict[str, Any], subprocess.Popen, Path, Path]:
    result_path, log_path = workdir / f"run{index}.json", workdir / f"run{index}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", PARENT_PID_ENV: str(os.getpid())}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--run-one", json.dumps(spec),
                                 "--result", str(result_path)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=workdir)  # MuJoCo writes MUJOCO_LOG.TXT here
    return spec, proc, result_path, log_path


def finish(spec: dict[str, Any], proc: subprocess.Popen, result_path: Path, log_path: Path) -> dict[str, Any]:
    if result_path.exists():
        run = json.loads(result_path.read_text())
    else:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        run = {**spec, "env_steps": None, "fit_s": None, "returns": [], "eval_mean": None,
               "error": f"exit {proc.returncode} without a result: {tail}"[-1500:]}
    run["steps_per_s"] = run["env_steps"] / run["fit_s"] if run.get("fit_s") else None
    return run


def progress_line(run: dict[str, Any]) -> str:
    head = f"[{run['env']} {run['algo']} {run['side']:<4} seed {run['seed']}]"
    if run.get("error"):
        return f"{head} failed: {run['error'][:300]}"
    return (f"{head} {run['env_steps']:,} steps in {run['fit_s']:.1f}s = {run['steps_per_s']:,.0f} steps/s; "
            f"greedy {run['eval_mean']:.1f} ({EVAL_EPISODES} episodes)")


def run_all(specs: list[dict[str, Any]], workers: int, wait_lock: str | None,
            save: Path | None, meta: dict[str, Any]) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    pending = list(enumerate(specs))
    running: list[tuple[dict[str, Any], subprocess.Popen, Path, Path]] = []
    with tempfile.TemporaryDirectory(prefix="lightning_rl_mujoco_runs_") as tmp:
        workdir = Path(tmp)
        try:
            while pending or running:
                while pending and len(running) < workers:
                    while wait_lock and os.path.exists(wait_lock):
                        time.sleep(20)
                    index, spec = pending.pop(0)
                    running.append(start(spec, workdir, index))
                time.sleep(0.5)
                for item in list(running):
                    if item[1].poll() is not None:
                        running.remove(item)
                        run = finish(*item)
                        runs.append(run)
                        print(progress_line(run), flush=True)
                        if save is not None:
                            save.write_text(json.dumps(json_safe({**meta, "runs": runs})))
        finally:
            for _, proc, _, _ in running:
                proc.kill()
                proc.wait()
    return runs


# --------------------------------------------------------------------------- the table
def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


def published(algo: str, env: str, steps: int) -> tuple[float | None, str]:
    entry = PUBLISHED.get((algo, env.split("-")[0]))
    if entry is None or entry[0] != steps:
        return None, "—"
    return entry[1], PUBLISHED_SOURCE


def quarter_means(curve: Sequence[Sequence[float]] | None, steps: int) -> list[float | None]:
    """The mean return of the training episodes that ended in each quarter of ``steps``."""
    quarters: list[list[float]] = [[], [], [], []]
    for end, value in curve or ():
        quarters[min(3, max(0, math.ceil(4 * end / steps) - 1))].append(value)
    return [statistics.fmean(q) if q else None for q in quarters]


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    keys: list[tuple[str, str, int]] = []
    for run in runs:
        key = (run["env"], run["algo"], run["steps"])
        if key not in keys:
            keys.append(key)
    for env, algo, steps in keys:
        row: dict[str, Any] = {"env": env, "algo": algo, "env_steps": steps}
        for side in ("ours", "sb3"):
            side_runs = sorted((r for r in runs if (r["env"], r["algo"], r["steps"], r["side"]) == (env, algo, steps,
                                                                                                  side)),
                               key=lambda r: r["seed"])
            returns = [r["eval_mean"] for r in side_runs if finite(r.get("eval_mean"))]
            rates = [r["steps_per_s"] for r in side_runs if finite(r.get("steps_per_s"))]
            per_seed_quarters = [quarter_means(r.get("curve"), steps) for r in side_runs if r.get("curve")]
            row[side] = {
                "return_mean": mean_std(returns)[0], "return_std": mean_std(returns)[1],
                "steps_per_s": mean_std(rates)[0], "steps_per_s_std": mean_std(rates)[1],
                "seeds": [r["seed"] for r in side_runs], "per_seed_return": [r.get("eval_mean") for r in side_runs],
                "errors": [r.get("error") for r in side_runs],
                "per_seed_quarters": per_seed_quarters,
                "quarters": [mean_std([q[k] for q in per_seed_quarters if q[k] is not None])[0] for k in range(4)],
                "runs": len(side_runs),
                "compile": side_runs[0].get("compile") if side == "ours" and side_runs else None,
            }
        reference = max((m for m in (row["ours"]["return_mean"], row["sb3"]["return_mean"]) if m is not None),
                        default=None)
        flags = []
        for side in ("ours", "sb3"):
            for seed, value, error in zip(row[side]["seeds"], row[side]["per_seed_return"], row[side]["errors"]):
                if error and "finite" not in error.lower() and "nan" not in error.lower():
                    flags.append(f"{side} s{seed} failed")
                elif not finite(value):
                    flags.append(f"{side} s{seed} NaN")
                elif reference is not None and reference > 0 and value < COLLAPSE_FRACTION * reference:
                    flags.append(f"{side} s{seed} collapsed")
        row["flags"] = flags
        # a ratio of returns says nothing where SB3's mean is not positive (-283 / -48 would read 5.9)
        sb3_mean = row["sb3"]["return_mean"]
        row["return_ratio"] = ratio(row["ours"]["return_mean"], sb3_mean) if sb3_mean and sb3_mean > 0 else None
        row["speed_ratio"] = ratio(row["ours"]["steps_per_s"], row["sb3"]["steps_per_s"])
        row["published_return"], row["published_source"] = published(algo, env, steps)
        row["return_target_met"] = None if row["return_ratio"] is None else row["return_ratio"] >= RATIO_TARGET
        row["speed_target_met"] = None if row["speed_ratio"] is None else row["speed_ratio"] >= SPEED_TARGET
        rows.append(row)
    return rows


def fmt(mean: float | None, std: float | None, digits: int = 0) -> str:
    return "—" if mean is None else f"{mean:,.{digits}f} ± {std:,.{digits}f}"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| env | algo | env steps | seeds | ours (greedy, 10 ep) | SB3 (greedy, 10 ep) | ratio | ours steps/s | "
        "SB3 steps/s | speed | published | source | flags |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        o, s = row["ours"], row["sb3"]
        seeds = ",".join(str(x) for x in sorted(set(o["seeds"]) | set(s["seeds"])))
        r = "—" if row["return_ratio"] is None else f"{row['return_ratio']:.2f}"
        v = "—" if row["speed_ratio"] is None else f"{row['speed_ratio']:.2f}x"
        pub = "—" if row["published_return"] is None else f"{row['published_return']:,.0f}"
        lines.append(
            f"| {row['env']} | {row['algo'].upper()}{'' if o['compile'] is not False else ' (eager)'} | "
            f"{row['env_steps']:,} | {seeds} | {fmt(o['return_mean'], o['return_std'])} | "
            f"{fmt(s['return_mean'], s['return_std'])} | {r} | {fmt(o['steps_per_s'], o['steps_per_s_std'])} | "
            f"{fmt(s['steps_per_s'], s['steps_per_s_std'])} | {v} | {pub} | {row['published_source']} | "
            f"{'; '.join(row['flags']) or '—'} |"
        )
    return "\n".join(lines)


def curve_table(rows: Sequence[dict[str, Any]]) -> str:
    """Training returns (exploring, as the sampler saw them) by quarter of each run's budget:
    the mean over seeds of each seed's mean over the episodes that ended in that quarter."""
    lines = ["| env | algo | side | 1st quarter | 2nd | 3rd | 4th | per seed, 4th quarter |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for row in rows:
        for side, name in (("ours", "ours"), ("sb3", "SB3")):
            q = row[side].get("quarters") or []
            if not any(v is not None for v in q):
                continue
            last = ", ".join("—" if p[3] is None else f"{p[3]:,.0f}" for p in row[side]["per_seed_quarters"])
            cells = " | ".join("—" if v is None else f"{v:,.0f}" for v in q)
            lines.append(f"| {row['env']} | {row['algo'].upper()} | {name} | {cells} | {last} |")
    return "\n".join(lines)


def plot_curves(runs: Sequence[dict[str, Any]], path: Path, window: int = 10) -> None:
    """One panel per (env, algorithm, budget): every seed's training return (mean of the last
    ``window`` episodes) against env steps, ours and SB3 in two colours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys((r["env"], r["algo"], r["steps"]) for r in runs if r.get("curve")))
    if not keys:
        raise SystemExit("--plot: no run carries a training curve")
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6), squeeze=False)
    for ax, (env, algo, steps) in zip(axes[0], keys, strict=True):
        for run in runs:
            if (run["env"], run["algo"], run["steps"]) != (env, algo, steps) or not run.get("curve"):
                continue
            ends, values = zip(*run["curve"], strict=True)
            smooth = [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]
            ax.plot(ends, smooth, color="tab:blue" if run["side"] == "ours" else "tab:orange", alpha=0.8,
                    linewidth=1, label=f"{'ours' if run['side'] == 'ours' else 'SB3'} s{run['seed']}")
        ax.set_title(f"{algo.upper()} {env}")
        ax.set_xlabel("env steps")
        ax.set_ylabel(f"training return (mean of last {window})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def versions() -> dict[str, Any]:
    from importlib.metadata import version

    import gymnasium
    import mujoco
    import pytorch_lightning as pl
    import stable_baselines3
    import torch

    import lightning_rl

    return {"python": platform.python_version(), "torch": torch.__version__, "pytorch_lightning": pl.__version__,
            "stable_baselines3": stable_baselines3.__version__, "gymnasium": gymnasium.__version__,
            "mujoco": getattr(mujoco, "__version__", None) or version("mujoco"),
            "lightning_rl": lightning_rl.__version__, "cpus": os.cpu_count()}


def load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


# --------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Columns, settings and conventions: see the module docstring.")
    p.add_argument("--envs", default=",".join(ENVS), help=f"comma-separated MuJoCo ids (default {','.join(ENVS)})")
    p.add_argument("--algos", default=",".join(ALGOS), help="comma-separated subset of ppo,sac,td3 (default all)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, the same on both sides (default 0,1,2)")
    p.add_argument("--ppo-steps", type=int, default=DEFAULT_STEPS["ppo"], help="PPO env steps per run (default 1M)")
    p.add_argument("--sac-steps", type=int, default=DEFAULT_STEPS["sac"], help="SAC env steps per run (default 300k)")
    p.add_argument("--td3-steps", type=int, default=DEFAULT_STEPS["td3"], help="TD3 env steps per run (default 300k)")
    p.add_argument("--learning-starts", type=int, default=None,
                   help="SAC/TD3 random steps before learning, both sides (default: the configs' 10000)")
    p.add_argument("--compile", choices=("on", "off"), default="on",
                   help="ours with compile=True (on, default) or eager")
    p.add_argument("--sides", default="ours,sb3", help="comma-separated subset of ours,sb3 (default both)")
    p.add_argument("--workers", type=int, default=1,
                   help="runs at a time, one process and torch thread each (default 1)")
    p.add_argument("--wait-lock", default=None, help="before each run starts, wait while this path exists")
    p.add_argument("--save", type=Path, default=None, help="write every finished run as JSON here after each run")
    p.add_argument("--plot", type=Path, default=None,
                   help="draw every run's training curve into this image (needs matplotlib)")
    p.add_argument("--from-json", default=None, help="comma-separated --save files: print their table, run nothing")
    p.add_argument("--run-one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    args.algos = [a.strip().lower() for a in args.algos.split(",") if a.strip()]
    args.sides = [s.strip().lower() for s in args.sides.split(",") if s.strip()]
    if set(args.algos) - set(ALGOS) or not args.algos:
        p.error(f"--algos: choose from {','.join(ALGOS)}")
    if set(args.sides) - {"ours", "sb3"} or not args.sides:
        p.error("--sides: choose from ours,sb3")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error("--seeds: comma-separated integers")
    if args.workers < 1 or min(args.ppo_steps, args.sac_steps, args.td3_steps) < 1:
        p.error("--workers and the step budgets must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_one is not None:
        die_with_parent()  # (the kernel kills a run whose benchmark process died, however it ended)
        run_child(args.run_one, args.result)
        return 0
    load_start = load_average()
    if args.from_json:
        runs: list[dict[str, Any]] = []
        for path in args.from_json.split(","):
            runs.extend(json.loads(Path(path).read_text())["runs"])
        meta: dict[str, Any] = {"from_json": args.from_json.split(",")}
    else:
        budgets = {"ppo": args.ppo_steps, "sac": args.sac_steps, "td3": args.td3_steps}
        meta = {
            "envs": args.envs, "algos": args.algos, "seeds": args.seeds, "budgets": budgets,
            "learning_starts": args.learning_starts, "compile": args.compile == "on", "workers": args.workers,
            "eval_episodes": EVAL_EPISODES, "eval_seed_offset": EVAL_SEED_OFFSET, "versions": versions(),
            "load_avg_start": load_start, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        specs = [
            {"env": env, "algo": algo, "seed": seed, "side": side, "steps": budgets[algo],
             "compile": args.compile == "on" if side == "ours" else None, "learning_starts": args.learning_starts}
            for env in args.envs for algo in args.algos for seed in args.seeds for side in args.sides
        ]
        print(f"{meta['versions']}; {len(specs)} runs, {args.workers} at a time; load average at start {load_start}",
              flush=True)
        runs = run_all(specs, args.workers, args.wait_lock, args.save, meta)
    rows = summarize(runs)
    load_end = load_average()
    print()
    print(markdown_table(rows))
    if any(row[side].get("per_seed_quarters") for row in rows for side in ("ours", "sb3")):
        print("\nTraining returns by quarter of the budget (exploring; mean over seeds):\n")
        print(curve_table(rows))
    if args.plot is not None:
        plot_curves(runs, args.plot)
        print(f"\ncurves: {args.plot}")
    print(f"\nload average at end {load_end}", flush=True)
    report = {**meta, "load_avg_start": meta.get("load_avg_start", load_start), "load_avg_end": load_end,
              "targets": {"return_ratio": RATIO_TARGET, "speed_ratio": SPEED_TARGET}, "rows": rows, "runs": runs}
    sys.stdout.write(json.dumps(json_safe(report)) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
