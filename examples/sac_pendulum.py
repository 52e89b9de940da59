"""Train SAC on Pendulum-v1 with its defaults (rl-zoo's settings): about -150 in 20k env steps.

    python examples/sac_pendulum.py
"""

from __future__ import annotations

import argparse

import numpy as np
import pytorch_lightning as pl

from lightning_rl import SAC, evaluate
from lightning_rl.loggers import default_logger


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total-env-steps", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="runs")
    args = parser.parse_args(argv)

    model = SAC(env="Pendulum-v1", total_env_steps=args.total_env_steps, seed=args.seed)
    trainer = pl.Trainer(
        max_epochs=-1,  # the budget is the limit
        logger=default_logger(args.log_dir, name="sac_pendulum"), log_every_n_steps=200, enable_checkpointing=False
    )
    trainer.fit(model)
    result = float(np.mean(evaluate(model, num_episodes=10, seed=args.seed + 1)))
    print(f"SAC Pendulum-v1: greedy return {result:.1f} over 10 episodes after {args.total_env_steps} env steps")
    return result


if __name__ == "__main__":
    main()
