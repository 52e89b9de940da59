"""Decentralized distributed PPO on Lightning's DDP strategy with 2 CPU ranks (gloo).

Each case runs ``tests/ddp_worker.py`` in a subprocess with a timeout, so a deadlock
fails the test instead of hanging CI.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import ddp_subprocess_env

WORKER = Path(__file__).with_name("ddp_worker.py")


def run_ddp(tmp_path: Path, mode: str, timeout: int) -> tuple[dict, dict, list[dict]]:
    env = ddp_subprocess_env(PL_DISABLE_FORK="1")  # a free MASTER_PORT of its own per launch
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(tmp_path), mode], env=env, capture_output=True, text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    metrics = max(tmp_path.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1]))
    return ranks[0], ranks[1], list(csv.DictReader(metrics.open()))


@pytest.fixture(scope="module")
def check_run(tmp_path_factory):
    return run_ddp(tmp_path_factory.mktemp("ddp"), "check", timeout=300)


def test_parameters_identical_on_both_ranks(check_run):
    r0, r1, _ = check_run
    assert r0["params"] == r1["params"]


@pytest.mark.parametrize("mode", ["compile", "compile-functional"])
def test_compiled_updates_under_ddp_match_the_eager_run(check_run, tmp_path, mode):
    """compile=True under DDP: one flat all-reduce between the gradient and the apply graphs;
    both ranks take identical steps, equal to the eager DDP run up to float rounding; also with
    the functional graphs a CUDA learner uses (forced here on the CPU)."""
    r0, r1, _ = run_ddp(tmp_path, mode, timeout=600)
    assert r0["params"] == r1["params"]
    assert r0["counters"]["num_grad_updates"] == check_run[0]["counters"]["num_grad_updates"] > 0
    eager = torch.tensor(check_run[0]["params"])
    torch.testing.assert_close(torch.tensor(r0["params"]), eager, rtol=1e-4, atol=1e-5)
    assert r0["kl_coeff"] == check_run[0]["kl_coeff"]


def test_kl_coeff_adapts_identically_on_every_rank(check_run):
    r0, r1, _ = check_run
    assert r0["kl_coeff"] == r1["kl_coeff"]  # adapted from the KL averaged over ranks
    assert r0["kl_coeff"]["default_policy"] != 0.2  # it did adapt


def test_ranks_sample_from_different_seeds(check_run):
    r0, r1, _ = check_run
    assert r0["first_obs"] != r1["first_obs"]


def test_global_counters_are_sums_of_rank_counters(check_run):
    r0, r1, _ = check_run
    for name, total in r0["global_counters"].items():
        assert total == r0["counters"][name] + r1["counters"][name], name
    assert r0["global_counters"] == r1["global_counters"]
    assert r0["global_counters"]["num_env_steps_sampled"] == 512  # the budget counts global steps
    assert r0["counters"]["num_iterations"] == r1["counters"]["num_iterations"] == 4


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs Linux and 2 CPUs for 2 ranks")
def test_each_rank_pinned_to_its_own_cpus_during_fit(check_run):
    r0, r1, _ = check_run
    assert r0["affinity_during"] and r1["affinity_during"]
    assert not set(r0["affinity_during"]) & set(r1["affinity_during"])
    assert set(r0["affinity_during"]) | set(r1["affinity_during"]) <= set(r0["affinity_before"])
    assert r0["affinity_after"] == r0["affinity_before"]  # the launching process gets its CPUs back


def test_learner_info_logged_once_with_reduced_values(check_run):
    r0, r1, rows = check_run
    assert len(rows) == 4  # one row per iteration, written by rank 0 only
    key = "learner/default_policy/learner_stats/pg_loss"
    for row, s0, s1 in zip(rows, r0["learner_stats"], r1["learner_stats"]):
        assert float(row[key]) == pytest.approx((s0["pg_loss"] + s1["pg_loss"]) / 2, rel=1e-5)
        assert float(row["learner/default_policy/learner_stats/max_ratio"]) == pytest.approx(
            max(s0["max_ratio"], s1["max_ratio"]), rel=1e-5)
        assert s0["pg_loss"] != s1["pg_loss"]  # each rank trained on its own batch
    assert [float(r["counters/num_env_steps_sampled"]) for r in rows] == [128.0, 256.0, 384.0, 512.0]


def test_episodes_on_one_rank_only_neither_hang_nor_log_nan(tmp_path):
    r0, r1, rows = run_ddp(tmp_path, "uneven", timeout=300)
    returns = [float(r["rollout/episode_return_mean"]) for r in rows if r.get("rollout/episode_return_mean")]
    assert returns and all(v == 6.0 for v in returns)  # rank 0's 3-step episodes of reward 2 (env_kwargs)
    # rank 1's never-ending episodes: 32 steps of step_size 0.2 (env_kwargs), so its envs got them too
    assert np.allclose(r0["last_obs_all"][1], 0.2 * 32)
    for row in rows:
        assert not any(v.lower() == "nan" for v in row.values()), row
    assert r0["params"] == r1["params"]


def test_dqn_under_ddp_each_rank_its_own_buffer_and_global_schedules(tmp_path):
    r0, r1, rows = run_ddp(tmp_path, "dqn", timeout=300)
    assert r0["params"] == r1["params"]
    assert r0["buffer_obs"] != r1["buffer_obs"]  # each rank filled its own buffer from its own envs
    assert r0["global_counters"]["num_env_steps_sampled"] == 512
    # learning starts on the 2nd of 8 iterations
    assert r0["counters"]["num_grad_updates"] == r1["counters"]["num_grad_updates"] == 4 * 7
    assert any(r.get("learner/default_policy/learner_stats/loss") for r in rows)
    # PER beta and epsilon follow the global env steps sampled before each iteration, the same on both
    # ranks: the last iteration starts at 448 of the 512 global steps, so beta = 0.4 + 0.6 * 448 / 512
    for key in ("replay_beta", "cur_epsilon"):
        assert [s[key] for s in r0["learner_stats"] if key in s] == [s[key] for s in r1["learner_stats"] if key in s]
    assert r0["learner_stats"][-1]["replay_beta"] == pytest.approx(0.4 + 0.6 * 448 / 512)


def test_dqn_on_stacked_frames_stored_once_under_ddp(tmp_path):
    """DQN on (4, 16, 16) frame stacks, each rank's replay storing one frame per step: both ranks
    take the same steps, each from its own frames, and end with identical weights."""
    r0, r1, _ = run_ddp(tmp_path, "dqn_frames", timeout=300)
    assert r0["replay_frame_stack"] is r1["replay_frame_stack"] is True
    assert r0["params"] == r1["params"]
    # 6 iterations of 32 env steps per rank, learning from the first (learning_starts=32)
    assert r0["counters"]["num_grad_updates"] == r1["counters"]["num_grad_updates"] == 2 * 6
    assert r0["buffer_obs"] != r1["buffer_obs"]  # each rank's own frames


def test_apex_on_stacked_frames_packed_under_ddp(tmp_path):
    """APEX on (4, 16, 16) frame stacks with a sampler worker per rank, each rank's replay storing its
    worker's frames once: both ranks take the same steps and end with identical weights."""
    r0, r1, _ = run_ddp(tmp_path, "apex_frames", timeout=300)
    assert r0["replay_frame_stack"] is r1["replay_frame_stack"] is True
    assert r0["params"] == r1["params"]
    assert r0["counters"]["num_grad_updates"] == r1["counters"]["num_grad_updates"] > 0
    assert r0["buffer_obs"] != r1["buffer_obs"]  # each rank's own frames


