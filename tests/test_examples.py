"""Every example script runs (short budgets) and writes TensorBoard logs."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "steps"),
    [("ppo_cartpole", 2048), ("ppo_pendulum", 8192), ("dqn_cartpole", 2048), ("sac_pendulum", 600)],
)
def test_example_runs_and_logs(name, steps, tmp_path):
    result = load(name).main(["--total-env-steps", str(steps), "--log-dir", str(tmp_path)])
    assert math.isfinite(result)
    assert list(tmp_path.glob(f"{name}/version_0/events.out.tfevents.*"))
