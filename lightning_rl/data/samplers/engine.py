"""The sampling engine: vector envs stepped with a policy into time-major fragments.

``EnvSampler`` knows no Lightning and no algorithm. It owns ``num_envs`` gymnasium envs (next-step
autoreset, episode statistics), their seeds and the action-sampling generator, and asks a policy
for one thing: exploring actions for a batch of observations (``ActingPolicy``). The synchronous
DataModules (``rollout.py``, ``replay.py``) and every sampler worker process use it; its
``local_state`` is plain data for checkpoints (``env_state.py``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from itertools import islice
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from lightning_rl.batch import (
    BOOTSTRAP,
    EPISODE_STARTS,
    PREV_ACTIONS,
    PREV_REWARDS,
    STATE_IN,
    STATE_OUT,
    SampleBatch,
)
from lightning_rl.data.envs import EnvSpec, close_vector_env, make_vector_env, reset_vector_env, step_vector_env
from lightning_rl.data.envs.state import UnsupportedEnvState, capture_env_state, restore_env_state


def rank_seed(seed: int | None, rank: int, span: int = 1000) -> int | None:
    """Distinct env seeds per DDP rank: ``seed + 1000 * rank``, for ranks that seed at most 1000
    envs each with consecutive seeds from there; ``span`` envs more than 1000 (``num_envs`` of
    one process) widen every rank's range to the next multiple of 1000, so that no two ranks'
    envs share a seed."""
    return None if seed is None else seed + 1000 * math.ceil(max(span, 1) / 1000) * rank


def new_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` (where the random numbers are drawn), seeded with
    ``seed``, or from OS entropy when ``seed`` is None (a fresh generator alone always starts
    from the same fixed seed)."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def policy_state(policy: nn.Module) -> list[Tensor]:
    """Every tensor a policy computes with, in a fixed order: its parameters, then its buffers
    (BatchNorm statistics, observation normalizers; non-persistent ones too). What a copy of
    the policy that acts elsewhere (a sampler worker, another device) must receive."""
    return [*policy.parameters(), *policy.buffers()]


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """Run ``module`` in eval mode (Dropout off, BatchNorm reading its running statistics
    without updating them), then give every submodule back the mode it had: acting is eval
    mode everywhere, the learner trains in the modes it set."""
    yield from _in_mode(module, False)


@contextlib.contextmanager
def train_mode(module: nn.Module) -> Iterator[None]:
    """Run ``module`` in train mode (what computing a gradient away from the learner's training
    step needs: an A3C worker's copy acts in eval mode), then give every submodule back the
    mode it had."""
    yield from _in_mode(module, True)


def _in_mode(module: nn.Module, mode: bool) -> Iterator[None]:
    modules = list(module.modules())
    switched = [m for m in modules if m.training != mode]
    # Where no class customizes ``train`` or ``__setattr__``, the flag is written straight into
    # each module's __dict__: what ``Module.train`` ends up doing, without its per-module
    # attribute checks, which sampling paid twice per iteration.
    plain = all(type(m).train is nn.Module.train and type(m).__setattr__ is nn.Module.__setattr__ for m in modules)
    if switched:
        if plain:
            for m in switched:
                m.__dict__["training"] = mode
        else:
            module.train(mode)
    try:
        yield
    finally:
        for m in switched:
            if plain:
                m.__dict__["training"] = not mode
            else:
                m.training = not mode


def act(policy: nn.Module, obs: Tensor, device: torch.device, explore: bool, generator: torch.Generator | None,
        inputs: dict[str, Tensor] | None, **exploration: Any) -> dict[str, Tensor]:
    """``policy.compute_actions`` on ``device`` in eval mode (submodules' modes restored)."""
    kwargs = {**exploration, **{k: v.to(device) for k, v in (inputs or {}).items()}}
    # (sampling puts the policies in eval mode once per iteration: no per-step walk of the submodules)
    with eval_mode(policy) if policy.training else contextlib.nullcontext():
        return policy.compute_actions(obs.to(device), explore=explore, generator=generator, **kwargs)


class ActingPolicy(Protocol):
    """What the engine asks of a policy."""

    recurrent: bool

    def act(self, obs: Tensor, generator: torch.Generator, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """Exploring outputs for ``obs [N, ...]``: ``actions`` and whatever the fragment keeps
        (``action_logp``, ``vf_preds``; a recurrent policy's ``state_out``)."""

    def initial_state(self, n: int) -> Tensor:
        """A recurrent policy's state at an episode's start for ``n`` envs."""


class ExploringPolicy:
    """An ``ActingPolicy`` of one network (``compute_actions``) with fixed exploration keyword
    arguments (DQN's epsilon), acting on ``device``."""

    def __init__(self, policy: nn.Module, exploration: dict[str, Any] | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.policy, self.exploration, self.device = policy, exploration or {}, torch.device(device)
        self.recurrent = bool(getattr(policy, "recurrent", False))

    def act(self, obs: Tensor, generator: torch.Generator, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        return act(self.policy, obs, self.device, True, generator, inputs, **self.exploration)

    def episodes_ended(self, ended: np.ndarray) -> None:
        """Exploration that carries over steps (an Ornstein-Uhlenbeck process, anything in the
        exploration arguments with a ``reset``) starts again in the envs whose episode ended."""
        for value in self.exploration.values():
            reset = getattr(value, "reset", None)
            if callable(reset):
                reset(ended)

    def initial_state(self, n: int) -> Tensor:
        return self.policy.initial_state(n)


class EnvSampler:
    """``num_envs`` vector envs, stepped with a policy.

    Args:
        env: a registered gymnasium id or any callable returning a ``gymnasium.Env``.
        num_envs: envs stepped in parallel.
        vectorization: see ``make_vector_env``.
        seed: the action-sampling generator's seed until ``reset`` re-seeds it.
        device: where the action-sampling generator lives (the policy acts there).
        check_finite: raise, naming the env, the field and the step, on a NaN or infinite
            reward or observation.
        where: appended to error messages (``" on rank 1"``).
    """

    def __init__(self, env: EnvSpec, num_envs: int, vectorization: str = "auto", seed: int | None = None,
                 device: torch.device | str = "cpu", check_finite: bool = True, where: str = "") -> None:
        self.env, self.num_envs, self.vectorization = env, num_envs, vectorization
        self.check_finite, self.where = check_finite, where
        self.generator = new_generator(seed, device)
        self.envs: gym.vector.VectorEnv | None = None
        self.obs: np.ndarray | None = None  # what the next actions are taken in
        self.steps = 0  # vector-env steps taken (each env's own step count)
        self.recurrent: dict[str, Tensor] | None = None  # a recurrent policy's inputs for the next step

    # ------------------------------------------------------------ envs
    def open(self) -> None:
        """Build the envs (``reset`` starts their episodes)."""
        self.envs = make_vector_env(self.env, self.num_envs, self.vectorization)
        space = self.envs.single_action_space
        self._clip = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
        self._float_obs = np.issubdtype(self.envs.single_observation_space.dtype or np.int64, np.floating)
        self.steps = 0

    def reset(self, seed: int | None) -> None:
        """Every env to a fresh episode (env ``j`` seeded ``seed + j``); the generator re-seeded
        with ``seed`` (when given)."""
        if seed is not None:
            self.generator.manual_seed(seed)
            self.envs.action_space.seed(seed)
        self.obs, _ = reset_vector_env(self.envs, seed=seed)
        self._prev_done = np.zeros(self.num_envs, dtype=bool)
        self._episodes_seen = self.envs.episode_count
        self.recurrent = None
        if self.check_finite and self._float_obs:
            self._check_finite("observation", self.obs)

    def close(self, terminate: bool = False) -> None:
        envs, self.envs = self.envs, None
        if envs is not None:
            close_vector_env(envs, terminate=terminate)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One vector-env step. Returns ``(obs, rewards, terminateds, truncateds, valid)`` where
        ``obs`` is what the actions were taken in and ``valid`` is False for the reset steps
        of gymnasium's next-step autoreset (the step after an episode end only resets)."""
        obs = self.obs
        if self._clip is not None:
            actions = np.clip(actions, *self._clip)
        self.obs, rewards, terminateds, truncateds, _ = step_vector_env(self.envs, actions)
        self.steps += 1
        if self.check_finite:
            self._check_finite("reward", rewards)
            if self._float_obs:
                self._check_finite("observation", self.obs)
        valid = ~self._prev_done
        self._prev_done = terminateds | truncateds
        return obs, rewards, terminateds, truncateds, valid

    def _check_finite(self, field: str, values: np.ndarray) -> None:
        finite = np.isfinite(values).reshape(self.num_envs, -1).all(axis=1)
        if finite.all():
            return
        env = int(np.flatnonzero(~finite)[0])
        raise ValueError(
            f"env {env} of {self.num_envs} ({self.env!r}){self.where} returned a non-finite {field} at its env step "
            f"{self.steps}: {values[env]!r}. Fix the env, or pass check_finite=False to train on it anyway"
        )

    def episode_info(self) -> dict[str, Any]:
        """Returns and lengths of the episodes that ended since the last call."""
        stats = self.envs  # the EpisodeStatistics wrapper (data/envs/__init__.py)
        new = min(stats.episode_count - self._episodes_seen, len(stats.return_queue))
        self._episodes_seen = stats.episode_count
        returns = [float(r) for r in islice(reversed(stats.return_queue), new)][::-1]
        lengths = [int(n) for n in islice(reversed(stats.length_queue), new)][::-1]
        return {"episode_returns": returns, "episode_lengths": lengths}

    # ------------------------------------------------------------ fragments
    def fragment(self, policy: ActingPolicy, length: int) -> SampleBatch:
        """The next ``length`` steps of every env as a time-major fragment: ``[T, N]`` columns
        ``obs``, the policy's outputs, ``rewards``, ``terminateds``, ``truncateds``, ``valid``
        (and a recurrent policy's inputs), and ``[N]`` ones the learner bootstraps from:
        ``bootstrap_obs`` (the observation after the last step) and, for a recurrent policy,
        ``bootstrap_<input>`` (its state etc. there)."""
        # The buffers are made outside inference mode and written inside it: the fragment's
        # tensors are ordinary ones autograd may save, with no copy out of inference mode.
        obs_buf = torch.empty((length, *self.obs.shape), dtype=torch.as_tensor(self.obs).dtype)
        with torch.inference_mode():
            cols, arrays = self._rollout(policy, length, obs_buf)
        fragment = SampleBatch({SampleBatch.OBS: obs_buf, **{k: torch.stack(v) for k, v in cols.items()},
                                **{k: torch.from_numpy(v) for k, v in arrays.items()}})
        fragment[SampleBatch.BOOTSTRAP_OBS] = torch.tensor(self.obs)
        for key, value in self.recurrent_inputs().items():
            fragment[BOOTSTRAP + key] = value.clone()
        return fragment

    def _rollout(self, policy: ActingPolicy, T: int,
                 obs_buf: Tensor) -> tuple[dict[str, list[Tensor]], dict[str, np.ndarray]]:
        N = self.num_envs
        # each step's policy outputs (and recurrent inputs) are kept as they come and stacked once
        cols: dict[str, list[Tensor]] = {}
        rewards = np.empty((T, N), dtype=np.float32)
        terminateds = np.empty((T, N), dtype=bool)
        truncateds = np.empty((T, N), dtype=bool)
        valid = np.empty((T, N), dtype=bool)
        if policy.recurrent and self.recurrent is None:
            self.recurrent = self.initial_recurrent_inputs(policy)
        for t in range(T):
            # The policy reads the copy in obs_buf, not numpy's memory: a matmul's rounding may
            # depend on its input's alignment, which numpy leaves to chance (exact resume).
            obs_buf[t] = torch.from_numpy(self.obs)
            inputs = self.recurrent_inputs()
            out = policy.act(obs_buf[t], self.generator, inputs)
            state_out = out.pop(STATE_OUT, None)
            for key, value in (out | inputs).items():
                cols.setdefault(key, []).append(value)
            actions = out[SampleBatch.ACTIONS].cpu()
            _, rewards[t], terminateds[t], truncateds[t], valid[t] = self.step(actions.numpy())
            if policy.recurrent:
                self._next_recurrent_inputs(state_out.cpu(), actions, rewards[t], valid[t])
        return cols, {SampleBatch.REWARDS: rewards, SampleBatch.TERMINATEDS: terminateds,
                      SampleBatch.TRUNCATEDS: truncateds, SampleBatch.VALID: valid}

    def recurrent_inputs(self) -> dict[str, Tensor]:
        """What a recurrent policy reads besides the observation, per env: its state, whether an
        episode starts (the state is zeroed there), the previous action and reward (zero at a
        start); empty for a feed-forward policy."""
        return {} if self.recurrent is None else dict(self.recurrent)

    def initial_recurrent_inputs(self, policy: ActingPolicy) -> dict[str, Tensor]:
        N = self.num_envs
        action_shape = self.envs.single_action_space.shape or ()
        action_dtype = torch.float32 if isinstance(self.envs.single_action_space, gym.spaces.Box) else torch.int64
        return {STATE_IN: policy.initial_state(N), EPISODE_STARTS: torch.ones(N, dtype=torch.bool),
                PREV_ACTIONS: torch.zeros((N, *action_shape), dtype=action_dtype),
                PREV_REWARDS: torch.zeros(N, dtype=torch.float32)}

    def _next_recurrent_inputs(self, state: Tensor, actions: Tensor, rewards: np.ndarray, valid: np.ndarray) -> None:
        # The inputs of the next row. After a done, that row is the reset step of next-step
        # autoreset: it holds the ended episode's final observation, whose value is what a
        # truncation bootstraps from, so it continues the episode (its state, the last action and
        # reward). The episode starts at the first real step after it (``valid`` False now): the
        # state, previous action and reward are zeroed there, as Stable-Baselines3's RecurrentPPO
        # values a final observation with the state its episode carried.
        starts = torch.from_numpy(~valid)
        keep = ~starts
        self.recurrent = {
            STATE_IN: state,
            EPISODE_STARTS: starts,
            PREV_ACTIONS: torch.where(keep.reshape(-1, *[1] * (actions.dim() - 1)), actions,
                                      torch.zeros_like(actions)),
            PREV_REWARDS: torch.from_numpy(rewards).float() * keep,
        }

    # ------------------------------------------------------------ state
    def local_state(self) -> dict[str, Any]:
        """Everything needed to continue exactly (plain tensors and values): RNG, the envs' own
        state (``env_state.py``; ``{"unsupported": why}`` where it cannot be captured), where each
        env is in its episode, a recurrent policy's inputs."""
        try:
            envs = capture_env_state(self.envs)
        except UnsupportedEnvState as err:  # async envs (other processes), C-extension state ...
            envs = {"unsupported": str(err)}
        return {
            "generator": self.generator.get_state(),
            "envs": envs,
            "obs": torch.from_numpy(np.array(self.obs)),
            "prev_done": torch.from_numpy(self._prev_done.copy()),
            "episodes_seen": int(self._episodes_seen),
            "steps": self.steps,
            "recurrent": None if self.recurrent is None else dict(self.recurrent),
        }

    def load_local_state(self, state: dict[str, Any]) -> bool:
        """Restore ``local_state``; False (nothing restored but the generator and step count)
        when it holds no env state, and the caller restarts the episodes."""
        self.generator.set_state(state["generator"])
        self.steps = int(state["steps"])
        if "unsupported" in state["envs"]:
            return False
        restore_env_state(self.envs, state["envs"])
        self.obs = state["obs"].numpy().copy()
        self._prev_done = state["prev_done"].numpy().copy()
        self._episodes_seen = int(state["episodes_seen"])
        if state.get("recurrent") is not None:
            self.recurrent = {k: v.clone() for k, v in state["recurrent"].items()}
        return True