def test_off_policy_ranks_start_learning_together(tmp_path):
    """The configuration where each rank used to decide "enough data to train" from its own buffer,
    so one rank entered an all-reduce the other never reached (gloo aborted, NCCL would hang)."""
    r0, r1, _ = run_ddp(tmp_path, "dqn_uneven", timeout=300)
    assert r0["params"] == r1["params"]
    assert r0["counters"]["num_grad_updates"] == r1["counters"]["num_grad_updates"] > 0


@pytest.mark.parametrize("mode", ["sac", "td3", "a2c", "impala", "appo", "apex"])
def test_algorithm_runs_under_plain_ddp(tmp_path, mode):
    r0, r1, _ = run_ddp(tmp_path, mode, timeout=300)
    assert r0["params"] == r1["params"]  # every optimizer step averaged its own gradients over the ranks
    assert r0["counters"]["num_grad_updates"] == r1["counters"]["num_grad_updates"] > 0
    assert r0["first_obs"] != r1["first_obs"]


def test_several_iterations_per_step_under_ddp_match_one_per_step(tmp_path):
    """A2C's iterations_per_step (5 per Lightning step here, the budget ending inside the second
    step) under 2-rank DDP: the same weights, to the bit, and counters as one iteration per step."""
    (tmp_path / "streamed").mkdir(), (tmp_path / "single").mkdir()
    streamed, _, _ = run_ddp(tmp_path / "streamed", "a2c", timeout=300)
    single, _, _ = run_ddp(tmp_path / "single", "a2c_one_per_step", timeout=300)
    assert streamed["params"] == single["params"]
    assert streamed["counters"] == single["counters"]
    assert streamed["counters"]["num_iterations"] == 6  # 2 * 20 env steps per iteration, 240 in all
    assert streamed["rows"] == single["rows"] > 0


