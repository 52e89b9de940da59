"""The CleanRL-style PPO of ``benchmarks/peers.py`` (``benchmarks/peers_cleanrl_style.py``) runs as
documented on a tiny budget, reproducibly, and ``peers.py`` times it, writes its rows, and skips in
one line a peer whose library is not installed."""

from __future__ import annotations

import importlib.util
import json

from tests.test_benchmark_scripts import run_benchmark


def test_cleanrl_style_ppo_runs_reproducibly_on_a_tiny_budget():
    procs = [run_benchmark("peers_cleanrl_style", "--total-timesteps", "1000", "--seed", "3") for _ in range(2)]
    assert all(proc.returncode == 0 for proc in procs), procs[0].stderr[-3000:] + procs[1].stderr[-3000:]
    first, second = (json.loads(proc.stdout.strip().splitlines()[-1]) for proc in procs)
    assert first["seed"] == 3 and first["env_steps"] == 1024  # rounded up to 4 iterations of 8 x 32
    assert first["episodes"] > 0 and first["loop_steps_per_s"] > 0
    assert 8 <= first["greedy_return_mean"] <= 500
    for key in ("episodes", "last20_train_return", "greedy_return_mean", "greedy_return_std"):
        assert first[key] == second[key], key


def test_peers_times_the_cleanrl_style_peer_and_skips_a_missing_one(tmp_path):
    path = tmp_path / "peers.json"
    proc = run_benchmark("peers", "--only", "cleanrl,skrl", "--steps", "600", "--seeds", "0", "--no-warmup",
                         "--json", str(path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(path.read_text())
    has_skrl = importlib.util.find_spec("skrl") is not None
    expected = ["cleanrl", "skrl"] if has_skrl else ["cleanrl"]
    assert ("skrl: skipped, skrl is not installed (pip install skrl)" in proc.stdout) is not has_skrl
    assert [r["impl"] for r in report["runs"]] == expected
    assert all(r["env_steps"] == 768 and r["whole_s"] >= r["loop_s"] > 0 for r in report["runs"])
    assert all(len(r["greedy_returns"]) == 10 for r in report["runs"])
    row = report["summary"]["impls"]["cleanrl"]
    assert row["runs"] == 1 and row["ours_c_over_this_whole"] is None  # ours-c was not run
    assert report["summary"]["fastest_peer"]["whole"]["peer"] in expected
    assert "cleanrl" in proc.stdout.split("==")[-1]  # the table
