"""APEX (distributed prioritized replay) and A3C (asynchronous gradients): the workers'
epsilons and priorities, the flat prioritized replay, n-step windows that never cross envs or
episodes, the priority loop of a fit, gradient packets equal to the in-process gradient and
applied as the optimizer would, weights back to each worker after its own packet, the flags by
value, and short learning runs."""

from __future__ import annotations

import copy
import itertools
import os
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl import A2C, A3C, APEX, RLModule, evaluate
from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from lightning_rl.data.async_gradients import GRADS
from lightning_rl.data.async_replay import ApexDataModule, td_errors, worker_epsilons
from lightning_rl.data.buffers.replay_buffer import TransitionReplayBuffer
from lightning_rl.data.learner_queue import POLICY_VERSION
from lightning_rl.learner_info import LEARNER_STATS_KEY, LearnerInfoBuilder
from tests.conftest import quiet_trainer
from tests.test_async import children, no_process_left, started  # noqa: F401  (no_process_left: the fixture)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_process_left")]

PID = DEFAULT_POLICY_ID


def apex(**kwargs) -> APEX:
    settings = dict(env="CartPole-v1", num_workers=0, num_envs=2, rollout_fragment_length=8, hiddens=(16,), seed=0,
                    total_env_steps=None, learning_starts=64, buffer_size=1000, train_batch_size=16,
                    num_gradient_steps=2, sampler_timeout_s=20.0)
    return APEX(**{**settings, **kwargs})


def a3c(**kwargs) -> A3C:
    settings = dict(env="CartPole-v1", num_workers=0, num_envs=2, rollout_fragment_length=5, hiddens=(16,), seed=0,
                    total_env_steps=None, sampler_timeout_s=20.0)
    return A3C(**{**settings, **kwargs})


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


# --------------------------------------------------------------------------- epsilons


def test_worker_epsilons_follow_the_ape_x_schedule_by_value():
    expected = [0.4, 0.4 ** (1 + 7 / 3), 0.4 ** (1 + 14 / 3), 0.4**8]
    assert worker_epsilons(4, 0.4, 7) == pytest.approx(expected, rel=1e-12)
    assert worker_epsilons(4, 0.4, 7)[-1] == pytest.approx(0.00065536, rel=1e-12)
    assert worker_epsilons(4, 0.4, 7)[1] == pytest.approx(0.04715, abs=1e-5)  # 0.4 ** (10/3)
    assert worker_epsilons(1, 0.4, 7) == [0.4]
    assert worker_epsilons(0, 0.4, 7) == [0.4]


# --------------------------------------------------------------------------- TransitionReplayBuffer

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACT_SPACE = gym.spaces.Discrete(3)


def transitions(first_id: int, count: int) -> dict[str, np.ndarray]:
    """``count`` transitions whose observations name their insertion number: ``obs = (id, -id)``."""
    ids = np.arange(first_id, first_id + count, dtype=np.float32)
    return {
        SampleBatch.OBS: np.stack([ids, -ids], 1), SampleBatch.ACTIONS: np.arange(count) % 3,
        SampleBatch.REWARDS: ids * 0.5, SampleBatch.NEXT_OBS: np.stack([ids + 1, -ids - 1], 1),
        SampleBatch.TERMINATEDS: np.arange(count) % 2 == 0, SampleBatch.DISCOUNTS: np.full(count, 0.9, np.float32),
    }


def test_transition_replay_inserts_priorities_of_the_given_td_errors():
    alpha, eps = 0.6, 1e-6
    buf = TransitionReplayBuffer(8, OBS_SPACE, ACT_SPACE, alpha=alpha, eps=eps, seed=0)
    td = np.array([0.5, -1.0, 2.0, 0.0, -3.0])
    ids = buf.add(transitions(0, 5), td)
    assert ids.tolist() == [0, 1, 2, 3, 4] and len(buf) == 5
    np.testing.assert_allclose(buf.priorities(ids), (np.abs(td) + eps) ** alpha, rtol=1e-12)
    assert buf.priorities(ids)[3] == pytest.approx(eps**alpha)  # td 0: eps keeps it drawable
    # the sum tree's total is the sum of the powered priorities: P(i) is proportional to each
    assert buf.prio.sum_tree.total() == pytest.approx(((np.abs(td) + eps) ** alpha).sum())