def test_several_off_policy_iterations_per_step_under_ddp_match_one_per_step(tmp_path):
    """SAC with 4 iterations (an env step and a gradient step each) per Lightning step under
    2-rank DDP: the same weights, to the bit, and counters as one iteration per step."""
    (tmp_path / "streamed").mkdir(), (tmp_path / "single").mkdir()
    streamed, _, _ = run_ddp(tmp_path / "streamed", "sac_streamed", timeout=300)
    single, _, _ = run_ddp(tmp_path / "single", "sac", timeout=300)
    assert streamed["params"] == single["params"]
    assert streamed["counters"] == single["counters"] and streamed["counters"]["num_grad_updates"] > 0


def test_dict_observations_and_multi_discrete_actions_under_ddp(tmp_path):
    """PPO on CueMatch (Dict observations flattened at the envs, MultiDiscrete actions with a
    non-zero start): both ranks take the same steps and end with identical weights."""
    r0, r1, _ = run_ddp(tmp_path, "spaces", timeout=300)
    assert r0["params"] == r1["params"]
    assert r0["counters"]["num_grad_updates"] == r1["counters"]["num_grad_updates"] == 3 * 2 * 2
    assert r0["first_obs"] != r1["first_obs"]  # each rank's own envs
    assert len(r0["first_obs"][0]) == 3 + 2  # the cue one-hot, then pos


def test_image_observations_and_a_cnn_under_ddp(tmp_path):
    """PPO on uint8 frames (BrightSide, 16x16) with the default CNN, in bf16-mixed: each rank
    samples its own frames, both take the same steps and end with identical CNN weights."""
    r0, r1, _ = run_ddp(tmp_path, "pixels", timeout=300)
    assert r0["params"] == r1["params"]
    assert r0["counters"]["num_grad_updates"] == r1["counters"]["num_grad_updates"] == 3 * 2 * 2
    assert r0["first_obs"] != r1["first_obs"]  # each rank's own envs
    assert {v for frame in r0["first_obs"] for row in frame for col in row for v in col} <= {0, 255}  # uint8 frames


def test_envpool_envs_under_ddp_each_rank_its_own_pool_seeded_seed_plus_1000_rank(tmp_path):
    """PPO CartPole with vectorization="envpool": both ranks take the same steps and end with
    identical weights; rank r's first observation is that of envpool's env 0 seeded 1000 * r."""
    pytest.importorskip("envpool")
    from lightning_rl.data.envs import make_vector_env

    r0, r1, _ = run_ddp(tmp_path, "envpool", timeout=300)
    assert r0["params"] == r1["params"]
    assert r0["counters"]["num_grad_updates"] == r1["counters"]["num_grad_updates"] == 3 * 2 * 2
    for rank, r in enumerate((r0, r1)):
        venv = make_vector_env("CartPole-v1", 2, "envpool")
        obs, _ = venv.reset(seed=1000 * rank)
        venv.close()
        np.testing.assert_allclose(r["first_obs"][0], obs[0], rtol=0, atol=1e-7)


@pytest.mark.parametrize("mode", ["multi_agent", "multi_agent_dqn", "multi_agent_impala"])
def test_multi_agent_policy_with_rows_on_one_rank_only(tmp_path, mode):
    """RankRelay: the helper agent (policy p_helper) acts only in rank 0's envs. Rank 1 steps on
    masked-out placeholder minibatches (PPO), weight-0 placeholder transitions (DQN) or columns
    that are all invalid (IMPALA, with a sampler worker per rank), so both
    ranks take the same steps and all-reduces and end with identical weights (a mismatch would
    abort gloo)."""
    r0, r1, _ = run_ddp(tmp_path, mode, timeout=300)
    assert r0["params"] == r1["params"]
    assert r0["counters"]["num_grad_updates"] == r1["counters"]["num_grad_updates"] > 0
    # rank 1's 80 env steps: the runner alone, one agent step each (IMPALA's envs spend one step
    # per 4-step episode on the reset: 64)
    runner_only = 64 if mode == "multi_agent_impala" else 80
    assert r0["counters"]["num_agent_steps_sampled"] > r1["counters"]["num_agent_steps_sampled"] == runner_only


def test_normalization_statistics_identical_on_both_ranks_and_global(tmp_path):
    """normalize_observations/normalize_rewards under DDP, with a user encoder: every update merges
    both ranks' rows (one all-reduce), so the statistics are the same on both ranks and count every
    row sampled; the encoder's weights are identical on both."""
    r0, r1, _ = run_ddp(tmp_path, "normalize", timeout=300)
    assert r0["buffers"] == r1["buffers"] and r0["params"] == r1["params"]
    assert r0["rows"] != r1["rows"] or r0["first_obs"] != r1["first_obs"]  # different data on each rank
    obs_count = r0["buffers"]["policies.default_policy.obs_rms.count"][0]
    assert obs_count == r0["rows"] + r1["rows"] == r0["buffers"]["policies.default_policy.return_rms.count"][0]
    assert r0["buffers"]["policies.default_policy.obs_rms.var"] != [1.0] * 4
    assert any(".net.0.weight" in name for name in r0["param_names"])  # the user's encoder, identical too


