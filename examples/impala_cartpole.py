"""Train IMPALA (or APPO) on CartPole-v1 with asynchronous sampler processes, with TensorBoard logs
(CSV without tensorboard).

    python examples/impala_cartpole.py                     # 2 workers x 4 envs, 500k env steps
    python examples/impala_cartpole.py --algo APPO --num-workers 0   # the synchronous baseline
    tensorboard --logdir runs                              # perf/learner_wait_ms, perf/worker_*, ...
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl

from lightning_rl import APPO, IMPALA, evaluate
from lightning_rl.loggers import default_logger


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=["IMPALA", "APPO"], default="IMPALA")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--total-env-steps", type=int, default=500_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="runs")
    args = parser.parse_args(argv)

    algo = {"IMPALA": IMPALA, "APPO": APPO}[args.algo]
    model = algo(env="CartPole-v1", num_workers=args.num_workers, num_envs=4, rollout_fragment_length=50,
                 train_batch_size=500, total_env_steps=args.total_env_steps, seed=args.seed)
    name = f"{args.algo.lower()}_cartpole"
    trainer = pl.Trainer(max_epochs=-1, logger=default_logger(args.log_dir, name=name), log_every_n_steps=5,
                         enable_checkpointing=False)
    trainer.fit(model)
    greedy = float(sum(evaluate(model, num_episodes=10, seed=args.seed + 1)) / 10)
    print(f"{args.algo} CartPole-v1, {args.num_workers} sampler workers: greedy return {greedy:.1f} after "
          f"{model.counters['num_env_steps_sampled']} env steps; logs in {trainer.logger.log_dir}")
    return greedy


if __name__ == "__main__":
    main()
