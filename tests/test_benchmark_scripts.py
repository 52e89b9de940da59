"""The benchmark scripts run as documented (``python benchmarks/NAME.py ...``), on tiny settings:
their last stdout line is the JSON object of figures their docstrings promise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    pythonpath = [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}, capture_output=True,
                          text=True, timeout=timeout)


def test_env_state_prints_its_figures_as_json_last():
    proc = run_benchmark("env_state", "--num-envs", "2", "--steps", "5", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("2 sync CartPoles after 5 steps: capture "), proc.stdout
    result = json.loads(lines[-1])
    assert sorted(result) == ["capture_ms", "kB", "num_envs", "steps", "torch_save_ms"]
    assert (result["num_envs"], result["steps"]) == (2, 5)
    assert all(isinstance(result[k], float) and result[k] > 0 for k in ("capture_ms", "torch_save_ms", "kB"))


@pytest.mark.slow  # two CNN fits per algorithm on 2 cores: about 3 minutes
def test_atari_prints_both_sides_throughput_as_json_last():
    proc = run_benchmark("atari", "--algos", "ppo,dqn", "--seeds", "1", "--ppo-steps", "1024", "--dqn-steps", "1100",
                         timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(result["algos"]) == ["dqn", "ppo"] and result["game"] == "ALE/Breakout-v5"
    for algo, steps in (("ppo", 1024), ("dqn", 1100)):
        figures = result["algos"][algo]
        assert figures["env_steps"] == steps and all(figures["steps_per_s"][k] > 0 for k in ("ours", "sb3"))
        assert figures["ratio_ours_over_sb3"] == figures["steps_per_s"]["ours"] / figures["steps_per_s"]["sb3"]


def test_replay_frames_prints_bytes_per_transition_against_sb3_as_json_last():
    proc = run_benchmark("replay", "--frames", "--capacity", "2000", "--fill", "40", "--repeats", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    per = result["bytes_per_transition"]
    assert sorted(per) == ["ours_frames", "ours_frames_per", "ours_whole_obs", "sb3", "sb3_optimize_memory"]
    assert per["ours_frames"] < per["ours_frames_per"] <= 7_500 < 28_224 < per["ours_whole_obs"]
    assert per["sb3_optimize_memory"] > 28_224 and per["sb3"] > 2 * 28_224
    assert sorted(result["sample_ms"]) == ["ours_frames", "ours_whole_obs", "sb3_optimize_memory"]
