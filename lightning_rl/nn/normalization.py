"""Running mean and variance of observations and returns, kept inside the policy.

Statistics are buffers of the policy, so checkpoints, exact resume, ``predict`` and
``export_policy`` carry them; they change only in ``update``, which the learner calls on
sampled batches (never during evaluation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

EPS = 1e-8


class RunningMeanStd(nn.Module):
    """Mean and (population) variance of every row ever passed to ``update``.

    Each update merges a batch's moments into the running ones (Chan, Golub and LeVeque's
    parallel formula), in float64. Before the first update the statistics are mean 0,
    variance 1: ``normalize`` is then the identity (up to clipping).

    Args:
        shape: shape of one row (``()`` for scalars such as returns).
        clip: ``normalize`` clips its output to ``[-clip, clip]``; ``None`` = no clipping.
    """

    def __init__(self, shape: Sequence[int] | int = (), clip: float | None = 10.0) -> None:
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if clip is not None and not clip > 0:
            raise ValueError(f"normalization clip must be positive or None, got {clip}")
        self.shape, self.clip = shape, clip
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        # float32 copies read on every forward (one subtraction and one product per call)
        self.register_buffer("shift", torch.zeros(shape))
        self.register_buffer("scale", torch.ones(shape))

    @torch.no_grad()
    def update(self, x: Tensor, mask: Tensor | None = None,
               reduce: Callable[[Tensor], Tensor] | None = None) -> None:
        """Merge the rows ``x [N, *shape]`` (those where ``mask [N]`` is nonzero) into the
        statistics. ``reduce`` sums a tensor over DDP ranks, so every rank merges the same
        global batch and the statistics stay identical across ranks."""
        rows = x.reshape(-1, *self.shape).to(self.mean.device, torch.float64)
        if mask is not None:
            rows = rows[mask.reshape(-1).to(rows.device) != 0]
        # Moments about the running mean (the same on every rank): one all-reduce, well conditioned.
        d = rows - self.mean
        moments = torch.stack([torch.full_like(self.mean, rows.shape[0]), d.sum(0), d.pow(2).sum(0)])
        if reduce is not None:
            moments = reduce(moments)
        n, total, total_sq = moments[0].reshape(-1)[0], moments[1], moments[2]
        if n <= 0:
            return
        batch_mean_d = total / n  # batch mean minus the running mean
        batch_m2 = (total_sq - total * batch_mean_d).clamp_min(0.0)
        count = self.count + n
        m2 = self.var * self.count + batch_m2 + batch_mean_d.pow(2) * self.count * n / count
        self.mean += batch_mean_d * n / count
        self.var.copy_(m2 / count)
        self.count.copy_(count)
        self.shift.copy_(self.mean)
        self.scale.copy_((self.var + EPS).rsqrt())

    def normalize(self, x: Tensor) -> Tensor:
        """``(x - mean) / sqrt(var + 1e-8)``, clipped: what the policy reads."""
        y = (x - self.shift) * self.scale
        return y if self.clip is None else y.clamp(-self.clip, self.clip)

    def scale_only(self, x: Tensor) -> Tensor:
        """``x / sqrt(var + 1e-8)``, clipped: rewards scaled by the std of the return, not shifted
        (shifting rewards would change which policy is optimal)."""
        y = x * self.scale
        return y if self.clip is None else y.clamp(-self.clip, self.clip)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, clip={self.clip}"

