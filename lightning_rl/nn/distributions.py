"""Action distributions with seeded sampling.

``torch.distributions`` samples only from the global RNG and validates its arguments on
every call; a sampler needs its own ``torch.Generator`` (reproducible, checkpointable
rollouts) and runs these once per env step, so these are small classes of our own.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class Categorical:
    """Categorical over the last dimension of ``logits`` ``[N, num_actions]``."""

    def __init__(self, logits: Tensor) -> None:
        self.logits = logits - logits.logsumexp(-1, keepdim=True)

    def sample(self, generator: torch.Generator | None = None) -> Tensor:
        """``[N]`` int64 actions."""
        return torch.multinomial(self.logits.exp(), 1, generator=generator).squeeze(-1)

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


Distribution = Categorical | DiagGaussian

__all__ = ["Categorical", "DiagGaussian", "Distribution"]
