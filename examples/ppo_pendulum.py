"""Train PPO on Pendulum-v1 (continuous actions) at rl-zoo's settings without gSDE.

    python examples/ppo_pendulum.py                 # 300k env steps, about -200 at the end
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl

from lightning_rl import PPO
from lightning_rl.loggers import default_logger


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total-env-steps", type=int, default=300_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="runs")
    args = parser.parse_args(argv)

    model = PPO(
        env="Pendulum-v1",
        num_envs=4,
        rollout_fragment_length=1024,
        num_sgd_iter=10,
        sgd_minibatch_size=64,
        lr=1e-3,
        gamma=0.9,
        lambda_=0.95,
        total_env_steps=args.total_env_steps,
        iterations_per_epoch=5,
        seed=args.seed,
    )
    trainer = pl.Trainer(
        max_epochs=-1,  # the budget is the limit
        logger=default_logger(args.log_dir, name="ppo_pendulum"), log_every_n_steps=1, enable_checkpointing=False
    )
    trainer.fit(model)
    result = float(trainer.callback_metrics["rollout/episode_return_mean"])
    print(f"PPO Pendulum-v1: mean return of the last 100 episodes {result:.1f}")
    return result


if __name__ == "__main__":
    main()
