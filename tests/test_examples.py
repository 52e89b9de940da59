"""Every example script runs (short budgets) and writes TensorBoard logs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import ddp_subprocess_env
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
    low, high = (8, 500) if "cartpole" in name else (-2000, 0)  # a CartPole episode lasts >= 8 steps
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
