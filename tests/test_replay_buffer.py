"""Oracle tests for the replay buffers and their sum/min trees.

Streams are laid out the way gymnasium's next-step autoreset produces them: after an
episode ends (terminated or truncated) the next row of that env is a *reset row* whose
observation is the final observation of the ended episode, with reward 0, no done flags
and ``valid=False``. Every observation holds a unique id, so a sampled row names the
stored step it came from, and a row from overwritten data cannot pass unnoticed.
"""

from __future__ import annotations

import io
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl.batch import SampleBatch
from lightning_rl.data.buffers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer
from lightning_rl.data.buffers.sum_tree import MinTree, SumTree
from lightning_rl.functional import n_step_returns

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACT_SPACE = gym.spaces.Discrete(3)


# --------------------------------------------------------------------------- streams


def make_stream(num_envs: int, steps: int, seed: int, p_term: float = 0.12, p_trunc: float = 0.08) -> dict:
    """A time-major ``[steps, num_envs]`` vector-env stream with next-step autoreset.

    ``obs[t, e] = (id, e)`` with ids unique over the whole stream.
    """
    rng = np.random.default_rng(seed)
    obs = np.zeros((steps, num_envs, 2), np.float32)
    actions = rng.integers(0, 3, (steps, num_envs))
    rewards = np.round(rng.normal(size=(steps, num_envs)), 3).astype(np.float32)
    terms = np.zeros((steps, num_envs), bool)
    truncs = np.zeros((steps, num_envs), bool)
    valid = np.zeros((steps, num_envs), bool)
    next_id = 0
    for e in range(num_envs):
        prev_done = False
        for t in range(steps):
            obs[t, e] = (next_id + 1000 * e, e)
            next_id += 1
            valid[t, e] = not prev_done
            if prev_done:  # reset step: reward 0, no flags
                rewards[t, e] = 0.0
                prev_done = False
                continue
            u = rng.random()
            terms[t, e] = u < p_term
            truncs[t, e] = p_term <= u < p_term + p_trunc
            prev_done = terms[t, e] or truncs[t, e]
    return dict(obs=obs, actions=actions, rewards=rewards, terms=terms, truncs=truncs, valid=valid)


def add_row(buf: ReplayBuffer, s: dict, t: int) -> None:
    buf.add(s["obs"][t], s["actions"][t], s["rewards"][t], s["terms"][t], s["truncs"][t], s["valid"][t])


def oracle(s: dict, num_added: int, rows: int, n: int, gamma: float) -> dict:
    """Expected sampleable transitions after ``num_added`` rows: flat slot -> transition.

    A plain loop per (row, env): walk up to ``n`` steps, stopping after the first
    terminated or truncated one; the row counts only if it is valid, still stored
    (not overwritten) and every step of its window plus the next observation is stored.
    """
    num_envs = s["obs"].shape[1]
    newest = num_added - 1
    expected = {}
    for t in range(max(0, num_added - rows), num_added):
        for e in range(num_envs):
            if not s["valid"][t, e]:
                continue
            ret, k, term, complete = 0.0, 0, False, False
            for i in range(n):
                if t + i + 1 > newest:  # step t+i or its next observation not stored yet
                    break
                ret += gamma**i * float(s["rewards"][t + i, e])
                k = i + 1
                if s["terms"][t + i, e] or s["truncs"][t + i, e]:
                    term = bool(s["terms"][t + i, e])
                    complete = True
                    break
            else:
                complete = True
            if not complete:
                continue
            expected[(t % rows) * num_envs + e] = dict(
                obs=s["obs"][t, e],
                action=int(s["actions"][t, e]),
                ret=ret,
                next_obs=s["obs"][t + k, e],
                terminated=term,
                discount=gamma**k,
            )
    return expected


def draw(buf: ReplayBuffer, count: int, **kwargs) -> SampleBatch:
    """``count`` samples in batches of at most ``len(buf)`` (a larger batch is an error)."""
    batches, got = [], 0
    while got < count:
        batches.append(buf.sample(min(len(buf), count - got), **kwargs))
        got += batches[-1].count
    return SampleBatch.concat_samples(batches)


