"""Oracle tests for lightning_rl.functional.

GAE is checked against a plain per-episode Python loop over hand-made rollouts laid out
the way gymnasium's next-step autoreset lays them out: after an episode ends (terminated
or truncated) the next row of that env is a *reset row* whose observation is the final
observation of the ended episode, with reward 0 and no done flags; it is not trained on.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest
import torch

from lightning_rl.functional import (
    explained_variance,
    gae,
    piecewise_linear,
    ppo_surrogate_loss,
    standardized,
    value_loss,
)

# --------------------------------------------------------------------------- rollout model

TERM, TRUNC, ONGOING = "term", "trunc", None


@dataclass
class Episode:
    """The part of one episode that lies in the fragment."""

    rewards: list[float]
    values: list[float]  # V(obs) of each step's observation
    end: str | None  # TERM / TRUNC, or ONGOING when it continues past the fragment
    v_after: float  # V of the observation after the last step (final obs, or next obs if ongoing)
    rows: list[int] = field(default_factory=list)  # fragment rows of its steps


@dataclass
class EnvFragment:
    episodes: list[Episode]
    reset_rows: list[int]
    row_values: list[float]  # values column, reset rows included
    row_rewards: list[float]
    row_term: list[bool]
    row_trunc: list[bool]
    bootstrap: float


def layout(script: list, rng: random.Random) -> EnvFragment:
    """Lay out one env's fragment from a script of ``(length, end)`` episodes.

    A reset row follows every episode that ends before the last row; the script does not
    list those. An explicit ``"reset"`` is allowed only first (the previous fragment ended
    with an episode end) or last (the fragment ends with a reset row).
    """
    episodes, reset_rows = [], []
    values, rewards, term, trunc = [], [], [], []

    def add_reset_row(value: float) -> None:
        # gymnasium next-step autoreset: obs is the final obs, reward 0, no done flags
        reset_rows.append(len(values))
        values.append(value)
        rewards.append(0.0)
        term.append(False)
        trunc.append(False)

    for i, item in enumerate(script):
        is_last = i == len(script) - 1
        if item == "reset":
            if i == 0:
                add_reset_row(rng.uniform(-2, 2))  # V(final obs) of an episode of the last fragment
                continue
            assert is_last and episodes[-1].end is not ONGOING, "explicit reset: first, or last after an ended episode"
            add_reset_row(episodes[-1].v_after)
            continue
        length, end = item
        assert length >= 1
        ep = Episode(
            rewards=[rng.uniform(-1, 2) for _ in range(length)],
            values=[rng.uniform(-2, 2) for _ in range(length)],
            end=end,
            v_after=rng.uniform(-2, 2),
        )
        for k in range(length):
            ep.rows.append(len(values))
            values.append(ep.values[k])
            rewards.append(ep.rewards[k])
            term.append(end == TERM and k == length - 1)
            trunc.append(end == TRUNC and k == length - 1)
        episodes.append(ep)
        if end is ONGOING:
            assert is_last, "only the last episode may be ongoing"
        elif not is_last and script[i + 1] != "reset":
            add_reset_row(ep.v_after)
    last = episodes[-1] if episodes else None
    if last is not None and last.rows[-1] == len(values) - 1:
        bootstrap = last.v_after  # next obs (ongoing) or the final obs (ended on the last row)
    else:
        bootstrap = rng.uniform(-2, 2)  # after a trailing reset row: first obs of a new episode
    return EnvFragment(episodes, reset_rows, values, rewards, term, trunc, bootstrap)


def oracle_episode(ep: Episode, gamma: float, lam: float) -> tuple[list[float], list[float]]:
    """GAE of one episode, written out by the textbook recursion."""
    n = len(ep.rewards)
    next_values = []
    for k in range(n):
        if k < n - 1:
            next_values.append(ep.values[k + 1])
        elif ep.end == TERM:
            next_values.append(0.0)
        else:  # truncated (bootstrap V(final obs)) or ongoing (bootstrap V(next obs))
            next_values.append(ep.v_after)
    adv = [0.0] * n
    running = 0.0
    for k in reversed(range(n)):
        delta = ep.rewards[k] + gamma * next_values[k] - ep.values[k]
        running = delta + gamma * lam * running
        adv[k] = running
    return adv, [a + v for a, v in zip(adv, ep.values)]


def closed_form_episode(ep: Episode, gamma: float, lam: float) -> list[float]:
    """Advantages for lam in {0, 1}: one-step TD error, or discounted return minus V."""
    n = len(ep.rewards)
    tail = 0.0 if ep.end == TERM else ep.v_after
    out = []
    for k in range(n):
        if lam == 0.0:
            nxt = ep.values[k + 1] if k < n - 1 else tail
            out.append(ep.rewards[k] + gamma * nxt - ep.values[k])
        else:
            ret = sum(gamma**j * ep.rewards[k + j] for j in range(n - k)) + gamma ** (n - k) * tail
            out.append(ret - ep.values[k])
    return out


def build(scripts: list[list], seed: int, float_flags: bool = False):
    rng = random.Random(seed)
    frags = [layout(s, rng) for s in scripts]
    lengths = {len(f.row_values) for f in frags}
    assert len(lengths) == 1, f"scripts give different fragment lengths: {lengths}"

    def col(name, dtype):
        return torch.tensor([getattr(f, name) for f in frags], dtype=dtype).T.contiguous()

    flag_dtype = torch.float64 if float_flags else torch.bool
    arrays = dict(
        rewards=col("row_rewards", torch.float64),
        values=col("row_values", torch.float64),
        bootstrap_value=torch.tensor([f.bootstrap for f in frags], dtype=torch.float64),
        terminateds=col("row_term", flag_dtype),
        truncateds=col("row_trunc", flag_dtype),
    )
    return frags, arrays


def oracle(frags: list[EnvFragment], gamma: float, lam: float):
    t_len, n_envs = len(frags[0].row_values), len(frags)
    adv = torch.full((t_len, n_envs), math.nan, dtype=torch.float64)
    targets = torch.full((t_len, n_envs), math.nan, dtype=torch.float64)
    valid = torch.zeros((t_len, n_envs), dtype=torch.bool)
    for b, frag in enumerate(frags):
        for ep in frag.episodes:
            a, tg = oracle_episode(ep, gamma, lam)
            for row, ak, tk in zip(ep.rows, a, tg):
                adv[row, b], targets[row, b], valid[row, b] = ak, tk, True
        assert not valid[frag.reset_rows, b].any()
    return adv, targets, valid


def check_gae(scripts, gamma, lam, seed=0, float_flags=False):
    frags, arrays = build(scripts, seed, float_flags)
    adv, targets = gae(**arrays, gamma=gamma, lambda_=lam)
    assert adv.shape == targets.shape == arrays["values"].shape
    exp_adv, exp_targets, valid = oracle(frags, gamma, lam)
    torch.testing.assert_close(adv[valid], exp_adv[valid])
    torch.testing.assert_close(targets[valid], exp_targets[valid])
    torch.testing.assert_close(targets, adv + arrays["values"])
    return frags, arrays, adv, valid


GAMMA_LAMBDA = [(0.99, 0.95), (0.9, 0.8), (0.5, 0.3), (1.0, 0.9), (0.97, 1.0), (0.97, 0.0), (0.0, 0.5)]

# T = 8 rows per env; each script lists the episodes of one env
MIXED_SCRIPTS = [
    [(8, ONGOING)],  # one episode crossing the fragment end: bootstrap
    [(3, TERM), (4, TRUNC)],  # termination, reset row, truncation on the last row
    [(2, TRUNC), (2, TRUNC), (2, TERM)],  # termination on the last row after resets
    [(4, TRUNC), (3, TERM)],  # termination on the last row
    ["reset", (3, TERM), (3, ONGOING)],  # fragment starts with a reset row
    [(1, TERM), (1, TRUNC), (1, TERM), (2, ONGOING)],  # one-step episodes
    [(6, TRUNC), (1, ONGOING)],  # reset row then a one-step ongoing episode
    [(7, TERM), "reset"],  # fragment ends with a reset row
    [(3, TRUNC), (3, TRUNC), "reset"],  # truncation, then the fragment ends with a reset row
    [(8, TRUNC)],  # truncation on the last row, no reset in the fragment
]


@pytest.mark.parametrize(("gamma", "lam"), GAMMA_LAMBDA)
def test_gae_matches_oracle_on_mixed_episodes(gamma, lam):
    check_gae(MIXED_SCRIPTS, gamma, lam)


def test_layout_marks_reset_rows():
    frags, arrays = build(MIXED_SCRIPTS, seed=0)
    assert [f.reset_rows for f in frags] == [[], [3], [2, 5], [4], [0, 4], [1, 3, 5], [6], [7], [3, 7], []]
    for b, frag in enumerate(frags):
        for row in frag.reset_rows:
            assert arrays["rewards"][row, b] == 0
            assert not arrays["terminateds"][row, b] and not arrays["truncateds"][row, b]
            if row > 0:  # the row before a reset row ends an episode, and the reset row holds V(final obs)
                assert arrays["terminateds"][row - 1, b] or arrays["truncateds"][row - 1, b]
                ended = next(ep for ep in frag.episodes if ep.rows[-1] == row - 1)
                assert arrays["values"][row, b] == ended.v_after


@pytest.mark.parametrize(("gamma", "lam"), GAMMA_LAMBDA)
def test_gae_float_done_flags(gamma, lam):
    check_gae(MIXED_SCRIPTS, gamma, lam, seed=3, float_flags=True)


@pytest.mark.parametrize("end", [TERM, TRUNC, ONGOING])
@pytest.mark.parametrize(("gamma", "lam"), [(0.9, 0.95), (0.99, 1.0), (0.8, 0.0)])
def test_gae_single_episode_end_kinds(end, gamma, lam):
    frags, arrays, adv, _ = check_gae([[(5, end)]], gamma, lam, seed=11)
    # the last step's one-step target is explicit: r + gamma * (0 | V(final) | bootstrap)
    ep = frags[0].episodes[0]
    tail = 0.0 if end == TERM else arrays["bootstrap_value"][0].item()
    assert tail == (0.0 if end == TERM else ep.v_after)
    expected_last = ep.rewards[-1] + gamma * tail - ep.values[-1]
    assert adv[-1, 0].item() == pytest.approx(expected_last)


def test_gae_termination_ignores_bootstrap_and_next_value():
    _, arrays = build([[(3, TERM), (4, TERM)]], seed=5)
    adv1, _ = gae(**arrays, gamma=0.9, lambda_=0.95)
    arrays2 = dict(arrays)
    arrays2["bootstrap_value"] = arrays["bootstrap_value"] + 100.0
    arrays2["values"] = arrays["values"].clone()
    arrays2["values"][3] += 100.0  # the reset row after the first termination
    adv2, _ = gae(**arrays2, gamma=0.9, lambda_=0.95)
    valid = torch.ones(8, dtype=torch.bool)
    valid[3] = False
    torch.testing.assert_close(adv1[valid], adv2[valid])


def test_gae_truncation_bootstraps_reset_row_value():
    _, arrays = build([[(3, TRUNC), (4, ONGOING)]], seed=6)
    adv1, _ = gae(**arrays, gamma=0.9, lambda_=0.95)
    arrays2 = dict(arrays)
    arrays2["values"] = arrays["values"].clone()
    arrays2["values"][3] += 1.0  # V(final obs) of the truncated episode
    adv2, _ = gae(**arrays2, gamma=0.9, lambda_=0.95)
    diff = (adv2 - adv1)[:, 0]
    # the truncated episode's step k gains (gamma lambda)^(2-k) * gamma; the next episode is untouched
    expected = torch.tensor([0.9 * (0.9 * 0.95) ** 2, 0.9 * 0.9 * 0.95, 0.9], dtype=torch.float64)
    torch.testing.assert_close(diff[:3], expected)
    torch.testing.assert_close(diff[4:], torch.zeros(4, dtype=torch.float64))


def test_gae_reset_row_contents_do_not_leak_into_valid_rows():
    scripts = MIXED_SCRIPTS
    frags, arrays = build(scripts, seed=8)
    adv1, _ = gae(**arrays, gamma=0.95, lambda_=0.9)
    _, _, valid = oracle(frags, 0.95, 0.9)
    arrays2 = dict(arrays)
    arrays2["rewards"] = arrays["rewards"].clone()
    arrays2["rewards"][~valid] = 1000.0  # whatever the reset step's reward, it must not matter
    adv2, _ = gae(**arrays2, gamma=0.95, lambda_=0.9)
    torch.testing.assert_close(adv1[valid], adv2[valid])


@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_gae_lambda_extremes_closed_form(lam):
    gamma = 0.93
    frags, arrays = build(MIXED_SCRIPTS, seed=4)
    adv, _ = gae(**arrays, gamma=gamma, lambda_=lam)
    for b, frag in enumerate(frags):
        for ep in frag.episodes:
            expected = torch.tensor(closed_form_episode(ep, gamma, lam), dtype=torch.float64)
            torch.testing.assert_close(adv[ep.rows, b], expected)


def _random_script(rng: random.Random, t_len: int) -> list:
    script: list = []
    remaining = t_len
    if rng.random() < 0.25:
        script.append("reset")
        remaining -= 1
    while remaining > 0:
        length = rng.randint(1, min(6, remaining))
        if length == remaining:
            script.append((length, rng.choice([TERM, TRUNC, ONGOING])))
            break
        script.append((length, rng.choice([TERM, TRUNC])))
        remaining -= length + 1  # and its reset row
        if remaining == 0:
            script.append("reset")  # the reset row is the fragment's last row
    return script


@pytest.mark.parametrize("seed", range(6))
def test_gae_matches_oracle_on_random_rollouts(seed):
    rng = random.Random(1000 + seed)
    t_len, n_envs = rng.randint(1, 40), rng.randint(1, 6)
    scripts = [_random_script(rng, t_len) for _ in range(n_envs)]
    gamma, lam = rng.choice([0.9, 0.99, 1.0]), rng.choice([0.0, 0.5, 0.95, 1.0])
    check_gae(scripts, gamma, lam, seed=seed)


def test_gae_float32():
    frags, arrays = build(MIXED_SCRIPTS, seed=9)
    arrays32 = {k: (v.float() if v.is_floating_point() else v) for k, v in arrays.items()}
    adv, targets = gae(**arrays32, gamma=0.99, lambda_=0.95)
    assert adv.dtype == targets.dtype == torch.float32
    exp_adv, exp_targets, valid = oracle(frags, 0.99, 0.95)
    torch.testing.assert_close(adv[valid].double(), exp_adv[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(targets[valid].double(), exp_targets[valid], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- infinite horizon


def _time_limit_rollout(horizon: int, t_len: int, n_envs: int):
    """Reward 1 every real step, episodes cut after ``horizon`` steps, next-step autoreset.

    Env ``b`` starts ``b`` steps into an episode, so episodes cross the fragment ends.
    """
    cut = torch.zeros(t_len, n_envs, dtype=torch.bool)
    reset = torch.zeros(t_len, n_envs, dtype=torch.bool)
    for b in range(n_envs):
        step = b % horizon
        for t in range(t_len):
            if t > 0 and cut[t - 1, b]:
                reset[t, b] = True
                step = 0
                continue
            step += 1
            cut[t, b] = step == horizon
    rewards = (~reset).double()
    return rewards, cut, reset


def _iterate_constant_value(gamma, lam, as_truncation, horizon=5, t_len=61, n_envs=3):
    rewards, cut, reset = _time_limit_rollout(horizon, t_len, n_envs)
    no_flags = torch.zeros_like(cut)
    term, trunc = (no_flags, cut) if as_truncation else (cut, no_flags)
    value = 0.0
    for _ in range(2000):
        values = torch.full((t_len, n_envs), value, dtype=torch.float64)
        _, targets = gae(rewards, values, torch.full((n_envs,), value, dtype=torch.float64), term, trunc, gamma, lam)
        new = targets[~reset].mean().item()
        if abs(new - value) < 1e-9:
            return new
        value = new
    raise AssertionError(f"value iteration did not converge (last {value})")


@pytest.mark.parametrize("lam", [0.95, 1.0, 0.0])
def test_gae_time_limit_truncation_recovers_infinite_horizon_value(lam):
    gamma = 0.9
    value = _iterate_constant_value(gamma, lam, as_truncation=True)
    assert value == pytest.approx(1 / (1 - gamma), rel=0.05)


@pytest.mark.parametrize("lam", [0.95, 1.0, 0.0])
def test_gae_time_limit_as_termination_underestimates(lam):
    # CleanRL-style bug: treating time limits as terminal makes the value episodic
    gamma = 0.9
    value = _iterate_constant_value(gamma, lam, as_truncation=False)
    assert value < 0.8 / (1 - gamma)


# --------------------------------------------------------------------------- standardized


def test_standardized_mean_zero_std_one():
    x = torch.randn(4, 25, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3 + 7
    y = standardized(x)
    assert y.shape == x.shape
    assert abs(y.mean().item()) < 1e-10
    assert y.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-10)
    torch.testing.assert_close(y, (x - x.mean()) / x.std(unbiased=False))


def test_standardized_hand_values():
    x = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    # mean 3, population std sqrt((4 + 1 + 0 + 9) / 4) = sqrt(3.5)
    expected = torch.tensor([-2.0, -1.0, 0.0, 3.0], dtype=torch.float64) / math.sqrt(3.5)
    torch.testing.assert_close(standardized(x), expected)


def test_standardized_constant_input_is_zeros():
    for x in (torch.full((10,), 3.5), torch.zeros(3, 3), torch.tensor([2.0])):
        y = standardized(x)
        assert not torch.isnan(y).any()
        torch.testing.assert_close(y, torch.zeros_like(x))


def test_standardized_eps_floor():
    x = torch.tensor([0.0, 1e-5], dtype=torch.float64)  # std 5e-6 < 1e-4
    torch.testing.assert_close(standardized(x), torch.tensor([-0.05, 0.05], dtype=torch.float64))
    torch.testing.assert_close(standardized(x, eps=1e-2), torch.tensor([-5e-4, 5e-4], dtype=torch.float64))


# --------------------------------------------------------------------------- PPO surrogate


def test_ppo_surrogate_loss_hand_computation():
    clip = 0.2
    ratios = [1.5, 0.5, 1.1, 0.5, 1.5, 0.9, 1.0]
    advs = [2.0, 2.0, 2.0, -1.0, -1.0, -3.0, 4.0]
    # per row min(r A, clip(r) A):
    #   A > 0, r > 1 + eps: clipped (1.2 A); A > 0, r < 1 - eps: r A (pessimistic)
    #   A < 0, r < 1 - eps: clipped (0.8 A); A < 0, r > 1 + eps: r A (pessimistic)
    expected_terms = [1.2 * 2.0, 0.5 * 2.0, 1.1 * 2.0, 0.8 * -1.0, 1.5 * -1.0, 0.9 * -3.0, 1.0 * 4.0]
    expected_loss = -sum(expected_terms) / len(expected_terms)

    old_logp = torch.tensor([-1.0, -0.3, -2.0, -0.7, -1.2, -0.1, -0.5], dtype=torch.float64)
    logp = (old_logp + torch.log(torch.tensor(ratios, dtype=torch.float64))).requires_grad_(True)
    loss, ratio = ppo_surrogate_loss(logp, old_logp, torch.tensor(advs, dtype=torch.float64), clip)
    assert loss.dim() == 0
    assert loss.item() == pytest.approx(expected_loss)
    torch.testing.assert_close(ratio.detach(), torch.tensor(ratios, dtype=torch.float64))

    loss.backward()
    # clipped rows carry no gradient; the others get -r A / N (d r / d logp = r)
    n = len(ratios)
    clipped = [True, False, False, True, False, False, False]
    expected_grad = [0.0 if c else -r * a / n for c, r, a in zip(clipped, ratios, advs)]
    torch.testing.assert_close(logp.grad, torch.tensor(expected_grad, dtype=torch.float64))


def test_ppo_surrogate_equal_policies_is_minus_mean_advantage():
    logp = torch.tensor([-0.5, -1.5, -2.0])
    adv = torch.tensor([1.0, -2.0, 4.0])
    loss, ratio = ppo_surrogate_loss(logp, logp.clone(), adv, 0.1)
    assert loss.item() == pytest.approx(-1.0)
    torch.testing.assert_close(ratio, torch.ones(3))


# --------------------------------------------------------------------------- value loss


def test_value_loss_unclipped():
    v = torch.tensor([1.0, 2.0, -1.0, 0.0])
    t = torch.tensor([0.0, 4.0, -1.0, 3.0])
    assert value_loss(v, t).item() == pytest.approx((1 + 4 + 0 + 9) / 4)
    # old values are ignored without a clip parameter
    assert value_loss(v, t, old_values=torch.zeros(4)).item() == pytest.approx(3.5)


def test_value_loss_clipped_hand_computation():
    clip = 0.2
    old = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    new = torch.tensor([1.0, 1.0, 0.1, 0.0, 0.5], dtype=torch.float64)
    tgt = torch.tensor([0.5, 2.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    # clipped predictions: [0.2, 0.2, 0.1, 0.8, 0.8]
    # unclipped errors:   [0.25, 1.0, 0.81, 0.0, 0.25]
    # clipped errors:     [0.09, 3.24, 0.81, 0.64, 0.64]
    expected = (0.25 + 3.24 + 0.81 + 0.64 + 0.64) / 5
    assert value_loss(new, tgt, old, vf_clip_param=clip).item() == pytest.approx(expected)
    assert value_loss(new, tgt).item() == pytest.approx((0.25 + 1.0 + 0.81 + 0.0 + 0.25) / 5)


def test_value_loss_clip_needs_old_values():
    with pytest.raises(ValueError):
        value_loss(torch.zeros(2), torch.ones(2), vf_clip_param=0.5)


# --------------------------------------------------------------------------- schedules, EV


@pytest.mark.parametrize(
    ("t", "expected"),
    [(-5, 1.0), (0, 1.0), (5, 0.75), (10, 0.5), (12.5, 0.375), (20, 0.0), (25, 0.0), (1e9, 0.0)],
)
def test_piecewise_linear(t, expected):
    points = [(0, 1.0), (10, 0.5), (20, 0.0)]
    value = piecewise_linear(points, t)
    assert isinstance(value, float)
    assert value == pytest.approx(expected)


def test_piecewise_linear_single_point_and_increasing():
    assert piecewise_linear([(100, 3)], 0) == 3.0
    assert piecewise_linear([(100, 3)], 1000) == 3.0
    assert piecewise_linear([(0, 0.0), (4, 8.0)], 1) == pytest.approx(2.0)


def test_explained_variance():
    y = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    assert explained_variance(y, y).item() == pytest.approx(1.0)
    assert explained_variance(torch.full_like(y, 2.5), y).item() == pytest.approx(0.0)
    # residual [0, 0, 0, -1]: var 0.1875; var(y) 1.25 -> 1 - 0.15
    pred = torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=torch.float64)
    assert explained_variance(pred, y).item() == pytest.approx(0.85)
    # much worse than a constant: clamped at -1
    assert explained_variance(-10 * y, y).item() == pytest.approx(-1.0)
    # constant targets: 0, not nan
    const = torch.full((5,), 3.0)
    ev = explained_variance(torch.randn(5, generator=torch.Generator().manual_seed(0)), const)
    assert ev.item() == 0.0


def test_standardized_with_population_moments_matches_the_concatenation():
    from lightning_rl.functional import moments

    a, b = torch.randn(50) * 3 + 1, torch.randn(70) * 0.5 - 2
    both = standardized(torch.cat([a, b]))
    stats = moments(a) + moments(b)  # what an all-reduce over two ranks computes
    torch.testing.assert_close(torch.cat([standardized(a, moments=stats), standardized(b, moments=stats)]), both)
