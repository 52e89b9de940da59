"""Ctrl-C (SIGINT) and SIGTERM during fit leave a checkpoint in the run's checkpoint folder and exit
130 / 143; a resumed run finishes the budget, counters continuing; no sampler process outlives it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import default_sigint
from tests.interrupt_worker import ITERATIONS, STEPS_PER_ITERATION
from tests.test_async_faults import processes_of
from tests.test_env_faults import live_pids

WORKER = Path(__file__).with_name("interrupt_worker.py")
ROOT = WORKER.parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def signal_at(args: list[str], sig: int, cwd: Path, at: str = "ITERATION 12", timeout: float = 240) -> tuple:
    """Run ``args``, send ``sig`` once a stdout line starts with ``at``; ``(exit code, output)``."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=cwd,
                            preexec_fn=default_sigint)
    lines = []
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(at):
                proc.send_signal(sig)
                break
            assert time.monotonic() < deadline, f"never printed {at!r}"
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return proc.returncode, "".join(lines) + out


def test_sigint_saves_a_checkpoint_that_resumes(tmp_path):
    code, out = signal_at([sys.executable, str(WORKER), str(tmp_path)], signal.SIGINT, tmp_path)
    assert code == 130, out[-3000:]  # 128 + SIGINT, as a shell reports a process Ctrl-C ended
    ckpt = tmp_path / "checkpoints" / "interrupted.ckpt"  # no logger: <default_root_dir>/checkpoints
    assert ckpt.is_file()

    resumed = subprocess.run([sys.executable, str(WORKER), str(tmp_path), str(ckpt)], capture_output=True,
                             text=True, env=ENV, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    result = json.loads(resumed.stdout.split("RESULT ", 1)[1])
    assert result["start"]["num_iterations"] >= 12  # counters continue from the interrupted run
    assert result["end"]["num_env_steps_sampled"] == ITERATIONS * STEPS_PER_ITERATION  # ... and the budget is finished
    assert result["end"]["num_iterations"] == ITERATIONS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["PPO", "IMPALA"])
def test_sigterm_saves_a_checkpoint_and_exits_143(algo, tmp_path):
    """Cluster preemption, ``docker stop``, ``timeout``: Lightning stops after the iteration in
    progress, so the checkpoint's counters are those of whole iterations. IMPALA's sampler
    process does not outlive the learner."""
    code, out = signal_at([sys.executable, str(WORKER), str(tmp_path), "-", algo], signal.SIGTERM, tmp_path)
    assert code == 143, out[-3000:]  # 128 + SIGTERM
    counters = torch.load(tmp_path / "checkpoints" / "interrupted.ckpt", weights_only=True)["lightning_rl"][
        "global_counters"]
    assert 12 <= counters["num_iterations"] < ITERATIONS, counters
    assert counters["num_env_steps_sampled"] == counters["num_iterations"] * STEPS_PER_ITERATION
    samplers = [int(p) for line in out.splitlines() if line.startswith("SAMPLERS ") for p in line.split()[1:]]
    assert len(samplers) == (algo == "IMPALA")
    assert not live_pids(samplers + processes_of(tmp_path), grace_s=3.0)


@pytest.mark.timeout(300)
def test_cli_ctrl_c_names_the_command_that_resumes_and_keeps_the_checkpoint_in_the_version_folder(tmp_path):
    """The message a CLI user gets is the ``lightning-rl`` command, which resumes the run to its budget;
    ``interrupted.ckpt`` is in the run's own version folder, where the next run does not overwrite it."""
    args = ["fit", "--model", "PPO", "--model.env", "CartPole-v1", "--model.num_envs", "4",
            "--model.rollout_fragment_length", "32", "--model.sgd_minibatch_size", "64",
            "--model.total_env_steps", str(ITERATIONS * STEPS_PER_ITERATION), "--trainer.enable_progress_bar", "false",
            "--trainer.callbacks+=tests.interrupt_worker.Progress"]
    code, out = signal_at([sys.executable, "-m", "lightning_rl.cli", *args], signal.SIGINT, tmp_path)
    assert code == 130, out[-3000:]
    ckpt = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "interrupted.ckpt"
    assert ckpt.is_file()
    command = shlex.join(["lightning-rl", *args, "--ckpt_path", str(ckpt)])
    assert f"resume with {command}" in out, out[-3000:]

    resumed = subprocess.run([sys.executable, "-m", "lightning_rl.cli", *shlex.split(command)[1:]], cwd=tmp_path,
                             env=ENV, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    last = torch.load(tmp_path / "lightning_logs" / "version_1" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["lightning_rl"]["global_counters"]["num_env_steps_sampled"] == ITERATIONS * STEPS_PER_ITERATION
    assert ckpt.is_file()  # the resumed run, ending normally, leaves it where it was
