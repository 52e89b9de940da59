"""Run by tests/test_interrupt.py: a CartPole fit that prints its progress, or resumes from a checkpoint.

    python tests/interrupt_worker.py ROOT_DIR [CKPT|-] [PPO|IMPALA]

PPO samples in this process; IMPALA in one sampler worker process (printed as ``SAMPLERS pid``).
Prints ``ITERATION n`` after each iteration and ``RESULT {...}`` when ``fit`` returns.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import warnings

import pytorch_lightning as pl

from lightning_rl import IMPALA, PPO

ITERATIONS = 60  # the budget: the signal comes at iteration 12, well before its end
STEPS_PER_ITERATION = 128


class Progress(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pool = getattr(pl_module.default_datamodule, "pool", None)
        workers = pool.processes if pool is not None else None
        if workers and pl_module.counters["num_iterations"] == 1:
            print("SAMPLERS " + " ".join(str(p.pid) for p in workers if p is not None), flush=True)
        print(f"ITERATION {pl_module.counters['num_iterations']}", flush=True)


def make_model(algo: str) -> pl.LightningModule:
    budget = ITERATIONS * STEPS_PER_ITERATION
    if algo == "IMPALA":
        return IMPALA(env="CartPole-v1", num_workers=1, num_envs=4, rollout_fragment_length=32,
                      train_batch_size=STEPS_PER_ITERATION, hiddens=(16,), seed=0, iterations_per_epoch=5,
                      total_env_steps=budget, sampler_timeout_s=20.0)
    return PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, sgd_minibatch_size=64, seed=0,
               iterations_per_epoch=5, total_env_steps=budget)


def main(root: str, ckpt: str | None, algo: str = "PPO") -> None:
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    # Ctrl-C must reach us even when started from a shell that ignores SIGINT in background jobs.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    model = make_model(algo)
    trainer = pl.Trainer(default_root_dir=root, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         callbacks=[Progress()])
    start = None
    if ckpt:
        import torch

        start = torch.load(ckpt, weights_only=True)["lightning_rl"]["global_counters"]
    trainer.fit(model, ckpt_path=ckpt)
    print("RESULT " + json.dumps({"start": start, "end": model.counters}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None,
         *sys.argv[3:4])
