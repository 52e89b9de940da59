"""Every example script runs (short budgets) and writes TensorBoard logs (CSV without tensorboard,
through ``default_logger``); the README's and the docs' tagged snippets run (tests/test_docs.py runs the
others) and their commands name one checkpoint file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import ddp_subprocess_env
from tests.doc_blocks import DOC_FILES, code_blocks, doc_block
from tests.test_env_faults import live_pids

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "steps"),
    [("ppo_cartpole", 2048), ("ppo_pendulum", 8192), ("dqn_cartpole", 2048), ("sac_pendulum", 600),
     ("impala_cartpole", 4000), ("apex_cartpole", 2048), ("a3c_cartpole", 2000),
     ("ppo_speaker_listener", 1600), ("custom_network", 2048)],
)
def test_example_runs_and_logs(name, steps, tmp_path):
    from tests.test_async import children

    before = set(children())
    result = load(name).main(["--total-env-steps", str(steps), "--log-dir", str(tmp_path)])
    assert not live_pids([p for p in children() if p not in before], grace_s=3.0)  # IMPALA's samplers too
    cartpole = "cartpole" in name or name == "custom_network"
    low, high = (8, 500) if cartpole else (-2000, 0)  # a CartPole episode lasts >= 8 steps
    assert low <= result <= high
    assert list(tmp_path.glob(f"{name}/version_0/events.out.tfevents.*"))


def test_ddp_example_runs_on_two_cpu_processes(tmp_path):
    import subprocess
    import sys

    env = ddp_subprocess_env()  # a free MASTER_PORT of its own
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "ppo_ddp.py"), "--devices", "2", "--total-env-steps", "2048",
         "--log-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "DD-PPO on 2 ranks" in proc.stdout and "2048 global env steps" in proc.stdout
    assert list(tmp_path.glob("ppo_ddp/version_0/events.out.tfevents.*"))


def test_readme_first_block_runs(tmp_path, monkeypatch):
    """The README's first snippet, with a 512-step budget: it trains, and acts on an observation it defines."""
    code = doc_block("quickstart")
    assert "lambda_=0.8, seed=0)" in code
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code.replace("lambda_=0.8, seed=0)", "lambda_=0.8, seed=0, total_env_steps=512)"), "README.md",
                 "exec"), scope)
    model = scope["model"]
    assert model.counters["num_env_steps_sampled"] >= 512
    assert model.compute_actions(scope["obs"], explore=False) in (0, 1)


def test_readme_coming_from_sb3_block_runs(tmp_path, monkeypatch):
    """The side-by-side with SB3 (docs), with a 2,048-step budget: trains, predicts one valid
    action, saves, and the reloaded model (normalization statistics included) acts the same."""
    import numpy as np
    import torch

    code = doc_block("sb3")
    assert "total_env_steps=100_000" in code
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code.replace("total_env_steps=100_000", "total_env_steps=2_048"), "sb3", "exec"), scope)
    model, loaded, action = scope["model"], scope["loaded"], scope["action"]
    assert model.counters["num_env_steps_sampled"] >= 2048 and np.ndim(action) == 0 and action in (0, 1)
    assert scope["best"].best_model_path and (tmp_path / "ppo_cartpole.ckpt").is_file()
    assert torch.equal(loaded.policy.obs_rms.mean, model.policy.obs_rms.mean) and model.policy.obs_rms.count > 0
    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])


def test_examples_log_to_csv_without_tensorboard(tmp_path, monkeypatch):
    """Without the tensorboard extra an example falls back to CSV logs (as the CLI does), rather
    than failing to build its TensorBoardLogger."""
    import lightning_rl.loggers

    monkeypatch.setattr(lightning_rl.loggers, "tensorboard_available", lambda: False)
    load("ppo_cartpole").main(["--total-env-steps", "512", "--log-dir", str(tmp_path)])
    assert (tmp_path / "ppo_cartpole" / "version_0" / "metrics.csv").is_file()
    assert not list(tmp_path.rglob("events.out.tfevents.*"))


def readme_shell_commands() -> list[list[str]]:
    """Every command of the ``bash``/``sh``/``shell``/``console`` code blocks of README.md and
    docs/, as the shell splits it (continuation lines joined, comments dropped)."""
    import shlex

    commands = []
    shells = ("bash", "sh", "shell", "console")
    blocks = [b.code for path in DOC_FILES for b in code_blocks(path) if b.language in shells]
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.removeprefix("$ "), comments=True)
            if words:
                commands.append(words)
    return commands


def ckpt_path_arguments(words: list[str]) -> list[str]:
    """The values of ``--ckpt_path VALUE`` and ``--ckpt_path=VALUE`` in one command."""
    values = [w.split("=", 1)[1] for w in words if w.startswith("--ckpt_path=")]
    values += [words[k + 1] for k, w in enumerate(words[:-1]) if w == "--ckpt_path"]
    return values


def test_readme_commands_name_one_checkpoint_file_never_a_glob():
    """Every fit writes ``epoch=...ckpt`` and ``last.ckpt``, so ``checkpoints/*.ckpt`` expands to
    two paths and the command fails: a documented command names one file."""
    import glob

    paths = [value for words in readme_shell_commands() for value in ckpt_path_arguments(words)]
    assert "lightning_logs/version_0/checkpoints/last.ckpt" in paths  # the parse finds the README's commands
    assert [p for p in paths if glob.has_magic(p)] == []
    assert ckpt_path_arguments(["lightning-rl", "fit", "--ckpt_path", "a/*.ckpt", "--ckpt_path=b/?.ckpt"]) == [
        "b/?.ckpt", "a/*.ckpt"]  # what the check would catch
    assert all(glob.has_magic(p) for p in ("a/*.ckpt", "b/?.ckpt"))


def test_examples_build_their_logger_with_the_default_logger_fallback():
    """No example imports or names ``TensorBoardLogger`` (it fails to build without the tensorboard
    extra); each logger an example passes is ``default_logger(...)``, which falls back to CSV."""
    import ast

    files = sorted(EXAMPLES.rglob("*.py"))
    assert EXAMPLES / "ppo_cartpole.py" in files and EXAMPLES / "custom_env" / "train_grid.py" in files
    named, other_loggers, with_logger = [], [], []
    for path in files:
        source = path.read_text()
        name = str(path.relative_to(EXAMPLES))
        named += [f"{name}:{n}" for n, line in enumerate(source.splitlines(), 1) if "TensorBoardLogger" in line]
        for node in ast.walk(ast.parse(source, filename=name)):
            for keyword in getattr(node, "keywords", []) if isinstance(node, ast.Call) else []:
                if keyword.arg != "logger" or (isinstance(keyword.value, ast.Constant) and keyword.value.value in
                                               (False, None)):
                    continue
                with_logger.append(name)
                value = keyword.value
                if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                        and value.func.id == "default_logger"):
                    other_loggers.append(f"{name}:{keyword.value.lineno}")
    assert named == []
    assert other_loggers == []
    assert "ppo_cartpole.py" in with_logger and "dqn_cartpole.py" in with_logger  # the walk finds the loggers
