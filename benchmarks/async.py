"""Async sampling: env steps/s on CartPole-v1 with 0, 1 and 2 sampler workers, and the policy lag
(IMPALA by default; APPO, APEX and A3C with ``--algo``).

Each run fits ``IMPALA`` (or ``APPO``) for ``--steps`` env steps with ``num_workers`` sampler
processes of ``--num-envs`` envs each (0: the synchronous baseline, sampling in the learner
process with the same envs per fragment), one torch thread per process, alternating the
worker counts within each repeat. Reported per worker count: median env steps/s over
``--repeats`` (fit time, process start-up included), its ratio to the 0-worker run, the policy
lag of the batches trained on (learner iterations since the weights that sampled each
fragment, or, for A3C, that computed each gradient: mean and max), the learner's wait for data
(ms per iteration), the rows trained on per second (APEX: replayed rows) and the greedy return
after the run (10 episodes). APEX's learner is the bottleneck (32 gradient steps of 64 rows per
128 inserted env steps): its env steps/s is what its learner consumes.

The issue's target on this 2-core machine: 2 workers >= 1.5x the 0-worker run. The anchor:
RLlib 2.60's APPO on CartPole with 2 env runners x 4 envs (its tuned example) ran 2,339 env
steps/s on this kind of machine and reached a mean return of 254 after 328k steps.

Usage::

    python benchmarks/async.py                          # IMPALA, 0/1/2 workers, 200k steps, 2 repeats
    python benchmarks/async.py --algo APPO --steps 500000 --repeats 1
    python benchmarks/async.py --algo APEX --steps 20000
    python benchmarks/async.py --algo A3C --num-envs 8
    python benchmarks/async.py --env ALE/Breakout-v5 --workers 0,2 --steps 8000 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import warnings
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from lightning_rl import A3C, APEX, APPO, IMPALA, evaluate


class Lag(pl.Callback):
    """Policy lag of every batch trained on, and the learner's wait for it."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.lag_max = 0.0
        self.waits: list[float] = []

    def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
        perf = batch.info.get("perf", {})
        self.lags.append(perf.get("policy_lag_mean", 0.0))
        self.lag_max = max(self.lag_max, perf.get("policy_lag_max", 0.0))
        self.waits.append(perf.get("learner_wait_ms", 0.0))


def run(algo: type, workers: int, steps: int, num_envs: int, seed: int, env: str = "CartPole-v1") -> dict[str, Any]:
    # an ALE id: impala_atari.yaml's network (IMPALA's CNN shared by both heads) and fragments
    pixels = dict(encoder="impala_cnn", hiddens=(), vf_share_layers=True) if env.startswith("ALE/") else {}
    if algo in (IMPALA, APPO):
        length = 20 if pixels else 50
        model = algo(env=env, num_workers=workers, num_envs=num_envs, rollout_fragment_length=length,
                     train_batch_size=10 * length, total_env_steps=steps, seed=seed,
                     iterations_per_epoch=50, **pixels)
    else:  # their defaults (APEX: 16-step fragments; A3C: 5-step ones)
        model = algo(env=env, num_workers=workers, num_envs=num_envs, total_env_steps=steps, seed=seed, **pixels)
    lag = Lag()
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[lag])
    start = time.perf_counter()
    trainer.fit(model)
    seconds = time.perf_counter() - start
    sampled = model.counters["num_env_steps_sampled"]
    return {
        "workers": workers, "seed": seed, "env_steps": sampled, "fit_s": seconds, "steps_per_s": sampled / seconds,
        "trained_per_s": model.counters["num_env_steps_trained"] / seconds,
        "lag_mean": float(np.mean(lag.lags)), "lag_max": int(lag.lag_max),
        "learner_wait_ms": float(np.mean(lag.waits)),
        "greedy": float(np.mean(evaluate(model, num_episodes=2 if pixels else 10, seed=seed + 10_000))),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=["IMPALA", "APPO", "APEX", "A3C"], default="IMPALA")
    p.add_argument("--workers", default="0,1,2", help="comma-separated worker counts (default 0,1,2)")
    p.add_argument("--steps", type=int, default=200_000, help="env steps per run (default 200k)")
    p.add_argument("--num-envs", type=int, default=4, help="envs per worker (default 4)")
    p.add_argument("--repeats", type=int, default=2, help="runs per worker count, seeds 0.. (default 2)")
    p.add_argument("--env", default="CartPole-v1", help="an env id; an ALE id gets IMPALA's CNN (default CartPole-v1)")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    algo = {"IMPALA": IMPALA, "APPO": APPO, "APEX": APEX, "A3C": A3C}[args.algo]
    counts = [int(w) for w in args.workers.split(",")]
    runs = []
    for seed in range(args.repeats):
        for workers in counts:
            r = run(algo, workers, args.steps, args.num_envs, seed, args.env)
            runs.append(r)
            print(f"[{args.algo} workers={workers} seed={seed}] {r['env_steps']:,} steps in {r['fit_s']:.1f}s = "
                  f"{r['steps_per_s']:,.0f} steps/s, {r['trained_per_s']:,.0f} trained rows/s; "
                  f"policy lag mean {r['lag_mean']:.2f} max {r['lag_max']}; "
                  f"learner wait {r['learner_wait_ms']:.1f} ms/iter; greedy {r['greedy']:.0f}", flush=True)
    base = statistics.median(r["steps_per_s"] for r in runs if r["workers"] == counts[0])
    print(f"\n{args.algo} {args.env}, {args.steps:,} env steps, {args.num_envs} envs per worker; medians of "
          f"{args.repeats}")
    print("| workers | env steps/s | vs 0 workers | trained rows/s | policy lag mean / max | learner wait ms/iter "
          "| greedy |")
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for workers in counts:
        mine = [r for r in runs if r["workers"] == workers]
        speed = statistics.median(r["steps_per_s"] for r in mine)
        summary[workers] = {"steps_per_s": speed, "ratio": speed / base}
        print(f"| {workers} | {speed:,.0f} | {speed / base:.2f}x | "
              f"{statistics.median(r['trained_per_s'] for r in mine):,.0f} | "
              f"{statistics.fmean(r['lag_mean'] for r in mine):.2f} / {max(r['lag_max'] for r in mine)} | "
              f"{statistics.fmean(r['learner_wait_ms'] for r in mine):.1f} | "
              f"{statistics.fmean(r['greedy'] for r in mine):.0f} |")
    print(json.dumps({"benchmark": "async", "algo": args.algo, "env": args.env, "steps": args.steps,
                      "num_envs": args.num_envs, "summary": summary, "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
