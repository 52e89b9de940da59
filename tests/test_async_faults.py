"""No hang anywhere with asynchronous sampling: whole IMPALA fits (and APEX's and A3C's, which
share the sampler workers, for Ctrl-C, env errors and restarts) (2 sampler processes) in a
subprocess (``tests/async_fault_worker.py MODE ROOT``) that finish, are interrupted (Ctrl-C),
lose their learner (SIGKILL), fail in an env or in the learner, or lose a sampler. After each,
no sampler process is alive, checked from /proc: the pids the script printed, and every
process whose command line is the script's run (the samplers are forks of it)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.test_env_faults import live_pids, pid_gone

WORKER = Path(__file__).with_name("async_fault_worker.py")
SCRIPT_TIMEOUT_S = 90  # a script that runs longer hangs: it is killed and the test fails
TEST_TIMEOUT_S = 150
FAULT_AT = 3  # the script's FAULT_AT: the iteration its faults come at
SNAP_MESSAGE = "SnappingCartPole: the pole snapped at step 195"  # the script's env error


def processes_of(root: Path) -> list[int]:
    """Live processes whose command line names ``root``: the script run for it and its forks."""
    needle = str(root).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in args and not pid_gone(int(entry)):
            found.append(int(entry))
    return found


class Script:
    """``async_fault_worker.py MODE ROOT`` in a subprocess, its output read as it comes."""

    def __init__(self, mode: str, root: Path, new_session: bool = False, algo: str = "IMPALA") -> None:
        self.mode, self.root = f"{algo} {mode}", root
        env = {**os.environ, "PYTHONPATH": str(WORKER.parents[1]), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), mode, str(root), algo], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env, start_new_session=new_session,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                        for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def wait_for(self, prefix: str, timeout: float = SCRIPT_TIMEOUT_S) -> str:
        """The first stdout line starting with ``prefix``, once the script prints it."""
        deadline = time.monotonic() + timeout
        while True:
            for line in list(self.out):
                if line.startswith(prefix):
                    return line
            if self.proc.poll() is not None and not any(r.is_alive() for r in self.readers):
                pytest.fail(f"{self.mode}: the script exited ({self.proc.returncode}) before printing "
                            f"{prefix!r}\n{self.stderr[-3000:]}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"{self.mode}: no {prefix!r} within {timeout} s\n{self.stderr[-3000:]}")
            time.sleep(0.02)

    def wait(self, timeout: float = SCRIPT_TIMEOUT_S) -> int:
        """The script's exit code; a script that does not exit within ``timeout`` hangs: fail."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            left = self.kill()
            pytest.fail(f"{self.mode}: the script did not exit within {timeout} s (samplers left: {left})\n"
                        f"{self.stderr[-3000:]}")
        for reader in self.readers:
            reader.join(10)
        return code

    def kill(self) -> list[int]:
        """SIGKILL the script and whatever it left; return the pids of what it left."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        return kill_leftovers(self)

    def sampler_pids(self) -> list[int]:
        """Every sampler pid the script printed, in order (a restarted worker adds one)."""
        pids: list[int] = []
        for line in list(self.out):
            if line.startswith("SAMPLERS "):
                pids += [int(p) for p in line.split()[1:] if int(p) not in pids]
        return pids

    def iterations(self) -> list[int]:
        return [int(line.split()[1]) for line in list(self.out) if line.startswith("ITERATION ")]


def kill_leftovers(script: Script, grace_s: float = 1.0) -> list[int]:
    """SIGKILL the script's sampler processes still alive after ``grace_s``; return their pids."""
    marker = str(script.root)
    left = set(live_pids(script.sampler_pids(), marker=marker, grace_s=grace_s)) | set(processes_of(script.root))
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return sorted(left)


def check_no_sampler_left(script: Script, grace_s: float = 1.0, expected: int = 2) -> None:
    pids = script.sampler_pids()
    assert len(pids) == expected, f"the script printed sampler pids {pids}\n{script.stderr[-3000:]}"
    assert script.proc.pid not in pids
    left = kill_leftovers(script, grace_s)
    assert left == [], f"{script.mode}: processes {left} outlived the script (sampler pids {pids})"


@pytest.fixture
def run_script(tmp_path):
    """Starts scripts; whatever happens in the test, each is killed afterwards with what it left."""
    started: list[Script] = []

    def start(mode: str, new_session: bool = False, algo: str = "IMPALA") -> Script:
        script = Script(mode, tmp_path / mode, new_session, algo)
        started.append(script)
        return script

    yield start
    for script in started:
        script.kill()


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_fit_ends_and_no_sampler_outlives_it(run_script):
    script = run_script("ok")
    code = script.wait()
    assert code == 0, script.stderr[-3000:]
    assert "FINISHED 6 RESTARTS 0" in script.stdout
    check_no_sampler_left(script)


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("target,algo", [("learner", "IMPALA"), ("process_group", "IMPALA"), ("learner", "APEX"),
                                         ("learner", "A3C")])