def check_against_oracle(buf: ReplayBuffer, expected: dict, batch: SampleBatch) -> set[int]:
    """Every sampled row equals its oracle transition; returns the slots seen."""
    assert len(buf) == len(expected)
    seen = set()
    for j, flat in enumerate(batch[SampleBatch.BATCH_INDEXES].tolist()):
        assert flat in expected, f"slot {flat} is not sampleable"
        x = expected[flat]
        np.testing.assert_array_equal(batch[SampleBatch.OBS][j].numpy(), x["obs"])
        assert batch[SampleBatch.ACTIONS][j].item() == x["action"]
        assert batch[SampleBatch.REWARDS][j].item() == pytest.approx(x["ret"], abs=1e-5)
        np.testing.assert_array_equal(batch[SampleBatch.NEXT_OBS][j].numpy(), x["next_obs"])
        assert bool(batch[SampleBatch.TERMINATEDS][j]) == x["terminated"]
        assert batch[SampleBatch.DISCOUNTS][j].item() == pytest.approx(x["discount"], rel=1e-6)
        seen.add(flat)
    return seen


# --------------------------------------------------------------------------- n-step math


def test_n_step_returns_matches_loop():
    rng = np.random.default_rng(0)
    B, n, gamma = 200, 4, 0.9
    rewards = torch.from_numpy(rng.normal(size=(B, n)).astype(np.float32))
    u = rng.random((B, n))
    terms, truncs = torch.from_numpy(u < 0.15), torch.from_numpy((u >= 0.15) & (u < 0.3))
    returns, discounts, terminated, k = n_step_returns(rewards, terms, truncs, gamma)
    assert returns.shape == discounts.shape == terminated.shape == k.shape == (B,)
    assert terminated.dtype == torch.bool and k.dtype == torch.int64
    for b in range(B):
        ret, steps, term = 0.0, 0, False
        for i in range(n):
            ret += gamma**i * rewards[b, i].item()
            steps += 1
            if terms[b, i] or truncs[b, i]:
                term = bool(terms[b, i])
                break
        assert returns[b].item() == pytest.approx(ret, abs=1e-5)
        assert k[b].item() == steps
        assert discounts[b].item() == pytest.approx(gamma**steps, rel=1e-6)
        assert terminated[b].item() == term


