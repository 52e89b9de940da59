"""Issue 42, items 2 and 3 (docs/guides/trainer-flags.md): ``pl.seed_everything`` seeds a module
made without ``seed=`` (its envs, sampling and generators, and the seed its checkpoints keep), and
``strategy="ddp_spawn"`` / ``"ddp_fork"`` are refused in one line naming ``strategy="ddp"``.

The runs that start processes run this file as a script in a subprocess with a timeout:

    python tests/test_trainer_flags_processes.py MODE OUT_DIR

MODE ``seed``: ``seed_everything(0, workers=True)``, then a PPO without ``seed`` fits 256 CartPole
env steps and writes what it ended with to ``OUT_DIR/result.json``; ``ddp_spawn``, ``ddp_fork``: the
same PPO (seeded) on 2 CPU ranks with that strategy.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lightning_rl import PPO
from lightning_rl.data.rollout import RolloutDataModule
from lightning_rl.data.settings import EnvSettings
from lightning_rl.distributed import check_strategy
from tests.conftest import ddp_subprocess_env, quiet_trainer

pytestmark = pytest.mark.timeout(300)

MARKER = "LRL_PROCESS_TEST_MARKER"  # an env var every process a run starts inherits


def tiny_ppo(**settings: Any) -> PPO:
    """128 CartPole env steps an iteration (2 envs x 64), 256 in the run."""
    defaults = dict(num_envs=2, rollout_fragment_length=64, sgd_minibatch_size=64, num_sgd_iter=2, hiddens=(16,),
                    iterations_per_epoch=2, total_env_steps=256, num_cpu_threads=1, cpu_affinity=False)
    return PPO(**{**defaults, **settings})


def flat_params(model: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def run_script(mode: str, out: Path, timeout: int = 240) -> tuple[subprocess.CompletedProcess, str]:
    """This file as a script in a subprocess; returns it and the marker its processes carry."""
    marker = uuid.uuid4().hex
    env = ddp_subprocess_env(**{MARKER: marker})
    proc = subprocess.run([sys.executable, __file__, mode, str(out)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc, marker


def processes_with(marker: str, wait_s: float = 10.0) -> list[int]:
    """The processes still alive (after up to ``wait_s``) whose environment holds ``marker``."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if f"{MARKER}={marker}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    alive.append(int(entry.name))
            except OSError:  # gone, or another user's
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


# ----------------------------------------------------------------------------- item 2: seed_everything
def test_seed_everything_without_module_seed_trains_the_same_weights_in_two_processes(tmp_path):
    """Two processes, each ``seed_everything(0, workers=True)`` then ``PPO()`` without ``seed``: the
    same final weights (envs and action sampling seeded from 0, not from the OS), the module's seed
    is 0 and so is the seed its last.ckpt records."""
    results = []
    for run in ("a", "b"):
        proc, _ = run_script("seed", tmp_path / run)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        results.append(json.loads((tmp_path / run / "result.json").read_text()))
    first, second = results
    assert first["initial"] == second["initial"]  # seed_everything seeded torch's RNG before the build
    assert first["global_env_steps"] == second["global_env_steps"] == 256
    assert first["final"] == second["final"]
    assert first["final"] != first["initial"]
    assert first["seed"] == first["checkpoint_seed"] == 0


@pytest.fixture
def lightning_seed_env(monkeypatch):
    """``seed_everything`` sets these in ``os.environ``: restored after the test."""
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        monkeypatch.delenv(name, raising=False)


