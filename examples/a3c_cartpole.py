"""Train A3C on CartPole-v1: 2 sampler processes compute gradients on their own rollouts and the
learner applies each as it arrives, with TensorBoard logs (CSV without tensorboard).

    python examples/a3c_cartpole.py                      # 2 workers x 8 envs, 500k env steps
    python examples/a3c_cartpole.py --num-workers 0      # the synchronous baseline (A2C-like)
    tensorboard --logdir runs                            # perf/policy_lag_mean (staleness), ...
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl

from lightning_rl import A3C, evaluate
from lightning_rl.loggers import default_logger


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--total-env-steps", type=int, default=500_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="runs")
    args = parser.parse_args(argv)

    model = A3C(env="CartPole-v1", num_workers=args.num_workers, total_env_steps=args.total_env_steps,
                seed=args.seed)
    trainer = pl.Trainer(max_epochs=-1, logger=default_logger(args.log_dir, name="a3c_cartpole"), log_every_n_steps=50,
                         enable_checkpointing=False)
    trainer.fit(model)
    greedy = float(sum(evaluate(model, num_episodes=10, seed=args.seed + 1)) / 10)
    print(f"A3C CartPole-v1, {args.num_workers} sampler workers: greedy return {greedy:.1f} after "
          f"{model.counters['num_env_steps_sampled']} env steps; logs in {trainer.logger.log_dir}")
    return greedy


if __name__ == "__main__":
    main()
