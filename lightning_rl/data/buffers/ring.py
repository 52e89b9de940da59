"""The replay ring over a vector-env stream: uniform replay of n-step transitions.

Storage is a preallocated numpy ring, time-major per env: every array is
``[rows, num_envs, ...]`` and one ``add`` writes one row, the step of all ``num_envs``
envs. Observations are stored once: the next observation of row ``(t, env)`` is the
observation of row ``(t + 1, env)``. With gymnasium's next-step autoreset that is right
at episode ends too: the step after an episode end is a *reset step* (action ignored,
reward 0, no done flags) whose observation is the final observation of the ended
episode; its row is stored with ``valid=False``, supplies that final observation, and is
never sampled as a transition.

A row ``t`` yields the n-step transition of the window that begins at it, and is *sampleable*
once that window and the observation after it are stored (``n_step.py``); so the newest row of
each env is never sampleable.

Flat indexes (``batch_indexes``) are ``slot * num_envs + env`` with ``slot`` the ring row.

With ``frame_stack=True`` (stacked ``uint8`` frames ``(K, H, W)``) a row stores only its
observation's newest frame (``frames.StackedFrames``) and a stack is rebuilt from the ``K - 1``
rows before it, as the env gave it; a row is then sampleable only while those rows are stored
too, so each env's ``K - 1`` oldest rows are not.

Each ``add`` must be the next step of every env. When the stream breaks (envs reset
without an episode end, e.g. after restoring the buffer from a checkpoint), call
``end_episodes()`` first so no window joins the old stream to the new one.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.batch import SampleBatch
from lightning_rl.data.buffers.arrays import _as_numpy, _space_layout
from lightning_rl.data.buffers.frames import StackedFrames, frame_stack_problem
from lightning_rl.data.buffers.n_step import completed_windows, window_transitions

__all__ = ["ReplayBuffer"]


class ReplayBuffer:
    """Uniform replay of n-step transitions from ``num_envs`` parallel envs.

    Args:
        capacity: transitions (env steps) held. Rounded **up** to a multiple of
            ``num_envs``: the ring has ``rows = ceil(capacity / num_envs)`` rows of
            ``num_envs`` steps, and ``self.capacity == rows * num_envs``. At most
            ``(rows - 1) * num_envs`` of them are sampleable (the newest row waits for its
            next observation). ``rows`` must exceed ``n_step``.
        observation_space: single-env ``Box`` or ``Discrete`` space. Observations keep the
            space's dtype (uint8 images stay uint8); Discrete observations are int64.
        action_space: single-env ``Box`` or ``Discrete`` space; Discrete actions are int64,
            Box actions float32.
        num_envs: envs stepped together; every ``add`` carries one step of each.
        n_step: length of the return window (1 = one-step transitions).
        gamma: discount of the n-step return.
        seed: seed of the buffer's own ``np.random.Generator`` (sampling only).
        frame_stack: store a ``uint8`` ``(K, H, W)`` frame stack one frame per step (see the
            module docstring); ``rows`` must then exceed ``n_step + K - 1``.
    """

    def __init__(
        self,
        capacity: int,
        observation_space: gym.Space,
        action_space: gym.Space,
        num_envs: int = 1,
        n_step: int = 1,
        gamma: float = 0.99,
        seed: int | None = None,
        frame_stack: bool = False,
    ) -> None:
        problem = frame_stack_problem(observation_space) if frame_stack else None
        if problem is not None:
            raise ValueError(f"frame_stack=True needs {problem}")
        history = int(observation_space.shape[0]) - 1 if frame_stack else 0
        rows = self.check_config(capacity, num_envs, n_step, gamma, history)
        self.obs_shape, self.obs_dtype = _space_layout(observation_space, "observation", action=False)
        self.action_shape, self.action_dtype = _space_layout(action_space, "action", action=True)
        self.observation_space, self.action_space = observation_space, action_space
        self.num_envs, self.rows, self.n_step, self.gamma = int(num_envs), int(rows), int(n_step), float(gamma)
        shape = (self.rows, self.num_envs)
        # np.zeros: pages are mapped lazily, and unwritten slots read as harmless zeros.
        self.frames = StackedFrames(self.rows, self.num_envs, observation_space) if frame_stack else None
        self._history = history  # rows before a row that its observation is rebuilt from
        if self.frames is None:
            self._obs = np.zeros((*shape, *self.obs_shape), dtype=self.obs_dtype)
        self._actions = np.zeros((*shape, *self.action_shape), dtype=self.action_dtype)
        self._rewards = np.zeros(shape, dtype=np.float32)
        self._terminateds = np.zeros(shape, dtype=bool)
        self._truncateds = np.zeros(shape, dtype=bool)
        self._valid = np.zeros(shape, dtype=bool)
        self._sampleable = np.zeros(shape, dtype=bool)
        # Flat views over slots: index slot * num_envs + env.
        size = self.capacity
        if self.frames is None:
            self._obs_flat = self._obs.reshape(size, *self.obs_shape)
        self._actions_flat = self._actions.reshape(size, *self.action_shape)
        self._rewards_flat = self._rewards.reshape(size)
        self._terminateds_flat = self._terminateds.reshape(size)
        self._truncateds_flat = self._truncateds.reshape(size)
        self._sampleable_flat = self._sampleable.reshape(size)
        self._window_offsets = self.num_envs * np.arange(self.n_step, dtype=np.int64)
        self._num_added = 0  # rows (vector-env steps) added so far
        self._num_sampleable = 0
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def check_config(capacity: int, num_envs: int, n_step: int, gamma: float, history: int = 0) -> int:
        """Validate the constructor's sizes (also for callers that build the buffer later);
        returns the ring's rows per env. ``n_step + 2`` rows (plus the ``history`` rows a stored
        frame stack reads) guarantee a sampleable row as soon as ``n_step + 1`` steps were
        added, whatever the episode ends."""
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if capacity < num_envs:
            raise ValueError(f"buffer capacity ({capacity}) must be at least num_envs ({num_envs})")
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        rows = -(-capacity // num_envs)
        if rows < n_step + 2 + history:
            frames = f" with {history + 1} stacked frames" if history else ""
            raise ValueError(
                f"buffer capacity ({capacity}) gives {rows} rows per env for num_envs={num_envs}; "
                f"n_step={n_step}{frames} needs at least {n_step + 2 + history}"
            )
        return rows

    # ------------------------------------------------------------------ sizes

    @property
    def capacity(self) -> int:
        """Transitions held: ``rows * num_envs`` (the requested capacity rounded up)."""
        return self.rows * self.num_envs

    @property
    def num_added(self) -> int:
        """Rows (vector-env steps) added since construction."""
        return self._num_added

    def __len__(self) -> int:
        """Number of sampleable rows (n-step transitions that can be drawn now)."""
        return self._num_sampleable

    def _storage(self) -> dict[str, np.ndarray]:
        return {
            **({"obs": self._obs} if self.frames is None else self.frames.arrays()),
            "actions": self._actions,
            "rewards": self._rewards,
            "terminateds": self._terminateds,
            "truncateds": self._truncateds,
            "valid": self._valid,
            "sampleable": self._sampleable,
        }

    @property
    def storage_nbytes(self) -> int:
        """Bytes of the transition storage arrays (observations once, or frames once, plus flags)."""
        return sum(a.nbytes for a in self._storage().values())

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays the buffer allocates (``PrioritizedReplayBuffer`` adds its trees)."""
        return self.storage_nbytes

    # ------------------------------------------------------------------ adding

    def add(
        self,
        obs: Any,
        actions: Any,
        rewards: Any,
        terminateds: Any,
        truncateds: Any,
        valid: Any,
    ) -> None:
        """Store one vector-env step of all ``num_envs`` envs (numpy arrays or CPU tensors).

        Args:
            obs: ``[N, *obs_shape]`` the observation each env's action was taken in.
            actions: ``[N, *action_shape]`` the actions sent.
            rewards: ``[N]`` rewards of the step.
            terminateds: ``[N]`` bool, what the env returned for the step.
            truncateds: ``[N]`` bool, what the env returned for the step.
            valid: ``[N]`` bool, False for reset steps of next-step autoreset (the step
                after an episode end); those rows are never sampled.
        """
        n = self.num_envs
        obs, actions = _as_numpy(obs), _as_numpy(actions)
        rewards, terminateds, truncateds, valid = (_as_numpy(x) for x in (rewards, terminateds, truncateds, valid))
        for name, arr, shape in (
            ("obs", obs, (n, *self.obs_shape)),
            ("actions", actions, (n, *self.action_shape)),
            ("rewards", rewards, (n,)),
            ("terminateds", terminateds, (n,)),
            ("truncateds", truncateds, (n,)),
            ("valid", valid, (n,)),
        ):
            if arr.shape != shape:
                raise ValueError(f"add: {name} has shape {arr.shape}, expected {shape}")
        kinds = None if self.frames is None else self.frames.how_they_start(obs)  # raises before any change
        t = self._num_added
        slot = t % self.rows
        if t >= self.rows:  # overwrite the oldest row; the stacks of the next `history` rows read it
            for j in range(self._history + 1):
                row = (slot + j) % self.rows
                lost = np.flatnonzero(self._sampleable[row])
                if lost.size:
                    self._sampleable[row, lost] = False
                    self._num_sampleable -= lost.size
                    self._on_unsampleable(row * n + lost)
        if self.frames is None:
            self._obs[slot] = obs
        else:
            self.frames.write(slot, obs, kinds)
        self._actions[slot] = actions
        self._rewards[slot] = rewards
        self._terminateds[slot] = terminateds
        self._truncateds[slot] = truncateds
        self._valid[slot] = valid
        self._num_added = t + 1
        if t >= 1:
            prev = (t - 1) % self.rows
            self._mark_sampleable(t, self._terminateds[prev] | self._truncateds[prev], full_windows=True)

    def _mark_sampleable(self, t: int, ended: np.ndarray, full_windows: bool) -> None:
        """Mark the rows whose window and next observation became complete with row ``t``
        (``n_step.completed_windows``: ``ended`` is ``[N]``, whether step ``t - 1`` ended its
        episode; ``full_windows``, whether a window of ``n_step`` steps completes too)."""
        flat = completed_windows(t, ended, full_windows, self.n_step, self._valid, self._terminateds,
                                 self._truncateds)
        if flat is not None:
            self._sampleable_flat[flat] = True
            self._num_sampleable += flat.size
            self._on_sampleable(flat)
    def _on_sampleable(self, flat: np.ndarray) -> None:
        """Hook: slots ``flat`` just became sampleable."""

    def _on_unsampleable(self, flat: np.ndarray) -> None:
        """Hook: sampleable slots ``flat`` are being overwritten."""

    def end_episodes(self) -> None:
        """Cut every env's running episode at the newest stored row, as a truncation.

        Call it before the stream restarts from freshly reset envs (e.g. after restoring
        the buffer from a checkpoint): the newest row becomes a reset row (its
        observation is the final observation of the cut episode; its own step is dropped)
        and the step before it is marked truncated, so its window bootstraps from that
        observation and no window joins the old stream to the new one.
        """
        t = self._num_added - 1
        if t < 0:
            return
        slot = t % self.rows
        if t == 0:
            self._valid[slot] = False
            return
        prev = (t - 1) % self.rows
        cut = ~(self._terminateds[prev] | self._truncateds[prev])
        self._truncateds[prev] |= cut
        self._valid[slot] &= ~cut
        self._terminateds[slot] &= ~cut
        self._truncateds[slot] &= ~cut
        # Rows with a full n-step window before the cut were already sampleable.
        self._mark_sampleable(t, cut, full_windows=False)

    # ------------------------------------------------------------------ sampling

    def _check_batch_size(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(self) == 0:
            raise ValueError("the replay buffer holds no sampleable transition yet")

    def _num_slots_written(self) -> int:
        return min(self._num_added, self.rows) * self.num_envs

    def _sample_uniform(self, batch_size: int) -> np.ndarray:
        """``[batch_size]`` flat slots drawn uniformly (with replacement) from the sampleable rows.

        Rejection over the written slots, a whole batch of draws per round: non-sampleable
        slots (reset rows, the newest rows) are a small fraction in practice, and the draws
        per round are sized by that fraction, so one or two rounds suffice.
        """
        written = self._num_slots_written()
        accept_rate = len(self) / written
        out: list[np.ndarray] = []
        needed = batch_size
        while needed > 0:
            draws = self.rng.integers(0, written, size=int(needed / accept_rate * 1.1) + 16)
            hits = draws[self._sampleable_flat.take(draws)]
            out.append(hits[:needed])
            needed -= len(out[-1])
        return np.concatenate(out) if len(out) > 1 else out[0]

    def sample(self, batch_size: int) -> SampleBatch:
        """``batch_size`` n-step transitions drawn uniformly with replacement (so a batch may be
        larger than what is stored, as in Stable-Baselines3).

        Columns (torch tensors, ``B = batch_size``): ``obs [B, *obs_shape]``, ``actions``,
        ``rewards [B]`` (n-step returns), ``next_obs`` (observation after the window),
        ``terminateds [B]`` (window ended by termination: do not bootstrap),
        ``discounts [B]`` (``gamma**k``), ``batch_indexes [B]`` (int64 flat slots),
        ``weights [B]`` (ones).
        """
        self._check_batch_size(batch_size)
        flat = self._sample_uniform(batch_size)
        batch = self._transitions(flat)
        batch[SampleBatch.WEIGHTS] = torch.ones(batch_size, dtype=torch.float32)
        return batch

    def _transitions(self, flat: np.ndarray) -> SampleBatch:
        """The n-step transitions of sampleable flat slots ``flat`` (``[B]`` int64)."""
        returns, discounts, terminated, next_flat = window_transitions(
            flat, self._window_offsets, self.num_envs, self._rewards_flat, self._terminateds_flat,
            self._truncateds_flat, self.gamma)
        return SampleBatch(
            {
                SampleBatch.OBS: self._observations(flat),
                SampleBatch.ACTIONS: torch.from_numpy(self._actions_flat.take(flat, axis=0)),
                SampleBatch.REWARDS: returns,
                SampleBatch.NEXT_OBS: self._observations(next_flat),
                SampleBatch.TERMINATEDS: terminated,
                SampleBatch.DISCOUNTS: discounts,
                SampleBatch.BATCH_INDEXES: torch.from_numpy(flat.astype(np.int64, copy=False)),
            }
        )

    def _observations(self, flat: np.ndarray) -> torch.Tensor:
        if self.frames is not None:
            return self.frames.gather(flat)
        # Copies into torch's 64-byte-aligned memory: a matmul's rounding may depend on its
        # input's alignment, which numpy leaves to chance (exact resume).
        return torch.tensor(self._obs_flat.take(flat, axis=0))

    # ------------------------------------------------------------------ checkpointing

    def _config(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "num_envs": self.num_envs,
            "n_step": self.n_step,
            "gamma": self.gamma,
            "obs_shape": list(self.obs_shape),
            "obs_dtype": str(self.obs_dtype),
            "action_shape": list(self.action_shape),
            "action_dtype": str(self.action_dtype),
            **({} if self.frames is None else {"frame_stack": True}),
        }

    def _arrays(self) -> dict[str, np.ndarray]:
        return self._storage()

    def state_dict(self, tensors: bool = False) -> dict[str, Any]:
        """Storage, counters and RNG state as a plain dict (arrays are views, not copies).

        ``tensors=True`` gives the arrays as CPU tensors sharing their memory, which
        ``torch.load(weights_only=True)`` accepts (numpy arrays it does not); everything
        else is ints, floats, strings, lists and dicts. ``load_state_dict`` takes either.
        """
        arrays = self._arrays()
        if tensors:
            arrays = {name: torch.from_numpy(a) for name, a in arrays.items()}
        return {
            **arrays,
            "num_added": self._num_added,
            "num_sampleable": self._num_sampleable,
            "rng_state": self.rng.bit_generator.state,
            "config": self._config(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; the buffer then samples exactly as the original."""
        config = dict(state["config"])
        if config != self._config():
            raise ValueError(f"replay buffer state is for {config}, this buffer is {self._config()}")
        for name, array in self._storage().items():
            np.copyto(array, _as_numpy(state[name]))
        self._num_added = int(state["num_added"])
        self._num_sampleable = int(state["num_sampleable"])
        self.rng.bit_generator.state = state["rng_state"]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self.capacity}, num_envs={self.num_envs}, n_step={self.n_step}, "
            f"len={len(self)}, nbytes={self.nbytes})"
        )
