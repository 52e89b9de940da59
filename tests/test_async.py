"""Async sampling (``AsyncSamplingDataModule``) and IMPALA: fragments, broadcasts, policy lag,
the minibatch buffer, worker faults and clean shutdown."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl import IMPALA, AsyncSamplingDataModule
from lightning_rl.batch import SampleBatch
from lightning_rl.data.learner_queue import POLICY_VERSION, VALID, MinibatchBuffer
from tests.conftest import fit_iterations, quiet_trainer
from tests.test_env_faults import live_pids

BOOTSTRAP_OBS = SampleBatch.BOOTSTRAP_OBS
pytestmark = pytest.mark.timeout(120)


def children() -> list[int]:
    """Live (non-zombie) child processes of this process, from /proc; not Python's
    multiprocessing resource tracker, which the spawn start method starts once and which lives
    as long as this interpreter (it is no sampler)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            cmdline = open(f"/proc/{entry}/cmdline").read()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] not in ("Z", "X") and "resource_tracker" not in cmdline:
            out.append(int(entry))
    return out


def impala(**kwargs) -> IMPALA:
    settings = dict(env="CartPole-v1", num_workers=2, num_envs=2, rollout_fragment_length=10,
                    train_batch_size=40, seed=0, total_env_steps=None, iterations_per_epoch=5, hiddens=(16,),
                    sampler_timeout_s=20.0)
    return IMPALA(**{**settings, **kwargs})


def started(model: IMPALA) -> AsyncSamplingDataModule:
    dm = model.default_datamodule
    dm.connect(model)
    dm.setup("fit")
    return dm


@pytest.fixture(autouse=True)
def no_process_left():
    before = set(children())
    yield
    left = live_pids([p for p in children() if p not in before], grace_s=3.0)
    assert not left, f"processes left alive: {left}"


def test_fragments_are_time_major_with_bootstrap_obs_and_versions():
    model = impala()
    dm = started(model)
    try:
        batch = dm.sample()
        sb = batch.policy_batches["default_policy"]
        assert batch.env_steps == 40 and dm.train_batch_size == 40
        assert sb["obs"].shape == (10, 4, 4) and sb["actions"].shape == (10, 4)  # [T, B]: 2 fragments x 2 envs
        assert sb[BOOTSTRAP_OBS].shape == (4, 4) and sb[POLICY_VERSION].tolist() == [0] * 4
        assert sb[VALID].dtype == torch.bool and sb[VALID][0].all()
        # a reset row follows every episode end, and only those
        done = sb["terminateds"] | sb["truncateds"]
        assert torch.equal(~sb[VALID][1:], done[:-1])
        assert set(batch.info["perf"]) >= {"learner_wait_ms", "load_wait_ms", "learner_queue_size",
                                           "worker_0_env_steps_per_s", "worker_1_env_steps_per_s"}
    finally:
        dm.close()


def test_a_worker_samples_what_the_learner_process_samples_with_the_same_seed():
    """Worker 0 and the synchronous ``num_workers=0`` path share seeds and weights: same fragment."""
    here = started(impala(num_workers=0, train_batch_size=20))
    there = started(impala(num_workers=1, train_batch_size=20))
    try:
        a, b = (dm.sample().policy_batches["default_policy"] for dm in (here, there))
        for key in ("obs", "actions", "action_logp", "rewards", "terminateds", VALID, BOOTSTRAP_OBS):
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    finally:
        here.close()
        there.close()


def test_broadcast_reaches_the_workers_and_versions_follow():
    model = impala(broadcast_interval=1, learner_queue_size=1)
    dm = started(model)
    try:
        dm.sample()
        with torch.no_grad():
            for p in model.policies.parameters():
                p.add_(1.0)
        model.policies.version += 1
        model.counters["num_iterations"] = 7
        deadline = time.monotonic() + 20
        while True:  # fragments sampled before the broadcast drain first
            sb = dm.sample().policy_batches["default_policy"]
            if (sb[POLICY_VERSION] == 7).all() or time.monotonic() > deadline:
                break
        assert (sb[POLICY_VERSION] == 7).all()
        # the workers' logps are those of the new weights
        dist, _ = model.policies["default_policy"](sb["obs"].flatten(0, 1))
        logp = dist.log_prob(sb["actions"].flatten()).reshape(sb["actions"].shape)
        torch.testing.assert_close(logp, sb["action_logp"], rtol=1e-5, atol=1e-6)
    finally:
        dm.close()


