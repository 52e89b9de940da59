"""Whole n-step transitions, for actors that send them on: ``NStepWindows`` makes them from a
stream of env steps (an APEX worker's envs, each agent of a multi-agent env), each once, when its
window completes; ``TransitionReplayBuffer`` stores them one at a time, in any order, and replays
them by priority (APEX's learner)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.batch import SampleBatch
from lightning_rl.data.buffers.arrays import _as_numpy, _space_layout
from lightning_rl.data.buffers.ring import ReplayBuffer
from lightning_rl.data.buffers.sum_tree import ProportionalPriorities

__all__ = ["NStepWindows", "TransitionReplayBuffer"]


class NStepWindows(ReplayBuffer):
    """n-step windows that hand out each transition once, when its window completes: what an
    actor that sends whole transitions on needs (an APEX worker's envs, each agent of a
    multi-agent env). ``ReplayBuffer``'s lock-step ring per env (so no env's steps enter
    another env's window, and episode ends cut windows exactly as in the learner's replay),
    just long enough for ``steps`` adds between two ``drain`` calls."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, num_envs: int, steps: int,
                 n_step: int, gamma: float) -> None:
        rows = steps + n_step + 2  # a row completes within n_step adds of its own
        super().__init__(rows * num_envs, observation_space, action_space, num_envs, n_step, gamma)
        self._completed: list[np.ndarray] = []

    def _on_sampleable(self, flat: np.ndarray) -> None:
        self._completed.append(flat)

    def drain(self) -> SampleBatch:
        """The transitions whose windows completed since the last call."""
        flat = np.concatenate(self._completed) if self._completed else np.zeros(0, dtype=np.int64)
        self._completed = []
        return self._transitions(flat)

    def add_fragment(self, rollout: dict[str, torch.Tensor], valid: torch.Tensor) -> SampleBatch:
        """Add a ``[T, N]`` fragment step by step; the transitions whose windows it completed."""
        for t in range(valid.shape[0]):
            self.add(rollout[SampleBatch.OBS][t], rollout[SampleBatch.ACTIONS][t], rollout[SampleBatch.REWARDS][t],
                     rollout[SampleBatch.TERMINATEDS][t], rollout[SampleBatch.TRUNCATEDS][t], valid[t])
        return self.drain()


