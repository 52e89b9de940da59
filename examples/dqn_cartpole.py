"""Train DQN (double Q, dueling, 3-step returns) on CartPole-v1 until greedy evaluation hits 475.

    python examples/dqn_cartpole.py                 # at most 60k env steps, usually ~25k
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl
from pytorch_lightning.callbacks import EarlyStopping

from lightning_rl import DQN
from lightning_rl.loggers import default_logger


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total-env-steps", type=int, default=60_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="runs")
    args = parser.parse_args(argv)

    model = DQN(
        env="CartPole-v1",
        lr=1e-3,
        lr_schedule="linear",
        train_freq=64,
        num_gradient_steps=64,
        n_step=3,
        double_q=True,
        dueling=True,
        prioritized_replay=False,
        total_env_steps=args.total_env_steps,
        iterations_per_epoch=max(1, min(78, args.total_env_steps // 64)),  # evaluate about every 5k env steps
        evaluation_interval=1,
        evaluation_num_episodes=10,
        seed=args.seed,
    )
    stop = EarlyStopping(monitor="val/episode_return_mean", mode="max", stopping_threshold=475, patience=1000)
    trainer = pl.Trainer(
        max_epochs=-1,  # the budget is the limit
        logger=default_logger(args.log_dir, name="dqn_cartpole"),
        log_every_n_steps=10,
        callbacks=[stop],
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model)
    result = float(trainer.callback_metrics["val/episode_return_mean"])
    print(f"DQN CartPole-v1: greedy return {result:.1f} after {model.counters['num_env_steps_sampled']} env steps")
    return result


if __name__ == "__main__":
    main()
