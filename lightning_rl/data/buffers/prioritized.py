"""Proportional prioritized replay (Schaul et al. 2016) over the replay ring: ``ReplayBuffer``'s
storage and n-step transitions, drawn in proportion to priorities kept in sum and min trees
(``sum_tree.ProportionalPriorities``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lightning_rl.batch import SampleBatch
from lightning_rl.data.buffers.arrays import _as_numpy
from lightning_rl.data.buffers.ring import ReplayBuffer
from lightning_rl.data.buffers.sum_tree import ProportionalPriorities

__all__ = ["PrioritizedReplayBuffer"]


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016) over the same storage.

    Every flat slot has a priority ``p**alpha`` (``ProportionalPriorities``); slots that are
    not sampleable have priority 0. A row gets the current maximum priority when it becomes
    sampleable, and loses its priority when its slot is overwritten. ``update_priorities``
    sets ``(|td| + eps)**alpha``.

    Args:
        alpha: how strongly priorities skew sampling (0 = uniform).
        beta: default importance-sampling exponent of ``sample``; annealing it is the
            caller's job (pass ``beta``).
        eps: added to ``|td|`` so no sampleable row gets priority 0.
        *args: ``ReplayBuffer``'s.
        **kwargs: ``ReplayBuffer``'s.
    """

    def __init__(self, *args: Any, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6, **kwargs: Any) -> None:
        self.check_priority_config(alpha, eps)
        if beta < 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        super().__init__(*args, **kwargs)
        self.beta = float(beta)
        self.prio = ProportionalPriorities(self.capacity, alpha, eps)
        self._sum_tree, self._min_tree = self.prio.sum_tree, self.prio.min_tree

    @staticmethod
    def check_priority_config(alpha: float, eps: float) -> None:
        """Validate ``alpha`` and ``eps`` (also for callers that build the buffer later)."""
        ProportionalPriorities(1, alpha, eps)

    alpha = property(lambda self: self.prio.alpha)
    eps = property(lambda self: self.prio.eps)

    @property
    def max_priority(self) -> float:
        """The largest ``|td| + eps`` given (before the alpha power); new rows get it."""
        return self.prio.max_priority

    @property
    def nbytes(self) -> int:
        return self.storage_nbytes + self.priority_nbytes

    @property
    def priority_nbytes(self) -> int:
        """Bytes of the sum and min trees."""
        return self.prio.nbytes

    def priorities(self, batch_indexes: Any) -> np.ndarray:
        """Current priorities ``p**alpha`` of flat slots (0 where not sampleable)."""
        return self._sum_tree[_as_numpy(batch_indexes)]

    def _on_sampleable(self, flat: np.ndarray) -> None:
        self.prio.set_max(flat)

    def _on_unsampleable(self, flat: np.ndarray) -> None:
        self.prio.clear(flat)

    def sample(self, batch_size: int, beta: float | None = None) -> SampleBatch:
        """``batch_size`` transitions drawn in proportion to their priorities.

        Stratified: one uniform draw in each of ``batch_size`` equal segments of the total
        priority (so rows come out ordered by slot). ``weights = (N * P(i))**-beta /
        max_j (N * P(j))**-beta`` with ``N = len(self)``, the max over all sampleable rows
        (from the min tree). Other columns as in ``ReplayBuffer.sample``.
        """
        self._check_batch_size(batch_size)
        flat, weights = self.prio.draw(batch_size, self.rng, len(self), self.beta if beta is None else float(beta))
        batch = self._transitions(flat)
        batch[SampleBatch.WEIGHTS] = torch.from_numpy(weights)
        return batch

    def update_priorities(self, batch_indexes: Any, td_errors: Any) -> None:
        """Set the priorities of flat slots ``batch_indexes`` (``[B]``) to ``(|td| + eps)**alpha``.

        ``td_errors`` is ``[B]`` (numpy or tensor, any device). Slots that stopped being
        sampleable since they were drawn (overwritten by newer rows) are skipped; with
        repeated indexes the last td error wins. ``max_priority`` tracks the largest
        ``|td| + eps`` given.
        """
        flat = _as_numpy(batch_indexes).astype(np.int64, copy=False).reshape(-1)
        td = _as_numpy(td_errors).astype(np.float64).reshape(-1)
        self.prio.check_update(flat, td)
        if flat.size == 0:
            return
        if flat.min() < 0 or flat.max() >= self.capacity:
            raise ValueError(f"update_priorities: batch_indexes must lie in [0, {self.capacity})")
        live = self._sampleable_flat.take(flat)
        if not live.all():
            flat, td = flat[live], td[live]
            if flat.size == 0:
                return
        self.prio.set(flat, self.prio.from_td(td))

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "alpha": self.alpha, "eps": self.eps}

    def _arrays(self) -> dict[str, np.ndarray]:
        return {**super()._arrays(), "priorities": self._sum_tree.leaves}

    def state_dict(self, tensors: bool = False) -> dict[str, Any]:
        """As ``ReplayBuffer.state_dict`` plus the leaf priorities and ``max_priority``."""
        return {**super().state_dict(tensors), "max_priority": self.max_priority}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.prio.load(_as_numpy(state["priorities"]), self._sampleable_flat, state["max_priority"])