class TransitionReplayBuffer:
    """Prioritized replay of whole n-step transitions inserted one at a time, in any order: what
    asynchronous actors need (APEX), whose transitions arrive out of step with each other's.

    A flat ring of ``capacity`` transitions ``(obs, actions, rewards, next_obs, terminateds,
    discounts)``, each with the priority its actor gave it (``add(..., td_errors)``: ``(|td| +
    eps)**alpha``). ``batch_indexes`` are insertion numbers, not slots: a row overwritten
    between ``sample`` and ``update_priorities`` is recognized and skipped.

    Args:
        capacity: transitions held.
        observation_space: single-env ``Box`` or ``Discrete`` space.
        action_space: single-env ``Box`` or ``Discrete`` space.
        alpha: as in ``PrioritizedReplayBuffer``.
        eps: as in ``PrioritizedReplayBuffer``.
        seed: seed of the buffer's own ``np.random.Generator``.
    """

    COLUMNS = (SampleBatch.OBS, SampleBatch.ACTIONS, SampleBatch.REWARDS, SampleBatch.NEXT_OBS,
               SampleBatch.TERMINATEDS, SampleBatch.DISCOUNTS)

    def __init__(self, capacity: int, observation_space: gym.Space, action_space: gym.Space, alpha: float = 0.6,
                 eps: float = 1e-6, seed: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        obs_shape, obs_dtype = _space_layout(observation_space, "observation", action=False)
        action_shape, action_dtype = _space_layout(action_space, "action", action=True)
        layout = self._layout({
            SampleBatch.OBS: (obs_shape, obs_dtype), SampleBatch.ACTIONS: (action_shape, action_dtype),
            SampleBatch.REWARDS: ((), np.dtype(np.float32)), SampleBatch.NEXT_OBS: (obs_shape, obs_dtype),
            SampleBatch.TERMINATEDS: ((), np.dtype(bool)), SampleBatch.DISCOUNTS: ((), np.dtype(np.float32)),
        })
        self._columns = {k: np.zeros((self.capacity, *shape), dtype=dtype) for k, (shape, dtype) in layout.items()}
        self.prio = ProportionalPriorities(self.capacity, alpha, eps)
        self.num_added = 0
        self.rng = np.random.default_rng(seed)

    def _layout(self, layout: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, tuple[tuple[int, ...], Any]]:
        """The stored columns' per-row shapes and dtypes (a subclass stores observations otherwise)."""
        return layout

    def __len__(self) -> int:
        return min(self.num_added, self.capacity)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._columns.values()) + self.prio.nbytes

    def add(self, transitions: dict[str, Any], td_errors: Any = None) -> np.ndarray:
        """Insert ``[K]`` transitions (the ``COLUMNS``) with priorities ``(|td_errors| + eps)**alpha``,
        or the largest priority so far when ``td_errors`` is None (new transitions are drawn
        first, as in Schaul et al.); returns their ``batch_indexes``. The oldest transitions are
        overwritten."""
        k = len(transitions[SampleBatch.REWARDS])
        td = None if td_errors is None else _as_numpy(td_errors).astype(np.float64).reshape(-1)
        if td is not None:
            k = td.size
        for key in self._columns:
            if len(transitions[key]) != k:
                raise ValueError(f"add: {len(transitions[key])} rows of {key!r} for {k} td_errors")
        if k == 0:
            return np.zeros(0, dtype=np.int64)
        if td is not None and not np.isfinite(td).all():
            raise ValueError("add: td_errors contain NaN or inf")
        ids = self.num_added + np.arange(k, dtype=np.int64)
        if k > self.capacity:  # only the newest fit
            ids, td = ids[-self.capacity:], None if td is None else td[-self.capacity:]
            transitions = {key: transitions[key][-self.capacity:] for key in self._columns}
        slots = ids % self.capacity
        for key in self._columns:
            self._columns[key][slots] = _as_numpy(transitions[key])
        if td is None:
            self.prio.set_max(slots)
        else:
            self.prio.set(slots, self.prio.from_td(td))
        self.num_added += k
        return ids

    def priorities(self, batch_indexes: Any) -> np.ndarray:
        """Current priorities ``p**alpha`` of the rows ``batch_indexes`` name (0 if overwritten)."""
        ids = _as_numpy(batch_indexes).astype(np.int64, copy=False)
        return np.where(self._live(ids), self.prio.sum_tree[ids % self.capacity], 0.0)

    def _live(self, ids: np.ndarray) -> np.ndarray:
        return (ids >= self.num_added - self.capacity) & (ids < self.num_added)

    def sample(self, batch_size: int, beta: float = 0.4) -> SampleBatch:
        """``batch_size`` transitions drawn in proportion to their priorities, with importance
        ``weights`` and ``batch_indexes`` (as ``PrioritizedReplayBuffer.sample``)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(self) == 0:
            raise ValueError("the replay buffer holds no transition yet")
        slots, weights = self.prio.draw(batch_size, self.rng, len(self), beta)
        # The insertion number of the transition now in each slot.
        newest_slot = (self.num_added - 1) % self.capacity
        ids = self.num_added - 1 - (newest_slot - slots) % self.capacity
        batch = SampleBatch(self._rows(slots))
        batch[SampleBatch.BATCH_INDEXES] = torch.from_numpy(ids)
        batch[SampleBatch.WEIGHTS] = torch.from_numpy(weights)
        return batch

    def _rows(self, slots: np.ndarray) -> dict[str, torch.Tensor]:
        """The transitions in ``slots``, one tensor per column."""
        return {key: torch.tensor(column.take(slots, axis=0)) for key, column in self._columns.items()}

    def update_priorities(self, batch_indexes: Any, td_errors: Any) -> None:
        """``(|td| + eps)**alpha`` for the rows ``batch_indexes`` names; rows overwritten since
        they were drawn are skipped."""
        ids = _as_numpy(batch_indexes).astype(np.int64, copy=False).reshape(-1)
        td = _as_numpy(td_errors).astype(np.float64).reshape(-1)
        self.prio.check_update(ids, td)
        live = self._live(ids)
        if live.any():
            self.prio.set(ids[live] % self.capacity, self.prio.from_td(td[live]))

    def _config(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "alpha": self.prio.alpha, "eps": self.prio.eps,
                **{f"{k}_shape": [list(a.shape[1:]), str(a.dtype)] for k, a in self._columns.items()}}

    def state_dict(self, tensors: bool = False) -> dict[str, Any]:
        arrays = {**self._columns, "priorities": self.prio.sum_tree.leaves}
        if tensors:
            arrays = {name: torch.from_numpy(a) for name, a in arrays.items()}
        return {**arrays, "num_added": self.num_added, "max_priority": self.prio.max_priority,
                "rng_state": self.rng.bit_generator.state, "config": self._config()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (for a buffer of the same configuration)."""
        if dict(state["config"]) != self._config():
            raise ValueError(f"replay buffer state is for {state['config']}, this buffer is {self._config()}")
        for key, array in self._columns.items():
            np.copyto(array, _as_numpy(state[key]))
        self.num_added = int(state["num_added"])
        live = np.arange(self.capacity) < len(self)
        self.prio.load(_as_numpy(state["priorities"]), live, state["max_priority"])
        self.rng.bit_generator.state = state["rng_state"]
