"""SIGTERM ends the sanity check, validation, test and ``record`` within seconds with exit code
143 (a checkpoint during ``fit``), also on an env whose episodes never end (issue 35, item 2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import default_sigint

WORKER = Path(__file__).with_name("sigterm_worker.py")
ROOT = WORKER.parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
STOPS_WITHIN_S = 30  # after the signal (a loaded CI machine; it takes about a second)


def terminate_when_evaluating(mode: str, cwd: Path) -> tuple[int, float, str]:
    """Run the worker, send SIGTERM once it evaluates; ``(exit code, seconds to exit, output)``."""
    proc = subprocess.Popen([sys.executable, str(WORKER), mode, str(cwd)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV, cwd=cwd, preexec_fn=default_sigint)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("EVALUATING"):
                time.sleep(0.5)  # well inside the evaluation's loop
                proc.send_signal(signal.SIGTERM)
                sent = time.monotonic()
                break
        else:
            pytest.fail("never evaluated:\n" + "".join(lines)[-3000:])
        try:
            out, _ = proc.communicate(timeout=STOPS_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{mode}: still running {STOPS_WITHIN_S} s after SIGTERM")
        return proc.returncode, time.monotonic() - sent, "".join(lines) + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["sanity", "validate", "test"])
def test_sigterm_during_evaluation_exits_143(mode, tmp_path):
    code, _, out = terminate_when_evaluating(mode, tmp_path)
    assert code == 143, out[-3000:]  # 128 + SIGTERM, as a shell reports it
    ckpt = tmp_path / "checkpoints" / "interrupted.ckpt"
    assert ckpt.is_file() == (mode == "sanity"), out[-3000:]  # training state only during fit


@pytest.mark.timeout(240)
def test_sigterm_during_record_ends_it(tmp_path):
    """pygame's SDL, which draws CartPole, would turn SIGTERM into an event no one reads."""
    pytest.importorskip("pygame")
    code, _, out = terminate_when_evaluating("record", tmp_path)
    assert code in (143, -signal.SIGTERM), out[-3000:]  # a shell reports both as 143
