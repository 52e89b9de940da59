"""A memory task: CartPole with the velocities removed from the observation, PPO with an LSTM.

The policy sees only the cart position and the pole angle; it must remember earlier steps to
infer the velocities. A feed-forward PPO cannot, and stays far below what the recurrent one
reaches (docs/guides/recurrent.md gives both over seeds).

    python examples/ppo_lstm_cartpole.py                  # 300k env steps
    python examples/ppo_lstm_cartpole.py --no-lstm        # the same PPO without the LSTM
    python examples/ppo_lstm_cartpole.py --compile        # compiled update steps
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl

from lightning_rl import PPO
from lightning_rl.loggers import default_logger


def cartpole_without_velocities() -> gym.Env:
    """CartPole-v1 observing ``[cart position, pole angle]`` only."""
    env = gym.make("CartPole-v1")
    low, high = env.observation_space.low[[0, 2]], env.observation_space.high[[0, 2]]
    space = gym.spaces.Box(low, high, dtype=np.float32)
    return gym.wrappers.TransformObservation(env, lambda obs: obs[[0, 2]], space)


class LastEpisodes(pl.Callback):
    """Mean return of the last ``n`` training episodes."""

    def __init__(self, n: int = 20) -> None:
        self.n, self.returns = n, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.returns += batch.info.get("episode_returns", [])

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns[-self.n:])) if self.returns else float("nan")


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total-env-steps", type=int, default=300_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-lstm", action="store_true")
    parser.add_argument("--compile", action="store_true", help="compiled update steps (about 2x faster after a "
                        "few minutes of compiling, measured)")
    parser.add_argument("--log-dir", default="runs")
    args = parser.parse_args(argv)

    model = PPO(
        env=cartpole_without_velocities,
        use_lstm=not args.no_lstm,
        lstm_cell_size=64,
        max_seq_len=32,
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
        compile=args.compile,
    )
    last = LastEpisodes(20)
    trainer = pl.Trainer(max_epochs=-1, logger=default_logger(args.log_dir, name="ppo_lstm_cartpole"),
                         log_every_n_steps=5, enable_checkpointing=False, callbacks=[last])
    trainer.fit(model)
    kind = "feed-forward" if args.no_lstm else "LSTM"
    print(f"PPO ({kind}) on CartPole without velocities: mean return of the last 20 training episodes "
          f"{last.mean:.1f} after {model.counters['num_env_steps_sampled']} env steps")
    return last.mean


if __name__ == "__main__":
    main()