def test_transition_replay_samples_insertion_numbers_and_skips_stale_priority_updates():
    alpha, eps = 0.6, 1e-6
    buf = TransitionReplayBuffer(8, OBS_SPACE, ACT_SPACE, alpha=alpha, eps=eps, seed=1)
    buf.add(transitions(0, 5), np.ones(5))
    buf.add(transitions(5, 7), np.arange(1, 8, dtype=np.float64))  # 12 inserted: ids 0..3 overwritten
    assert buf.num_added == 12 and len(buf) == 8
    batch = buf.sample(64)
    ids = batch[SampleBatch.BATCH_INDEXES]
    assert ids.dtype == torch.int64
    assert set(ids.tolist()) <= set(range(4, 12)) and len(set(ids.tolist())) > 4
    # each sampled row is the transition inserted with that number
    torch.testing.assert_close(batch[SampleBatch.OBS][:, 0], ids.float(), rtol=0, atol=0)
    torch.testing.assert_close(batch[SampleBatch.REWARDS], ids.float() * 0.5, rtol=0, atol=0)
    torch.testing.assert_close(batch[SampleBatch.NEXT_OBS][:, 0], ids.float() + 1, rtol=0, atol=0)

    stale, live = np.array([0, 1, 2, 3]), np.array([8, 9, 10, 11])  # the same slots
    before = buf.priorities(np.arange(4, 12)).copy()
    leaves = buf.prio.sum_tree.leaves.copy()
    assert buf.priorities(stale).tolist() == [0.0] * 4
    buf.update_priorities(stale, np.full(4, 100.0))
    np.testing.assert_array_equal(buf.prio.sum_tree.leaves, leaves)  # nothing changed
    np.testing.assert_array_equal(buf.priorities(np.arange(4, 12)), before)
    new_td = np.array([0.25, -4.0, 0.0, 9.0])
    buf.update_priorities(np.concatenate([stale, live]), np.concatenate([np.full(4, 100.0), new_td]))
    np.testing.assert_allclose(buf.priorities(live), (np.abs(new_td) + eps) ** alpha, rtol=1e-12)
    np.testing.assert_array_equal(buf.priorities(np.arange(4, 8)), before[:4])  # untouched live rows
    assert buf.prio.max_priority == pytest.approx(9.0 + eps)  # stale td errors did not count

    # more than the capacity at once: only the newest fit, with their own numbers and priorities
    ids = buf.add(transitions(12, 20), np.arange(20, dtype=np.float64))
    assert ids.tolist() == list(range(24, 32)) and buf.num_added == 32 and len(buf) == 8
    np.testing.assert_allclose(buf.priorities(ids), (np.arange(12, 20) + eps) ** alpha, rtol=1e-12)
    batch = buf.sample(32)
    assert set(batch[SampleBatch.BATCH_INDEXES].tolist()) <= set(range(24, 32))
    torch.testing.assert_close(batch[SampleBatch.OBS][:, 0], batch[SampleBatch.BATCH_INDEXES].float(), rtol=0, atol=0)


