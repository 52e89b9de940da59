"""Pure math shared by the algorithms. Every function states the shapes it takes.

Time-major arrays are ``[T, B]``: ``T`` steps of ``B`` parallel envs.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import torch
from torch import Tensor


def gae(
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    terminateds: Tensor,
    truncateds: Tensor,
    gamma: float,
    lambda_: float,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016) over time-major arrays.

    Args:
        rewards: ``[T, B]`` reward of step ``t``.
        values: ``[T, B]`` value of the observation step ``t`` was taken in.
        bootstrap_value: ``[B]`` value of the observation after the last step.
        terminateds: ``[T, B]`` step ``t`` ended the episode in a terminal state.
        truncateds: ``[T, B]`` step ``t`` cut the episode (time limit): not terminal.

    The value of the next observation is ``values[t + 1]`` (``bootstrap_value`` for the
    last step). On truncation it is the value of the episode's final observation and is
    bootstrapped; on termination it is zero. Either way the advantage recursion stops.

    With gymnasium's next-step autoreset the row after an episode end is a reset step:
    its observation is the final observation (so ``values`` there is exactly the
    bootstrap value truncation needs) and its action was ignored. Its advantage is
    meaningless and must not be trained on; the rows before it are unaffected.

    Returns:
        ``(advantages, value_targets)``, both ``[T, B]``; targets are ``advantages + values``.
    """
    tensors = (rewards, values, bootstrap_value)
    if all(x.device.type == "cpu" and x.dtype == values.dtype and not x.requires_grad for x in tensors) and \
            values.dtype in (torch.float32, torch.float64):
        # The same float operations in numpy, whose per-op cost on [B] rows is a fraction of torch's.
        advantages = torch.from_numpy(_gae_numpy(*(x.numpy() for x in tensors), terminateds.numpy(),
                                                 truncateds.numpy(), gamma, lambda_))
        return advantages, advantages + values
    terminateds = terminateds.to(values.dtype)
    dones = torch.maximum(terminateds, truncateds.to(values.dtype))
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = rewards + gamma * next_values * (1.0 - terminateds) - values
    discounts = gamma * lambda_ * (1.0 - dones)
    advantages = torch.empty_like(values)
    last = torch.zeros_like(bootstrap_value)
    for t in range(values.shape[0] - 1, -1, -1):
        last = deltas[t] + discounts[t] * last
        advantages[t] = last
    return advantages, advantages + values


def _gae_numpy(rewards: np.ndarray, values: np.ndarray, bootstrap_value: np.ndarray, terminateds: np.ndarray,
               truncateds: np.ndarray, gamma: float, lambda_: float) -> np.ndarray:
    """``gae``'s advantages in numpy, operation for operation (the same bits on the CPU)."""
    dtype = values.dtype.type
    terminal = terminateds.astype(values.dtype)
    dones = np.maximum(terminal, truncateds.astype(values.dtype))
    next_values = np.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = rewards + dtype(gamma) * next_values * (dtype(1.0) - terminal) - values
    discounts = dtype(gamma * lambda_) * (dtype(1.0) - dones)
    out = np.empty_like(values)
    last = np.zeros_like(bootstrap_value)
    for t in range(values.shape[0] - 1, -1, -1):
        last = deltas[t] + discounts[t] * last
        out[t] = last
    return out


def gae_batch(rollout: dict[str, Tensor], bootstrap_value: Tensor, valid: Tensor, gamma: float,
              lambda_: float) -> dict[str, Tensor]:
    """A time-major ``[T, N]`` rollout (``rewards``, ``vf_preds``, ``terminateds``, ``truncateds``
    and the rest) with ``advantages`` and ``value_targets`` from ``gae``, flattened to ``[T * N]``
    rows and the reset rows of next-step autoreset (``valid`` False) dropped."""
    advantages, targets = gae(rollout["rewards"], rollout["vf_preds"], bootstrap_value, rollout["terminateds"],
                              rollout["truncateds"], gamma, lambda_)
    cols = {**rollout, "advantages": advantages, "value_targets": targets}
    rows = {k: v.reshape(-1, *v.shape[2:]) for k, v in cols.items()}
    if bool(valid.all()):
        return rows
    keep = valid.reshape(-1).nonzero().squeeze(1)  # found once, not once per column
    return {k: v.index_select(0, keep.to(v.device)) for k, v in rows.items()}