def test_max_policy_lag_drops_old_fragments():
    model = impala(max_policy_lag=2, learner_queue_size=8)
    dm = started(model)
    try:
        dm.sample()
        time.sleep(1.0)  # fragments of version 0 pile up in the queue
        model.counters["num_iterations"] = 50
        model.policies.version += 1
        sb = dm.sample().policy_batches["default_policy"]
        assert (sb[POLICY_VERSION] >= 48).all()
        assert dm.counters["num_fragments_dropped"] > 0
    finally:
        dm.close()


def test_a_slow_learner_bounds_the_policy_lag():
    """Workers wait once the learner queue is full: after a long pause, fragments from the new
    weights arrive within the few batches the queue, the slots and the ready batch hold."""
    model = impala(learner_queue_size=2)
    dm = started(model)
    try:
        dm.sample()
        time.sleep(2.0)  # unbounded, the workers would pile up hundreds of fragments meanwhile
        model.counters["num_iterations"] = 50
        model.policies.version += 1
        fresh = [(dm.sample().policy_batches["default_policy"][POLICY_VERSION] == 50).any() for _ in range(6)]
        assert any(fresh)
    finally:
        dm.close()


def test_minibatch_buffer_hands_out_each_batch_exactly_num_passes_times():
    made = iter(range(100))
    buffer = MinibatchBuffer(lambda: next(made), size=2, num_passes=3)
    out = [buffer.get() for _ in range(12)]
    assert [b for b, _ in out] == [0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3]
    assert [new for _, new in out] == [True, True, False, False, False, False] * 2


def test_reused_batches_count_their_env_steps_once():
    model = impala(num_sgd_iter=3, num_workers=0, iterations_per_epoch=6)
    fit_iterations(model, 6)
    assert model.counters["num_iterations"] == 6
    assert model.counters["num_env_steps_sampled"] == 2 * 40  # two batches, three passes each
    assert model.counters["num_grad_updates"] == 6


