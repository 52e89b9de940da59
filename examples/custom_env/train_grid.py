"""PPO on the custom ``GridTarget-v0`` env of ``my_envs.py``, from Python.

    python examples/custom_env/train_grid.py --size 5 --total-env-steps 30000

The same run from the command line (with ``examples/custom_env`` on ``PYTHONPATH``)::

    lightning-rl fit --model PPO --model.env my_envs:GridTarget-v0 --model.env_kwargs '{size: 5}'
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytorch_lightning as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))  # so "my_envs:..." imports from here

from lightning_rl import PPO, evaluate


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=5)
    parser.add_argument("--total-env-steps", type=int, default=30_000)
    args = parser.parse_args(argv)
    model = PPO(env="my_envs:GridTarget-v0", env_kwargs={"size": args.size}, total_env_steps=args.total_env_steps,
                seed=0)
    pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(model)
    returns = evaluate(model, num_episodes=20, seed=1)
    mean = sum(returns) / len(returns)
    print(f"GridTarget size {args.size}: mean greedy return {mean:.2f} over {len(returns)} episodes")
    return mean


if __name__ == "__main__":
    main()
