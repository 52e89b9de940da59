"""Benchmark lightning_rl's PPO, A2C, DQN and SAC against Stable-Baselines3.

PPO, A2C and DQN run on CartPole-v1, SAC on Pendulum-v1. Both implementations get the
rl-baselines3-zoo hyperparameters:

* PPO: 8 envs, 32 steps per env per iteration, batch 256 (one minibatch), 20 epochs, lr 1e-3 and
  clip range 0.2 both decaying linearly to 0, gamma 0.98, GAE lambda 0.8, no entropy bonus,
  value loss coefficient 0.5, grad-norm clip 0.5; 100k env steps.
* A2C: 8 envs, 5 steps per env per iteration, RMSprop (alpha 0.99, eps 1e-5), lr 7e-4, gamma 0.99,
  GAE lambda 1.0, no entropy bonus, no advantage normalization; 500k env steps.
* DQN (plain: SB3 has no double Q, dueling heads or n-step returns, so ours runs with
  ``double_q=False, dueling=False, n_step=1``): 1 env, lr 2.3e-3 constant (ours' DQN decays its
  rate linearly unless told otherwise: ``lr_schedule="constant"``), batch 64, buffer 100k,
  learning_starts 1000, gamma 0.99, hard target update (tau 1) every 10 env steps, train_freq 256
  with 128 gradient steps, epsilon 1 -> 0.04 over the first 16% of the budget (8000 steps),
  MLP [256, 256] ReLU, Huber loss, grad-norm clip 10; 50k env steps.
* SAC on Pendulum-v1: 1 env, lr 1e-3 (actor, critics and temperature), buffer 1M,
  learning_starts 100, batch 256, tau 0.005, gamma 0.99, train_freq 1, 1 gradient step,
  automatic entropy tuning from alpha 1.0 towards target entropy -dim(A), MLP [256, 256] ReLU;
  20k env steps.

``--compile off,on`` (the default) runs ours eagerly and with ``compile=True`` (labels ``+c``).
In one process the warm-up run pays the first compile (dynamo's trace of each update step,
inductor's code from its on-disk cache or built) and prints its time; later fits of the same
settings reuse its graphs (``compiled_code.shared_code``), as a sweep's trials do.
``--process-per-fit`` runs every fit, SB3's too, in a fresh Python process of its own instead:
each fit then pays imports' first calls and the whole compile (inductor's disk cache warmed by
the warm-up process), as a user's single run does.

Before the timed runs each implementation trains briefly untimed (``--no-warmup`` skips this:
two iterations for PPO/A2C; for DQN and SAC until a little past ``learning_starts`` so that
gradient steps run too: 1280 and 200 env steps), so the first timed run does not pay for lazy
imports and first-call set-up. Runs alternate within one invocation (ours-sync seed 0, ours-vec
seed 0, sb3 seed 0, ours-sync seed 1, ...), so slow drifts in machine load hit all
implementations alike.

Measured per run:

* ``steps/s``: env steps sampled (``model.counters["num_env_steps_sampled"]`` / SB3's
  ``num_timesteps``) divided by the wall time of ``trainer.fit`` / ``model.learn``. Env and
  model construction outside those calls is not timed (milliseconds for CartPole).
* ``solve s``: wall time from the start of ``fit`` / ``learn`` until the mean training return of
  the last 20 finished episodes first reaches >= 475 (CartPole: PPO, A2C, DQN), or of the last
  10 episodes reaches >= -200 (Pendulum: SAC); ``None`` if never. The check runs once per
  iteration, right after the rollout was sampled and before the update on it, for both (ours in
  ``on_train_batch_start``, SB3 in ``_on_rollout_end``; for SAC an iteration is one env step),
  so neither is charged for the update on the batch that solved. ``solve steps`` is the
  env-step count at that moment. DQN's training returns include epsilon-greedy exploration.
* ``eval`` (DQN and SAC only): after ``fit`` / ``learn``, untimed, the mean return of 10 greedy
  episodes on a fresh env (ours: ``lightning_rl.evaluate(model, num_episodes=10, seed=...)``,
  10 envs, one episode each; SB3: ``evaluate_policy(..., n_eval_episodes=10,
  deterministic=True)`` on one env seeded alike). The table shows its mean ± std over seeds.

Known differences between the two implementations (not benchmark artifacts):

* SB3 standardizes PPO advantages per minibatch, lightning_rl per iteration batch; with
  batch 256 = minibatch 256 the two coincide here.
* lightning_rl uses gymnasium's next-step autoreset: the step after an episode end only resets
  the env. It counts as an env step but is dropped from the training batch (about 1 row per
  finished episode; for off-policy ones no transition is stored); SB3's VecEnvs reset within
  the same step. So ours plays slightly fewer episodes per budget (Pendulum: 1 in 201 steps).
* Linear schedules: lightning_rl evaluates them at the env steps sampled *before* the current
  rollout, SB3 after it (one iteration apart: 256 of 100k steps for PPO).
* DQN target network: SB3 copies it every 10 env steps while collecting; ours checks after
  every gradient step against the global env steps, so it is due at the first gradient step of
  each iteration. The online network does not change while collecting, so in both the target
  equals the network at the end of the last training phase.
* SAC/DQN ``learning_starts``: SB3 trains once ``num_timesteps > learning_starts``, ours once
  ``>=`` (SAC: from env step 100 instead of 101; DQN: both first train at 1024).

Threads: ``torch.set_num_threads(--threads)`` (default 1) is applied once, for both, and
re-asserted before every run; ours also gets ``num_cpu_threads=--threads`` (the modules set the
thread count during ``fit`` themselves). More threads than idle cores slows both down badly.
Both sample in the training process, one Python env object per env for ``sync`` and SB3's
``DummyVecEnv``; ``ours-vec`` uses gymnasium's numpy-batched CartPole
(``vectorization="vector_entry_point"``), which SB3 has no counterpart for. ``--vectorization``
applies to PPO and A2C only: DQN and SAC run one env, ours always with ``vectorization="sync"``.

Ours runs as a user would run it: with the ``LearnerInfoCallback`` and ``RolloutMetricsCallback``
the modules add by default, which call ``LightningModule.log`` each iteration even with
``logger=False`` (at Lightning's ``log_every_n_steps`` cadence). ``--steps-scale`` also shortens
the linear schedules (they decay to 0 over the scaled budget) and DQN's epsilon schedule (16% of
the scaled budget, on both sides), so scaled-down runs need not solve.

Usage::

    python benchmarks/compare_sb3.py                                   # PPO and A2C, 3 seeds
    python benchmarks/compare_sb3.py --algos ppo --seeds 5
    python benchmarks/compare_sb3.py --algos dqn,sac --seeds 2         # the off-policy pair
    python benchmarks/compare_sb3.py --algos all                       # all four (long)
    python benchmarks/compare_sb3.py --seeds 1 --steps-scale 0.2      # quick smoke check
    python benchmarks/compare_sb3.py --algos a2c --a2c-steps 100000 --process-per-fit   # a user's single run

``--algos`` defaults to ``ppo,a2c`` (the long-standing default; ``all`` runs all four).

The last stdout line is one JSON object with every figure: per algo its env, solve threshold and
window, budget, per-impl summaries and ours/SB3 ratios, plus every run.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from learning import PARENT_PID_ENV, die_with_parent  # benchmarks/learning.py

if __name__ == "__main__":
    die_with_parent()  # a --process-per-fit child: the kernel kills it when its benchmark process dies

warnings.filterwarnings("ignore")
os.environ.setdefault("PYTHONWARNINGS", "ignore")

import numpy as np  # noqa: E402
import pytorch_lightning as pl  # noqa: E402
import stable_baselines3  # noqa: E402
import torch  # noqa: E402
from stable_baselines3 import A2C as SB3A2C  # noqa: E402
from stable_baselines3 import DQN as SB3DQN  # noqa: E402
from stable_baselines3 import PPO as SB3PPO  # noqa: E402
from stable_baselines3 import SAC as SB3SAC  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402

import lightning_rl  # noqa: E402
from lightning_rl import A2C, DQN, PPO, SAC, evaluate  # noqa: E402

ENV_ID = "CartPole-v1"
SOLVE_THRESHOLD = 475.0
SOLVE_WINDOW = 20
ALGOS = ("ppo", "a2c", "dqn", "sac")
ENV_IDS = {"ppo": ENV_ID, "a2c": ENV_ID, "dqn": ENV_ID, "sac": "Pendulum-v1"}
# (threshold, window) of the training-return mean that counts as solved
SOLVE_CRITERIA = {"ppo": (475.0, 20), "a2c": (475.0, 20), "dqn": (475.0, 20), "sac": (-200.0, 10)}
DEFAULT_STEPS = {"ppo": 100_000, "a2c": 500_000, "dqn": 50_000, "sac": 20_000}
# PPO/A2C: two iterations; DQN/SAC: past learning_starts, so gradient steps are warmed up too
WARMUP_STEPS = {"ppo": 512, "a2c": 80, "dqn": 1280, "sac": 200}
OFF_POLICY = ("dqn", "sac")
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 10_000  # greedy evaluation env seed = run seed + this, the same on both sides
VECTORIZATION_LABELS = {"sync": "ours-sync", "vector_entry_point": "ours-vec"}


def label(vectorization: str, compile: bool) -> str:
    return VECTORIZATION_LABELS.get(vectorization, f"ours-{vectorization}") + ("+c" if compile else "")


def silence() -> None:
    """Quiet Lightning's banners ("GPU available", tips) and all warnings."""
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


