"""``benchmarks/continuous_control.py`` runs as documented on tiny settings: both sides fit PPO, SAC and TD3
on Hopper-v5 in their own processes, and the last stdout line is the JSON object of figures its
docstring promises."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import run_one_children
from tests.test_benchmark_scripts import ROOT, run_benchmark

pytest.importorskip("mujoco")
pytest.importorskip("stable_baselines3")


def test_mujoco_table_runs_both_sides_and_prints_its_figures_as_json_last(tmp_path):
    # eager (--compile off) keeps the six fits short; SAC/TD3 learn from env step 100 instead of 10k
    proc = run_benchmark("continuous_control", "--envs", "Hopper-v5", "--seeds", "0", "--ppo-steps", "2048",
                         "--sac-steps", "300", "--td3-steps", "300", "--learning-starts", "100", "--compile", "off",
                         "--plot", str(tmp_path / "curves.png"), timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("| Hopper-v5 | PPO (eager) | 2,048 | 0 |") for line in lines), proc.stdout
    result = json.loads(lines[-1])
    assert result["budgets"] == {"ppo": 2048, "sac": 300, "td3": 300} and result["seeds"] == [0]
    assert result["compile"] is False and result["learning_starts"] == 100
    assert len(result["load_avg_start"]) == 3 and len(result["load_avg_end"]) == 3
    assert [(row["env"], row["algo"]) for row in result["rows"]] == [("Hopper-v5", a) for a in ("ppo", "sac", "td3")]
    for row in result["rows"]:
        assert row["published_return"] is None and row["published_source"] == "—"  # no published figure at this budget
        for side in ("ours", "sb3"):
            figures = row[side]
            assert figures["runs"] == 1 and figures["errors"] == [None], figures
            assert figures["steps_per_s"] > 0 and isinstance(figures["return_mean"], float)
        sb3_mean = row["sb3"]["return_mean"]  # a ratio only where SB3's mean is positive
        assert row["return_ratio"] == (pytest.approx(row["ours"]["return_mean"] / sb3_mean) if sb3_mean > 0 else None)
        assert row["speed_ratio"] == pytest.approx(row["ours"]["steps_per_s"] / row["sb3"]["steps_per_s"])
    runs = result["runs"]
    assert sorted((r["algo"], r["side"]) for r in runs) == sorted(
        (a, s) for a in ("ppo", "sac", "td3") for s in ("ours", "sb3"))
    for run in runs:
        assert run["env_steps"] == run["steps"] and len(run["returns"]) == 10 and run["error"] is None, run
        # the training curve: an episode's end step is the sum of the episode lengths so far
        ends = [end for end, _ in run["curve"]]
        assert len(ends) >= 2 and ends == sorted(set(ends)) and ends[-1] <= run["steps"], run["curve"]
    assert any(line.startswith("| Hopper-v5 | TD3 | SB3 |") for line in lines), proc.stdout  # by quarter
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert not run_one_children("continuous_control.py"), "a run process outlived the benchmark"


def test_a_run_dies_with_its_benchmark_process():
    """A run started by the benchmark is killed by the kernel when the benchmark process dies,
    however it ends (here SIGKILL while the first run loads)."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "continuous_control.py"), "--envs", "Hopper-v5",
                             "--seeds", "0", "--algos", "ppo", "--ppo-steps", "2048", "--compile", "off"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not run_one_children("continuous_control.py") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run_one_children("continuous_control.py"), "no run started within 120 s"
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while run_one_children("continuous_control.py") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not run_one_children("continuous_control.py")


def load_benchmark(monkeypatch):
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # as a script, it imports learning.py beside it
    # learning.py sets PYTHONWARNINGS=ignore for its children where unset: kept to this test, or
    # the subprocesses of later tests in this worker would lose the warnings they assert
    monkeypatch.setenv("PYTHONWARNINGS", "default")
    spec = importlib.util.spec_from_file_location("cc_bench", ROOT / "benchmarks" / "continuous_control.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_return_ratio_is_left_out_where_sb3s_mean_is_not_positive(monkeypatch):
    """-283 / -48 would read 5.9x: a ratio of returns is printed only where SB3's mean is above 0."""
    bench = load_benchmark(monkeypatch)

    def run(side, seed, ret):
        return {"env": "HalfCheetah-v5", "algo": "sac", "steps": 20000, "side": side, "seed": seed,
                "eval_mean": ret, "steps_per_s": 100.0, "error": None}

    negative = bench.summarize([run("ours", 0, -433.0), run("sb3", 0, -48.0)])[0]
    assert negative["return_ratio"] is None and negative["return_target_met"] is None
    positive = bench.summarize([run("ours", 0, 90.0), run("sb3", 0, 100.0)])[0]
    assert positive["return_ratio"] == pytest.approx(0.9) and positive["return_target_met"] is True


def test_training_curves_by_value(monkeypatch):
    """Episodes placed at the sum of the lengths so far; each quarter's mean over the episodes
    that ended in it (an end on a quarter's boundary belongs to the quarter it closes)."""
    bench = load_benchmark(monkeypatch)
    curve = bench.EpisodeCurve()
    curve.add([1.0, 3.0], [10, 15])
    curve.add([], [])
    curve.add([5.0, 7.0], [1, 74])
    assert curve.points == [[10, 1.0], [25, 3.0], [26, 5.0], [100, 7.0]]
    assert bench.quarter_means(curve.points, 100) == [2.0, 5.0, None, 7.0]
    assert bench.quarter_means(None, 100) == [None] * 4
    runs = [{"env": "Hopper-v5", "algo": "td3", "steps": 100, "side": side, "seed": seed, "eval_mean": 1.0,
             "steps_per_s": 1.0, "error": None, "curve": [[50, 10.0 * seed], [100, 20.0 * seed + (side == "sb3")]]}
            for side in ("ours", "sb3") for seed in (1, 2)]
    row = bench.summarize(runs)[0]
    assert row["ours"]["quarters"] == [None, 15.0, None, 30.0] and row["sb3"]["quarters"][3] == 31.0
    assert row["ours"]["per_seed_quarters"] == [[None, 10.0, None, 20.0], [None, 20.0, None, 40.0]]
    assert "| Hopper-v5 | TD3 | SB3 | — | 15 | — | 31 | 21, 41 |" in bench.curve_table([row])