def test_seed_everything_after_the_module_is_made_seeds_its_sampling_and_warns_once_about_its_weights(
        lightning_seed_env, tmp_path):
    """The other order, ``PPO()`` then ``seed_everything(0)``: the fit takes seed 0 (its envs, sampling
    and generators; the DataModule test below shows what that seeds), and one warning says the weights
    were built unseeded."""
    model = tiny_ppo(total_env_steps=128)
    pl.seed_everything(0, workers=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(default_root_dir=tmp_path).fit(model)
    said = [str(w.message) for w in caught if "seed_everything" in str(w.message)]
    assert said == ["PPO was made before seed_everything(0), without seed=, so its initial weights are unseeded "
                    "(its envs and sampling follow seed 0): for a reproducible run call seed_everything before "
                    "making it, or pass PPO(seed=0)"]
    assert model.seed == model.hparams["seed"] == model.default_datamodule.seed == 0


def test_a_datamodule_made_without_seed_takes_lightnings_seed(lightning_seed_env):
    """A DataModule given to ``fit`` with ``seed=None`` is seeded by ``seed_everything`` too: its first
    observations are those of the same DataModule made with ``seed=3``."""
    pl.seed_everything(3)
    observations = []
    for seed in (None, 3):
        dm = RolloutDataModule(EnvSettings("CartPole-v1", num_envs=2, seed=seed), rollout_fragment_length=8)
        dm.connect(tiny_ppo(seed=0))
        dm.setup("fit")
        try:
            assert dm.seed == 3
            observations.append(dm.sampler.obs.copy())
        finally:
            dm.teardown("fit")
    assert (observations[0] == observations[1]).all()


def test_resuming_a_module_made_without_seed_keeps_the_runs_seed(lightning_seed_env, tmp_path):
    """The seed a run took from ``seed_everything`` is the one its checkpoint keeps, and a resume of
    it with a module made without ``seed`` (and no ``seed_everything``) continues with that seed."""
    pl.seed_everything(5)
    quiet_trainer(default_root_dir=tmp_path, enable_checkpointing=True).fit(tiny_ppo(total_env_steps=128))
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["hyper_parameters"]["seed"] == 5
    os.environ.pop("PL_GLOBAL_SEED")
    resumed = tiny_ppo(total_env_steps=256)
    quiet_trainer(default_root_dir=tmp_path / "resumed", enable_checkpointing=True).fit(resumed, ckpt_path=str(last))
    assert resumed.seed == resumed.hparams["seed"] == 5
    assert resumed.global_counters["num_env_steps_sampled"] == 256
    resumed_last = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    assert torch.load(resumed_last, weights_only=True)["hyper_parameters"]["seed"] == 5


# ----------------------------------------------------------------------------- item 3: ddp_spawn, ddp_fork
REFUSAL = ("strategy='ddp_{}' is not supported (the counters, global_step, envs and replay of a fit would stay "
           "in its child processes): use strategy='ddp' (processes started by Lightning's launcher), see "
           "docs/guides/ddp.md")


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_multiprocessing_strategies_are_refused_in_one_line_and_leave_no_process(tmp_path, method):
    """``strategy="ddp_spawn"`` used to crash pickling the module (``bad value(s) in fds_to_keep``) and
    ``"ddp_fork"`` to train with the main process left at 0 counters and ``global_step``: both are
    refused with one line naming ``strategy="ddp"`` (ddp_spawn in the main process before a rank
    starts; ddp_fork in the ranks, as the module is attached), nothing is trained, and no process
    of the run outlives it."""
    proc, marker = run_script(f"ddp_{method}", tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert f"ValueError: {REFUSAL.format(method)}" in output.splitlines(), output[-3000:]
    assert "RESULT" not in proc.stdout and "fds_to_keep" not in output
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()
    if method == "spawn":  # refused in the main process, as its last line
        assert output.strip().splitlines()[-1] == f"ValueError: {REFUSAL.format(method)}"
    assert processes_with(marker) == []


def test_the_strategy_error_names_ddp_alone():
    """The error for several processes without Lightning's DDP names ``strategy='ddp'`` only (it used
    to offer 'ddp_spawn', which is refused)."""
    trainer = SimpleNamespace(world_size=2, model=torch.nn.Linear(1, 1), strategy=SimpleNamespace())
    with pytest.raises(ValueError) as raised:
        check_strategy(trainer)  # type: ignore[arg-type]
    assert str(raised.value) == ("lightning_rl trains on several processes with strategy='ddp' only (see "
                                 "docs/guides/ddp.md), got SimpleNamespace")


# ----------------------------------------------------------------------------- the subprocess side
def _main(mode: str, out: Path) -> None:
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    out.mkdir(parents=True, exist_ok=True)
    trainer_args = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        default_root_dir=str(out))
    if mode == "seed":
        pl.seed_everything(0, workers=True)
        model = tiny_ppo()
        initial = flat_params(model)
        pl.Trainer(devices=1, **trainer_args).fit(model)
        checkpoint = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
        (out / "result.json").write_text(json.dumps({
            "initial": initial, "final": flat_params(model), "seed": model.seed,
            "checkpoint_seed": checkpoint["hyper_parameters"]["seed"],
            "global_env_steps": model.global_counters["num_env_steps_sampled"],
        }))
    else:
        model = tiny_ppo(seed=0)
        trainer = pl.Trainer(devices=2, strategy=mode, **trainer_args)
        trainer.fit(model)
        print("RESULT", json.dumps({"global_step": trainer.global_step, "counters": model.global_counters}))


if __name__ == "__main__":
    _main(sys.argv[1], Path(sys.argv[2]))
