"""Ctrl-C during fit leaves a checkpoint; a resumed run finishes the budget, counters continuing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.interrupt_worker import ITERATIONS

WORKER = Path(__file__).with_name("interrupt_worker.py")


def test_sigint_saves_a_checkpoint_that_resumes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(WORKER.parents[1])}
    proc = subprocess.Popen([sys.executable, str(WORKER), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 240
    try:
        for line in proc.stdout:
            if line.startswith("ITERATION 12"):
                proc.send_signal(signal.SIGINT)
                break
            assert time.monotonic() < deadline, "training never reached iteration 12"
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0  # Lightning exits non-zero after a graceful interrupt
    ckpt = tmp_path / "checkpoints" / "interrupted.ckpt"
    assert ckpt.is_file()

    resumed = subprocess.run([sys.executable, str(WORKER), str(tmp_path), str(ckpt)], capture_output=True,
                             text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    result = json.loads(resumed.stdout.split("RESULT ", 1)[1])
    assert result["start"]["num_iterations"] >= 12  # counters continue from the interrupted run
    assert result["end"]["num_env_steps_sampled"] == ITERATIONS * 128  # ... and the budget is finished
    assert result["end"]["num_iterations"] == ITERATIONS
