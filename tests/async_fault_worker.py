"""Run by tests/test_async_faults.py: a fit with 2 sampler processes, where something goes wrong.

    python tests/async_fault_worker.py MODE ROOT [ALGO]

ALGO (default IMPALA) is IMPALA, APEX or A3C: the three share the sampler workers' code.

Prints ``SAMPLERS pid pid`` whenever the set of sampler processes changes (so the test can check
from /proc that none outlives the script), ``ITERATION n`` after each training iteration and
``FINISHED n RESTARTS r`` when ``fit`` returns. MODE:

``ok``: 6 iterations that finish normally.
``sigint`` / ``learner_sigkill``: a budget it never reaches; the test interrupts (SIGINT) or
    SIGKILLs this process once it prints a few iterations.
``env_raises``: the env copy seeded with ``SNAP_SEED`` (sampler worker 1's second env) raises
    ``ValueError(SNAP_MESSAGE)`` at its ``SNAP_AT``-th step (its 20th fragment: the run is in its
    steady state by then), a step that takes ``SNAP_DELAY_S`` like a slow simulator's.
``training_raises``: a callback raises ``RuntimeError(TRAINING_MESSAGE)`` in the learner at
    iteration ``FAULT_AT``.
``sampler_sigkill``: with ``restart_failed_workers=True``, SIGKILLs sampler worker 1 at
    iteration ``FAULT_AT`` and must still finish its ``RESTART_ITERATIONS`` iterations.

Every iteration sleeps ``PACE_S`` in the learner: the learner is the bottleneck (as with a real
network), so the samplers spend their time waiting for free slots and the loader on a full queue.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import gymnasium as gym
import pytorch_lightning as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lightning_rl import A3C, APEX, IMPALA

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

MODES = ("ok", "sigint", "learner_sigkill", "env_raises", "training_raises", "sampler_sigkill")
TRAIN_BATCH_SIZE = 40
OK_ITERATIONS = 6
RESTART_ITERATIONS = 30
ENDLESS_ITERATIONS = 100_000  # a budget the interrupted / failing modes never reach
FAULT_AT = 3
PACE_S = 0.1
# Worker i of a run seeded 0 seeds its 2 envs with 2 * i + j: seed 3 is worker 1's env 1.
SNAP_SEED, SNAP_AT, SNAP_DELAY_S = 3, 195, 0.25
SNAP_MESSAGE = f"SnappingCartPole: the pole snapped at step {SNAP_AT}"
TRAINING_MESSAGE = f"the learner broke at iteration {FAULT_AT}"


class SnappingCartPole(gym.Env):
    """CartPole; the copy reset with seed ``SNAP_SEED`` raises at its ``SNAP_AT``-th step (over episodes)."""

    def __init__(self) -> None:
        self.env = gym.make("CartPole-v1")
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space
        self.steps, self.armed = 0, False

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.armed = seed == SNAP_SEED
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.armed and self.steps == SNAP_AT:
            self.snap()
        return self.env.step(action)

    def snap(self) -> None:  # a named frame the worker's traceback must show
        time.sleep(SNAP_DELAY_S)
        raise ValueError(SNAP_MESSAGE)


class Faults(pl.Callback):
    """Prints the sampler pids and the progress; paces the learner; injects the mode's fault."""

    def __init__(self, mode: str, iterations: int) -> None:
        self.mode, self.iterations = mode, iterations
        self.printed: list[int] = []

    def _print_samplers(self, pl_module: pl.LightningModule) -> list[int]:
        pool = pl_module.default_datamodule.pool
        pids = [p.pid for p in (pool.processes if pool is not None else []) if p is not None]
        if pids and pids != self.printed:
            print("SAMPLERS " + " ".join(map(str, pids)), flush=True)
            self.printed = pids
        return pids

    def on_train_start(self, trainer, pl_module) -> None:
        self._print_samplers(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        pids = self._print_samplers(pl_module)
        iteration = pl_module.counters["num_iterations"]
        print(f"ITERATION {iteration}", flush=True)
        if iteration >= self.iterations:
            trainer.should_stop = True
        time.sleep(PACE_S)
        if iteration != FAULT_AT:
            return
        if self.mode == "training_raises":
            raise RuntimeError(TRAINING_MESSAGE)
        if self.mode == "sampler_sigkill":
            print(f"KILLED {pids[1]}", flush=True)
            os.kill(pids[1], signal.SIGKILL)

    def on_train_end(self, trainer, pl_module) -> None:
        self._print_samplers(pl_module)  # a restarted worker, if it came after the last iteration


def make_model(algo: str, mode: str, iterations: int) -> pl.LightningModule:
    """Two sampler workers of 2 envs and 10-step fragments; ``iterations`` training iterations."""
    common = dict(env=SnappingCartPole if mode == "env_raises" else "CartPole-v1", num_workers=2, num_envs=2,
                  rollout_fragment_length=10, hiddens=(16,), seed=0, iterations_per_epoch=10,
                  sampler_timeout_s=20.0, restart_failed_workers=mode == "sampler_sigkill")
    if algo == "IMPALA":
        return IMPALA(**common, train_batch_size=TRAIN_BATCH_SIZE, total_env_steps=iterations * TRAIN_BATCH_SIZE)
    if algo == "APEX":  # one fragment per worker (40 env steps) per iteration
        return APEX(**common, learning_starts=40, num_gradient_steps=1, train_batch_size=16,
                    total_env_steps=iterations * 40)
    if algo == "A3C":  # one or two gradient packets per iteration: Faults stops it after `iterations`
        return A3C(**common, total_env_steps=None)
    raise SystemExit(f"ALGO must be IMPALA, APEX or A3C, got {algo!r}")


def main(mode: str, root: str, algo: str = "IMPALA") -> None:
    # Ctrl-C must reach us even when started from a shell that ignores SIGINT in background jobs.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if mode not in MODES:
        raise SystemExit(f"MODE must be one of {MODES}, got {mode!r}")
    iterations = {"ok": OK_ITERATIONS, "sampler_sigkill": RESTART_ITERATIONS}.get(mode, ENDLESS_ITERATIONS)
    model = make_model(algo, mode, iterations)
    trainer = pl.Trainer(default_root_dir=root, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[Faults(mode, iterations)])
    trainer.fit(model)
    restarts = model.default_datamodule.counters["num_worker_restarts"]
    print(f"FINISHED {model.counters['num_iterations']} RESTARTS {restarts}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
