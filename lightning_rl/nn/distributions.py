"""Action distributions with seeded sampling.

``torch.distributions`` samples only from the global RNG and validates its arguments on
every call; a sampler needs its own ``torch.Generator`` (reproducible, checkpointable
rollouts) and runs these once per env step, so these are small classes of our own.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def gumbel_max(logits: Tensor, generator: torch.Generator | None) -> Tensor:
    """One draw per row of the categorical over the last dimension of ``logits [..., n]``:
    ``argmax(logits + G)`` with ``G = -log E``, ``E ~ Exp(1)`` Gumbel noise (the Gumbel-max
    trick), four small kernels where ``torch.multinomial`` costs three times as much on a few
    rows. ``E`` is kept above 0, so a -inf logit (a masked action) is never drawn."""
    noise = torch.empty_like(logits).exponential_(generator=generator).clamp_min_(torch.finfo(logits.dtype).tiny)
    return (logits - noise.log()).argmax(-1)


class Categorical:
    """Categorical over the last dimension of ``logits`` ``[N, num_actions]``."""

    def __init__(self, logits: Tensor) -> None:
        self.logits = logits.log_softmax(-1)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """``[N]`` int64 actions."""
        return gumbel_max(self.logits, generator)

    def deterministic_sample(self) -> Tensor:
        return self.logits.argmax(-1)

    def log_prob(self, actions: Tensor) -> Tensor:
        return self.logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def _finite_logits(self) -> Tensor:
        # Masked actions (logit -inf) have probability 0 and add 0, not 0 * -inf = nan.
        return self.logits.clamp_min(torch.finfo(self.logits.dtype).min)

    def entropy(self) -> Tensor:
        return -(self.logits.exp() * self._finite_logits()).sum(-1)

    def kl(self, other: Categorical) -> Tensor:
        return (self.logits.exp() * (self._finite_logits() - other._finite_logits())).sum(-1)


class DiagGaussian:
    """Diagonal Gaussian over ``[N, action_dim]`` with mean ``loc`` and log std ``log_std``."""

    def __init__(self, loc: Tensor, log_std: Tensor) -> None:
        self.loc = loc
        self.log_std = log_std.expand_as(loc)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        noise = torch.randn(self.loc.shape, generator=generator, device=self.loc.device, dtype=self.loc.dtype)
        return self.loc + noise * self.log_std.exp()

    def deterministic_sample(self) -> Tensor:
        return self.loc

    def log_prob(self, actions: Tensor) -> Tensor:
        z = (actions - self.loc) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> Tensor:
        return (self.log_std + 0.5 + 0.5 * math.log(2 * math.pi)).sum(-1)

    def kl(self, other: DiagGaussian) -> Tensor:
        var_ratio = torch.exp(2 * (self.log_std - other.log_std))
        t1 = ((self.loc - other.loc) * torch.exp(-other.log_std)).pow(2)
        return 0.5 * (var_ratio + t1 - 1 - 2 * (self.log_std - other.log_std)).sum(-1)


def _padding_index(nvec: tuple[int, ...], device: torch.device) -> Tensor:
    """``[k, max(nvec)]`` positions in ``[*component logits, -inf]``: component ``i``'s logit
    ``j``, or the trailing -inf where ``j >= nvec[i]``."""
    offsets = torch.tensor([0, *nvec[:-1]]).cumsum(0)
    j = torch.arange(max(nvec))
    return torch.where(j < torch.tensor(nvec)[:, None], offsets[:, None] + j, sum(nvec)).to(device)


@functools.cache
def _cached_padding_index(nvec: tuple[int, ...], device: torch.device) -> Tensor:
    with torch.inference_mode(False):  # cached: a normal tensor, usable later under autograd
        return _padding_index(nvec, device)


class MultiCategorical:
    """Independent categoricals, one per ``MultiDiscrete`` component: ``logits [N, sum(nvec)]``
    hold the components' logits side by side; actions are ``[N, k]`` int64 values
    ``start + index`` (``start`` is the space's, zeros when None). ``log_prob``, ``entropy`` and
    ``kl`` sum over the ``k`` components, as for a product distribution."""

    def __init__(self, logits: Tensor, nvec: Sequence[int], start: Tensor | None = None) -> None:
        nvec = [int(n) for n in nvec]
        k, width = len(nvec), max(nvec)
        if len(set(nvec)) == 1:
            padded = logits.reshape(*logits.shape[:-1], k, width)
        else:  # components of unequal size: pad each to the widest with -inf (probability 0)
            padded = torch.cat([logits, logits.new_full((*logits.shape[:-1], 1), -math.inf)], -1)
            # A compiled graph holds the index as a constant; eager calls reuse a cached one.
            index = (_padding_index if torch.compiler.is_compiling() else _cached_padding_index)
            padded = padded[..., index(tuple(nvec), logits.device)]
        self.logits = padded.log_softmax(-1)  # [N, k, width]
        self.start = start

    def _offset(self, index: Tensor) -> Tensor:
        return index if self.start is None else index + self.start.to(index.device)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """``[N, k]`` int64 actions."""
        return self._offset(gumbel_max(self.logits, generator))

    def deterministic_sample(self) -> Tensor:
        return self._offset(self.logits.argmax(-1))

    def log_prob(self, actions: Tensor) -> Tensor:
        index = actions.long() if self.start is None else actions.long() - self.start.to(actions.device)
        return self.logits.gather(-1, index.unsqueeze(-1)).squeeze(-1).sum(-1)

    def _finite_logits(self) -> Tensor:
        return self.logits.clamp_min(torch.finfo(self.logits.dtype).min)  # padding adds 0, not nan

    def entropy(self) -> Tensor:
        return -(self.logits.exp() * self._finite_logits()).sum((-2, -1))

    def kl(self, other: MultiCategorical) -> Tensor:
        return (self.logits.exp() * (self._finite_logits() - other._finite_logits())).sum((-2, -1))


class Bernoulli:
    """Independent Bernoullis over ``[N, k]`` ``logits`` (``MultiBinary`` actions); actions are
    ``[N, k]`` int64 0/1. ``log_prob``, ``entropy`` and ``kl`` sum over the ``k`` components."""

    def __init__(self, logits: Tensor) -> None:
        self.logits = logits

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        u = torch.rand(self.logits.shape, generator=generator, device=self.logits.device, dtype=self.logits.dtype)
        return (u < torch.sigmoid(self.logits)).long()

    def deterministic_sample(self) -> Tensor:
        return (self.logits > 0).long()

    def log_prob(self, actions: Tensor) -> Tensor:
        # log p(x) = x * l - softplus(l): log sigmoid(l) for x = 1, log sigmoid(-l) for x = 0
        return (actions.to(self.logits.dtype) * self.logits - F.softplus(self.logits)).sum(-1)

    def _log_p_q(self) -> tuple[Tensor, Tensor]:
        return -F.softplus(-self.logits), -F.softplus(self.logits)  # log p(1), log p(0)

    def entropy(self) -> Tensor:
        log_p1, log_p0 = self._log_p_q()
        p1 = torch.sigmoid(self.logits)
        return -(p1 * log_p1 + (1 - p1) * log_p0).sum(-1)

    def kl(self, other: Bernoulli) -> Tensor:
        log_p1, log_p0 = self._log_p_q()
        log_q1, log_q0 = other._log_p_q()
        p1 = torch.sigmoid(self.logits)
        return (p1 * (log_p1 - log_q1) + (1 - p1) * (log_p0 - log_q0)).sum(-1)


Distribution = Categorical | DiagGaussian | MultiCategorical | Bernoulli

__all__ = ["Bernoulli", "Categorical", "DiagGaussian", "Distribution", "MultiCategorical"]