# --------------------------------------------------------------------------- measurement
class SolveTracker:
    """Rolling window of episode returns; records when its mean first reaches the threshold."""

    def __init__(self, window: int = SOLVE_WINDOW, threshold: float = SOLVE_THRESHOLD) -> None:
        self.returns: deque[float] = deque(maxlen=window)
        self.threshold = threshold
        self.start = time.perf_counter()
        self.episodes = 0
        self.solve_s: float | None = None
        self.solve_steps: int | None = None

    def add(self, returns: Sequence[float]) -> None:
        self.returns.extend(float(r) for r in returns)
        self.episodes += len(returns)

    def check(self, env_steps: int) -> None:
        if self.solve_s is not None or len(self.returns) < (self.returns.maxlen or 0):
            return
        if sum(self.returns) / len(self.returns) >= self.threshold:
            self.solve_s = time.perf_counter() - self.start
            self.solve_steps = int(env_steps)

    def last_mean(self) -> float | None:
        return sum(self.returns) / len(self.returns) if self.returns else None


class OursSolveCallback(pl.Callback):
    """Feeds each training step's finished episodes to the tracker (of each of its iterations
    with ``iterations_per_step``), after the step."""

    def __init__(self, tracker: SolveTracker) -> None:
        self.tracker = tracker

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.tracker.add(batch.info["episode_returns"])
        self.tracker.check(pl_module.counters["num_env_steps_sampled"])


