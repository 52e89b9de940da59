"""The benchmark scripts run as documented (``python benchmarks/NAME.py ...``), on tiny settings:
their last stdout line is the JSON object of figures their docstrings promise."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_one_children

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


@pytest.mark.slow  # three CNN fits per algorithm, then three PPO fits (one compiled) on 2 cores: about 7 minutes
def test_atari_prints_both_sides_throughput_as_json_last():
    proc = run_benchmark("atari", "--algos", "ppo,dqn", "--seeds", "1", "--ppo-steps", "2048", "--dqn-steps", "1100",
                         "--env-only-steps", "20", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(result["algos"]) == ["dqn", "ppo"] and result["game"] == "ALE/Breakout-v5"
    assert sorted(result["env_only_steps_per_s"]) == ["envpool", "sb3", "sync"]
    for algo, steps in (("ppo", 2048), ("dqn", 1100)):
        figures = result["algos"][algo]
        rates = figures["steps_per_s"]
        assert figures["env_steps"] == steps and sorted(rates) == ["ours-envpool", "ours-sync", "sb3"]
        assert all(rate > 0 for rate in rates.values()) and all(0 < s < 1 for s in figures["sampling_share"].values())
        assert figures["ratio_over_sb3"] == {k: rates[k] / rates["sb3"] for k in ("ours-sync", "ours-envpool")}
        steady = figures["steady_steps_per_s"]
        assert sorted(steady) == sorted(rates) and all(rate > 0 for rate in steady.values())
        assert figures["compiled_graphs"] == {"ours-envpool": 0, "ours-sync": 0}
    proc = run_benchmark("atari", "--algos", "ppo", "--seeds", "1", "--ppo-steps", "2048", "--vectorizations", "sync",
                         "--precisions", "bf16-mixed", "--compile", "false,true", "--env-only-steps", "0", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])["algos"]["ppo"]
    assert sorted(figures["steps_per_s"]) == ["ours-sync-bf16", "ours-sync-bf16-compiled", "sb3"]
    assert figures["compiled_graphs"]["ours-sync-bf16"] == 0 < figures["compiled_graphs"]["ours-sync-bf16-compiled"]


def test_replay_frames_prints_bytes_per_transition_against_sb3_as_json_last():
    """SB3's rows come with the bench extra; without it the script still measures ours and says so."""
    proc = run_benchmark("replay", "--frames", "--capacity", "2000", "--fill", "40", "--repeats", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    per = result["bytes_per_transition"]
    ours = ["ours_apex_packed", "ours_apex_whole", "ours_frames", "ours_frames_per", "ours_whole_obs"]
    assert per["ours_frames"] < per["ours_frames_per"] <= 7_500 < 28_224 < per["ours_whole_obs"]
    # APEX at its defaults: at most 23 frames per 16 transitions, against both stacks whole
    assert 10_100 < per["ours_apex_packed"] < 10_300 and 56_400 < per["ours_apex_whole"] < 56_600
    if importlib.util.find_spec("stable_baselines3") is None:
        assert sorted(per) == ours and "stable_baselines3 is not installed" in proc.stdout
        assert sorted(result["sample_ms"]) == ["ours_frames", "ours_whole_obs"]
    else:
        assert sorted(per) == [*ours, "sb3", "sb3_optimize_memory"]
        assert per["sb3_optimize_memory"] > 28_224 and per["sb3"] > 2 * 28_224
        assert sorted(result["sample_ms"]) == ["ours_frames", "ours_whole_obs", "sb3_optimize_memory"]


def test_async_learner_threads_and_compile_set_the_learner_in_every_run():
    proc = run_benchmark("async", "--workers", "0,1", "--steps", "2000", "--repeats", "1", "--learner-threads", "2",
                         timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["learner_threads"] == 2 and [r["learner_threads"] for r in result["runs"]] == [2, 2]
    assert result["compile"] is False
    assert all(r["after_first_update_steps_per_s"] > 0 and r["second_half_steps_per_s"] > 0 for r in result["runs"])
    assert result["summary"]["0 -"]["second_half_ratio"] == 1.0
    assert result["summary"]["0 -"]["after_first_update_ratio"] == 1.0
    assert [r["compiled_graphs"] for r in result["runs"]] == [0, 0]
    proc = run_benchmark("async", "--workers", "0", "--steps", "1000", "--repeats", "1", "--compile", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["compile"] is True and result["runs"][0]["compiled_graphs"] > 0


@pytest.mark.slow  # a local Ray each, actors importing torch: about a minute on 2 cores
def test_async_compares_ray_actors_with_processes_and_measures_ingest():
    proc = run_benchmark("async", "--backend", "ray", "--workers", "0,1", "--steps", "1200", "--repeats", "1",
                         timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(result["summary"]) == ["0 -", "1 processes", "1 ray"]
    ray_row = result["summary"]["1 ray"]
    assert ray_row["steps_per_s"] > 0 and ray_row["vs_processes"] > 0 and ray_row["steady_vs_processes"] > 0
    assert {r["learner_threads"] for r in result["runs"]} == {1}
    proc = run_benchmark("async", "--ingest", "--ingest-seconds", "1", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["fragment_bytes"] == 7864  # CartPole: 4 envs x 50 steps of IMPALA's columns
    assert all(result[b]["fragments_per_s"] > 0 and result[b]["learner_cpu_ms_per_fragment"] > 0
               for b in ("processes", "ray"))


def test_bf16_ratio_after_steps_compares_both_old_logp_sources_with_moved_weights():
    proc = run_benchmark("bf16_ratio", "--steps", "4", "--after-steps", "2", "--lr", "1e-3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    moved = json.loads(proc.stdout.strip().splitlines()[-1])["after_steps"]
    assert moved["steps"] == 2 and moved["lr"] == 1e-3
    assert moved["true_abs_ratio_minus_1_median"] > 1e-3  # the steps moved the policy
    assert set(moved["ratio_error"]) == {"float32 actor", "bf16 recomputed"}
    assert all(0 <= e["median"] <= e["p90"] < 0.1 for e in moved["ratio_error"].values())


def test_bf16_ratio_prints_how_far_bf16_moves_ppo_ratio_as_json_last():
    proc = run_benchmark("bf16_ratio", "--steps", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    dev, clipped = result["abs_ratio_minus_1"], result["clipped_before_any_step"]
    assert result["rows"] == 32 and result["env"] == "ALE/Breakout-v5"
    assert 0 < dev["median"] <= dev["p90"] <= dev["max"] < 1e-3  # the trunk's rounding moves it (float32 heads)
    assert sorted(clipped, key=float) == ["0.005", "0.01", "0.02", "0.03", "0.1"] and clipped["0.005"] == 0.0
    assert "after_steps" not in result


def test_design_measures_prints_the_code_shape_as_json_last():
    """``python benchmarks/design_measures.py``: the numbers docs/design.md no longer writes."""
    import re

    from tests.test_layers import cycles, import_graph

    proc = run_benchmark("design_measures")
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["import_cycles"] == cycles(import_graph())
    assert found["import_cycles_type_only_included"] == cycles(import_graph(type_checking=True))
    assert all(lines > 400 for lines in found["files_over_400_lines"].values())
    assert all(re.fullmatch(r"[\w/]+\.py:\d+ \w+", entry) for entry in found["num_envs_parameters"])
    reads = found["algorithm_reads_from_data"]
    assert reads["total"] == sum(v for k, v in reads.items() if k != "total") > 0
    assert "ppo.py" in found["algorithm_files"]
    assert {"PPO", "IMPALA with sampler workers"} <= set(found["paths"])
    assert all(path["files"] <= path["hops"] and path["crossings"] >= 1 for path in found["paths"].values())


def test_compare_sb3_with_a_process_per_fit_runs_each_fit_apart_and_reports_it():
    """``--process-per-fit``: every fit (SB3's too) runs in a fresh Python process of the script,
    its result read back; the figures are those of the one-process run's format, marked."""
    pytest.importorskip("stable_baselines3")  # the bench extra
    proc = run_benchmark("compare_sb3", "--algos", "a2c", "--seeds", "1", "--a2c-steps", "400", "--vectorization",
                         "sync", "--compile", "off", "--no-warmup", "--process-per-fit", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["process_per_fit"] is True
    assert not run_one_children("compare_sb3.py"), "a fit's process outlived the benchmark"
    runs = report["runs"]
    assert sorted(r["impl"] for r in runs) == ["ours-sync", "sb3"]
    assert all(r["env_steps"] >= 400 and r["wall_s"] > 0 and r["steps_per_s"] > 0 for r in runs)


def test_compare_sb3_gives_both_sides_dqns_constant_learning_rate(monkeypatch):
    """SB3's DQN keeps its rate constant; ours decays it linearly unless told (``lr_schedule_unset``),
    so the benchmark says ``lr_schedule="constant"``: identical settings, not half the mean rate."""
    pytest.importorskip("stable_baselines3")  # the bench extra
    monkeypatch.setenv("PYTHONWARNINGS", "default")  # the script sets it for its children where unset
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # as a script, it imports learning.py beside it
    spec = importlib.util.spec_from_file_location("compare_sb3_bench", ROOT / "benchmarks" / "compare_sb3.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "compare_sb3_bench", bench)  # (its dataclasses look their module up)
    spec.loader.exec_module(bench)
    ours, sb3 = bench.build_ours("dqn", 0, 2000, "sync", 1, False), bench.build_sb3("dqn", 0, 2000)
    assert ours.lr_points is None and ours.current(ours.lr_points, ours.lr) == sb3.learning_rate == 2.3e-3
