"""Train Ape-X DQN on CartPole-v1: 2 sampler processes explore with their own epsilons and fill
one prioritized replay, with TensorBoard logs (CSV without tensorboard).

    python examples/apex_cartpole.py                     # 2 workers x 4 envs, 100k env steps
    python examples/apex_cartpole.py --num-workers 0     # the synchronous baseline
    tensorboard --logdir runs                            # perf/replay_size, perf/worker_*_epsilon, ...
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl

from lightning_rl import APEX, evaluate
from lightning_rl.loggers import default_logger


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--total-env-steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="runs")
    args = parser.parse_args(argv)

    model = APEX(env="CartPole-v1", num_workers=args.num_workers, total_env_steps=args.total_env_steps,
                 seed=args.seed)
    trainer = pl.Trainer(max_epochs=-1, logger=default_logger(args.log_dir, name="apex_cartpole"), log_every_n_steps=10,
                         enable_checkpointing=False)
    trainer.fit(model)
    greedy = float(sum(evaluate(model, num_episodes=10, seed=args.seed + 1)) / 10)
    print(f"APEX CartPole-v1, {args.num_workers} sampler workers: greedy return {greedy:.1f} after "
          f"{model.counters['num_env_steps_sampled']} env steps; logs in {trainer.logger.log_dir}")
    return greedy


if __name__ == "__main__":
    main()
