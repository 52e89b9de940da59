"""n-step windows over a replay ring (``ring.ReplayBuffer``'s storage), as functions of its arrays.

The ring is time-major per env: ``[rows, N]`` arrays whose flat slot ``s * N + e`` is row ``s``
of env ``e``. A row ``t`` yields the n-step transition ``(obs_t, a_t, R, obs_{t+k}, terminated,
gamma**k)`` (see ``lightning_rl.functional.n_step_returns``): its window holds ``k <= n_step``
steps, stopping at the first terminated or truncated step. A row is *sampleable* once its
window and ``obs_{t+k}`` are stored (``n_step`` more rows added, or its episode ended and the
following row exists) and until its slot is overwritten; so the newest row of each env is
never sampleable.
"""

from __future__ import annotations

import numpy as np
import torch

from lightning_rl.functional import n_step_returns

__all__ = ["completed_windows", "window_transitions"]


def completed_windows(t: int, ended: np.ndarray, full_windows: bool, n_step: int, valid: np.ndarray,
                      terminateds: np.ndarray, truncateds: np.ndarray) -> np.ndarray | None:
    """The flat slots of the rows whose window and next observation became complete with row
    ``t`` (the ``t``-th row added; ``valid``, ``terminateds``, ``truncateds`` are the ring's
    ``[rows, N]`` flags), or ``None`` when there are none.

    Row ``t - j`` (``1 <= j <= n_step``) becomes sampleable when it is valid, no step in
    ``t - j .. t - 2`` ended its episode, and either step ``t - 1`` ended it (``ended``,
    ``[N]``: a window of ``j`` steps) or ``j == n_step`` (a full window, when
    ``full_windows``). Each row meets this exactly once.
    """
    rows, num_envs = valid.shape
    clean = np.ones(num_envs, dtype=bool)
    new: list[np.ndarray] = []
    any_ended = bool(ended.any())
    for j in range(1, min(n_step, t) + 1):
        row = (t - j) % rows
        if j >= 2:
            clean &= ~(terminateds[row] | truncateds[row])
        if j == n_step:
            if not full_windows:
                break
            ready = valid[row] & clean
        elif any_ended:
            ready = valid[row] & clean & ended
        else:
            continue
        envs = np.flatnonzero(ready)
        if envs.size:
            new.append(row * num_envs + envs)
    return np.concatenate(new) if new else None


def window_transitions(flat: np.ndarray, offsets: np.ndarray, num_envs: int, rewards: np.ndarray,
                       terminateds: np.ndarray, truncateds: np.ndarray, gamma: float
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
    """``(returns, discounts, terminated, next_flat)`` of the windows that begin at the sampleable
    flat slots ``flat`` (``[B]`` int64) of a ring of ``size = rewards.size`` slots, ``num_envs``
    to a row: ``rewards``, ``terminateds``, ``truncateds`` are its flat ``[size]`` arrays and
    ``offsets`` is ``num_envs * arange(n_step)``; ``next_flat`` is the slot of ``obs_{t+k}``."""
    size = rewards.size
    # Window step i of slot s (env e) lives at flat (s + i) % rows * N + e = (flat + i*N) % size;
    # i*N < size, so the modulo is one conditional subtraction.
    window = flat[:, None] + offsets
    np.subtract(window, size, out=window, where=window >= size)
    returns, discounts, terminated, k = n_step_returns(
        torch.from_numpy(rewards.take(window)),
        torch.from_numpy(terminateds.take(window)),
        torch.from_numpy(truncateds.take(window)),
        gamma,
    )
    next_flat = flat + num_envs * k.numpy()
    np.subtract(next_flat, size, out=next_flat, where=next_flat >= size)
    return returns, discounts, terminated, next_flat
