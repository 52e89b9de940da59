"""Train PPO on CartPole-v1 at rl-zoo's settings, with TensorBoard logs (CSV without tensorboard).

    python examples/ppo_cartpole.py                 # 100k env steps, logs in runs/ppo_cartpole
    tensorboard --logdir runs
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl

from lightning_rl import PPO
from lightning_rl.loggers import default_logger


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total-env-steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="runs")
    args = parser.parse_args(argv)

    model = PPO(
        env="CartPole-v1",
        num_envs=8,
        rollout_fragment_length=32,
        num_sgd_iter=20,
        sgd_minibatch_size=256,
        lr=1e-3,
        lr_schedule="linear",
        clip_param=0.2,
        clip_param_schedule="linear",
        gamma=0.98,
        lambda_=0.8,
        total_env_steps=args.total_env_steps,
        seed=args.seed,
    )
    trainer = pl.Trainer(
        max_epochs=-1,  # the budget is the limit
        logger=default_logger(args.log_dir, name="ppo_cartpole"),
        log_every_n_steps=5,
        enable_checkpointing=False,
    )
    trainer.fit(model)
    result = float(trainer.callback_metrics["rollout/episode_return_mean"])
    print(
        f"PPO CartPole-v1: mean return of the last 100 episodes {result:.1f} after "
        f"{model.counters['num_env_steps_sampled']} env steps; logs in {trainer.logger.log_dir}"
    )
    return result


if __name__ == "__main__":
    main()
