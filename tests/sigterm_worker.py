"""Run by tests/test_sigterm.py: an evaluation that would not end by itself, to be stopped by SIGTERM.

    python tests/sigterm_worker.py sanity|validate|test|record ROOT_DIR

Prints ``EVALUATING`` once the evaluation (or recording) runs.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl

from lightning_rl import PPO
from tests.test_evaluation_cap import GoRight


class Announce(pl.Callback):
    def on_validation_batch_start(self, *args, **kwargs):
        print("EVALUATING", flush=True)

    def on_test_batch_start(self, *args, **kwargs):
        print("EVALUATING", flush=True)


class SlowTinyFrames(gym.Wrapper):
    """CartPole drawn by pygame (whose SDL would catch SIGTERM), frames shrunk, steps slowed."""

    def __init__(self, env):
        super().__init__(env)
        self.said = False

    def step(self, action):
        if not self.said:
            print("EVALUATING", flush=True)
            self.said = True
        time.sleep(0.01)
        return self.env.step(action)

    def render(self):
        return self.env.render()[::20, ::20]


def cartpole_frames():
    return SlowTinyFrames(gym.make("CartPole-v1", render_mode="rgb_array"))


def main(mode: str, root: str) -> None:
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    if mode == "record":
        from lightning_rl.recording import record

        record(PPO(env="CartPole-v1", seed=0), f"{root}/agent.gif", num_episodes=10**6, env=cartpole_frames,
               max_frames=10**7)
        return
    model = PPO(env=GoRight, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=16, total_env_steps=10**6,
                evaluation_interval=1, evaluation_num_episodes=2, evaluation_max_episode_steps=10**9, seed=0)
    trainer = pl.Trainer(default_root_dir=root, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         callbacks=[Announce()], num_sanity_val_steps=1)
    if mode == "sanity":
        trainer.fit(model)
    elif mode == "validate":
        trainer.validate(model)
    else:
        trainer.test(model)
    print("ENDED", np.nan, flush=True)  # never reached


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