def test_transition_replay_state_dict_round_trip_samples_identically():
    buf = TransitionReplayBuffer(8, OBS_SPACE, ACT_SPACE, alpha=0.7, eps=1e-3, seed=3)
    buf.add(transitions(0, 11), np.linspace(-2, 2, 11))
    drawn = buf.sample(16)
    buf.update_priorities(drawn[SampleBatch.BATCH_INDEXES], torch.linspace(0, 3, 16))
    for tensors in (False, True):
        copy_ = TransitionReplayBuffer(8, OBS_SPACE, ACT_SPACE, alpha=0.7, eps=1e-3, seed=99)
        copy_.load_state_dict(buf.state_dict(tensors=tensors))
        assert copy_.num_added == 11 and len(copy_) == 8
        np.testing.assert_array_equal(copy_.priorities(np.arange(3, 11)), buf.priorities(np.arange(3, 11)))
        state = copy.deepcopy(buf.state_dict())  # both continue from the same point
        a, b = copy_.sample(32, beta=0.5), buf.sample(32, beta=0.5)
        for key in (*TransitionReplayBuffer.COLUMNS, SampleBatch.BATCH_INDEXES, SampleBatch.WEIGHTS):
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
        buf.load_state_dict(state)


# --------------------------------------------------------------------------- APEX priorities


def inserted_rows(buffer: TransitionReplayBuffer, ids: np.ndarray) -> SampleBatch:
    slots = ids % buffer.capacity
    return SampleBatch({k: torch.tensor(buffer._columns[k][slots]) for k in TransitionReplayBuffer.COLUMNS})


def check_priorities_are_the_networks(model: APEX, dm: ApexDataModule, ids: np.ndarray) -> None:
    """The stored priorities are ``(|td| + eps)**alpha`` of the TD errors under ``model``'s
    Q-network, as online and target network both (a worker has one copy)."""
    rows = inserted_rows(dm.buffer, ids)
    q_net = model.policies[PID]
    with torch.no_grad():
        td = td_errors(q_net, rows)
        q = q_net(rows[SampleBatch.OBS]).gather(-1, rows[SampleBatch.ACTIONS][:, None]).squeeze(-1)
        not_done = 1.0 - rows[SampleBatch.TERMINATEDS].float()
        target = rows[SampleBatch.REWARDS] + rows[SampleBatch.DISCOUNTS] * not_done * q_net(
            rows[SampleBatch.NEXT_OBS]).max(-1).values
    torch.testing.assert_close(td, q - target, rtol=1e-6, atol=1e-6)
    expected = (td.abs().double() + dm.eps) ** dm.alpha
    np.testing.assert_allclose(dm.buffer.priorities(ids), expected.numpy(), rtol=1e-5, atol=1e-7)
    assert (dm.buffer.priorities(ids) > 0).all()


def test_apex_learner_process_inserts_priorities_of_its_own_q_network():
    model = apex(num_workers=0)
    dm = started(model)
    try:
        before = dm.buffer.num_added
        for _ in range(4):
            batch = dm.sample()
            assert batch.env_steps == 16 and batch.policy_batches == {}
        ids = np.arange(before, dm.buffer.num_added)
        # 4 fragments of 2 envs x 8 steps: 64 env steps less the reset rows and the still open windows
        assert 40 <= len(ids) <= 64
        check_priorities_are_the_networks(model, dm, ids)
        assert len(np.unique(dm.buffer.priorities(ids))) > len(ids) // 2  # each row its own priority
        assert dm.env_steps == 64 and batch.replay is dm  # learning_starts=64 reached
    finally:
        dm.close()


def test_apex_workers_insert_priorities_of_the_broadcast_q_network():
    model = apex(num_workers=2)
    dm = started(model)
    try:
        before = dm.buffer.num_added
        batch = dm.sample()  # the first 2 fragments to arrive, from either worker
        assert batch.env_steps == 32 and batch.info[POLICY_VERSION].tolist() == [0, 0]
        dm.sample()
        ids = np.arange(before, dm.buffer.num_added)
        assert len(ids) >= 40
        # no training step ran: the learner's network is the one the workers were given
        check_priorities_are_the_networks(model, dm, ids)
    finally:
        dm.close()


# --------------------------------------------------------------------------- n-step windows

_ENV_NUMBERS = itertools.count()
STEPS: list[tuple[int, int, int, int]] = []  # every Tagged step of this process's envs
N_STEP, GAMMA = 3, 0.9