def test_ctrl_c_stops_the_fit_and_every_sampler(run_script, target, algo):
    """SIGINT to the learner alone (``kill -INT``), or to its whole process group as a terminal's
    Ctrl-C sends it (the samplers get it too, and leave it to the learner): a graceful
    interrupt, exit code 130, well before the budget."""
    script = run_script("sigint", new_session=target == "process_group", algo=algo)
    script.wait_for(f"ITERATION {FAULT_AT}")
    assert len(script.sampler_pids()) == 2
    start = time.monotonic()
    if target == "learner":
        os.kill(script.proc.pid, signal.SIGINT)
    else:
        os.killpg(script.proc.pid, signal.SIGINT)  # a session leader: its group id is its pid
    code = script.wait()
    stopped_in = time.monotonic() - start
    check_no_sampler_left(script)
    assert code == 130, f"exit code {code}\n{script.stderr[-3000:]}"  # 128 + SIGINT (InterruptCheckpoint)
    assert "FINISHED" not in script.stdout
    assert max(script.iterations()) < 1000  # of its 100000
    assert stopped_in < 20, f"the interrupted fit took {stopped_in:.1f} s to exit"


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_samplers_exit_when_the_learner_is_sigkilled(run_script):
    """Nothing in the learner runs after SIGKILL: the samplers notice by themselves (their parent
    changes, their pipes close) and exit within a few seconds."""
    script = run_script("learner_sigkill")
    script.wait_for(f"ITERATION {FAULT_AT}")
    pids = script.sampler_pids()
    assert len(pids) == 2 and live_pids(pids, marker=str(script.root), grace_s=0) == pids
    os.kill(script.proc.pid, signal.SIGKILL)
    assert script.wait() == -signal.SIGKILL
    start = time.monotonic()
    left = live_pids(pids, marker=str(script.root), grace_s=5.0)
    gone_in = time.monotonic() - start
    assert left == [], f"sampler processes {left} outlived their SIGKILLed learner by 5 s"
    check_no_sampler_left(script, grace_s=0)
    assert gone_in < 5


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("algo", ["IMPALA", "APEX", "A3C"])
def test_env_error_in_a_sampler_fails_the_fit_with_the_env_message(run_script, algo):
    """The env copy of sampler worker 1 raises (after a slow step) while the paced learner trains:
    the fit fails with a RuntimeError that names that worker and carries the env's own error and
    traceback, and stops every sampler."""
    script = run_script("env_raises", algo=algo)
    code = script.wait()
    check_no_sampler_left(script)
    pids = script.sampler_pids()
    assert code != 0 and "FINISHED" not in script.stdout
    stderr = script.stderr
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    assert f"RuntimeError: sampler worker 1 (pid {pids[1]}) failed" in stderr, (
        f"the fit failed with {last!r}, not with the env's error\n{stderr[-3000:]}"
    )
    assert "Traceback in the worker process" in stderr
    assert "in snap" in stderr  # the env's own frame
    assert f"ValueError: {SNAP_MESSAGE}" in stderr


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_learner_exception_fails_the_fit_and_stops_every_sampler(run_script):
    script = run_script("training_raises")
    code = script.wait()
    check_no_sampler_left(script)
    assert code != 0 and "FINISHED" not in script.stdout
    assert f"RuntimeError: the learner broke at iteration {FAULT_AT}" in script.stderr, script.stderr[-3000:]
    assert max(script.iterations()) == FAULT_AT


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("algo", ["IMPALA", "APEX", "A3C"])
def test_sigkilled_sampler_is_restarted_and_the_fit_finishes(run_script, algo):
    """``restart_failed_workers=True``: the script SIGKILLs sampler worker 1 at iteration 3; a new
    worker 1 takes its place, the fit finishes its 30 iterations, and no sampler (old or new) is
    left afterwards."""
    script = run_script("sampler_sigkill", algo=algo)
    code = script.wait()
    assert code == 0, script.stderr[-3000:]
    assert "FINISHED 30 RESTARTS 1" in script.stdout, script.stdout[-2000:]
    samplers = [[int(p) for p in line.split()[1:]] for line in script.out if line.startswith("SAMPLERS ")]
    killed = int(re.search(r"^KILLED (\d+)$", script.stdout, re.M).group(1))
    assert len(samplers) == 2, samplers  # the first pair, then worker 0 and the new worker 1
    assert killed == samplers[0][1]
    assert samplers[1][0] == samplers[0][0] and samplers[1][1] not in samplers[0]
    check_no_sampler_left(script, expected=3)
