"""Returns and advantages: GAE (whole fragments, sequences, segments), V-trace, n-step and
discounted returns. Time-major arrays are ``[T, B]``: ``T`` steps of ``B`` parallel envs."""

from __future__ import annotations

from collections.abc import Sequence

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