def episode_length(env_number: int, episode: int) -> int:
    return 1 + (3 * episode + env_number) % 5


class Tagged(gym.Env):
    """Observations ``(pid, env number, episode, t)``; reward ``1 + t``; episode ``e`` of env
    ``k`` lasts ``episode_length(k, e)`` steps (1 to 5) and terminates when ``e`` is even, is
    truncated when odd. Every step is logged in ``STEPS``."""

    observation_space = gym.spaces.Box(0.0, float(2**23), (4,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.number = next(_ENV_NUMBERS)
        self.episode, self.t = -1, 0

    def _obs(self) -> np.ndarray:
        return np.array([os.getpid(), self.number, self.episode, self.t], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        STEPS.append((os.getpid(), self.number, self.episode, self.t))
        reward = 1.0 + self.t
        self.t += 1
        ended = self.t == episode_length(self.number, self.episode)
        even = self.episode % 2 == 0
        return self._obs(), reward, ended and even, ended and not even, {}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_n_step_windows_stay_within_one_env_and_one_episode(num_workers):
    STEPS.clear()
    model = apex(env=Tagged, vectorization="sync", num_workers=num_workers, num_envs=3, rollout_fragment_length=7,
                 n_step=N_STEP, gamma=GAMMA, learning_starts=10**6)
    dm = started(model)
    try:
        for _ in range(4):
            dm.sample()
    finally:
        dm.close()
    rows = inserted_rows(dm.buffer, np.arange(dm.buffer.num_added))
    obs, next_obs = rows[SampleBatch.OBS].long(), rows[SampleBatch.NEXT_OBS].long()
    pid, number, episode, t = obs.T
    k = next_obs[:, 3] - t
    assert torch.equal(next_obs[:, :3], obs[:, :3])  # the same process, env and episode
    assert ((k >= 1) & (k <= N_STEP)).all()
    length = torch.tensor([episode_length(n, e) for n, e in zip(number.tolist(), episode.tolist())])
    assert (t < length).all()  # never a reset row's observation (the ended episode's final one)
    reached_end = next_obs[:, 3] == length
    assert (reached_end | (k == N_STEP)).all()  # a window is shorter than n_step only at an episode end
    torch.testing.assert_close(rows[SampleBatch.DISCOUNTS], GAMMA ** k.float(), rtol=1e-6, atol=0)
    assert torch.equal(rows[SampleBatch.TERMINATEDS], reached_end & (episode % 2 == 0))
    returns = torch.tensor([sum(GAMMA**i * (1.0 + tt + i) for i in range(kk))
                            for tt, kk in zip(t.tolist(), k.tolist())],
                           dtype=torch.float32)
    torch.testing.assert_close(rows[SampleBatch.REWARDS], returns, rtol=1e-6, atol=1e-6)
    # every kind of window occurs: full ones, and ones cut by termination and by truncation
    assert (k == N_STEP).any() and (reached_end & rows[SampleBatch.TERMINATEDS]).any()
    assert (reached_end & ~rows[SampleBatch.TERMINATEDS]).any() and (k == 1).any()
    keys = list(zip(pid.tolist(), number.tolist(), episode.tolist(), t.tolist()))
    assert len(set(keys)) == len(keys)  # each step handed out once
    envs = {(p, n) for p, n, _, _ in keys}
    assert len(envs) >= 3 and all(sum(1 for p, _ in envs if p == q) == 3 for q, _ in envs)  # 3 envs a process
    if num_workers == 0:  # every step whose window completed was handed out (the last n_step may wait)
        stepped = [s for s in STEPS if s[:2] in envs]
        assert set(keys) <= set(stepped)
        per_env: dict[tuple[int, int], list] = {}
        for s in stepped:
            per_env.setdefault(s[:2], []).append(s)
        for env_steps in per_env.values():
            assert set(env_steps[:-N_STEP]) <= set(keys)


# --------------------------------------------------------------------------- APEX priority loop


def test_apex_fit_updates_each_drawn_minibatch_once_with_rows_from_both_workers():
    model = apex(num_workers=2, total_env_steps=320, target_network_update_freq=48)
    dm = model.default_datamodule
    events: list[tuple] = []
    fragment_workers: list[list[int]] = []
    sample_minibatch, update_priorities = dm.sample_minibatch, dm.update_priorities
    assemble, next_batch = dm._assemble, dm._next_batch

    def drawing(policy_id, batch_size, beta=None):
        batch = sample_minibatch(policy_id, batch_size, beta)
        events.append(("sample", batch[SampleBatch.BATCH_INDEXES].clone()))
        return batch

    def updating(policy_id, batch_indexes, td_error):
        update_priorities(policy_id, batch_indexes, td_error)
        events.append(("update", batch_indexes.clone(), td_error.clone()))
        ids = batch_indexes.numpy()
        last = {i: float(td) for i, td in zip(ids.tolist(), td_error.tolist())}  # repeated rows: the last wins
        expected = [(abs(last[i]) + dm.eps) ** dm.alpha for i in ids.tolist()]
        np.testing.assert_allclose(dm.buffer.priorities(ids), expected, rtol=1e-9)

    def assembling(fragments, info, perf):
        batch = assemble(fragments, info, perf)
        batch.info["fragment_workers"] = [f.index for f in fragments]
        return batch

    def next_inserted():
        batch = next_batch()
        fragment_workers.append(batch.info["fragment_workers"])
        return batch

    dm.sample_minibatch, dm.update_priorities = drawing, updating
    dm._assemble, dm._next_batch = assembling, next_inserted
    trainer = quiet_trainer(max_epochs=-1, log_every_n_steps=1)
    trainer.fit(model)
    assert not children()
    # 10 iterations of 2 fragments x 2 envs x 8 steps; learning from the 2nd (64 env steps inserted)
    assert model.counters["num_env_steps_sampled"] == 320 and model.counters["num_iterations"] == 10
    assert model.counters["num_grad_updates"] == 18
    assert [e[0] for e in events] == ["sample", "update"] * 18
    for drawn, updated in zip(events[0::2], events[1::2]):
        assert torch.equal(drawn[1], updated[1])
        assert updated[1].shape == (16,) and updated[2].shape == (16,)
    assert len(fragment_workers) == 10 and all(len(w) == 2 for w in fragment_workers)
    assert set(itertools.chain(*fragment_workers)) == {0, 1}
    # target updates every 48 trained rows = 3 gradient steps of 16 rows; the last one after the last step
    assert model.counters["num_target_updates"] == 6
    assert torch.equal(flat_params(model.target_q), flat_params(model.policies))
    logged = trainer.callback_metrics
    assert float(logged["perf/worker_0_epsilon"]) == pytest.approx(0.4)
    assert float(logged["perf/worker_1_epsilon"]) == pytest.approx(0.4**8)


# --------------------------------------------------------------------------- A3C packets


def a2c_reference_gradient(model: A3C, rollout: dict, valid: torch.Tensor, bootstrap_obs: torch.Tensor) -> torch.Tensor:
    """The gradient of ``A2C.loss`` (``backward``) on the same fragment, with the same weights."""
    h = model.hparams
    ref = A2C(env="CartPole-v1", num_envs=h.num_envs, rollout_fragment_length=h.rollout_fragment_length,
              hiddens=h.hiddens, gamma=h.gamma, lambda_=h.lambda_, vf_loss_coeff=h.vf_loss_coeff,
              entropy_coeff=h.entropy_coeff, seed=123, total_env_steps=None)
    ref.policies.load_state_dict(model.policies.state_dict())
    fragment = SampleBatch({**{k: v.clone() for k, v in rollout.items()}, SampleBatch.VALID: valid,
                            SampleBatch.BOOTSTRAP_OBS: bootstrap_obs})
    batch = ref.postprocess(MultiAgentBatch({PID: fragment}, env_steps=valid.numel())).policy_batches[PID]
    loss, _ = ref.loss(PID, batch)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in ref.policies[PID].parameters()])


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop"])
def test_a3c_packet_is_the_a2c_gradient_and_is_applied_as_the_optimizer_would(optimizer):
    model = a3c(num_envs=4, rollout_fragment_length=20, gamma=0.95, lambda_=0.9, vf_loss_coeff=0.7,
                entropy_coeff=0.01, grad_clip=None, optimizer=optimizer, lr=1e-2)
    dm = started(model)
    task = dm.gradient_task
    fragments: list[tuple] = []
    make = task.make

    def recording(policy, rollout, valid, bootstrap_obs):
        fragments.append(({k: v.clone() for k, v in rollout.items()}, valid.clone(), bootstrap_obs.clone()))
        return make(policy, rollout, valid, bootstrap_obs)

    task.make = recording
    optimizer_ = model.configure_optimizers()
    model.optimizers = lambda: optimizer_
    ref_policy = copy.deepcopy(model.policies[PID])
    ref_optimizer = (torch.optim.Adam(ref_policy.parameters(), lr=1e-2) if optimizer == "adam" else
                     torch.optim.RMSprop(ref_policy.parameters(), lr=1e-2, alpha=0.99, eps=1e-5))
    resets = 0
    try:
        for _ in range(3):
            packet = dm.sample()
            rollout, valid, bootstrap_obs = fragments[-1]
            resets += int((~valid).sum())
            grads = packet.policy_batches[PID][GRADS]
            assert grads.shape == (1, sum(p.numel() for p in model.policies[PID].parameters()))
            direct, _ = task.gradient(copy.deepcopy(model.policies[PID]), rollout, valid, bootstrap_obs)
            torch.testing.assert_close(grads[0], direct, rtol=0, atol=0)  # with the module's current weights
            expected = a2c_reference_gradient(model, rollout, valid, bootstrap_obs)
            assert expected.norm() > 0
            torch.testing.assert_close(grads[0], expected, rtol=1e-5, atol=1e-7)
            assert packet.info["rows"] == int(valid.sum()) and packet.env_steps == 80
            # applied: exactly the optimizer's step with that gradient as .grad
            offset = 0
            for p in ref_policy.parameters():
                p.grad = grads[0, offset: offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            ref_optimizer.step()
            builder = LearnerInfoBuilder()
            assert model.learn_on_batch(packet, builder) == int(valid.sum())
            model.policies.version += 1  # as training_step: the sampling copy then takes the new weights
            torch.testing.assert_close(flat_params(model.policies[PID]), flat_params(ref_policy), rtol=0, atol=0)
            stats = builder.finalize()[PID][LEARNER_STATS_KEY]
            assert "grad_gnorm" not in stats and stats["cur_lr"] == pytest.approx(1e-2)
        assert model.counters["num_grad_updates"] == 3
        assert resets > 0  # the reset rows of ended episodes were left out alike
    finally:
        dm.close()


def test_a3c_each_worker_computes_its_next_packet_with_its_own_update_applied():
    model = a3c(num_workers=2, total_env_steps=400)
    records: list[tuple[int, int, int]] = []
    learn = model.learn_on_batch

    def recording(batch, builder):
        workers = batch.info["workers"]
        assert len(set(workers)) == len(workers)  # at most one packet per worker in an iteration
        for worker, version in zip(workers, batch.info[POLICY_VERSION].tolist()):
            records.append((worker, version, model.counters["num_iterations"]))
        return learn(batch, builder)

    model.learn_on_batch = recording
    quiet_trainer(max_epochs=-1).fit(model)
    assert not children()
    iterations = model.counters["num_iterations"]
    assert model.counters["num_grad_updates"] == len(records) >= iterations  # one optimizer step per packet
    sampled = model.counters["num_env_steps_sampled"]
    assert sampled == 10 * len(records)  # 2 envs x 5 steps a packet
    # the budget stops fit after the iteration that reaches it; that iteration takes at most one
    # packet per worker, so it overshoots by less than 2 packets (410 when both arrive together at 390)
    assert 400 <= sampled < 400 + 2 * 10
    assert sorted({it for _, _, it in records}) == list(range(iterations))
    by_worker: dict[int, list[tuple[int, int]]] = {}
    for worker, version, iteration in records:
        assert version <= iteration  # no packet from weights the learner did not have yet
        by_worker.setdefault(worker, []).append((version, iteration))
    assert set(by_worker) == {0, 1} and all(len(v) >= 5 for v in by_worker.values())
    for packets in by_worker.values():
        for (_, applied_at), (next_version, _) in itertools.pairwise(packets):
            assert next_version >= applied_at + 1


def test_a3c_under_ddp_is_a_clear_error(monkeypatch):
    """A Trainer set up for 2 DDP processes (not launched: the check is A3C's first fit hook)."""
    base_hook: list[int] = []
    monkeypatch.setattr(RLModule, "on_fit_start", lambda self: base_hook.append(self.trainer.world_size))
    model = a3c()
    trainer = quiet_trainer(devices=2, strategy="ddp")
    assert trainer.world_size == 2
    model._trainer = trainer
    with pytest.raises(RuntimeError, match=r"A3C does not run under DDP.*num_workers.*IMPALA/APPO"):
        model.on_fit_start()
    assert base_hook == []  # raised before anything was set up
    model._trainer = SimpleNamespace(world_size=1)
    model.on_fit_start()  # one process: on to the base hook
    assert base_hook == [1]


# --------------------------------------------------------------------------- flags by value


@pytest.mark.parametrize(("intensity", "num_workers", "num_envs", "fragment", "batch_size", "steps"), [
    (8.0, 2, 4, 16, 64, 16),  # 128 env steps per iteration: 8 * 128 / 64
    (1.3, 2, 4, 16, 64, 3),  # 2.6 rounds to 3
    (3.0, 0, 4, 16, 64, 3),  # the learner process samples one fragment of 64 steps
    (0.1, 2, 4, 16, 64, 1),  # 0.2 rounds to 0: at least 1
    (None, 2, 4, 16, 64, 5),  # num_gradient_steps as given
    ("default", 2, 4, 16, 64, 32),  # neither given: training_intensity 16
    ("default", 0, 4, 16, 64, 16),  # the same replay ratio with half the env steps per iteration
])
def test_apex_training_intensity_sets_num_gradient_steps(intensity, num_workers, num_envs, fragment, batch_size,
                                                         steps):
    given = {} if intensity == "default" else (
        {"num_gradient_steps": 5} if intensity is None else {"training_intensity": intensity})
    model = APEX(num_workers=num_workers, num_envs=num_envs, rollout_fragment_length=fragment,
                 train_batch_size=batch_size, hiddens=(8,), **given)
    assert model.num_gradient_steps == steps
    with pytest.raises(ValueError, match="training_intensity"):
        APEX(training_intensity=0.0, hiddens=(8,))
    with pytest.raises(ValueError, match="not both"):
        APEX(training_intensity=1.0, num_gradient_steps=4, hiddens=(8,))


@pytest.mark.parametrize(("world_size", "due_at"), [(1, [3, 6, 9]), (2, [2, 4, 6, 8])])
def test_apex_target_network_update_freq_counts_trained_rows(world_size, due_at):
    model = apex(train_batch_size=16, target_network_update_freq=48)
    if world_size > 1:
        model._trainer = SimpleNamespace(world_size=world_size)
    due = []
    for step in range(1, 10):
        model.counters["num_grad_updates"] = step
        if model.target_update_due():
            due.append(step)
    assert due == due_at  # 48 rows: 3 steps of 16 rows, or 2 steps of 16 rows on each of 2 ranks
    assert model.counters["num_target_updates"] == len(due_at)
    every = apex(target_network_update_freq=0)
    for step in range(1, 4):
        every.counters["num_grad_updates"] = step
        assert every.target_update_due()


def test_apex_target_update_copies_the_online_weights_and_keeps_the_target_a_constant():
    """``update_targets`` runs inside the training step, with autograd on: the copy must not
    record history (the target network stays leaves without gradients, as built)."""
    model = apex()
    with torch.no_grad():
        for p in model.policies.parameters():
            p.add_(0.5)
    assert not torch.equal(flat_params(model.target_q), flat_params(model.policies))
    with torch.enable_grad():
        model.update_targets()
    assert torch.equal(flat_params(model.target_q), flat_params(model.policies))
    for name, p in model.target_q.named_parameters():
        assert p.is_leaf and not p.requires_grad and p.grad_fn is None, name


def a3c_packet(grads: torch.Tensor) -> MultiAgentBatch:
    return MultiAgentBatch({PID: SampleBatch({GRADS: grads[None]})}, env_steps=10,
                           info={"worker_stats": [{"total_loss": 0.0}], "rows": 10, "workers": [0]})


@pytest.mark.parametrize(("grad_clip", "scale"), [(0.5, 0.5 / 10.0), (20.0, 1.0)])
def test_a3c_grad_clip_clips_the_applied_gradient_norm(grad_clip, scale):
    model = a3c(grad_clip=grad_clip, optimizer="adam", lr=1e-3)
    n = sum(p.numel() for p in model.policies[PID].parameters())
    g = torch.randn(n, generator=torch.Generator().manual_seed(0))
    g = g * (10.0 / g.norm())  # norm 10
    optimizer = model.configure_optimizers()
    model.optimizers = lambda: optimizer
    ref = copy.deepcopy(model.policies[PID])
    ref_optimizer = torch.optim.Adam(ref.parameters(), lr=1e-3)
    builder = LearnerInfoBuilder()
    model.learn_on_batch(a3c_packet(g), builder)
    applied = torch.cat([p.grad.reshape(-1) for p in model.policies[PID].parameters()])
    torch.testing.assert_close(applied, g * scale, rtol=1e-5, atol=1e-7)
    assert float(applied.norm()) == pytest.approx(min(grad_clip, 10.0), rel=1e-5)
    assert float(builder.finalize()[PID][LEARNER_STATS_KEY]["grad_gnorm"]) == pytest.approx(10.0, rel=1e-5)
    offset = 0
    for p in ref.parameters():
        p.grad = applied[offset: offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    ref_optimizer.step()
    torch.testing.assert_close(flat_params(model.policies[PID]), flat_params(ref), rtol=0, atol=0)


# --------------------------------------------------------------------------- learning


def test_apex_learns_cartpole_synchronously():
    """Seeded, ``num_workers=0``: 10k env steps lift the greedy return far above random play
    (about 22); seed 0 reaches about 160 (seeds 0-3: 105-163)."""
    model = APEX(env="CartPole-v1", num_workers=0, seed=0, total_env_steps=10_000, hiddens=(64, 64))
    quiet_trainer(max_epochs=-1).fit(model)
    assert model.counters["num_env_steps_sampled"] == 10_048
    assert np.mean(evaluate(model, num_episodes=5, seed=123)) > 80


def test_a3c_learns_cartpole_synchronously():
    """Seeded, ``num_workers=0`` (A2C on one rollout per packet): 40k env steps lift the greedy
    return far above random play; seed 0 reaches about 200 (seeds 0-2: 198-500)."""
    model = A3C(env="CartPole-v1", num_workers=0, seed=0, total_env_steps=40_000)
    quiet_trainer(max_epochs=-1).fit(model)
    assert model.counters["num_env_steps_sampled"] == 40_000
    assert np.mean(evaluate(model, num_episodes=5, seed=123)) > 100
