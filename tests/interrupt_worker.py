"""Run by tests/test_interrupt.py: PPO CartPole that prints its progress, or resumes from a checkpoint.

    python tests/interrupt_worker.py ROOT_DIR [CKPT]
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import warnings

import pytorch_lightning as pl

from lightning_rl import PPO

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

ITERATIONS = 60  # the budget: Ctrl-C comes at iteration 12, well before its end


class Progress(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        print(f"ITERATION {pl_module.counters['num_iterations']}", flush=True)


def main(root: str, ckpt: str | None) -> None:
    # Ctrl-C must reach us even when started from a shell that ignores SIGINT in background jobs.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    model = PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, sgd_minibatch_size=64, seed=0,
                iterations_per_epoch=5, total_env_steps=ITERATIONS * 128)
    trainer = pl.Trainer(default_root_dir=root, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         callbacks=[Progress()])
    start = None
    if ckpt:
        import torch

        start = torch.load(ckpt, weights_only=True)["lightning_rl"]["global_counters"]
    trainer.fit(model, ckpt_path=ckpt)
    print("RESULT " + json.dumps({"start": start, "end": model.counters}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
