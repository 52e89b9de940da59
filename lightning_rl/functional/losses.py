"""Loss terms and the targets they regress to (PPO's surrogate, value losses, A2C, Huber, the
double-Q targets, target smoothing, Polyak updates), exploration noise, the statistics they
report and the piecewise-linear schedules that weight them."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import Tensor


def standardized(x: Tensor, eps: float = 1e-4, moments: Tensor | None = None) -> Tensor:
    """``(x - mean) / max(eps, std)`` over all elements of ``x`` (any shape).

    ``moments`` = ``[count, sum, sum of squares]`` (e.g. summed over DDP ranks) gives the
    mean and std of a larger population than ``x`` itself.
    """
    if moments is None:
        return (x - x.mean()) / x.std(unbiased=False).clamp_min(eps)
    count, total, total_sq = moments.double()
    mean = total / count
    std = (total_sq / count - mean * mean).clamp_min(0.0).sqrt()
    return (x - mean.to(x.dtype)) / std.to(x.dtype).clamp_min(eps)


def moments(x: Tensor, mask: Tensor | None = None) -> Tensor:
    """``[count, sum, sum of squares]`` of all elements of ``x`` (those where the 0/1 ``mask`` is
    1), in float64 (for ``standardized``)."""
    x = x.double()
    if mask is None:
        count = torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device)
        return torch.stack([count, x.sum(), (x * x).sum()])
    mask = mask.double()
    return torch.stack([mask.sum(), (x * mask).sum(), (x * x * mask).sum()])


def masked_mean(x: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean of ``[N]`` values over the rows where the ``[N]`` 0/1 ``mask`` is 1 (all rows without
    one): losses over the fixed-size, padded minibatches of the compiled update."""
    if mask is None:
        return x.mean()
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def ppo_surrogate_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_param: float | Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate objective (Schulman et al. 2017, eq. 7), as a loss.

    Args:
        logp: ``[N]`` log-probability of the taken actions under the current policy.
        old_logp: ``[N]`` the same under the policy that sampled them.
        advantages: ``[N]``.
        mask: ``[N]`` 0/1 rows to average over (``masked_mean``); ``None`` = all.

    Returns:
        ``(pg_loss, ratio)``: the scalar loss ``-mean(min(r A, clip(r) A))`` and ``[N]`` ratios.
    """
    ratio = torch.exp(logp - old_logp)
    surrogate = torch.minimum(
        ratio * advantages, torch.clamp(ratio, 1.0 - clip_param, 1.0 + clip_param) * advantages
    )
    return -masked_mean(surrogate, mask), ratio


def value_loss(
    values: Tensor, value_targets: Tensor, old_values: Tensor | None = None, vf_clip_param: float | None = None,
    mask: Tensor | None = None,
) -> Tensor:
    """Squared-error value loss, optionally clipped around the sampler's predictions.

    Args:
        values: ``[N]`` current value predictions.
        value_targets: ``[N]``.
        old_values: ``[N]`` predictions of the sampling policy (needed when clipping).
        vf_clip_param: clip the new prediction to ``old_values +- vf_clip_param`` and take
            the larger of the clipped and unclipped errors (PPO2 value clipping); ``None``
            means no clipping.
        mask: ``[N]`` 0/1 rows to average over (``masked_mean``); ``None`` = all.

    Returns:
        scalar ``mean(error**2)`` (no factor 1/2, as in RLlib and Stable-Baselines3).
    """
    err = (values - value_targets).pow(2)
    if vf_clip_param is not None:
        if old_values is None:
            raise ValueError("value clipping needs old_values")
        clipped = old_values + torch.clamp(values - old_values, -vf_clip_param, vf_clip_param)
        err = torch.maximum(err, (clipped - value_targets).pow(2))
    return masked_mean(err, mask)


def a2c_loss(
    logp: Tensor, values: Tensor, entropy: Tensor, advantages: Tensor, value_targets: Tensor,
    vf_loss_coeff: float, entropy_coeff: float, mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The advantage actor-critic loss (Mnih et al. 2016), ``pg_loss + vf_loss_coeff * vf_loss -
    entropy_coeff * entropy`` with ``pg_loss = -mean(logp * advantages)``; all inputs ``[N]``
    (``entropy`` per row), averaged over ``mask``'s rows. Returns the loss and its detached
    terms (``total_loss``, ``pg_loss``, ``vf_loss``, ``entropy``, ``vf_explained_var``)."""
    pg_loss = -masked_mean(logp * advantages, mask)
    vf_loss = value_loss(values, value_targets, mask=mask)
    entropy = masked_mean(entropy, mask)
    total_loss = pg_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy
    with torch.no_grad():
        stats = {
            "total_loss": total_loss.detach(), "pg_loss": pg_loss.detach(), "vf_loss": vf_loss.detach(),
            "entropy": entropy.detach(), "vf_explained_var": explained_variance(values, value_targets, mask),
        }
    return total_loss, stats


