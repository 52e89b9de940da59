"""Your own network in front of PPO's heads, from Python or from YAML.

    python examples/custom_network.py
    PYTHONPATH=examples lightning-rl fit -c examples/custom_network.yaml

``ResidualEncoder`` is an ordinary ``nn.Module`` whose constructor takes the observation space;
PPO puts one in front of its policy and one in front of its value head (one shared with
``vf_share_layers``), then its ``hiddens`` MLP (``[]`` for none) and the heads. Its
``out_features`` tells PPO the width it returns (without it, PPO runs it once to find out).
"""

from __future__ import annotations

import argparse
from functools import partial

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from lightning_rl import PPO
from lightning_rl.evaluation import evaluate
from lightning_rl.loggers import default_logger


class ResidualEncoder(nn.Module):
    """``[N, obs_dim]`` -> ``[N, features]``: a linear embedding and ``blocks`` residual GELU blocks."""

    def __init__(self, observation_space: gym.Space, features: int = 64, blocks: int = 1) -> None:
        super().__init__()
        self.embed = nn.Linear(int(torch.tensor(observation_space.shape).prod()), features)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(features), nn.Linear(features, features), nn.GELU())
                                    for _ in range(blocks))
        self.out_features = features

    def forward(self, obs: Tensor) -> Tensor:
        x = self.embed(obs.flatten(1))
        for block in self.blocks:
            x = x + block(x)
        return x


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--total-env-steps", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="runs")
    args = parser.parse_args(argv)

    model = PPO(env="CartPole-v1", encoder=partial(ResidualEncoder, features=64, blocks=2), hiddens=[64],
                activation="gelu", total_env_steps=args.total_env_steps, seed=args.seed)
    trainer = pl.Trainer(max_epochs=-1, logger=default_logger(args.log_dir, name="custom_network"), log_every_n_steps=5,
                         enable_checkpointing=False)
    trainer.fit(model)
    result = float(np.mean(evaluate(model, num_episodes=10, seed=args.seed + 1)))
    print(f"PPO with ResidualEncoder on CartPole-v1: greedy return {result:.1f} over 10 episodes after "
          f"{model.counters['num_env_steps_sampled']} env steps")
    return result


if __name__ == "__main__":
    main()
