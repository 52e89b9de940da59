"""Oracle tests for the action distributions against torch.distributions."""

from __future__ import annotations

import math

import pytest
import torch
from torch import distributions as td

from lightning_rl.nn.distributions import Bernoulli, Categorical, DiagGaussian, MultiCategorical


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


# --------------------------------------------------------------------------- MultiCategorical (MultiDiscrete)

NVEC = [3, 2, 4]


def multi_logits(seed: int, n: int = 6) -> torch.Tensor:
    return torch.randn(n, sum(NVEC), generator=gen(seed), dtype=torch.float64) * 2 + 1


def torch_components(logits: torch.Tensor) -> list[td.Categorical]:
    return [td.Categorical(logits=part) for part in logits.split(NVEC, -1)]


@pytest.mark.parametrize("start", [None, [1, 0, -2]])
def test_multi_categorical_log_prob_matches_torch(start):
    logits = multi_logits(2)
    start_t = None if start is None else torch.tensor(start)
    ours = MultiCategorical(logits, NVEC, start_t)
    index = torch.stack([torch.randint(n, (6,), generator=gen(3 + i)) for i, n in enumerate(NVEC)], -1)
    actions = index if start_t is None else index + start_t
    ref = sum(c.log_prob(index[:, i]) for i, c in enumerate(torch_components(logits)))
    torch.testing.assert_close(ours.log_prob(actions), ref)
    torch.testing.assert_close(ours.log_prob(actions.double()), ref)  # as stored in a float column
    assert ours.log_prob(actions).shape == (6,)


def test_multi_categorical_entropy_and_kl_match_torch():
    p_logits, q_logits = multi_logits(4), multi_logits(5)
    p, q = MultiCategorical(p_logits, NVEC), MultiCategorical(q_logits, NVEC)
    p_ref, q_ref = torch_components(p_logits), torch_components(q_logits)
    torch.testing.assert_close(p.entropy(), sum(c.entropy() for c in p_ref))
    torch.testing.assert_close(p.kl(q), sum(td.kl_divergence(a, b) for a, b in zip(p_ref, q_ref, strict=True)))
    torch.testing.assert_close(p.kl(MultiCategorical(p_logits.clone(), NVEC)), torch.zeros(6, dtype=torch.float64))


def test_multi_categorical_equal_components_match_torch():
    logits = torch.randn(5, 6, generator=gen(6), dtype=torch.float64)
    ours, refs = MultiCategorical(logits, [3, 3]), [td.Categorical(logits=p) for p in logits.split(3, -1)]
    actions = ours.sample(gen(0))
    ref = refs[0].log_prob(actions[:, 0]) + refs[1].log_prob(actions[:, 1])
    torch.testing.assert_close(ours.log_prob(actions), ref)
    torch.testing.assert_close(ours.entropy(), refs[0].entropy() + refs[1].entropy())


def test_multi_categorical_sampling_is_seeded_in_range_and_greedy_is_argmax():
    logits = multi_logits(7, n=2000)
    start = torch.tensor([1, 0, -2])
    dist = MultiCategorical(logits, NVEC, start)
    a, b = dist.sample(gen(11)), dist.sample(gen(11))
    assert torch.equal(a, b) and a.dtype == torch.int64 and a.shape == (2000, 3)
    index = a - start
    assert ((index >= 0) & (index < torch.tensor(NVEC))).all()
    greedy = dist.deterministic_sample() - start
    assert torch.equal(greedy, torch.stack([p.argmax(-1) for p in logits.split(NVEC, -1)], -1))
    # one row's frequencies: each component follows its own softmax
    row = MultiCategorical(logits[:1].expand(20000, -1), NVEC).sample(gen(12))
    for i, part in enumerate(logits[0].split(NVEC)):
        freq = torch.bincount(row[:, i], minlength=NVEC[i]).double() / 20000
        torch.testing.assert_close(freq, part.softmax(-1), atol=0.015, rtol=0)


# --------------------------------------------------------------------------- Bernoulli (MultiBinary)


def test_bernoulli_matches_torch():
    p_logits, q_logits = random_logits(8, k=4), random_logits(9, k=4) - 3
    p, q = Bernoulli(p_logits), Bernoulli(q_logits)
    p_ref, q_ref = td.Bernoulli(logits=p_logits), td.Bernoulli(logits=q_logits)
    actions = (torch.rand(6, 4, generator=gen(10)) < 0.5).long()
    torch.testing.assert_close(p.log_prob(actions), p_ref.log_prob(actions.double()).sum(-1))
    torch.testing.assert_close(p.entropy(), p_ref.entropy().sum(-1))
    torch.testing.assert_close(p.kl(q), td.kl_divergence(p_ref, q_ref).sum(-1))
    # large logits stay finite
    big = Bernoulli(torch.tensor([[80.0, -80.0]]))
    assert torch.isfinite(big.log_prob(torch.tensor([[0, 1]]))).all() and torch.isfinite(big.entropy()).all()


def test_bernoulli_sampling_is_seeded_and_greedy_thresholds_at_zero():
    logits = torch.tensor([[-1.0, 0.5, 2.0]]).expand(20000, -1)
    dist = Bernoulli(logits)
    a = dist.sample(gen(13))
    assert torch.equal(a, dist.sample(gen(13))) and a.dtype == torch.int64
    torch.testing.assert_close(a.double().mean(0), torch.sigmoid(logits[0]).double(), atol=0.015, rtol=0)
    assert torch.equal(dist.deterministic_sample()[0], torch.tensor([0, 1, 1]))
