"""Run by tests/test_ray.py in a subprocess: fits whose sampler workers are Ray actors.

    python tests/ray_worker.py MODE OUT_DIR [RAY_ADDRESS]

``finish``: an IMPALA fit on a local Ray it starts itself (no Ray running, no address), then one
whose env raises; after each it prints ``CLEAN <label> <pids>`` with the Ray processes it had
started (its descendants while the fit ran). ``sigint``: the same fit, long; prints its Ray
processes and ``ITERATION n``, the test sends SIGINT. ``ddp``: IMPALA under 2-rank CPU DDP, each
rank's actors on the cluster at RAY_ADDRESS; each rank writes ``rank<r>.json``. ``ray_train``:
the recipe of docs/guides/scaling-out.md, the whole fit under Ray Train's ``TorchTrainer`` (2 ranks, Lightning's DDP
through ``ray.train.lightning``) on the cluster at RAY_ADDRESS; each rank writes ``rank<r>.json``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import pytorch_lightning as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lightning_rl import IMPALA

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

SMALL = dict(env="CartPole-v1", num_workers=2, num_envs=2, rollout_fragment_length=10, train_batch_size=40,
             hiddens=(16,), seed=0, sampler_backend="ray", sampler_timeout_s=60.0)


class Breaks(gym.Wrapper):
    """CartPole whose 30th step raises."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 30:
            raise RuntimeError("the emulator lost its state at step 30")
        return self.env.step(action)


def descendants(root: int) -> list[int]:
    """Live processes below ``root`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Report(pl.Callback):
    """Prints this process's descendants (the Ray it started, its actors) and the iterations."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def on_train_start(self, trainer, pl_module):
        self.seen |= set(descendants(os.getpid()))  # the Ray started and its actors placed in setup

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen |= set(descendants(os.getpid()))
        print(f"RAY {' '.join(map(str, sorted(self.seen)))}", flush=True)
        print(f"ITERATION {pl_module.counters['num_iterations']}", flush=True)


def trainer(**kwargs) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **kwargs)


class Ranks(pl.Callback):
    """Each rank's actors (where they run) and the first observations it trained on."""

    def __init__(self, out: Path) -> None:
        self.out, self.first_obs = out, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.first_obs is None:
            self.first_obs = batch.policy_batches["default_policy"]["obs"][0, 0].tolist()

    def on_train_end(self, trainer, pl_module):
        pool = pl_module.default_datamodule.pool
        params = [p.detach().flatten().tolist() for p in pl_module.parameters()]
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps({
            "where": pool.where, "first_obs": self.first_obs, "params": params,
            "counters": dict(pl_module.counters), "global_counters": dict(pl_module.global_counters)}))


# the documented recipe's cluster settings -> this test's small CPU run (each must be in the block)
RAY_TRAIN_EDITS = {
    'IMPALA(env="ALE/Breakout-v5", num_workers=32, sampler_backend="ray",\n'
    '                   custom_resources_per_worker={"cpu_node": 1})': "IMPALA(**SMALL, total_env_steps=2 * 40 * 4)",
    'accelerator="gpu"': 'accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, '
                         'enable_model_summary=False, callbacks=[Ranks(Path(config["out"]))]',
    "ScalingConfig(num_workers=2, use_gpu=True))": "ScalingConfig(num_workers=2, use_gpu=False), "
                                                   "train_loop_config=CONFIG, run_config=RUN)",
}


def ray_train(out: Path, address: str) -> None:
    """The documented recipe (the block tagged ``ray_train`` in docs/guides/scaling-out.md), on CPU
    ranks with this module's small IMPALA: the whole fit under Ray Train, one learner rank per Ray
    Train worker, each rank's sampler actors on the same cluster."""
    import ray
    from ray.train import RunConfig

    from tests.doc_blocks import doc_block

    code = doc_block("ray_train")
    for old, new in RAY_TRAIN_EDITS.items():
        assert old in code, f"the documented Ray Train recipe no longer holds {old!r}"
        code = code.replace(old, new)
    scope = {"SMALL": SMALL, "Ranks": Ranks, "Path": Path, "CONFIG": {"out": str(out)},
             "RUN": RunConfig(storage_path=str(out / "ray_train"), name="impala")}
    ray.init(address=address, log_to_driver=False)
    try:
        exec(compile(code, "docs/guides/scaling-out.md", "exec"), scope)
    finally:
        ray.shutdown()


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    address = sys.argv[3] if len(sys.argv) > 3 else None
    os.environ.pop("RAY_ADDRESS", None)
    if mode == "finish":
        for label, env in (("fit", "CartPole-v1"), ("raises", Breaks)):
            report = Report()
            failed = descendants(os.getpid())  # a fit that fails in setup: what it left, gone below
            try:
                trainer(max_epochs=-1, callbacks=[report]).fit(IMPALA(**{**SMALL, "env": env}, total_env_steps=200))
            except RuntimeError as err:
                print(f"ERROR {str(err).splitlines()[0]}", flush=True)
                assert "the emulator lost its state at step 30" in str(err), err
            print(f"CLEAN {label} {' '.join(map(str, sorted(report.seen | set(failed))))}", flush=True)
    elif mode == "sigint":
        trainer(max_epochs=-1, callbacks=[Report()]).fit(IMPALA(**SMALL, total_env_steps=400_000))
    elif mode == "ddp":
        model = IMPALA(**SMALL, ray_address=address, total_env_steps=2 * 40 * 4)
        trainer(strategy="ddp", devices=2, callbacks=[Ranks(out)]).fit(model)
    elif mode == "ray_train":
        ray_train(out, address)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
