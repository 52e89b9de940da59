"""Decentralized distributed PPO (DD-PPO) with Lightning's DDP strategy.

Every rank samples its own envs (seed + 1000 * rank) and trains on its own batch; DDP
all-reduces the gradients of every minibatch. No parameter server, no code of ours for
communication.

    python examples/ppo_ddp.py --devices 2                       # 2 CPU processes (gloo)
    python examples/ppo_ddp.py --accelerator gpu --devices 4     # 4 GPUs on one machine (nccl)
    torchrun --nnodes 2 --nproc-per-node 4 ... examples/ppo_ddp.py --accelerator gpu --devices 4 --num-nodes 2

With ``num_envs`` per rank, the global batch per iteration is ``devices * num_nodes *
num_envs * rollout_fragment_length``; ``total_env_steps`` counts global env steps.
"""

from __future__ import annotations

import argparse

import pytorch_lightning as pl

from lightning_rl import PPO
from lightning_rl.loggers import default_logger


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--total-env-steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="runs")
    args = parser.parse_args(argv)

    world = args.devices * args.num_nodes
    model = PPO(
        env="CartPole-v1",
        num_envs=max(1, 8 // world),  # keep rl-zoo's global batch of 256 env steps per iteration
        rollout_fragment_length=32,
        num_sgd_iter=20,
        sgd_minibatch_size=max(1, 256 // world),
        lr=1e-3,
        lr_schedule="linear",
        clip_param_schedule="linear",
        gamma=0.98,
        lambda_=0.8,
        total_env_steps=args.total_env_steps,
        seed=args.seed,
    )
    trainer = pl.Trainer(
        max_epochs=-1,  # the budget is the limit
        strategy="ddp",
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.num_nodes,
        logger=default_logger(args.log_dir, name="ppo_ddp"),
        log_every_n_steps=5,
        enable_checkpointing=False,
    )
    trainer.fit(model)
    result = float(trainer.callback_metrics.get("rollout/episode_return_mean", float("nan")))
    if trainer.is_global_zero:
        print(f"DD-PPO on {world} ranks: mean return {result:.1f} after "
              f"{model.global_counters['num_env_steps_sampled']} global env steps")
    return result


if __name__ == "__main__":
    main()
