"""Replay buffers over a vector-env stream: uniform and prioritized, with n-step returns.

Storage is a preallocated numpy ring, time-major per env: every array is
``[rows, num_envs, ...]`` and one ``add`` writes one row, the step of all ``num_envs``
envs. Observations are stored once: the next observation of row ``(t, env)`` is the
observation of row ``(t + 1, env)``. With gymnasium's next-step autoreset that is right
at episode ends too: the step after an episode end is a *reset step* (action ignored,
reward 0, no done flags) whose observation is the final observation of the ended
episode; its row is stored with ``valid=False``, supplies that final observation, and is
never sampled as a transition.

A row ``t`` yields the n-step transition ``(obs_t, a_t, R, obs_{t+k}, terminated, gamma**k)``
(see ``lightning_rl.functional.n_step_returns``): its window holds ``k <= n_step`` steps,
stopping at the first terminated or truncated step. A row is *sampleable* once its
window and ``obs_{t+k}`` are stored (``n_step`` more rows added, or its episode ended and
the following row exists) and until its slot is overwritten; so the newest row of each env
is never sampleable.

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
from lightning_rl.data.buffers.frames import StackedFrames, frame_stack_problem
from lightning_rl.data.buffers.sum_tree import ProportionalPriorities
from lightning_rl.functional import n_step_returns


def _space_layout(space: gym.Space, what: str, action: bool) -> tuple[tuple[int, ...], np.dtype]:
    """Per-env shape and storage dtype of a Box or Discrete space."""
    if isinstance(space, gym.spaces.Box):
        return tuple(space.shape), np.dtype(np.float32) if action else np.dtype(space.dtype)
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    raise ValueError(f"ReplayBuffer supports Box and Discrete {what} spaces, got {space!r}")


def _as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


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
        """Mark the rows whose window and next observation became complete with row ``t``.

        Row ``t - j`` (``1 <= j <= n_step``) becomes sampleable when it is valid, no step in
        ``t - j .. t - 2`` ended its episode, and either step ``t - 1`` ended it (``ended``,
        ``[N]``: a window of ``j`` steps) or ``j == n_step`` (a full window, when
        ``full_windows``). Each row meets this exactly once.
        """
        clean = np.ones(self.num_envs, dtype=bool)
        new: list[np.ndarray] = []
        any_ended = bool(ended.any())
        for j in range(1, min(self.n_step, t) + 1):
            row = (t - j) % self.rows
            if j >= 2:
                clean &= ~(self._terminateds[row] | self._truncateds[row])
            if j == self.n_step:
                if not full_windows:
                    break
                ready = self._valid[row] & clean
            elif any_ended:
                ready = self._valid[row] & clean & ended
            else:
                continue
            envs = np.flatnonzero(ready)
            if envs.size:
                self._sampleable[row, envs] = True
                new.append(row * self.num_envs + envs)
        if new:
            flat = np.concatenate(new)
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
        size = self.capacity
        # Window step i of slot s (env e) lives at flat (s + i) % rows * N + e = (flat + i*N) % size;
        # i*N < size, so the modulo is one conditional subtraction.
        window = flat[:, None] + self._window_offsets
        np.subtract(window, size, out=window, where=window >= size)
        returns, discounts, terminated, k = n_step_returns(
            torch.from_numpy(self._rewards_flat.take(window)),
            torch.from_numpy(self._terminateds_flat.take(window)),
            torch.from_numpy(self._truncateds_flat.take(window)),
            self.gamma,
        )
        next_flat = flat + self.num_envs * k.numpy()
        np.subtract(next_flat, size, out=next_flat, where=next_flat >= size)
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


REPLAY_CHECKPOINT_AUTO_BYTES = 2**30  # checkpoint_replay_buffer="auto" keeps buffers of at most this many bytes


def check_checkpoint_replay_setting(value: Any) -> None:
    """``checkpoint_replay_buffer`` is ``True``, ``False`` or ``"auto"``."""
    if not (isinstance(value, bool) or value == "auto"):
        raise ValueError(f"checkpoint_replay_buffer must be True, False or 'auto', got {value!r}")


def keeps_replay(setting: bool | str, nbytes: int) -> bool:
    """Whether a checkpoint holds a replay of ``nbytes`` (all its arrays, per process):
    ``checkpoint_replay_buffer`` itself, or with ``"auto"`` at most ``REPLAY_CHECKPOINT_AUTO_BYTES``
    (1 GiB)."""
    return nbytes <= REPLAY_CHECKPOINT_AUTO_BYTES if setting == "auto" else bool(setting)


def check_replay_settings(buffer_size: int, num_envs: int, train_freq: int, learning_starts: int, n_step: int,
                          gamma: float, prioritized_replay: bool, alpha: float, eps: float) -> None:
    """Validate a replay DataModule's settings before any buffer is built."""
    if train_freq < 1:
        raise ValueError(f"train_freq must be >= 1, got {train_freq}")
    if learning_starts < 0:
        raise ValueError(f"learning_starts must be >= 0, got {learning_starts}")
    ReplayBuffer.check_config(buffer_size, num_envs, n_step, gamma)
    if prioritized_replay:
        PrioritizedReplayBuffer.check_priority_config(alpha, eps)
