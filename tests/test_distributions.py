"""Oracle tests for the action distributions against torch.distributions."""

from __future__ import annotations

import math

import pytest
import torch
from torch import distributions as td

from lightning_rl.nn.distributions import Categorical, DiagGaussian


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- Categorical


def random_logits(seed: int, n: int = 6, k: int = 5) -> torch.Tensor:
    return torch.randn(n, k, generator=gen(seed), dtype=torch.float64) * 2 + 3  # not normalized


def test_categorical_log_prob_matches_torch():
    logits = random_logits(0)
    actions = torch.tensor([0, 4, 2, 2, 1, 3])
    ours = Categorical(logits)
    ref = td.Categorical(logits=logits)
    torch.testing.assert_close(ours.log_prob(actions), ref.log_prob(actions))
    # float actions (as stored in a batch) are accepted
    torch.testing.assert_close(ours.log_prob(actions.double()), ref.log_prob(actions))
    # log-probs of all actions are a normalized distribution
    all_lp = torch.stack([ours.log_prob(torch.full((6,), a)) for a in range(5)], dim=-1)
    torch.testing.assert_close(all_lp.exp().sum(-1), torch.ones(6, dtype=torch.float64))


def test_categorical_log_prob_gradient_matches_torch():
    logits = random_logits(1).requires_grad_(True)
    actions = torch.tensor([1, 1, 0, 4, 3, 2])
    Categorical(logits).log_prob(actions).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    td.Categorical(logits=logits).log_prob(actions).sum().backward()
    torch.testing.assert_close(ours, logits.grad)


def test_categorical_entropy_matches_torch():
    logits = random_logits(2)
    torch.testing.assert_close(Categorical(logits).entropy(), td.Categorical(logits=logits).entropy())
    # uniform: log k
    uniform = Categorical(torch.zeros(3, 4))
    torch.testing.assert_close(uniform.entropy(), torch.full((3,), math.log(4)))


def test_categorical_kl_matches_torch():
    p, q = random_logits(3), random_logits(4)
    expected = td.kl_divergence(td.Categorical(logits=p), td.Categorical(logits=q))
    torch.testing.assert_close(Categorical(p).kl(Categorical(q)), expected)
    torch.testing.assert_close(Categorical(p).kl(Categorical(p + 7.0)), torch.zeros(6, dtype=torch.float64))
    assert (Categorical(q).kl(Categorical(p)) > 0).all()


def test_categorical_deterministic_sample_is_argmax():
    logits = random_logits(5)
    torch.testing.assert_close(Categorical(logits).deterministic_sample(), logits.argmax(-1))


def test_categorical_sampling_is_seeded():
    logits = random_logits(6, n=200, k=7)
    a = Categorical(logits).sample(gen(42))
    b = Categorical(logits).sample(gen(42))
    c = Categorical(logits).sample(gen(43))
    assert a.shape == (200,)
    assert a.dtype == torch.int64
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert ((a >= 0) & (a < 7)).all()


def test_categorical_empirical_frequencies():
    probs = torch.tensor([0.5, 0.2, 0.25, 0.05, 0.0])
    n = 40_000
    logits = torch.log(probs).expand(n, 5)
    samples = Categorical(logits).sample(gen(0))
    freq = torch.bincount(samples, minlength=5).double() / n
    # standard error <= 0.0025; 0.01 is 4 of them
    torch.testing.assert_close(freq, probs.double(), atol=0.01, rtol=0)
    assert freq[4] == 0  # zero-probability action never sampled


# --------------------------------------------------------------------------- DiagGaussian


def random_gaussian(seed: int, n: int = 6, d: int = 3, shared_log_std: bool = False):
    g = gen(seed)
    loc = torch.randn(n, d, generator=g, dtype=torch.float64)
    shape = (d,) if shared_log_std else (n, d)
    log_std = torch.randn(*shape, generator=g, dtype=torch.float64) * 0.5
    return loc, log_std


def torch_gaussian(loc, log_std):
    return td.Independent(td.Normal(loc, log_std.exp().expand_as(loc)), 1)


@pytest.mark.parametrize("shared_log_std", [False, True])
def test_gaussian_log_prob_matches_torch(shared_log_std):
    loc, log_std = random_gaussian(0, shared_log_std=shared_log_std)
    actions = torch.randn(6, 3, generator=gen(1), dtype=torch.float64) * 2
    ours = DiagGaussian(loc, log_std).log_prob(actions)
    assert ours.shape == (6,)
    torch.testing.assert_close(ours, torch_gaussian(loc, log_std).log_prob(actions))


def test_gaussian_log_prob_gradient_matches_torch():
    loc, log_std = random_gaussian(2)
    loc.requires_grad_(True)
    log_std.requires_grad_(True)
    actions = torch.randn(6, 3, generator=gen(3), dtype=torch.float64)
    DiagGaussian(loc, log_std).log_prob(actions).sum().backward()
    ours = loc.grad.clone(), log_std.grad.clone()
    loc.grad = log_std.grad = None
    torch_gaussian(loc, log_std).log_prob(actions).sum().backward()
    torch.testing.assert_close(ours[0], loc.grad)
    torch.testing.assert_close(ours[1], log_std.grad)


@pytest.mark.parametrize("shared_log_std", [False, True])
def test_gaussian_entropy_matches_torch(shared_log_std):
    loc, log_std = random_gaussian(4, shared_log_std=shared_log_std)
    ours = DiagGaussian(loc, log_std).entropy()
    assert ours.shape == (6,)
    torch.testing.assert_close(ours, torch_gaussian(loc, log_std).entropy())


def test_gaussian_kl_matches_torch():
    p_loc, p_log_std = random_gaussian(5)
    q_loc, q_log_std = random_gaussian(6)
    expected = td.kl_divergence(torch_gaussian(p_loc, p_log_std), torch_gaussian(q_loc, q_log_std))
    ours = DiagGaussian(p_loc, p_log_std).kl(DiagGaussian(q_loc, q_log_std))
    torch.testing.assert_close(ours, expected)
    same = DiagGaussian(p_loc, p_log_std).kl(DiagGaussian(p_loc.clone(), p_log_std.clone()))
    torch.testing.assert_close(same, torch.zeros(6, dtype=torch.float64))


def test_gaussian_deterministic_sample_is_loc():
    loc, log_std = random_gaussian(7)
    assert torch.equal(DiagGaussian(loc, log_std).deterministic_sample(), loc)


def test_gaussian_sampling_is_seeded():
    loc, log_std = random_gaussian(8, shared_log_std=True)
    dist = DiagGaussian(loc, log_std)
    a, b, c = dist.sample(gen(42)), dist.sample(gen(42)), dist.sample(gen(43))
    assert a.shape == loc.shape
    assert a.dtype == loc.dtype
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_gaussian_empirical_mean_and_std():
    n = 40_000
    mean = torch.tensor([1.0, -2.0, 0.0])
    std = torch.tensor([0.5, 2.0, 1.0])
    dist = DiagGaussian(mean.expand(n, 3), torch.log(std))
    samples = dist.sample(gen(0))
    # standard errors: mean std/200 (<= 0.01), std ~ std/283 (<= 0.0071)
    torch.testing.assert_close(samples.mean(0), mean, atol=0.04, rtol=0)
    torch.testing.assert_close(samples.std(0), std, atol=0, rtol=0.03)
    # the dimensions are independent
    corr = torch.corrcoef(samples.T)
    torch.testing.assert_close(corr, torch.eye(3), atol=0.03, rtol=0)