def explained_variance(y_pred: Tensor, y_true: Tensor, mask: Tensor | None = None) -> Tensor:
    """``1 - Var[y_true - y_pred] / Var[y_true]`` of ``[N]`` arrays (over the rows of ``mask``);
    ``-1`` (clamped) when worse than a constant."""
    # Branch-free (no host sync per minibatch on a GPU); a constant target gives 0.
    def var(x: Tensor) -> Tensor:
        return x.var(unbiased=False) if mask is None else masked_mean((x - masked_mean(x, mask)).pow(2), mask)

    var_y = var(y_true)
    ev = 1.0 - var(y_true - y_pred) / var_y.clamp_min(torch.finfo(var_y.dtype).tiny)
    return torch.where(var_y > 0, ev.clamp_min(-1.0), torch.zeros_like(ev))


def huber_loss(x: Tensor, delta: float = 1.0) -> Tensor:
    """Elementwise Huber loss of ``[N]`` errors: quadratic within ``delta``, linear outside."""
    return torch.where(x.abs() < delta, 0.5 * x.pow(2), delta * (x.abs() - 0.5 * delta))


def piecewise_linear(points: Sequence[tuple[float, float]], t: float) -> float:
    """Value at ``t`` of the piecewise-linear schedule through ``[(t0, v0), (t1, v1), ...]``.

    Before the first point the first value holds, after the last the last value.
    """
    if t <= points[0][0]:
        return float(points[0][1])
    for (t0, v0), (t1, v1) in pairwise(points):
        if t < t1:
            return float(v0 + (t - t0) / (t1 - t0) * (v1 - v0))
    return float(points[-1][1])


def double_q_target(
    rewards: Tensor, discounts: Tensor, terminateds: Tensor, next_q_target: Tensor, next_q_select: Tensor
) -> Tensor:
    """The n-step Q-learning target ``R + gamma^k * (1 - terminated) * Q_target(s', argmax_a
    Q_select(s', a))`` (van Hasselt et al. 2016 with ``Q_select`` the online network; plain DQN
    with ``Q_select = Q_target``). ``rewards, discounts, terminateds [B]``, ``next_q_* [B, A]``."""
    next_q = next_q_target.gather(-1, next_q_select.argmax(-1, keepdim=True)).squeeze(-1)
    return rewards + discounts * (1.0 - terminateds.float()) * next_q


def smoothed_target_actions(next_actions: Tensor, noise: Tensor, noise_clip: float) -> Tensor:
    """TD3's target policy smoothing (Fujimoto et al. 2018, eq. 15): ``clip(a' + clip(noise, -c, c),
    -1, 1)`` with ``a'`` the target actor's ``[B, A]`` actions in ``[-1, 1]`` and ``noise [B, A]``
    already scaled by the target policy noise (zeros: no smoothing)."""
    return (next_actions + noise.clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)


def clipped_double_q_target(
    rewards: Tensor, discounts: Tensor, terminateds: Tensor, next_qs: Sequence[Tensor]
) -> Tensor:
    """The n-step target ``R + gamma^k (1 - terminated) min_i Q_target_i(s', a')`` of clipped double
    Q (Fujimoto et al. 2018; one ``next_qs`` entry: DDPG's plain target). ``rewards, discounts,
    terminateds [B]``; ``next_qs``: one or two ``[B]``."""
    next_q = next_qs[0] if len(next_qs) == 1 else torch.minimum(next_qs[0], next_qs[1])
    return rewards + discounts * (1.0 - terminateds.float()) * next_q


@torch.no_grad()
def soft_update_(target: Sequence[Tensor], source: Sequence[Tensor], tau: float) -> None:
    """In place, ``target <- (1 - tau) * target + tau * source`` for matching tensor lists
    (Polyak averaging; ``tau = 1`` is a hard copy)."""
    if tau == 1.0:
        torch._foreach_copy_(list(target), list(source))
    else:
        torch._foreach_lerp_(list(target), list(source), tau)


def ornstein_uhlenbeck_step(x: Tensor, gaussian: Tensor, sigma: float, theta: float, dt: float) -> Tensor:
    """One Euler-Maruyama step of a zero-mean Ornstein-Uhlenbeck process: ``x - theta x dt + sigma
    sqrt(dt) gaussian``, with ``x`` and the standard-normal ``gaussian`` of any one shape."""
    return x - theta * x * dt + sigma * dt ** 0.5 * gaussian
