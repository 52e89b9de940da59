"""Observation normalization on a badly scaled env: PPO with and without ``normalize_observations``.

The env is ``tests/test_normalization.py``'s ``scaled_cartpole`` (CartPole-v1 with observations
``1000 * obs + 500``); PPO runs at rl-zoo's CartPole settings (docs/algorithms.md's), as the CI test
does, for ``--budget`` env steps (default 150k), with a greedy evaluation (10 episodes) every 10
iterations and an early stop once one averages 475. Each (setting, seed) run is its own process,
at most ``--workers`` at a time, one torch thread each.

Reported per run: the env steps sampled (where it stopped), the best greedy evaluation during
training and the step it came at, and a greedy return over 10 episodes (seed 123) after fit.
Outputs a Markdown table and, as the last stdout line, one JSON object with every figure.

    python benchmarks/normalization.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.test_normalization's env


def run(normalize: bool, seed: int, budget: int) -> dict[str, Any]:
    import numpy as np
    import pytorch_lightning as pl
    import torch

    from lightning_rl import PPO
    from lightning_rl.evaluation import evaluate
    from tests.conftest import quiet_trainer
    from tests.test_normalization import scaled_cartpole, solved_early

    torch.set_num_threads(1)
    evaluations: list[tuple[int, float]] = []

    class Record(pl.Callback):
        def on_validation_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            value = trainer.callback_metrics.get("val/episode_return_mean")
            if value is not None:
                evaluations.append((module.global_counters["num_env_steps_sampled"], float(value)))

    model = PPO(env=scaled_cartpole, normalize_observations=normalize, seed=seed, total_env_steps=budget, num_envs=8,
                rollout_fragment_length=32, num_sgd_iter=20, sgd_minibatch_size=256, lr=1e-3, lr_schedule="linear",
                clip_param_schedule="linear", gamma=0.98, lambda_=0.8, iterations_per_epoch=10,
                evaluation_interval=1, evaluation_num_episodes=10)
    quiet_trainer(num_sanity_val_steps=0, callbacks=[solved_early(), Record()]).fit(model)
    best_step, best = max(evaluations, key=lambda e: e[1])
    return dict(normalize=normalize, seed=seed, steps=model.global_counters["num_env_steps_sampled"],
                best_eval=best, best_eval_step=best_step,
                final_greedy=float(np.mean(evaluate(model, num_episodes=10, seed=123))))


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=150_000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    jobs = [(normalize, seed) for normalize in (True, False) for seed in args.seeds]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(run, *zip(*jobs, strict=True), [args.budget] * len(jobs)))
    print("| normalize_observations | seed | env steps | best greedy eval (at step) | greedy after fit |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['normalize']} | {r['seed']} | {r['steps']:,} | {r['best_eval']:.1f} ({r['best_eval_step']:,}) "
              f"| {r['final_greedy']:.1f} |")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
