"""Run by tests/test_env_faults.py: PPO on 2 async envs, where something goes wrong.

    python tests/env_fault_worker.py OUT_DIR MODE

MODE ``raise``: the env raises ``RuntimeError("boom from env")`` at its 20th step;
``sigkill``: env worker 1 is SIGKILLed after 2 iterations; ``sigint``: the script sends
itself SIGINT (Ctrl-C) after 2 iterations; ``ok``: 4 iterations that finish normally.
Every env worker pid seen during fit is written to ``OUT_DIR/pids.json``, so the test can
check that none outlives the script.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import warnings
from functools import partial
from pathlib import Path

import gymnasium as gym
import pytorch_lightning as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lightning_rl import PPO
from lightning_rl.data.envs import async_env_of

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

MODES = ("raise", "sigkill", "sigint", "ok")
ROLLOUT, NUM_ENVS = 8, 2
FAULT_AFTER_ITERATIONS = 2


class RaiseAtStep(gym.Wrapper):
    """Raises ``RuntimeError("boom from env")`` at the ``at``-th call of ``step`` (across episodes)."""

    def __init__(self, env: gym.Env, at: int) -> None:
        super().__init__(env)
        self.at = at
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at:
            raise RuntimeError("boom from env")
        return self.env.step(action)


def make_env(mode: str) -> gym.Env:
    env = gym.make("CartPole-v1")
    return RaiseAtStep(env, at=20) if mode == "raise" else env


class Faults(pl.Callback):
    """Records the env worker pids; in ``sigkill`` / ``sigint`` mode, injects the fault."""

    def __init__(self, out_dir: Path, mode: str) -> None:
        self.path = out_dir / "pids.json"
        self.mode = mode
        self.pids: set[int] = set()

    def _record(self, pl_module: pl.LightningModule) -> list[int]:
        venv = async_env_of(pl_module.active_datamodule.envs)
        pids = [p.pid for p in venv.processes]
        if not self.pids.issuperset(pids):
            self.pids.update(pids)
            self.path.write_text(json.dumps(sorted(self.pids)))
        return pids

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._record(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        pids = self._record(pl_module)
        if pl_module.counters["num_iterations"] != FAULT_AFTER_ITERATIONS:
            return
        if self.mode == "sigkill":
            os.kill(pids[1], signal.SIGKILL)
        elif self.mode == "sigint":
            os.kill(os.getpid(), signal.SIGINT)


def main(out_dir: str, mode: str) -> None:
    # Ctrl-C must reach us even when started from a shell that ignores SIGINT in background jobs.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if mode not in MODES:
        raise SystemExit(f"MODE must be one of {MODES}, got {mode!r}")
    iterations = 4 if mode == "ok" else 1000
    model = PPO(env=partial(make_env, mode), num_envs=NUM_ENVS, vectorization="async", rollout_fragment_length=ROLLOUT,
                sgd_minibatch_size=16, num_sgd_iter=2, total_env_steps=iterations * ROLLOUT * NUM_ENVS, seed=0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[Faults(Path(out_dir), mode)])
    trainer.fit(model)
    print(f"FINISHED {model.counters['num_iterations']} iterations", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
