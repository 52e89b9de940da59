"""A failing async env worker is an error that names the env, never a hang, and no worker
outlives it: the functions of ``lightning_rl.data.envs`` on ``AsyncVectorEnv`` directly, then
whole fits in a subprocess (``test_subprocess_fit_*``, run with ``-k subprocess_fit``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from lightning_rl.data.envs import async_env_of, close_vector_env, make_vector_env, reset_vector_env, step_vector_env

WORKER = Path(__file__).with_name("env_fault_worker.py")


class FailingEnv(gym.Env):
    """Raises ``error`` at its ``at``-th step, but only in the copy reset with seed ``seed_to_fail``
    (``reset(seed=s)`` seeds env ``i`` with ``s + i``, so the seed picks the env index)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, error: Exception, at: int = 3, seed_to_fail: int = 1) -> None:
        self.error, self.at, self.seed_to_fail = error, at, seed_to_fail
        self.steps, self.armed = 0, False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.armed = seed == self.seed_to_fail
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.armed and self.steps == self.at:
            self.explode()
        return np.zeros(2, dtype=np.float32), 1.0, False, False, {}

    def explode(self) -> None:  # a named frame the worker's traceback must show
        raise self.error


class TwoArgError(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code}: {text}")


class UnpicklableError(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.lock = threading.Lock()


def failing(error: Exception) -> FailingEnv:
    return FailingEnv(error)


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def plain_async(factory, num_envs: int = 2) -> gym.vector.VectorEnv:
    """gymnasium's own AsyncVectorEnv under the wrapper ``make_vector_env`` adds: no help from us."""
    venv = gym.vector.AsyncVectorEnv([factory] * num_envs)
    return gym.wrappers.vector.RecordEpisodeStatistics(venv)


BUILDERS = {
    "make_vector_env": lambda factory: make_vector_env(factory, 2, "async"),
    "plain_AsyncVectorEnv": plain_async,
}


def pid_gone(pid: int, marker: str | None = None) -> bool:
    """No live process ``pid`` (a zombie counts as gone); with ``marker``, a live process whose
    command line lacks it is a reused pid, also gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return True
    if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
        return True
    return marker is not None and marker not in cmdline


def live_pids(pids: list[int], marker: str | None = None, grace_s: float = 1.0) -> list[int]:
    deadline = time.monotonic() + grace_s
    while (alive := [p for p in pids if not pid_gone(p, marker)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


@pytest.fixture
def envs_to_close():
    """Envs a test made; whatever happens in the test, their workers are killed afterwards."""
    made: list[gym.vector.VectorEnv] = []
    yield made
    for envs in made:
        venv = async_env_of(envs)
        for process in venv.processes:
            if process.is_alive():
                process.kill()
                process.join(5)


def actions(envs: gym.vector.VectorEnv) -> np.ndarray:
    return np.zeros(envs.num_envs, dtype=np.int64)


# ------------------------------------------------------------------ the functions, in process
@pytest.mark.timeout(60)
@pytest.mark.parametrize("build", list(BUILDERS))
def test_env_error_names_the_env_and_no_worker_survives(build, envs_to_close):
    envs = BUILDERS[build](lambda: failing(ValueError("boom from env")))
    envs_to_close.append(envs)
    venv = async_env_of(envs)
    pids = [p.pid for p in venv.processes]
    reset_vector_env(envs, seed=0)
    step_vector_env(envs, actions(envs))
    step_vector_env(envs, actions(envs))
    expected = rf"^env 1 \(worker pid {pids[1]}\) raised ValueError: boom from env"
    with pytest.raises(RuntimeError, match=expected) as info:
        step_vector_env(envs, actions(envs))
    if build == "make_vector_env":  # our workers also send the env's traceback
        assert "in explode" in str(info.value) and "Traceback in the env worker process" in str(info.value)
    assert all(p.exitcode is not None for p in venv.processes)
    assert live_pids(pids) == []
    assert venv.closed
    close_vector_env(envs)  # after the failure, closing again is quiet
    close_vector_env(envs, terminate=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("error", [TwoArgError(7, "bad state"), UnpicklableError("holds a lock")])
def test_env_error_that_cannot_travel_still_arrives(error, envs_to_close):
    # gymnasium alone: TwoArgError breaks its re-raise, UnpicklableError never reaches the
    # parent, which then waits on the error queue forever.
    envs = make_vector_env(lambda: failing(error), 2, "async")
    envs_to_close.append(envs)
    reset_vector_env(envs, seed=0)
    step_vector_env(envs, actions(envs))
    step_vector_env(envs, actions(envs))
    with pytest.raises(RuntimeError, match=rf"^env 1 .* raised RuntimeError: {type(error).__qualname__}: {error}"):
        step_vector_env(envs, actions(envs))
    assert live_pids([p.pid for p in async_env_of(envs).processes]) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("build", list(BUILDERS))
def test_sigkilled_worker_names_the_env_and_exit_code(build, envs_to_close):
    envs = BUILDERS[build](cartpole)
    envs_to_close.append(envs)
    venv = async_env_of(envs)
    pids = [p.pid for p in venv.processes]
    reset_vector_env(envs, seed=0)
    step_vector_env(envs, actions(envs))
    os.kill(pids[1], signal.SIGKILL)
    venv.processes[1].join(5)
    with pytest.raises(
        RuntimeError, match=rf"env 1 \(worker pid {pids[1]}\) exit code -9 \(killed by SIGKILL\)"
    ) as info:
        step_vector_env(envs, actions(envs))
    assert "env 0" not in str(info.value)  # the survivor is not blamed
    assert isinstance(info.value.__cause__, EOFError | OSError)  # the pipe error stays attached
    assert live_pids(pids) == [] and venv.closed
    close_vector_env(envs)


@pytest.mark.timeout(60)
def test_worker_killed_during_a_step(envs_to_close):
    # The parent waits in recv when the worker dies: EOFError / ConnectionResetError, not BrokenPipe.
    envs = make_vector_env(cartpole, 2, "async")
    envs_to_close.append(envs)
    venv = async_env_of(envs)
    reset_vector_env(envs, seed=0)
    os.kill(venv.processes[0].pid, signal.SIGSTOP)  # holds the step in flight ...
    venv.step_async(actions(envs))
    timer = threading.Timer(0.3, os.kill, (venv.processes[0].pid, signal.SIGKILL))  # ... until it dies
    timer.start()
    try:
        with pytest.raises(RuntimeError, match=r"env 0 \(worker pid \d+\) exit code -9 \(killed by SIGKILL\)"):
            step_vector_env(_WaitOnly(envs), None)
    finally:
        timer.join()
    assert live_pids([p.pid for p in venv.processes]) == []


class _WaitOnly(gym.vector.VectorWrapper):
    """``step`` finishes the step already sent with ``step_async``."""

    def step(self, actions):
        return self.env.unwrapped.step_wait()


@pytest.mark.timeout(60)
def test_close_is_idempotent_and_ends_every_worker(envs_to_close):
    envs = make_vector_env(cartpole, 2, "async")
    envs_to_close.append(envs)
    venv = async_env_of(envs)
    reset_vector_env(envs, seed=0)
    step_vector_env(envs, actions(envs))
    close_vector_env(envs)
    assert [p.exitcode for p in venv.processes] == [0, 0]  # a graceful close: the envs closed themselves
    close_vector_env(envs)
    close_vector_env(envs, terminate=True)
    close_vector_env(None)


@pytest.mark.timeout(60)
def test_terminate_mid_step_ends_every_worker(envs_to_close):
    # An exception (Ctrl-C) while a step is in flight: close(terminate=True) must not wait for it.
    envs = make_vector_env(cartpole, 2, "async")
    envs_to_close.append(envs)
    venv = async_env_of(envs)
    reset_vector_env(envs, seed=0)
    os.kill(venv.processes[1].pid, signal.SIGSTOP)  # a worker that will never answer
    venv.step_async(actions(envs))
    start = time.monotonic()
    close_vector_env(envs, terminate=True, timeout=1.0)
    assert time.monotonic() - start < 10
    assert live_pids([p.pid for p in venv.processes]) == [] and venv.closed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("terminate", [True, False])
def test_close_kills_workers_that_ignore_sigterm(terminate, envs_to_close):
    # gymnasium's own workers forked under a SIGTERM-swallowing handler (Lightning's): its
    # close(terminate=True) joins them forever; ours escalates to SIGKILL.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        envs = plain_async(cartpole)
    finally:
        signal.signal(signal.SIGTERM, previous)
    envs_to_close.append(envs)
    venv = async_env_of(envs)
    reset_vector_env(envs, seed=0)
    os.kill(venv.processes[1].pid, signal.SIGSTOP)  # a worker that will never answer `close`
    venv.step_async(actions(envs))
    start = time.monotonic()
    close_vector_env(envs, terminate=terminate, timeout=1.0)
    assert time.monotonic() - start < 10
    assert venv.processes[1].exitcode == -signal.SIGKILL
    assert live_pids([p.pid for p in venv.processes]) == [] and venv.closed


@pytest.mark.timeout(60)
def test_close_after_a_worker_died_does_not_raise(envs_to_close):
    envs = make_vector_env(cartpole, 2, "async")
    envs_to_close.append(envs)
    venv = async_env_of(envs)
    reset_vector_env(envs, seed=0)
    os.kill(venv.processes[0].pid, signal.SIGKILL)
    venv.processes[0].join(5)
    close_vector_env(envs)  # gymnasium's own close raises BrokenPipeError here
    assert live_pids([p.pid for p in venv.processes]) == [] and venv.closed


@pytest.mark.timeout(60)
def test_workers_obey_sigterm_and_leave_sigint_to_the_trainer(envs_to_close):
    # Forked workers inherit the parent's Python handlers; Lightning's SIGTERM handler swallowed
    # SIGTERM, so terminate() (and the interpreter's exit) waited on them forever.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        envs = make_vector_env(cartpole, 2, "async")
    finally:
        signal.signal(signal.SIGTERM, previous)
    envs_to_close.append(envs)
    venv = async_env_of(envs)
    reset_vector_env(envs, seed=0)
    os.kill(venv.processes[0].pid, signal.SIGINT)
    time.sleep(0.2)
    step_vector_env(envs, actions(envs))  # Ctrl-C is the training process's: the worker carries on
    venv.processes[1].terminate()
    venv.processes[1].join(5)
    assert venv.processes[1].exitcode == -signal.SIGTERM
    close_vector_env(envs)
    assert live_pids([p.pid for p in venv.processes]) == []


@pytest.mark.timeout(60)
def test_sync_envs_pass_through():
    envs = make_vector_env(cartpole, 2, "sync")
    obs, _ = reset_vector_env(envs, seed=0)
    out = step_vector_env(envs, actions(envs))
    assert obs.shape == (2, 4) and out[0].shape == (2, 4)
    close_vector_env(envs)
    close_vector_env(envs)


# ------------------------------------------------ whole fits in a subprocess (`-k subprocess_fit`)
def run_worker(out_dir: Path, mode: str) -> subprocess.CompletedProcess:
    """Run the worker script; on a timeout, kill what it left and fail."""
    env = {**os.environ, "PYTHONPATH": str(WORKER.parents[1])}
    try:
        return subprocess.run([sys.executable, str(WORKER), str(out_dir), mode], capture_output=True, text=True,
                              env=env, timeout=120)
    except subprocess.TimeoutExpired as err:
        left = kill_leftovers(out_dir)
        pytest.fail(f"{mode}: the script did not exit within 120 s (env workers left: {left})\n{err.stderr}")


def recorded_pids(out_dir: Path) -> list[int]:
    path = out_dir / "pids.json"
    return json.loads(path.read_text()) if path.is_file() else []


def kill_leftovers(out_dir: Path) -> list[int]:
    """SIGKILL the env workers of our script that are still alive; return their pids."""
    left = live_pids(recorded_pids(out_dir), marker=WORKER.name, grace_s=1.0)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def check_no_worker_left(out_dir: Path) -> None:
    pids = recorded_pids(out_dir)
    assert len(pids) == 2, f"the script recorded env worker pids {pids}"
    left = kill_leftovers(out_dir)
    assert left == [], f"env worker processes {left} outlived the script"


@pytest.mark.timeout(300)
def test_subprocess_fit_env_raises(tmp_path):
    result = run_worker(tmp_path, "raise")
    check_no_worker_left(tmp_path)
    assert result.returncode != 0
    assert "boom from env" in result.stderr
    assert "FINISHED" not in result.stdout
    assert "(worker pid" in result.stderr  # the error names the env and its worker


@pytest.mark.timeout(300)
def test_subprocess_fit_worker_sigkilled(tmp_path):
    result = run_worker(tmp_path, "sigkill")
    check_no_worker_left(tmp_path)
    assert result.returncode != 0
    assert "env 1 (worker pid" in result.stderr and "exit code -9 (killed by SIGKILL)" in result.stderr, (
        result.stderr[-3000:]
    )


@pytest.mark.timeout(300)
def test_subprocess_fit_sigint(tmp_path):
    result = run_worker(tmp_path, "sigint")
    check_no_worker_left(tmp_path)
    assert result.returncode == 130  # 128 + SIGINT, after a graceful interrupt (InterruptCheckpoint)
    assert "FINISHED" not in result.stdout


@pytest.mark.timeout(300)
def test_subprocess_fit_ok(tmp_path):
    result = run_worker(tmp_path, "ok")
    check_no_worker_left(tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FINISHED 4 iterations" in result.stdout