class SB3SolveCallback(BaseCallback):
    """Collects Monitor episode returns each env step; checks the window at rollout end."""

    def __init__(self, tracker: SolveTracker) -> None:
        super().__init__(verbose=0)
        self.tracker = tracker

    def _on_step(self) -> bool:
        returns = [info["episode"]["r"] for info in self.locals["infos"] if "episode" in info]
        if returns:
            self.tracker.add(returns)
        return True

    def _on_rollout_end(self) -> None:
        self.tracker.check(self.num_timesteps)


@dataclass
class RunResult:
    algo: str
    impl: str
    seed: int
    env_steps: int
    wall_s: float
    steps_per_s: float
    solve_s: float | None
    solve_steps: int | None
    episodes: int
    final_mean_return: float | None
    eval_mean_return: float | None = None  # greedy evaluation after training (DQN, SAC)
    eval_std_return: float | None = None


# --------------------------------------------------------------------------- runners
def linear_schedule(initial: float) -> Callable[[float], float]:
    """SB3 schedule: ``initial`` at progress_remaining 1, 0 at progress_remaining 0."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * initial

    return schedule


def dqn_epsilon_steps(steps: int) -> int:
    """SB3's ``exploration_fraction=0.16`` of the run's budget, in env steps (8000 of 50k)."""
    return max(1, int(0.16 * steps))


def build_ours(algo: str, seed: int, steps: int, vectorization: str, threads: int, compile: bool = False) -> Any:
    # The modules set torch's intra-op threads during fit (``num_cpu_threads``, default 1): pass
    # --threads so both implementations run with the same count.
    extra: dict[str, Any] = {"compile": compile}
    cls = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "sac": SAC}[algo]
    if "num_cpu_threads" in inspect.signature(cls.__init__).parameters:
        extra["num_cpu_threads"] = threads
    if algo == "dqn":
        return DQN(
            env=ENV_IDS["dqn"], num_envs=1, lr=2.3e-3, lr_schedule="constant", gamma=0.99, buffer_size=100_000,
            learning_starts=1000, train_freq=256, num_gradient_steps=128, train_batch_size=64, n_step=1, grad_clip=10.0,
            hiddens=(256, 256), activation="relu", double_q=False, dueling=False, target_network_update_freq=10,
            tau=1.0, epsilon_start=1.0, epsilon_end=0.04, epsilon_timesteps=dqn_epsilon_steps(steps),
            prioritized_replay=False, seed=seed, total_env_steps=steps, vectorization=vectorization, **extra,
        )
    if algo == "sac":
        return SAC(
            env=ENV_IDS["sac"], num_envs=1, lr=1e-3, gamma=0.99, buffer_size=1_000_000, learning_starts=100,
            train_freq=1, num_gradient_steps=1, train_batch_size=256, n_step=1, grad_clip=None,
            hiddens=(256, 256), activation="relu", tau=0.005, target_network_update_freq=1, initial_alpha=1.0,
            target_entropy="auto", prioritized_replay=False, seed=seed, total_env_steps=steps,
            vectorization=vectorization, **extra,
        )
    if algo == "ppo":
        return PPO(
            env=ENV_ID, num_envs=8, rollout_fragment_length=32, num_sgd_iter=20, sgd_minibatch_size=256,
            lr=1e-3, lr_schedule="linear", clip_param=0.2, clip_param_schedule="linear", gamma=0.98,
            lambda_=0.8, entropy_coeff=0.0, vf_loss_coeff=0.5, grad_clip=0.5, seed=seed,
            total_env_steps=steps, vectorization=vectorization, **extra,
        )
    return A2C(
        env=ENV_ID, num_envs=8, rollout_fragment_length=5, lr=7e-4, gamma=0.99, lambda_=1.0,
        vf_loss_coeff=0.5, entropy_coeff=0.0, grad_clip=0.5, optimizer="rmsprop", standardize_fields=(),
        seed=seed, total_env_steps=steps, vectorization=vectorization, **extra,
    )


def eval_stats(returns: Sequence[float]) -> tuple[float, float]:
    return float(np.mean(returns)), float(np.std(returns))


def run_ours(algo: str, seed: int, steps: int, vectorization: str, threads: int, final_eval: bool = True,
             compile: bool = False) -> RunResult:
    model = build_ours(algo, seed, steps, vectorization, threads, compile)
    tracker = SolveTracker(*SOLVE_CRITERIA[algo][::-1])
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[OursSolveCallback(tracker)],
    )
    tracker.start = start = time.perf_counter()
    trainer.fit(model)
    wall = time.perf_counter() - start
    env_steps = int(model.counters["num_env_steps_sampled"])
    eval_mean = eval_std = None
    if final_eval and algo in OFF_POLICY:  # untimed, greedy
        torch.set_num_threads(threads)
        eval_mean, eval_std = eval_stats(evaluate(model, num_episodes=EVAL_EPISODES, seed=seed + EVAL_SEED_OFFSET))
    return RunResult(
        algo, label(vectorization, compile), seed, env_steps, wall,
        env_steps / wall, tracker.solve_s, tracker.solve_steps, tracker.episodes, tracker.last_mean(),
        eval_mean, eval_std,
    )


def build_sb3(algo: str, seed: int, steps: int) -> Any:
    if algo == "dqn":
        venv = make_vec_env(ENV_IDS["dqn"], n_envs=1, seed=seed)
        return SB3DQN(
            "MlpPolicy", venv, learning_rate=2.3e-3, buffer_size=100_000, learning_starts=1000, batch_size=64,
            tau=1.0, gamma=0.99, train_freq=256, gradient_steps=128, n_steps=1, target_update_interval=10,
            exploration_fraction=dqn_epsilon_steps(steps) / steps, exploration_initial_eps=1.0,
            exploration_final_eps=0.04, max_grad_norm=10.0,
            policy_kwargs={"net_arch": [256, 256], "activation_fn": torch.nn.ReLU}, seed=seed, device="cpu",
            verbose=0,
        )
    if algo == "sac":
        venv = make_vec_env(ENV_IDS["sac"], n_envs=1, seed=seed)
        return SB3SAC(
            "MlpPolicy", venv, learning_rate=1e-3, buffer_size=1_000_000, learning_starts=100, batch_size=256,
            tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, n_steps=1, ent_coef="auto",
            target_update_interval=1, target_entropy="auto",
            policy_kwargs={"net_arch": [256, 256], "activation_fn": torch.nn.ReLU}, seed=seed, device="cpu",
            verbose=0,
        )
    if algo == "ppo":
        venv = make_vec_env(ENV_ID, n_envs=8, seed=seed)
        return SB3PPO(
            "MlpPolicy", venv, n_steps=32, batch_size=256, n_epochs=20, gae_lambda=0.8, gamma=0.98,
            learning_rate=linear_schedule(1e-3), clip_range=linear_schedule(0.2), ent_coef=0.0,
            vf_coef=0.5, max_grad_norm=0.5, seed=seed, device="cpu", verbose=0,
        )
    venv = make_vec_env(ENV_ID, n_envs=8, seed=seed)
    return SB3A2C(
        "MlpPolicy", venv, n_steps=5, learning_rate=7e-4, gamma=0.99, gae_lambda=1.0, ent_coef=0.0,
        vf_coef=0.5, max_grad_norm=0.5, seed=seed, device="cpu", verbose=0,
    )


def run_sb3(algo: str, seed: int, steps: int, threads: int = 1, final_eval: bool = True) -> RunResult:
    model = build_sb3(algo, seed, steps)
    tracker = SolveTracker(*SOLVE_CRITERIA[algo][::-1])
    callback = SB3SolveCallback(tracker)
    tracker.start = start = time.perf_counter()
    model.learn(total_timesteps=steps, callback=callback)
    wall = time.perf_counter() - start
    env_steps = int(model.num_timesteps)
    model.get_env().close()
    eval_mean = eval_std = None
    if final_eval and algo in OFF_POLICY:  # untimed, greedy
        torch.set_num_threads(threads)
        eval_env = make_vec_env(ENV_IDS[algo], n_envs=1, seed=seed + EVAL_SEED_OFFSET)
        returns, _ = evaluate_policy(
            model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True, return_episode_rewards=True
        )
        eval_env.close()
        eval_mean, eval_std = eval_stats(returns)
    return RunResult(
        algo, "sb3", seed, env_steps, wall, env_steps / wall, tracker.solve_s, tracker.solve_steps,
        tracker.episodes, tracker.last_mean(), eval_mean, eval_std,
    )


# --------------------------------------------------------------------------- reporting
def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(mean: float | None, std: float | None, digits: int = 1) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def summarize(results: list[RunResult], impls: list[str]) -> dict[str, Any]:
    """Per impl: steps/s and solve time mean/std, solved count; ratios of each ours-* to SB3."""
    out: dict[str, Any] = {}
    for impl in impls:
        runs = [r for r in results if r.impl == impl]
        if not runs:
            continue
        sps_mean, sps_std = mean_std([r.steps_per_s for r in runs])
        sps_median = statistics.median([r.steps_per_s for r in runs])
        solved = [r for r in runs if r.solve_s is not None]
        solve_mean, solve_std = mean_std([r.solve_s for r in solved])  # type: ignore[misc]
        steps_mean, _ = mean_std([float(r.solve_steps) for r in solved])  # type: ignore[arg-type]
        evals = [r.eval_mean_return for r in runs if r.eval_mean_return is not None]
        eval_mean, eval_std = mean_std(evals)
        out[impl] = {
            "steps_per_s": sps_mean,
            "steps_per_s_std": sps_std,
            "steps_per_s_median": sps_median,
            "solve_s": solve_mean,
            "solve_s_std": solve_std,
            "solve_steps": steps_mean,
            "solved": len(solved),
            "runs": len(runs),
            "eval_return": eval_mean,  # mean over seeds of each run's 10-episode greedy mean
            "eval_return_std": eval_std,  # std over seeds
        }
    ratios: dict[str, Any] = {}
    sb3 = out.get("sb3")
    for impl, stats in out.items():
        if impl == "sb3" or sb3 is None:
            continue
        ratios[impl] = {
            "steps_per_s_ours_over_sb3": ratio(stats["steps_per_s"], sb3["steps_per_s"]),
            "median_steps_per_s_ours_over_sb3": ratio(stats["steps_per_s_median"], sb3["steps_per_s_median"]),
            "solve_s_sb3_over_ours": ratio(sb3["solve_s"], stats["solve_s"]),
        }
    return {"impls": out, "ratios": ratios}


def print_table(algo: str, steps: int, summary: dict[str, Any]) -> None:
    impls = summary["impls"]
    threshold, window = SOLVE_CRITERIA[algo]
    with_eval = algo in OFF_POLICY
    print(
        f"\n== {algo.upper()} on {ENV_IDS[algo]}, {steps:,} env steps per run; solved = mean training return of "
        f"last {window} episodes >= {threshold:g} =="
    )
    header = f"{'impl':<10} {'steps/s':>18} {'solve s (solved runs)':>24} {'solved':>7} {'solve steps':>12}"
    if with_eval:
        header += f" {'greedy eval (10 ep)':>22}"
    print(header)
    print("-" * len(header))
    for impl, s in impls.items():
        steps_txt = "-" if s["solve_steps"] is None else f"{s['solve_steps']:,.0f}"
        line = (
            f"{impl:<10} {fmt(s['steps_per_s'], s['steps_per_s_std'], 0):>18} "
            f"{fmt(s['solve_s'], s['solve_s_std'], 1):>24} {s['solved']:>3}/{s['runs']:<3} {steps_txt:>12}"
        )
        if with_eval:
            line += f" {fmt(s['eval_return'], s['eval_return_std'], 1):>22}"
        print(line)
    for impl, r in summary["ratios"].items():
        sps = "-" if r["steps_per_s_ours_over_sb3"] is None else f"{r['steps_per_s_ours_over_sb3']:.2f}x"
        med = "-" if r["median_steps_per_s_ours_over_sb3"] is None else f"{r['median_steps_per_s_ours_over_sb3']:.2f}x"
        solve = "-" if r["solve_s_sb3_over_ours"] is None else f"{r['solve_s_sb3_over_ours']:.2f}x"
        print(f"{impl}: steps/s ours/SB3 = {sps} (medians {med}); solve time SB3/ours = {solve} (>1: ours faster)")


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


# --------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per implementation (default 3)")
    p.add_argument(
        "--algos", default="ppo,a2c",
        help="comma-separated subset of ppo,a2c,dqn,sac, or 'all' (default ppo,a2c)",
    )
    p.add_argument("--steps-scale", type=float, default=1.0, help="multiply every env-step budget (quick checks)")
    p.add_argument("--ppo-steps", type=int, default=DEFAULT_STEPS["ppo"], help="PPO env steps (default 100k)")
    p.add_argument("--a2c-steps", type=int, default=DEFAULT_STEPS["a2c"], help="A2C env steps (default 500k)")
    p.add_argument("--dqn-steps", type=int, default=DEFAULT_STEPS["dqn"], help="DQN env steps (default 50k)")
    p.add_argument("--sac-steps", type=int, default=DEFAULT_STEPS["sac"], help="SAC env steps (default 20k)")
    p.add_argument(
        "--vectorization", default="sync,vector_entry_point",
        help="comma-separated vectorizations of ours for PPO/A2C: sync (like SB3's DummyVecEnv) and/or "
        "vector_entry_point (DQN and SAC always run sync)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for both (default 1)")
    p.add_argument("--compile", default="off,on",
                   help="comma-separated compile settings of ours: off and/or on (default both)")
    p.add_argument("--no-sb3", action="store_true", help="run only ours (profiling)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed short run of each impl")
    p.add_argument("--process-per-fit", action="store_true",
                   help="every fit (warm-up and timed) in a fresh Python process, as a user's single run pays it")
    p.add_argument("--run-one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run_one is not None:
        return args
    args.algos = [a.strip().lower() for a in args.algos.split(",") if a.strip()]
    if args.algos == ["all"]:
        args.algos = list(ALGOS)
    unknown = set(args.algos) - set(ALGOS)
    if unknown:
        p.error(f"unknown algos {sorted(unknown)}; choose from {','.join(ALGOS)} or all")
    args.vectorization = [v.strip() for v in args.vectorization.split(",") if v.strip()]
    bad = set(args.vectorization) - set(VECTORIZATION_LABELS)
    if bad:
        p.error(f"unknown vectorization {sorted(bad)}; choose from {sorted(VECTORIZATION_LABELS)}")
    args.compile = [c.strip() == "on" for c in args.compile.split(",") if c.strip()]
    if args.seeds < 1 or args.threads < 1 or args.steps_scale <= 0:
        p.error("--seeds, --threads and --steps-scale must be positive")
    return args


def run_job(algo: str, seed: int, steps: int, job: tuple[str, bool] | None, threads: int, final_eval: bool,
            process_per_fit: bool) -> RunResult:
    """One fit, SB3's (``job`` None) or ours (vectorization, compile); with ``process_per_fit`` in
    a fresh Python process of this script (``--run-one``), its result read back as JSON."""
    if not process_per_fit:
        torch.set_num_threads(threads)
        if job is None:
            return run_sb3(algo, seed, steps, threads, final_eval=final_eval)
        return run_ours(algo, seed, steps, job[0], threads, final_eval=final_eval, compile=job[1])
    spec = json.dumps({"algo": algo, "seed": seed, "steps": steps, "job": job, "threads": threads,
                       "final_eval": final_eval})
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--run-one", spec], capture_output=True,
                          text=True, check=False, env={**os.environ, PARENT_PID_ENV: str(os.getpid())})
    if proc.returncode != 0:
        raise RuntimeError(f"{algo} {job} seed {seed} failed in its process:\n{proc.stderr[-3000:]}")
    return RunResult(**json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    silence()
    if args.run_one is not None:  # a child of --process-per-fit: one fit, its result as the last line
        spec = json.loads(args.run_one)
        job = None if spec["job"] is None else tuple(spec["job"])
        result = run_job(spec["algo"], spec["seed"], spec["steps"], job, spec["threads"], spec["final_eval"], False)
        print(json.dumps(asdict(result)), flush=True)
        return
    torch.set_num_threads(args.threads)
    budgets = {"ppo": args.ppo_steps, "a2c": args.a2c_steps, "dqn": args.dqn_steps, "sac": args.sac_steps}
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, pytorch_lightning {pl.__version__}, "
        f"stable_baselines3 {stable_baselines3.__version__}, lightning_rl {lightning_rl.__version__}, "
        f"numpy {np.__version__}; torch threads {args.threads}; cpus {os.cpu_count()}; "
        f"load average at start {load}",
        flush=True,
    )
    report: dict[str, Any] = {
        "env": {algo: ENV_IDS[algo] for algo in args.algos},  # per algo; thresholds are in "algos"
        "seeds": args.seeds,
        "threads": args.threads,
        "steps_scale": args.steps_scale,
        "process_per_fit": args.process_per_fit,
        "load_avg_start": list(load) if load else None,
        "algos": {},
    }
    all_results: list[RunResult] = []
    for algo in args.algos:
        steps = max(1, int(budgets[algo] * args.steps_scale))
        results: list[RunResult] = []
        vectorizations = ["sync"] if algo in OFF_POLICY else args.vectorization
        ours = [(v, c) for v in vectorizations for c in args.compile]
        impls = [label(v, c) for v, c in ours] + ([] if args.no_sb3 else ["sb3"])
        # None = SB3; the order is ours (each vectorization and compile setting), then SB3, seed by seed
        jobs: list[tuple[str, bool] | None] = [*ours, *([] if args.no_sb3 else [None])]
        if not args.no_warmup:  # untimed: lazy imports and first-call set-up of each implementation
            for job in jobs:
                start = time.perf_counter()
                run_job(algo, 0, WARMUP_STEPS[algo], job, args.threads, False, args.process_per_fit)
                if job is not None:
                    if job[1]:  # the first compile of this run (inductor's on-disk cache as it was)
                        report.setdefault("first_compile_run_s", {})[algo] = time.perf_counter() - start
                        print(f"[{algo} {label(*job)}] warm-up run with the first compile: "
                              f"{time.perf_counter() - start:.1f}s", flush=True)
        for seed in range(args.seeds):
            for job in jobs:
                r = run_job(algo, seed, steps, job, args.threads, True, args.process_per_fit)
                results.append(r)
                solve = "not solved" if r.solve_s is None else f"solved at {r.solve_s:.1f}s / {r.solve_steps:,} steps"
                last = "-" if r.final_mean_return is None else f"{r.final_mean_return:.1f}"
                evaluation = (
                    "" if r.eval_mean_return is None
                    else f"; greedy eval {r.eval_mean_return:.1f} ± {r.eval_std_return:.1f} ({EVAL_EPISODES} ep)"
                )
                print(
                    f"[{algo} {r.impl:<9} seed {seed}] {r.env_steps:,} steps in {r.wall_s:.1f}s = "
                    f"{r.steps_per_s:,.0f} steps/s; {solve}; {r.episodes} episodes, "
                    f"last-{SOLVE_CRITERIA[algo][1]} mean {last}{evaluation}",
                    flush=True,
                )
        summary = summarize(results, impls)
        print_table(algo, steps, summary)
        threshold, window = SOLVE_CRITERIA[algo]
        report["algos"][algo] = {
            "env": ENV_IDS[algo], "env_steps": steps, "solve_threshold": threshold, "solve_window": window,
            **summary,
        }
        all_results.extend(results)
    load_end = os.getloadavg() if hasattr(os, "getloadavg") else None
    report["load_avg_end"] = list(load_end) if load_end else None
    report["runs"] = [asdict(r) for r in all_results]
    print(f"\nload average at end {load_end}", flush=True)
    sys.stdout.write(json.dumps(json_safe(report)) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
