"""``functional.vtrace`` against a plain-Python oracle written from the V-trace definition."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_rl.functional import gae, vtrace

T, B = 7, 3
# env 0: terminated at row 2 (row 3 is a reset row), then truncated on the last row;
# env 1: truncated at row 4 (row 5 is a reset row holding V(final obs)), ongoing at the end;
# env 2: one episode crossing the whole fragment (bootstrap only).
TERM_ROWS = {0: [2]}
TRUNC_ROWS = {0: [6], 1: [4]}


def make_batch(seed: int = 0, on_policy: bool = False, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    terminateds = torch.zeros(T, B, dtype=torch.bool)
    truncateds = torch.zeros(T, B, dtype=torch.bool)
    for b, rows in TERM_ROWS.items():
        terminateds[rows, b] = True
    for b, rows in TRUNC_ROWS.items():
        truncateds[rows, b] = True
    behaviour_logp = -2.0 * torch.rand(T, B, generator=g, dtype=dtype)
    noise = 0.7 * torch.randn(T, B, generator=g, dtype=dtype)
    target_logp = behaviour_logp.clone() if on_policy else behaviour_logp + noise
    return dict(
        behaviour_logp=behaviour_logp,
        target_logp=target_logp,
        rewards=torch.randn(T, B, generator=g, dtype=dtype),
        values=torch.randn(T, B, generator=g, dtype=dtype),
        bootstrap_value=torch.randn(B, generator=g, dtype=dtype),
        terminateds=terminateds,
        truncateds=truncateds,
    )


def oracle(batch, gamma, clip_rho, clip_pg_rho, lam):
    """V-trace from its definition, in floats: ``vs_s = V(x_s) + sum_{t=s}^{e} gamma^(t-s)
    (prod_{i=s}^{t-1} c_i) delta_t`` with ``e`` the first episode end at or after ``s`` (else the
    last row), and ``pg_s = rho_pg_s (r_s + gamma v_{s+1} - V(x_s))``."""
    lists = {k: v.tolist() for k, v in batch.items()}
    val, boot, rew = lists["values"], lists["bootstrap_value"], lists["rewards"]
    term, trunc = lists["terminateds"], lists["truncateds"]
    vs = [[0.0] * B for _ in range(T)]
    pg = [[0.0] * B for _ in range(T)]
    for b in range(B):
        rho = [math.exp(lists["target_logp"][t][b] - lists["behaviour_logp"][t][b]) for t in range(T)]

        def clip(x, th):
            return x if th is None else min(x, th)

        def next_value(t, b=b):
            if term[t][b]:
                return 0.0
            return val[t + 1][b] if t + 1 < T else boot[b]

        delta = [clip(rho[t], clip_rho) * (rew[t][b] + gamma * next_value(t) - val[t][b]) for t in range(T)]
        for s in range(T):
            total, weight = 0.0, 1.0  # weight = gamma^(t-s) prod_{i=s}^{t-1} c_i
            for t in range(s, T):
                total += weight * delta[t]
                if term[t][b] or trunc[t][b]:
                    break
                weight *= gamma * lam * min(1.0, rho[t])
            vs[s][b] = val[s][b] + total
        for s in range(T):
            if term[s][b] or trunc[s][b] or s == T - 1:
                v_next = next_value(s)  # 0, V(final obs), or the bootstrap value
            else:
                v_next = vs[s + 1][b]
            pg[s][b] = clip(rho[s], clip_pg_rho) * (rew[s][b] + gamma * v_next - val[s][b])
    return torch.tensor(vs, dtype=torch.float64), torch.tensor(pg, dtype=torch.float64)


def discounted_returns(batch, gamma):
    """On-policy lambda = 1 targets: discounted rewards to the episode or fragment end, plus the
    discounted next value (zero after a termination)."""
    lists = {k: v.tolist() for k, v in batch.items()}
    out = [[0.0] * B for _ in range(T)]
    for b in range(B):
        for s in range(T):
            ret, disc = 0.0, 1.0
            for t in range(s, T):
                ret += disc * lists["rewards"][t][b]
                disc *= gamma
                if lists["terminateds"][t][b]:
                    break
                if lists["truncateds"][t][b] or t == T - 1:
                    ret += disc * (lists["values"][t + 1][b] if t + 1 < T else lists["bootstrap_value"][b])
                    break
            out[s][b] = ret
    return torch.tensor(out, dtype=torch.float64)


def end_rows(batch) -> torch.Tensor:
    """``[T, B]`` rows whose trace is one step: the step ended the episode, or it is the last row."""
    ends = batch["terminateds"] | batch["truncateds"]
    ends[-1] = True
    return ends


@pytest.mark.parametrize(
    ("gamma", "clip_rho", "clip_pg_rho", "lam"),
    [(0.9, 1.0, 1.0, 1.0), (0.99, None, None, 1.0), (0.95, 0.8, 2.0, 0.7), (1.0, 1.5, None, 0.9), (0.0, 1.0, 1.0, 1.0)],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_matches_oracle(gamma, clip_rho, clip_pg_rho, lam, seed):
    batch = make_batch(seed)
    rho = torch.exp(batch["target_logp"] - batch["behaviour_logp"])
    assert (rho > 1.05).any() and (rho < 0.95).any()  # both sides of every clip are exercised
    vs, pg = vtrace(
        **batch, gamma=gamma, clip_rho_threshold=clip_rho, clip_pg_rho_threshold=clip_pg_rho, lambda_=lam
    )
    exp_vs, exp_pg = oracle(batch, gamma, clip_rho, clip_pg_rho, lam)
    assert vs.shape == pg.shape == (T, B) and vs.dtype == pg.dtype == torch.float64
    torch.testing.assert_close(vs, exp_vs)
    torch.testing.assert_close(pg, exp_pg)


@pytest.mark.parametrize("clip", [1.0, 1.5, None])
@pytest.mark.parametrize("gamma", [0.9, 1.0])
def test_vtrace_on_policy_is_discounted_return_and_gae_lambda_one(clip, gamma):
    batch = make_batch(seed=4, on_policy=True)
    vs, pg = vtrace(**batch, gamma=gamma, clip_rho_threshold=clip, clip_pg_rho_threshold=clip, lambda_=1.0)
    torch.testing.assert_close(vs, discounted_returns(batch, gamma))
    gae_args = {k: v for k, v in batch.items() if not k.endswith("logp")}
    advantages, targets = gae(**gae_args, gamma=gamma, lambda_=1.0)
    torch.testing.assert_close(vs, targets)
    # rho_pg (r + gamma vs_{t+1} - V) with rho = 1 telescopes to the lambda = 1 advantage vs - V.
    torch.testing.assert_close(pg, advantages)
    torch.testing.assert_close(pg, vs - batch["values"])


def test_each_clip_and_lambda_change_the_result():
    batch = make_batch(seed=2)
    rho = torch.exp(batch["target_logp"] - batch["behaviour_logp"])
    assert (rho > 1.0).any()
    ends = end_rows(batch)

    def run(clip_rho=1.0, clip_pg_rho=1.0, lam=1.0):
        return vtrace(**batch, gamma=0.9, clip_rho_threshold=clip_rho, clip_pg_rho_threshold=clip_pg_rho, lambda_=lam)

    vs, pg = run()
    # clip_rho_threshold changes vs; on one-step rows exactly where rho > 1.
    vs_free, _ = run(clip_rho=None)
    assert not torch.allclose(vs, vs_free)
    torch.testing.assert_close(vs[ends & (rho <= 1)], vs_free[ends & (rho <= 1)], rtol=0, atol=0)
    assert ((vs - vs_free)[ends & (rho > 1)].abs() > 1e-9).all()
    # clip_pg_rho_threshold changes pg_advantages where rho > 1, never vs.
    vs_pg_free, pg_free = run(clip_pg_rho=None)
    torch.testing.assert_close(vs_pg_free, vs, rtol=0, atol=0)
    torch.testing.assert_close(pg_free[rho <= 1], pg[rho <= 1], rtol=0, atol=0)
    assert ((pg_free - pg)[rho > 1].abs() > 1e-9).all()
    torch.testing.assert_close(pg_free[rho > 1], (pg * rho)[rho > 1])  # min(rho, 1) = 1 there
    # lambda_ < 1 shortens the traces: vs changes, except on one-step rows.
    vs_lam, _ = run(lam=0.5)
    assert ((vs_lam - vs)[~ends].abs() > 1e-9).any()
    torch.testing.assert_close(vs_lam[ends], vs[ends], rtol=0, atol=0)


ARGS = ["behaviour_logp", "target_logp", "rewards", "bootstrap_value", "terminateds", "truncateds"]


@pytest.mark.parametrize("name", ARGS)
@pytest.mark.parametrize("bad", ["short", "transposed"])
def test_mismatched_shapes_raise_naming_the_argument(name, bad):
    batch = make_batch()
    x = batch[name]
    batch[name] = x[:-1] if bad == "short" else (x.unsqueeze(0) if x.dim() == 1 else x.T)
    with pytest.raises(ValueError, match=rf"vtrace: {name} has shape"):
        vtrace(**batch, gamma=0.9)


def test_mismatched_values_raise():
    batch = make_batch()
    batch["values"] = batch["values"][:-1]
    with pytest.raises(ValueError, match="from values"):
        vtrace(**batch, gamma=0.9)


def perturbed(batch, b, first_row, keys):
    out = {k: v.clone() for k, v in batch.items()}
    g = torch.Generator().manual_seed(123)
    for k in keys:
        if k == "bootstrap_value":
            out[k][b] += 10.0
        else:
            out[k][first_row:, b] += 1.0 + torch.rand(T - first_row, generator=g, dtype=torch.float64)
    return out


@pytest.mark.parametrize(("clip_rho", "lam"), [(1.0, 1.0), (None, 0.8)])
def test_rows_before_an_episode_end_ignore_what_follows(clip_rho, lam):
    batch = make_batch(seed=5)
    kwargs = dict(gamma=0.95, clip_rho_threshold=clip_rho, clip_pg_rho_threshold=None, lambda_=lam)
    vs, pg = vtrace(**batch, **kwargs)
    steps = ["behaviour_logp", "target_logp", "rewards"]

    # Termination at row 2 of env 0: nothing from row 3 on (values there included) reaches rows 0-2.
    other = perturbed(batch, 0, 3, [*steps, "values", "bootstrap_value"])
    vs2, pg2 = vtrace(**other, **kwargs)
    torch.testing.assert_close(vs2[:3, 0], vs[:3, 0], rtol=0, atol=0)
    torch.testing.assert_close(pg2[:3, 0], pg[:3, 0], rtol=0, atol=0)
    assert not torch.allclose(vs2[3:, 0], vs[3:, 0])
    torch.testing.assert_close(vs2[:, 1:], vs[:, 1:], rtol=0, atol=0)  # other envs untouched

    # Truncation at row 4 of env 1: the reset row 5's step (reward, logps) and all later rows are
    # ignored by rows 0-4; only the reset row's value, V(final obs), is bootstrapped.
    other = perturbed(batch, 1, 5, steps)
    other = perturbed(other, 1, 6, ["values", "bootstrap_value"])
    vs2, pg2 = vtrace(**other, **kwargs)
    torch.testing.assert_close(vs2[:5, 1], vs[:5, 1], rtol=0, atol=0)
    torch.testing.assert_close(pg2[:5, 1], pg[:5, 1], rtol=0, atol=0)
    assert not torch.allclose(vs2[5:, 1], vs[5:, 1])
    bumped = perturbed(batch, 1, 5, ["values"])
    vs3, pg3 = vtrace(**bumped, **kwargs)
    assert (vs3[4, 1] - vs[4, 1]).abs() > 1e-6 and (pg3[4, 1] - pg[4, 1]).abs() > 1e-6


def test_works_on_float32_tensors_that_require_grad():
    batch = make_batch(seed=6, dtype=torch.float32)
    for k in ("target_logp", "values", "bootstrap_value"):
        batch[k].requires_grad_(True)
    vs, pg = vtrace(**batch, gamma=0.9)
    assert vs.dtype == pg.dtype == torch.float32
    exp_vs, exp_pg = oracle({k: v.detach().double() for k, v in batch.items()}, 0.9, 1.0, 1.0, 1.0)
    torch.testing.assert_close(vs.detach().double(), exp_vs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pg.detach().double(), exp_pg, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        vs_ng, pg_ng = vtrace(**batch, gamma=0.9)
    assert not vs_ng.requires_grad and not pg_ng.requires_grad
    torch.testing.assert_close(vs_ng, vs.detach())