def gae_sequences(rollout: dict[str, Tensor], bootstrap_value: Tensor, valid: Tensor, gamma: float, lambda_: float,
                  seq_len: int) -> dict[str, Tensor]:
    """A time-major ``[T, N]`` rollout with ``advantages`` and ``value_targets`` from ``gae`` (on
    the whole, unpadded rollout), each env's column then cut into sequences of ``seq_len`` steps
    (``T % seq_len == 0``): ``[S * seq_len]`` rows, sequence after sequence (``S = T / seq_len *
    N``), with ``seq_lens [S]`` and a 0/1 ``mask`` that is 0 on the reset rows of next-step
    autoreset (kept: a recurrent policy's sequence must stay whole)."""
    advantages, targets = gae(rollout["rewards"], rollout["vf_preds"], bootstrap_value, rollout["terminateds"],
                              rollout["truncateds"], gamma, lambda_)
    cols = {**rollout, "advantages": advantages, "value_targets": targets, "mask": valid.float()}
    T, N = valid.shape
    chunks = T // seq_len
    out = {k: v.reshape(chunks, seq_len, N, *v.shape[2:]).transpose(1, 2).reshape(chunks * N * seq_len, *v.shape[2:])
           for k, v in cols.items()}
    out["seq_lens"] = torch.full((chunks * N,), seq_len, dtype=torch.int64)
    return out


def gae_segments(rewards: Tensor, values: Tensor, terminateds: Tensor, lengths: Sequence[int],
                 bootstrap_value: Tensor, gamma: float, lambda_: float) -> tuple[Tensor, Tensor]:
    """``(advantages, value_targets)`` ``[R]`` of ``[R]`` rows that are ``len(lengths)`` trajectory
    segments one after another (an agent's steps in a multi-agent env), each segment's GAE
    bootstrapping from its entry of ``bootstrap_value [S]`` (0 where it ended terminally)."""
    advantages, targets = [], []
    start = 0
    for length, value in zip(lengths, bootstrap_value):
        seg = slice(start, start + length)
        adv, tgt = gae(rewards[seg, None], values[seg, None], value.reshape(1), terminateds[seg, None],
                       torch.zeros(length, 1, dtype=torch.bool, device=rewards.device), gamma, lambda_)
        advantages.append(adv[:, 0])
        targets.append(tgt[:, 0])
        start += length
    return torch.cat(advantages), torch.cat(targets)


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