@pytest.mark.parametrize(("mode", "updates"), [("lstm", 4 * 2 * 2), ("lstm_impala", 4)])
def test_recurrent_ppo_takes_the_same_steps_on_both_ranks(tmp_path, mode, updates):
    """use_lstm under DDP: PPO's sequences standardized over both ranks' real rows, the same
    number of whole-sequence minibatches per rank (IMPALA: one step per batch); both ranks end
    identical."""
    r0, r1, _ = run_ddp(tmp_path, mode, timeout=300)
    assert r0["params"] == r1["params"]
    assert r0["counters"]["num_grad_updates"] == r1["counters"]["num_grad_updates"] == updates


@pytest.fixture(scope="module", params=["ppo", "dqn", "apex", "ma_ppo", "td3"])
def resumed_runs(request, tmp_path_factory):
    algo = request.param
    full = run_ddp(tmp_path_factory.mktemp(f"{algo}_full"), f"resume-{algo}-full", timeout=300)
    halves = tmp_path_factory.mktemp(f"{algo}_halves")
    first = run_ddp(halves, f"resume-{algo}-first", timeout=300)
    second = run_ddp(halves, f"resume-{algo}-second", timeout=300)
    return algo, full, first, second, halves / "half.ckpt"


def test_ddp_resume_is_bit_identical_to_an_uninterrupted_run(resumed_runs):
    algo, full, first, second, _ = resumed_runs
    assert first[0]["global_counters"]["num_env_steps_sampled"] == 4096
    assert full[0]["global_counters"]["num_env_steps_sampled"] == 8192
    for rank in (0, 1):
        assert second[rank]["counters"] == full[rank]["counters"], (algo, rank)
        assert second[rank]["params"] == full[rank]["params"], (algo, rank)
    assert second[0]["last_obs_all"] == full[0]["last_obs_all"]  # each rank's envs continued where they were
    assert second[0]["last_obs_all"][0] != second[0]["last_obs_all"][1]  # ... and not from rank 0's state


def test_resuming_a_ddp_checkpoint_on_one_process_reseeds_with_a_warning(resumed_runs):
    algo, _, first, _, path = resumed_runs
    from tests.conftest import quiet_trainer
    from tests.ddp_worker import RESUME

    cls, kwargs = RESUME[algo]
    model = cls(**kwargs, seed=0, total_env_steps=8192 + 1024)
    with pytest.warns(UserWarning, match=r"holds the .* of 2 of 2 ranks, and this run has 1.*restarts from fresh"):
        quiet_trainer().fit(model, ckpt_path=path)
    assert model.global_counters["num_env_steps_sampled"] >= 8192 + 1024
    assert model.counters["num_iterations"] > first[0]["counters"]["num_iterations"]


@pytest.mark.slow  # minutes: kept out of CI; benchmarks/learning.py --algos ddppo_cartpole runs it over seeds
@pytest.mark.timeout(1500)  # above the run's own 1200 s limit, which reports the run's output
def test_ddp_ppo_cartpole_learns_within_the_same_global_budget(tmp_path):
    """Greedy evaluation (5 episodes per rank, averaged over ranks) every 1280 global env steps."""
    r0, _, rows = run_ddp(tmp_path, "learn", timeout=1200)
    evaluations = [(int(float(r["step"])), float(r["val/episode_return_mean"]))
                   for r in rows if r.get("val/episode_return_mean")]
    assert r0["global_counters"]["num_env_steps_sampled"] <= 100_000 + 256
    assert len(evaluations) >= 30 and max(v for _, v in evaluations) >= 475, evaluations


def test_a_gloo_process_group_is_destroyed_before_the_interpreter_exits(tmp_path):
    """Left to interpreter shutdown, a gloo group sometimes aborted a rank that had finished
    (exit -6, "terminate called without an active exception"): the learner registers, once, an
    ``atexit`` hook that destroys it first (checked here by a hook that runs after it)."""
    script = tmp_path / "exit.py"
    script.write_text(
        "import atexit, torch\n"
        "from lightning_rl import distributed\n"
        "atexit.register(lambda: print('initialized at exit:', torch.distributed.is_initialized(), flush=True))\n"
        f"torch.distributed.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, "
        "world_size=1)\n"
        "distributed.destroy_gloo_group_at_exit()\n"
        "distributed.destroy_gloo_group_at_exit()  # once per process\n"
        "print('initialized:', torch.distributed.is_initialized(), flush=True)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["initialized: True", "initialized at exit: False"], proc.stdout
