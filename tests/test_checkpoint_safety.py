"""Checkpoints never run code; callable hyperparameters; the CLI's checkpoint and seed handling."""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from lightning_rl import PPO, SAC, TD3
from lightning_rl.checkpoint import CheckpointError
from lightning_rl.cli import cli
from tests.conftest import fit_iterations, quiet_trainer

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=1, seed=0,
             iterations_per_epoch=2, total_env_steps=None)


class _Payload:
    """Unpickling this creates ``path``: proof that a loader ran code from the file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _fit_and_save(tmp_path: Path, **kwargs) -> Path:
    model = PPO(**{**SMALL, **kwargs})
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model)
    path = tmp_path / "good.ckpt"
    trainer.save_checkpoint(path)
    return path


def _craft(good: Path, out: Path, marker: Path, evil_module: str) -> Path:
    """A checkpoint that loads with weights_only=True but whose bytes fields hold a pickle that
    creates ``marker``, whose algorithm and ``_class_path`` name a module that creates it on import."""
    checkpoint = torch.load(good, weights_only=True)
    payload = pickle.dumps(_Payload(str(marker)))
    state = checkpoint["lightning_rl"]
    state["datamodule"]["ranks"][0]["envs"] = payload  # where pickled envs used to be
    state["datamodule"]["envs"] = payload
    state["algorithm"] = f"{evil_module}.PPO"
    checkpoint["hyper_parameters"]["_class_path"] = f"{evil_module}.PPO"
    torch.save(checkpoint, out)
    return out


@pytest.fixture
def crafted(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    (tmp_path / "evil_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\nfrom lightning_rl import PPO\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return _craft(_fit_and_save(tmp_path), tmp_path / "crafted.ckpt", marker, "evil_mod"), marker


def test_a_crafted_checkpoint_runs_no_code_on_resume(crafted):
    path, marker = crafted
    with pytest.raises(CheckpointError, match=r"evil_mod\.PPO, not lightning_rl\.algorithms\.ppo\.PPO"):
        quiet_trainer(max_epochs=2).fit(PPO(**SMALL), ckpt_path=path)
    assert not marker.exists() and "evil_mod" not in sys.modules


def test_a_crafted_checkpoint_runs_no_code_when_its_bytes_are_restored(tmp_path):
    good = _fit_and_save(tmp_path)
    marker = tmp_path / "pwned"
    checkpoint = torch.load(good, weights_only=True)
    checkpoint["lightning_rl"]["datamodule"]["ranks"][0]["envs"] = pickle.dumps(_Payload(str(marker)))
    torch.save(checkpoint, tmp_path / "bytes.ckpt")
    with pytest.raises((ValueError, TypeError)):
        quiet_trainer(max_epochs=2).fit(PPO(**SMALL), ckpt_path=tmp_path / "bytes.ckpt")
    assert not marker.exists()


def test_a_crafted_checkpoint_runs_no_code_in_load_from_checkpoint(crafted):
    path, marker = crafted
    model = PPO.load_from_checkpoint(path, weights_only=True)
    assert model.counters["num_iterations"] == 2
    assert not marker.exists() and "evil_mod" not in sys.modules


@pytest.mark.timeout(300)
def test_a_crafted_checkpoint_runs_no_code_in_cli_validate(crafted, tmp_path):
    path, marker = crafted
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}  # evil_mod importable, if anyone tried
    proc = subprocess.run([sys.executable, "-m", "lightning_rl.cli", "validate", "--ckpt_path", str(path),
                           "--trainer.logger", "false"], env=env, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    # evil_mod.PPO is not defined here: the file is validated as the PPO it records as its base, with a
    # warning naming it (as a __main__ subclass's checkpoint is), and evil_mod is never imported
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'evil_mod.PPO' is not defined in this process: loading it as" in proc.stderr
    assert not marker.exists()


# ----------------------------------------------------------------------------- callable hyperparameters
def _cartpole():
    return gym.make("CartPole-v1")


class CartPoleFactory:
    def __call__(self):
        return gym.make("CartPole-v1")


def _closure():
    max_steps = 200
    return lambda: gym.make("CartPole-v1", max_episode_steps=max_steps)


@pytest.mark.parametrize(
    "env",
    [lambda: gym.make("CartPole-v1"), _closure(), functools.partial(gym.make, "CartPole-v1"), _cartpole,
     CartPoleFactory()],
    ids=["lambda", "closure", "partial", "function", "object"],
)
def test_any_callable_env_trains_checkpoints_and_reloads(env, tmp_path):
    model = PPO(**{**SMALL, "env": env})
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model)
    assert model.counters["num_iterations"] == 2
    path = tmp_path / "callable.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["hyper_parameters"]["env"]
    assert saved.startswith("<callable ") and saved.endswith(">")  # a name, not code
    with pytest.raises(ValueError, match=r"env=<callable .*checkpoint cannot hold.*load_from_checkpoint\(path, env="):
        PPO.load_from_checkpoint(path, weights_only=True)
    restored = PPO.load_from_checkpoint(path, weights_only=True, env=env)
    torch.testing.assert_close(restored.state_dict(), model.state_dict())
    resumed = PPO(**{**SMALL, "env": env})
    quiet_trainer(max_epochs=2).fit(resumed, ckpt_path=path)  # resume with the callable given again
    assert resumed.counters["num_iterations"] == 4


def test_a_class_env_is_a_callable_too():
    from gymnasium.envs.classic_control import CartPoleEnv

    model = PPO(**{**SMALL, "env": CartPoleEnv})
    fit_iterations(model, 1)
    assert model.hparams.env == "<callable gymnasium.envs.classic_control.cartpole.CartPoleEnv>"


@pytest.mark.timeout(300)
def test_cli_validate_needs_a_callable_env_again(tmp_path):
    path = _fit_and_save(tmp_path, env=_cartpole)
    base = [sys.executable, "-m", "lightning_rl.cli", "validate", "--ckpt_path", str(path), "--trainer.logger",
            "false", "--trainer.enable_progress_bar", "false"]
    run = functools.partial(subprocess.run, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                            text=True, timeout=240, cwd=tmp_path)
    missing = run(base)
    assert missing.returncode != 0 and "pass it again with --model.env" in missing.stderr
    given = run([*base, "--model.env", "CartPole-v1"])
    assert given.returncode == 0, given.stderr[-2000:]
    assert "val/episode_return_mean" in given.stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["ppo", "sac", "td3"])
def test_cli_validates_a_python_api_checkpoint_with_only_ckpt_path(algo, tmp_path):
    """Item 13: a checkpoint written from the Python API (tuple hiddens, schedules as lists, a
    non-default class) validates from the CLI with nothing but ``--ckpt_path``."""
    if algo == "ppo":
        model = PPO(**{**SMALL, "hiddens": (16, 16), "lr_schedule": [[0, 1e-3], [64, 1e-4]]})
    else:
        model = {"sac": SAC, "td3": TD3}[algo](env="Pendulum-v1", learning_starts=16, train_batch_size=16,
                                               hiddens=(16,), seed=0, total_env_steps=None, iterations_per_epoch=24,
                                               evaluation_num_episodes=1)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model)
    path = tmp_path / f"{algo}.ckpt"
    trainer.save_checkpoint(path)
    proc = subprocess.run([sys.executable, "-m", "lightning_rl.cli", "validate", "--ckpt_path", str(path),
                           "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "val/episode_return_mean" in proc.stdout


# ----------------------------------------------------------------------------- the CLI's seed
def test_cli_model_seed_follows_seed_everything(tmp_path):
    args = ["--model", "PPO", "--seed_everything", "7", "--trainer.default_root_dir", str(tmp_path)]
    assert cli(args, run=False).model.seed == 7
    assert cli([*args, "--model.seed", "3"], run=False).model.seed == 3  # an explicit model seed wins


def test_cli_runs_with_the_same_seed_everything_are_identical(tmp_path):
    def run(name: str):
        config = cli(["--model", "PPO", "--seed_everything", "5", "--model.num_envs", "2",
                      "--model.rollout_fragment_length", "16", "--model.sgd_minibatch_size", "16",
                      "--trainer.default_root_dir", str(tmp_path / name)], run=False)
        fit_iterations(config.model, 2)
        return torch.cat([p.detach().flatten() for p in config.model.parameters()])

    torch.testing.assert_close(run("a"), run("b"), rtol=0, atol=0)


def test_seed_none_is_random():
    a, b = (PPO(**{**SMALL, "seed": None}) for _ in range(2))
    assert not torch.equal(a.shuffle_generator.get_state(), b.shuffle_generator.get_state())
    dm_a, dm_b = a.default_datamodule, b.default_datamodule
    assert not torch.equal(dm_a.generator.get_state(), dm_b.generator.get_state())
    seeded = [PPO(**SMALL).default_datamodule.generator.get_state() for _ in range(2)]
    assert torch.equal(*seeded)



@pytest.mark.parametrize("kwargs", [dict(), dict(use_lstm=True)], ids=["mlp", "lstm"])
def test_seeded_weights_do_not_depend_on_torch_thread_count(kwargs):
    """Orthogonal init's QR decomposition differs in the last bit with the thread count; a seed
    must give the same network whatever torch.set_num_threads was when it was built."""
    threads = torch.get_num_threads()
    try:
        built = []
        for n in (1, 2, 4):
            torch.set_num_threads(n)
            model = PPO(env="CartPole-v1", seed=0, **kwargs)
            built.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(built[0], b) for b in built[1:])