def test_hand_made_single_env_stream():
    """One env, n=3, gamma=0.5: truncation and termination inside the window, reset rows."""
    #        t:   0    1    2       3      4    5      6      7    8    9    10
    rewards = [1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 0.0, 6.0, 7.0, 8.0, 9.0]
    terms = [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    truncs = [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    valid = [1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1]
    buf = ReplayBuffer(32, OBS_SPACE, ACT_SPACE, num_envs=1, n_step=3, gamma=0.5, seed=0)
    for t in range(11):
        buf.add([[t, 0]], [t % 3], [rewards[t]], [bool(terms[t])], [bool(truncs[t])], [bool(valid[t])])
    # row: (return, next obs id, terminated, discount)
    expected = {
        0: (1 + 0.5 * 2 + 0.25 * 3, 3, False, 0.125),  # window cut by the truncation at t=2: bootstraps
        1: (2 + 0.5 * 3, 3, False, 0.25),
        2: (3.0, 3, False, 0.5),  # next obs = final obs, held by the reset row t=3
        4: (4 + 0.5 * 5, 6, True, 0.25),  # termination at t=5: no bootstrap
        5: (5.0, 6, True, 0.5),
        7: (6 + 0.5 * 7 + 0.25 * 8, 10, False, 0.125),
    }  # rows 8, 9 wait for obs 11 / 12; row 10 is the newest; 3 and 6 are reset rows
    assert len(buf) == len(expected)
    batch = draw(buf, 300)
    got = {}
    for j, row in enumerate(batch[SampleBatch.BATCH_INDEXES].tolist()):
        got[row] = (
            batch[SampleBatch.REWARDS][j].item(),
            int(batch[SampleBatch.NEXT_OBS][j, 0]),
            bool(batch[SampleBatch.TERMINATEDS][j]),
            batch[SampleBatch.DISCOUNTS][j].item(),
        )
        assert batch[SampleBatch.OBS][j, 0].item() == row
    assert got.keys() == expected.keys()
    for row, (ret, nxt, term, disc) in expected.items():
        assert got[row] == (pytest.approx(ret), nxt, term, pytest.approx(disc))
    assert torch.all(batch[SampleBatch.WEIGHTS] == 1.0)
    buf.add([[11, 0]], [0], [0.0], [False], [False], [True])
    assert len(buf) == 7  # row 8 completed its 3-step window


@pytest.mark.parametrize("n_step", [1, 3])
def test_stream_with_wraparound_matches_oracle(n_step):
    num_envs, rows, steps, gamma = 3, 10, 45, 0.9
    s = make_stream(num_envs, steps, seed=n_step)
    assert s["terms"].any() and s["truncs"].any() and not s["valid"].all()
    buf = ReplayBuffer(rows * num_envs - 1, OBS_SPACE, ACT_SPACE, num_envs, n_step, gamma, seed=1)
    assert buf.capacity == rows * num_envs  # rounded up to a multiple of num_envs
    for t in range(steps):
        add_row(buf, s, t)
        expected = oracle(s, t + 1, rows, n_step, gamma)
        assert len(buf) == len(expected)
        if len(expected) >= 1 and t % 3 == 0:
            seen = check_against_oracle(buf, expected, draw(buf, 400))
            assert seen == set(expected)  # 400 draws cover <= 27 rows
    assert buf.num_added == steps > 4 * rows  # wrapped around several times


def test_reset_rows_and_overwritten_rows_never_sampled():
    num_envs, rows, steps = 4, 8, 30
    s = make_stream(num_envs, steps, seed=5, p_term=0.3, p_trunc=0.2)
    buf = ReplayBuffer(rows * num_envs, OBS_SPACE, ACT_SPACE, num_envs, n_step=2, seed=0)
    for t in range(steps):
        add_row(buf, s, t)
    ids = draw(buf, 2000)[SampleBatch.OBS][:, 0].numpy()
    reset_ids = s["obs"][~s["valid"]][:, 0]
    overwritten_ids = s["obs"][: steps - rows][:, :, 0].ravel()
    assert not np.isin(ids, reset_ids).any()
    assert not np.isin(ids, overwritten_ids).any()
    newest_ids = s["obs"][steps - 1][:, 0]
    assert not np.isin(ids, newest_ids).any()


def test_end_episodes_cuts_every_env_as_truncation():
    num_envs, rows, n, gamma = 3, 12, 3, 0.8
    s = make_stream(num_envs, 10, seed=7)
    buf = ReplayBuffer(rows * num_envs, OBS_SPACE, ACT_SPACE, num_envs, n, gamma, seed=0)
    for t in range(10):
        add_row(buf, s, t)
    buf.end_episodes()
    buf.end_episodes()  # idempotent
    # The same cut applied to the oracle's stream: the step before the newest row is
    # truncated and the newest row becomes a reset row.
    cut = ~(s["terms"][8] | s["truncs"][8])
    s["truncs"][8] |= cut
    s["valid"][9] &= ~cut
    s["terms"][9] &= ~cut
    s["truncs"][9] &= ~cut
    expected = oracle(s, 10, rows, n, gamma)
    check_against_oracle(buf, expected, draw(buf, 500))
    # A fresh stream continues; no window joins the old stream to the new one.
    fresh = make_stream(num_envs, 8, seed=8)
    fresh["obs"][..., 0] += 10_000
    joined = {key: np.concatenate([s[key], fresh[key]]) for key in s}
    for t in range(8):
        add_row(buf, fresh, t)
        expected = oracle(joined, 11 + t, rows, n, gamma)
        check_against_oracle(buf, expected, draw(buf, 500))


def test_sample_columns_dtypes_and_uint8_images():
    obs_space = gym.spaces.Box(0, 255, (6, 6, 3), np.uint8)
    act_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float64)
    buf = ReplayBuffer(64, obs_space, act_space, num_envs=2, n_step=2, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(10):
        buf.add(
            rng.integers(0, 256, (2, 6, 6, 3), dtype=np.uint8),
            rng.uniform(-1, 1, (2, 2)),
            np.ones(2, np.float32),
            np.zeros(2, bool),
            np.zeros(2, bool),
            np.ones(2, bool),
        )
    batch = buf.sample(5)
    assert batch[SampleBatch.OBS].dtype == torch.uint8 and batch[SampleBatch.OBS].shape == (5, 6, 6, 3)
    assert batch[SampleBatch.NEXT_OBS].dtype == torch.uint8
    assert batch[SampleBatch.ACTIONS].dtype == torch.float32 and batch[SampleBatch.ACTIONS].shape == (5, 2)
    assert batch[SampleBatch.REWARDS].dtype == torch.float32
    assert batch[SampleBatch.TERMINATEDS].dtype == torch.bool
    assert batch[SampleBatch.DISCOUNTS].dtype == torch.float32
    assert batch[SampleBatch.BATCH_INDEXES].dtype == torch.int64
    assert batch[SampleBatch.WEIGHTS].dtype == torch.float32
    columns = {"obs", "actions", "rewards", "next_obs", "terminateds", "discounts", "batch_indexes", "weights"}
    assert set(batch) == columns


def test_uniform_sampling_frequencies():
    buf = ReplayBuffer(40, OBS_SPACE, ACT_SPACE, num_envs=2, n_step=1, seed=3)
    s = make_stream(2, 20, seed=3)
    for t in range(20):
        add_row(buf, s, t)
    draws = draw(buf, 40_000)[SampleBatch.BATCH_INDEXES].numpy()
    counts = np.bincount(draws, minlength=buf.capacity)
    slots = np.flatnonzero(counts)
    assert len(slots) == len(buf)
    chi2 = ((counts[slots] - len(draws) / len(slots)) ** 2 / (len(draws) / len(slots))).sum()
    dof = len(slots) - 1
    assert chi2 < dof + 6 * math.sqrt(2 * dof)


# --------------------------------------------------------------------------- trees


def check_tree_invariants(tree, leaves: np.ndarray, reduce) -> None:
    np.testing.assert_array_equal(tree.leaves, leaves)
    P = tree.num_leaves
    internal = tree.tree[1:P]
    children = tree.op(tree.tree[2 : 2 * P : 2], tree.tree[3 : 2 * P : 2])
    np.testing.assert_array_equal(internal, children)
    assert tree.root() == reduce(leaves)


@pytest.mark.parametrize("size", [1, 2, 5, 1000, 20_000])
def test_sum_and_min_trees_against_brute_force(size):
    rng = np.random.default_rng(size)
    sum_tree, min_tree = SumTree(size), MinTree(size)
    leaves = np.zeros(size)
    for _ in range(6):
        idx = rng.choice(size, size=min(size, 300), replace=False)
        vals = rng.integers(0, 5, len(idx)).astype(np.float64)  # integers: sums are exact
        sum_tree.update(idx, vals)
        min_tree.update(idx, np.where(vals > 0, vals, np.inf))
        leaves[idx] = vals
        check_tree_invariants(sum_tree, leaves, np.sum)
        check_tree_invariants(min_tree, np.where(leaves > 0, leaves, np.inf), np.min)
        np.testing.assert_array_equal(sum_tree[idx], vals)
    if sum_tree.total() == 0:
        return
    cumsum = np.cumsum(leaves)
    boundaries = cumsum[cumsum < cumsum[-1]]
    prefixes = np.concatenate([rng.random(500) * cumsum[-1], boundaries, [0.0, np.nextafter(cumsum[-1], 0)]])
    expected = np.searchsorted(cumsum, prefixes, side="right")  # first leaf whose cumsum exceeds u
    found = sum_tree.find_prefixsum(prefixes)
    np.testing.assert_array_equal(found, expected)
    assert (leaves[found] > 0).all()
    np.testing.assert_array_equal(sum_tree._find_safe(prefixes), expected)


def test_prefix_past_total_lands_on_a_positive_leaf():
    # 16384 leaves: the search jumps to the 4096-node level (4 leaves a node), then walks.
    tree = SumTree(16_384)
    tree.update(np.arange(4097), 1.0)
    total = tree.total()
    # A prefix at (or, through rounding, past) the total must still give the last positive leaf.
    assert tree.find_prefixsum(np.array([total, total * (1 + 1e-12), total - 0.5])).tolist() == [4096, 4096, 4096]


def test_sum_tree_sampling_frequencies():
    rng = np.random.default_rng(0)
    size = 50
    tree = SumTree(size)
    p = rng.random(size) * (rng.random(size) < 0.7)
    tree.update(np.arange(size), p)
    draws = tree.find_prefixsum(rng.random(200_000) * tree.total())
    counts = np.bincount(draws, minlength=size)
    assert counts[p == 0].sum() == 0
    expected = p / p.sum() * len(draws)
    pos = p > 0
    chi2 = ((counts[pos] - expected[pos]) ** 2 / expected[pos]).sum()
    dof = pos.sum() - 1
    assert chi2 < dof + 6 * math.sqrt(2 * dof)


def test_tree_update_with_repeated_indexes_last_wins():
    tree = SumTree(8)
    tree.update(np.array([3, 3, 5]), np.array([1.0, 2.0, 4.0]))
    assert tree[np.array([3, 5])].tolist() == [2.0, 4.0] and tree.total() == 6.0


# --------------------------------------------------------------------------- prioritized replay


def filled_per(num_envs=2, rows=16, steps=40, n_step=2, seed=0, **kwargs) -> tuple[PrioritizedReplayBuffer, dict]:
    buf = PrioritizedReplayBuffer(rows * num_envs, OBS_SPACE, ACT_SPACE, num_envs, n_step, seed=seed, **kwargs)
    s = make_stream(num_envs, steps, seed=seed + 100)
    for t in range(steps):
        add_row(buf, s, t)
    return buf, s


def sampleable_mask(buf: ReplayBuffer) -> np.ndarray:
    return buf.state_dict()["sampleable"].reshape(-1).copy()


def test_per_priorities_track_sampleable_rows_through_wraparound():
    buf = PrioritizedReplayBuffer(24, OBS_SPACE, ACT_SPACE, num_envs=3, n_step=2, seed=0)
    s = make_stream(3, 50, seed=11)
    rng = np.random.default_rng(0)
    for t in range(50):
        add_row(buf, s, t)
        mask = sampleable_mask(buf)
        pri = buf.priorities(np.arange(buf.capacity))
        assert ((pri > 0) == mask).all()  # not sampleable (overwritten, reset, pending) -> 0
        assert buf._min_tree.min() == (pri[mask].min() if mask.any() else np.inf)
        if len(buf) >= 4:
            batch = buf.sample(4)
            buf.update_priorities(batch[SampleBatch.BATCH_INDEXES], rng.random(4) * 3)
    expected = oracle(s, 50, 8, 2, buf.gamma)
    check_against_oracle(buf, expected, draw(buf, 300, beta=0.5))


def test_per_sampling_frequencies_proportional_to_priority_alpha():
    buf, _ = filled_per(num_envs=2, rows=16, steps=40, n_step=1, seed=1, alpha=0.7)
    live = np.flatnonzero(sampleable_mask(buf))
    td = np.linspace(0.0, 4.0, len(live))
    buf.update_priorities(live, td)
    counts = np.zeros(buf.capacity)
    counts += np.bincount(draw(buf, 200 * 256)[SampleBatch.BATCH_INDEXES].numpy(), minlength=buf.capacity)
    assert counts.sum() == 200 * 256 and counts[sampleable_mask(buf) == 0].sum() == 0
    p = (np.abs(td) + buf.eps) ** 0.7
    expected = p / p.sum() * counts.sum()
    chi2 = ((counts[live] - expected) ** 2 / expected).sum()
    dof = len(live) - 1
    assert chi2 < dof + 6 * math.sqrt(2 * dof)


@pytest.mark.parametrize("beta", [None, 0.0, 1.0])
def test_per_importance_weights_equal_formula(beta):
    buf, _ = filled_per(seed=2, beta=0.4)
    live = np.flatnonzero(sampleable_mask(buf))
    rng = np.random.default_rng(0)
    buf.update_priorities(live, rng.exponential(size=len(live)))
    batch = draw(buf, 64, beta=beta)
    b = 0.4 if beta is None else beta
    pri = buf.priorities(np.arange(buf.capacity))
    N, total = len(buf), pri.sum()
    prob = pri[batch[SampleBatch.BATCH_INDEXES].numpy()] / total
    max_weight = (N * pri[live].min() / total) ** -b
    expected = (N * prob) ** -b / max_weight
    np.testing.assert_allclose(batch[SampleBatch.WEIGHTS].numpy(), expected, rtol=1e-5)
    assert batch[SampleBatch.WEIGHTS].max() <= 1.0 + 1e-6


def test_per_update_sets_exactly_those_priorities():
    buf, _ = filled_per(seed=3, alpha=0.6, eps=1e-3)
    before = buf.priorities(np.arange(buf.capacity))
    live = np.flatnonzero(sampleable_mask(buf))
    idx = live[::3]
    td = torch.linspace(-2.0, 2.0, len(idx))
    buf.update_priorities(torch.from_numpy(idx), td)
    after = buf.priorities(np.arange(buf.capacity))
    np.testing.assert_allclose(after[idx], (np.abs(td.numpy().astype(np.float64)) + 1e-3) ** 0.6, rtol=1e-12)
    others = np.setdiff1d(np.arange(buf.capacity), idx)
    np.testing.assert_array_equal(after[others], before[others])
    assert buf.max_priority == pytest.approx(2.0 + 1e-3)


def test_per_new_rows_get_max_priority_and_stale_updates_are_ignored():
    buf = PrioritizedReplayBuffer(16, OBS_SPACE, ACT_SPACE, num_envs=1, n_step=1, seed=0, alpha=0.5)
    s = make_stream(1, 40, seed=4, p_term=0.0, p_trunc=0.0)
    for t in range(10):
        add_row(buf, s, t)
    live = np.flatnonzero(sampleable_mask(buf))
    assert np.allclose(buf.priorities(live), 1.0)  # initial max priority 1
    buf.update_priorities(live, np.full(len(live), 0.1))
    buf.update_priorities(live[:1], [8.0])
    assert buf.max_priority == pytest.approx(8.0 + buf.eps)
    add_row(buf, s, 10)  # row 9 becomes sampleable
    assert buf.priorities([9])[0] == pytest.approx((8.0 + buf.eps) ** 0.5)
    for t in range(11, 17):
        add_row(buf, s, t)  # row 16 overwrote slot 0 (row 0): it is the newest, not sampleable
    assert buf.priorities([0])[0] == 0.0
    buf.update_priorities([0], [5.0])  # stale index from an earlier sample: ignored
    assert buf.priorities([0])[0] == 0.0
    assert buf.max_priority == pytest.approx(8.0 + buf.eps)


# --------------------------------------------------------------------------- checkpoints, memory, errors


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_state_dict_round_trip_samples_identically(cls):
    num_envs, rows = 3, 12
    s = make_stream(num_envs, 60, seed=9)
    a = cls(rows * num_envs, OBS_SPACE, ACT_SPACE, num_envs, n_step=3, seed=4)
    for t in range(30):
        add_row(a, s, t)
        if len(a) >= 8:
            batch = a.sample(8)
            if cls is PrioritizedReplayBuffer:
                a.update_priorities(batch[SampleBatch.BATCH_INDEXES], batch[SampleBatch.REWARDS])
    # Through a real checkpoint file loaded with weights_only=True (tensors, not arrays).
    f = io.BytesIO()
    torch.save(a.state_dict(tensors=True), f)
    f.seek(0)
    b = cls(rows * num_envs, OBS_SPACE, ACT_SPACE, num_envs, n_step=3, seed=123)
    b.load_state_dict(torch.load(f, weights_only=True))
    c = cls(rows * num_envs, OBS_SPACE, ACT_SPACE, num_envs, n_step=3, seed=77)
    c.load_state_dict({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in a.state_dict().items()})
    for t in range(30, 60):
        for buf in (a, b, c):
            add_row(buf, s, t)
        batches = [buf.sample(min(16, len(buf))) for buf in (a, b, c)]
        for other in batches[1:]:
            assert other.keys() == batches[0].keys()
            for key in batches[0]:
                assert torch.equal(batches[0][key], other[key]), key
        if cls is PrioritizedReplayBuffer:
            td = batches[0][SampleBatch.REWARDS] * 0.5
            for buf in (a, b, c):
                buf.update_priorities(batches[0][SampleBatch.BATCH_INDEXES], td)
    assert len(a) == len(b) == len(c)


def test_load_state_dict_rejects_other_config():
    a = ReplayBuffer(20, OBS_SPACE, ACT_SPACE, num_envs=2, n_step=2)
    b = ReplayBuffer(20, OBS_SPACE, ACT_SPACE, num_envs=2, n_step=3)
    with pytest.raises(ValueError, match="n_step"):
        b.load_state_dict(a.state_dict())


def test_memory_stores_observations_once():
    cap, num_envs = 4096, 8
    buf = ReplayBuffer(cap, OBS_SPACE, ACT_SPACE, num_envs=num_envs, n_step=3)
    obs_bytes = 2 * 4  # float32 (2,)
    raw_per_transition = obs_bytes + 8 + 4 + 3  # obs once, int64 action, float32 reward, 3 bool flags
    assert buf.nbytes <= 1.2 * raw_per_transition * cap
    assert buf.nbytes < (raw_per_transition + obs_bytes) * cap  # less than with a next_obs array
    image_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)
    img = ReplayBuffer(cap, image_space, ACT_SPACE, num_envs=num_envs)
    assert img.nbytes <= 1.2 * (84 * 84 + 8 + 4 + 3) * cap
    per = PrioritizedReplayBuffer(cap, OBS_SPACE, ACT_SPACE, num_envs=num_envs)
    assert per.storage_nbytes <= 1.2 * raw_per_transition * cap
    assert per.nbytes == per.storage_nbytes + per.priority_nbytes


def test_errors():
    buf = ReplayBuffer(20, OBS_SPACE, ACT_SPACE, num_envs=2, n_step=1)
    s = make_stream(2, 4, seed=0, p_term=0.0, p_trunc=0.0)
    for t in range(4):
        add_row(buf, s, t)
    assert len(buf) == 6
    big = buf.sample(50)  # more than stored: drawn with replacement from the 6 sampleable rows
    assert len(big) == 50 and len(set(big["batch_indexes"].tolist())) <= 6
    with pytest.raises(ValueError, match="holds no sampleable transition"):
        ReplayBuffer(20, OBS_SPACE, ACT_SPACE, num_envs=2, n_step=1).sample(1)
    with pytest.raises(ValueError, match=r"capacity \(3\).*num_envs \(4\)"):
        ReplayBuffer(3, OBS_SPACE, ACT_SPACE, num_envs=4)
    with pytest.raises(ValueError, match="MultiDiscrete"):
        ReplayBuffer(10, OBS_SPACE, gym.spaces.MultiDiscrete([2, 3]))
    with pytest.raises(ValueError, match="Dict"):
        ReplayBuffer(10, gym.spaces.Dict({"a": OBS_SPACE}), ACT_SPACE)
    with pytest.raises(ValueError, match=r"n_step=3 needs at least 5"):
        ReplayBuffer(8, OBS_SPACE, ACT_SPACE, num_envs=2, n_step=3)
    with pytest.raises(ValueError, match="obs has shape"):
        buf.add(np.zeros((3, 2)), np.zeros(2), np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), np.ones(2, bool))
    per = PrioritizedReplayBuffer(20, OBS_SPACE, ACT_SPACE, num_envs=2)
    for t in range(4):
        add_row(per, s, t)
    with pytest.raises(ValueError, match="NaN"):
        per.update_priorities([0], [float("nan")])
    with pytest.raises(ValueError, match="batch_indexes"):
        per.update_priorities([0, 1], [1.0])
    assert len(per.sample(9)) == 9  # with replacement, as uniform replay