def n_step_returns(
    rewards: Tensor, terminateds: Tensor, truncateds: Tensor, gamma: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Discounted n-step returns of windows that stop at the first episode end.

    Args:
        rewards: ``[B, n]`` rewards of steps ``t .. t + n - 1`` of ``B`` windows.
        terminateds: ``[B, n]`` bool, step ``t + i`` ended the episode in a terminal state.
        truncateds: ``[B, n]`` bool, step ``t + i`` cut the episode (time limit).

    A window holds ``k`` steps: up to and including its first terminated or truncated
    step, else all ``n``. Entries after that step are ignored (they may be garbage).

    Returns:
        ``(returns, discounts, terminated, k)``, all ``[B]``: ``returns = sum_{i<k}
        gamma**i * rewards[:, i]`` (dtype of ``rewards``); ``discounts = gamma**k`` (same
        dtype), the factor of the bootstrap value of the observation after step
        ``t + k - 1``; ``terminated`` (bool) the window ended by termination, so the
        target must not bootstrap (a truncation ends the window but still bootstraps);
        ``k`` (int64) in ``[1, n]``. The n-step target is ``returns + discounts * (1 -
        terminated) * V(obs_{t+k})``.
    """
    n = rewards.shape[-1]
    dones = terminateds | truncateds
    # Step i is in the window iff no episode end strictly before it: ends up to i == ends at i.
    in_window = torch.cumsum(dones, dim=-1) == dones
    powers = torch.pow(gamma, torch.arange(n, dtype=rewards.dtype, device=rewards.device))
    returns = torch.where(in_window, rewards, 0.0) @ powers
    k = in_window.sum(dim=-1)
    discounts = torch.pow(gamma, k.to(rewards.dtype))
    terminated = (terminateds & in_window).any(dim=-1)
    return returns, discounts, terminated, k


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


def ornstein_uhlenbeck_step(x: Tensor, gaussian: Tensor, sigma: float, theta: float, dt: float) -> Tensor:
    """One Euler-Maruyama step of a zero-mean Ornstein-Uhlenbeck process: ``x - theta x dt + sigma
    sqrt(dt) gaussian``, with ``x`` and the standard-normal ``gaussian`` of any one shape."""
    return x - theta * x * dt + sigma * dt ** 0.5 * gaussian


@torch.no_grad()
def soft_update_(target: Sequence[Tensor], source: Sequence[Tensor], tau: float) -> None:
    """In place, ``target <- (1 - tau) * target + tau * source`` for matching tensor lists
    (Polyak averaging; ``tau = 1`` is a hard copy)."""
    if tau == 1.0:
        torch._foreach_copy_(list(target), list(source))
    else:
        torch._foreach_lerp_(list(target), list(source), tau)


def huber_loss(x: Tensor, delta: float = 1.0) -> Tensor:
    """Elementwise Huber loss of ``[N]`` errors: quadratic within ``delta``, linear outside."""
    return torch.where(x.abs() < delta, 0.5 * x.pow(2), delta * (x.abs() - 0.5 * delta))


def vtrace(
    behaviour_logp: Tensor,
    target_logp: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    terminateds: Tensor,
    truncateds: Tensor,
    gamma: float,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace off-policy value targets and policy-gradient advantages over time-major arrays.

    Args:
        behaviour_logp: ``[T, B]`` log-probability of step ``t``'s action under the policy that
            sampled it.
        target_logp: ``[T, B]`` the same under the policy being learned.
        rewards: ``[T, B]`` reward of step ``t``.
        values: ``[T, B]`` value of the observation step ``t`` was taken in.
        bootstrap_value: ``[B]`` value of the observation after the last step.
        terminateds: ``[T, B]`` step ``t`` ended the episode in a terminal state.
        truncateds: ``[T, B]`` step ``t`` cut the episode (time limit): not terminal.
        clip_rho_threshold: clip of the importance ratio in the value targets (rho bar);
            ``None`` means no clipping.
        clip_pg_rho_threshold: clip of the ratio in the policy-gradient advantages; ``None``
            means no clipping.
        lambda_: trace decay multiplying the trace coefficients ``c = min(1, ratio)``.

    Next values, truncation and termination are handled as in ``gae``: the value of the next
    observation is ``values[t + 1]`` (``bootstrap_value`` for the last step), bootstrapped on
    truncation and zero on termination, and either end stops the trace. The advantage of step
    ``t`` uses ``vs[t + 1]`` while the episode continues, the plain next value when step ``t``
    ended it, and ``bootstrap_value`` on the last row.

    With gymnasium's next-step autoreset the row after an episode end is a reset step: its
    observation is the final observation (so ``values`` there is the bootstrap value truncation
    needs) and its action was ignored. Its target and advantage are meaningless and must be
    masked out by the caller; the rows before it are unaffected (they read only that value).

    Computed in the inputs' dtype. The outputs are targets: call this under
    ``torch.no_grad()`` or detach them.

    Returns:
        ``(vs, pg_advantages)``, both ``[T, B]``.
    """
    for name, x, shape in (
        ("behaviour_logp", behaviour_logp, values.shape),
        ("target_logp", target_logp, values.shape),
        ("rewards", rewards, values.shape),
        ("bootstrap_value", bootstrap_value, values.shape[1:]),
        ("terminateds", terminateds, values.shape),
        ("truncateds", truncateds, values.shape),
    ):
        if x.shape != shape:
            raise ValueError(f"vtrace: {name} has shape {tuple(x.shape)}, expected {tuple(shape)} from values")
    # Espeholt et al. 2018 (IMPALA): the target v_s of eq. 1 with c_i = lambda min(1, rho_i), and the
    # policy-gradient advantage rho_s (r_s + gamma v_{s+1} - V(x_s)) of section 4.2.
    rho = torch.exp(target_logp - behaviour_logp)
    clipped_rho = rho if clip_rho_threshold is None else rho.clamp(max=clip_rho_threshold)
    clipped_pg_rho = rho if clip_pg_rho_threshold is None else rho.clamp(max=clip_pg_rho_threshold)
    not_term = 1.0 - terminateds.to(values.dtype)
    cont = 1.0 - torch.maximum(terminateds.to(values.dtype), truncateds.to(values.dtype))
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rho * (rewards + gamma * not_term * next_values - values)
    discounts = gamma * lambda_ * rho.clamp(max=1.0) * cont
    accs = [torch.zeros_like(bootstrap_value)]  # accs[-1] is acc[t + 1]
    for t in range(values.shape[0] - 1, -1, -1):
        accs.append(deltas[t] + discounts[t] * accs[-1])
    acc_next = torch.stack(accs[:-1][::-1])  # acc[t + 1], [T, B]
    vs = values + torch.stack(accs[1:][::-1])
    vs_next = next_values + cont * acc_next
    pg_advantages = clipped_pg_rho * (rewards + gamma * not_term * vs_next - values)
    return vs, pg_advantages


def discounted_returns(rewards: Tensor, dones: Tensor, valid: Tensor, carry: Tensor,
                       gamma: float) -> tuple[Tensor, Tensor]:
    """Each env's running discounted return after every step, as the standard reward
    normalizers track it (``R = gamma * R + r``, zeroed after an episode ends): what
    ``normalize_rewards`` takes the std of.

    Args:
        rewards: ``[T, N]``.
        dones: ``[T, N]``.
        valid: ``[T, N]``, False on next-step autoreset's reset rows (their return is 0 and
            they are left out of the statistics by the caller).
        carry: ``[N]`` float64 returns before the first step.

    Returns:
        ``([T, N]`` float64 returns, ``[N]`` carry after the last step).
    """
    out = torch.empty(rewards.shape, dtype=torch.float64)
    ret = carry.clone()
    for t in range(rewards.shape[0]):
        ret = torch.where(valid[t], ret * gamma + rewards[t].double(), torch.zeros_like(ret))
        out[t] = ret
        ret = torch.where(dones[t], torch.zeros_like(ret), ret)
    return out, ret