class FailsInWorker(gym.Env):
    """CartPole-like spaces; raises at its 15th step with a message the learner must show."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, dtype=np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps == 15:
            raise ValueError("the simulator diverged at step 15")
        return np.zeros(4, dtype=np.float32), 1.0, False, False, {}


def test_an_env_error_in_a_worker_reaches_the_learner_with_its_message():
    model = impala(env=FailsInWorker, vectorization="sync")
    with pytest.raises(RuntimeError, match=r"(?s)sampler worker \d.*the simulator diverged at step 15"):
        fit_iterations(model, 10)


def test_a_killed_worker_is_named_with_its_exit_code():
    model = impala()
    dm = started(model)
    try:
        dm.sample()
        victim = dm.pool.processes[1]
        os.kill(victim.pid, signal.SIGKILL)
        died = r"sampler worker 1 \(pid \d+\) died: exit code -9 \(killed by SIGKILL\)"
        with pytest.raises(RuntimeError, match=died):
            for _ in range(50):
                dm.sample()
    finally:
        dm.close()


def test_a_killed_worker_is_restarted_when_asked():
    model = impala(restart_failed_workers=True)
    dm = started(model)
    try:
        dm.sample()
        old = dm.pool.processes[0].pid
        os.kill(old, signal.SIGKILL)
        # the other worker's fragments keep coming meanwhile: sample until the death is noticed
        # (within sampler_timeout_s of the kill) or 60 s have passed
        deadline = time.monotonic() + 60
        while dm.counters["num_worker_restarts"] == 0 and time.monotonic() < deadline:
            dm.sample()
        for _ in range(3):  # and the restarted worker keeps up
            dm.sample()
        assert dm.counters["num_worker_restarts"] == 1 and dm.pool.processes[0].pid != old
        assert dm.pool.processes[0].is_alive()
    finally:
        dm.close()


def test_no_worker_outlives_fit_and_the_learner_logs_async_metrics():
    model = impala()
    trainer = fit_iterations(model, 4, log_every_n_steps=1)
    assert not children()
    logged = trainer.callback_metrics
    for name in ("learner_wait_ms", "load_wait_ms", "learner_queue_size", "policy_lag_mean", "policy_lag_max",
                 "worker_0_env_steps_per_s", "worker_1_env_steps_per_s", "num_worker_restarts"):
        assert f"perf/{name}" in logged, name
    assert logged["perf/policy_lag_max"] >= logged["perf/policy_lag_mean"] >= 0
    assert logged["perf/worker_0_env_steps_per_s"] > 0


def test_impala_learns_cartpole_synchronously():
    """Seeded and deterministic with ``num_workers=0``: the V-trace learner (on-policy here, so
    every ratio is 1 up to the minibatch-buffer replays) clearly improves CartPole within 150k
    steps (random play scores about 22)."""
    from lightning_rl import evaluate

    model = IMPALA(env="CartPole-v1", num_workers=0, seed=0, total_env_steps=150_000, iterations_per_epoch=50)
    quiet_trainer(max_epochs=-1).fit(model)
    assert model.counters["num_env_steps_sampled"] == 150_000
    assert np.mean(evaluate(model, num_episodes=10, seed=5)) > 200


def test_broadcast_interval_spaces_the_weight_broadcasts():
    model = impala(broadcast_interval=3)
    dm = started(model)
    try:
        dm.sample()
        for iteration in (1, 2):
            model.policies.version, model.counters["num_iterations"] = iteration, iteration
            dm.sample()
            assert int(dm.pool.weights.seq[1]) == 0  # not yet: 3 iterations between broadcasts
        model.policies.version, model.counters["num_iterations"] = 3, 3
        dm.sample()
        assert int(dm.pool.weights.seq[1]) == 3
    finally:
        dm.close()


class HangsInWorker(FailsInWorker):
    def step(self, action):
        time.sleep(30)  # a stuck simulator
        return super().step(action)


def test_no_data_within_sampler_timeout_s_is_an_error_not_a_hang():
    model = impala(env=HangsInWorker, vectorization="sync", sampler_timeout_s=1.0)
    dm = started(model)
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"no batch from the 2 sampler workers within sampler_timeout_s=1 s"):
            dm.sample()
        assert time.monotonic() - start < 10
    finally:
        dm.close(terminate=True)


def test_broadcasts_follow_iterations_while_a_batch_is_reused():
    """With ``num_sgd_iter`` > 1 the learner trains on a batch several iterations; the workers still
    get the weights every ``broadcast_interval`` iterations, not only with each new batch."""
    model = impala(num_sgd_iter=4)
    dm = started(model)
    try:
        dm.sample()
        model.policies.version, model.counters["num_iterations"] = 1, 1
        batch = dm.sample()
        assert batch.env_steps == 0  # the same batch again ...
        assert int(dm.pool.weights.seq[1]) == 1  # ... and the new weights went out
    finally:
        dm.close()


@pytest.mark.parametrize("algo", ["IMPALA", "APEX", "A3C"])
def test_workers_start_with_spawn_when_cuda_is_initialised(algo, monkeypatch):
    """A learner that initialised CUDA cannot fork: the workers are spawned, so everything they
    get (policy, task, shared weights and slots, env spec) must pickle. Checked on CPU by making
    the learner look CUDA-initialised."""
    from lightning_rl import A3C, APEX

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    small = dict(env="CartPole-v1", num_workers=2, num_envs=2, rollout_fragment_length=10, hiddens=(16,), seed=0,
                 sampler_timeout_s=60.0, iterations_per_epoch=5)
    model = {
        "IMPALA": lambda: IMPALA(**small, train_batch_size=40, total_env_steps=200),
        "APEX": lambda: APEX(**small, learning_starts=40, num_gradient_steps=1, train_batch_size=16,
                             total_env_steps=200),
        "A3C": lambda: A3C(**small, total_env_steps=100),
    }[algo]()
    quiet_trainer(max_epochs=-1).fit(model)
    assert model.default_datamodule.pool.ctx.get_start_method() == "spawn"
    # the others run 5 iterations; A3C applies the packets (20 env steps each) that are ready, one
    # or two per iteration, so the iteration that crosses the 100-step budget may apply a sixth
    if algo == "A3C":
        assert model.counters["num_grad_updates"] in (5, 6)
    else:
        assert model.counters["num_iterations"] == 5 and model.counters["num_grad_updates"] > 0
