"""On-policy sampling: a DataModule that owns vector envs and yields one policy batch per step."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.batch import BOOTSTRAP, DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from lightning_rl.data.base import EnvDataModule, rank_seed
from lightning_rl.data.envs import EnvSpec
from lightning_rl.functional import discounted_returns
from lightning_rl.nn.recurrent import EPISODE_STARTS, PREV_ACTIONS, PREV_REWARDS, STATE_IN, STATE_OUT

__all__ = ["DISCOUNTED_RETURNS", "RolloutDataModule", "rank_seed"]

DISCOUNTED_RETURNS = "discounted_returns"


class RolloutDataModule(EnvDataModule):
    """Steps ``num_envs`` gymnasium envs for ``rollout_fragment_length`` steps per iteration.

    Each Lightning training step receives one ``MultiAgentBatch`` holding one time-major
    fragment (``fragment``); the algorithm post-processes it in its training step (GAE,
    dropping the reset steps of gymnasium's next-step autoreset). ``batch.env_steps`` counts
    every env step taken (``num_envs * rollout_fragment_length``).

    ``return_discount``: also record each env's running discounted return after every step
    (``discounted_returns``, carried across fragments and checkpoints): what reward
    normalization takes the std of.
    """

    def __init__(
        self,
        env: EnvSpec,
        num_envs: int = 8,
        rollout_fragment_length: int = 32,
        vectorization: str = "auto",
        seed: int | None = None,
        iterations_per_epoch: int = 10,
        sampling_device: str = "cpu",
        check_finite: bool = True,
        return_discount: float | None = None,
    ) -> None:
        super().__init__(env, num_envs, vectorization, seed, iterations_per_epoch, sampling_device, check_finite)
        if rollout_fragment_length < 1:
            raise ValueError(f"rollout_fragment_length must be >= 1, got {rollout_fragment_length}")
        self.rollout_fragment_length = rollout_fragment_length
        self.return_discount = return_discount

    @property
    def train_batch_size(self) -> int:
        return self.num_envs * self.rollout_fragment_length

    def sample(self, policy_id: str = DEFAULT_POLICY_ID) -> MultiAgentBatch:
        """One fragment of every env (``fragment``); the algorithm post-processes it (GAE) in its
        training step."""
        assert self.module is not None and self.envs is not None, "call setup() first"
        start = time.perf_counter()
        fragment = self.fragment(policy_id)
        if self.return_discount is not None:
            dones = fragment[SampleBatch.TERMINATEDS] | fragment[SampleBatch.TRUNCATEDS]
            fragment[DISCOUNTED_RETURNS], self._returns = discounted_returns(
                fragment[SampleBatch.REWARDS], dones, fragment[SampleBatch.VALID], self._returns, self.return_discount)
        info = self.episode_info()
        info["sample_time_s"] = time.perf_counter() - start
        return MultiAgentBatch({policy_id: fragment}, env_steps=self.train_batch_size, info=info)

    def fragment(self, policy_id: str = DEFAULT_POLICY_ID) -> SampleBatch:
        """The next ``rollout_fragment_length`` steps of every env as a time-major fragment:
        ``[T, N]`` columns (``rollout_fragment``) with ``valid``, and ``[N]`` ones the learner
        bootstraps from: ``bootstrap_obs`` (the observation after the last step) and, for a
        recurrent policy, ``bootstrap_<input>`` (its state etc. there)."""
        with torch.inference_mode():
            rollout, valid = self.rollout_fragment(policy_id)
        # Outside inference mode: the fragment's tensors become ordinary ones autograd may save.
        fragment = SampleBatch({k: v.clone() for k, v in rollout.items()})
        fragment[SampleBatch.VALID] = valid.clone()
        fragment[SampleBatch.BOOTSTRAP_OBS] = torch.tensor(self._obs)
        for key, value in self.recurrent_inputs().items():
            fragment[BOOTSTRAP + key] = value.clone()
        return fragment

    def rollout_fragment(self, policy_id: str) -> tuple[SampleBatch, torch.Tensor]:
        """Time-major ``[T, N]`` columns of one fragment (call under ``torch.inference_mode``) and
        the ``[T, N]`` mask of real transitions; ``self._obs`` is then the observation after it."""
        T, N = self.rollout_fragment_length, self.num_envs
        cols: dict[str, torch.Tensor] = {}
        rewards = np.empty((T, N), dtype=np.float32)
        terminateds = np.empty((T, N), dtype=bool)
        truncateds = np.empty((T, N), dtype=bool)
        valid = np.empty((T, N), dtype=bool)
        obs_buf = torch.empty((T, N, *self._obs.shape[1:]), dtype=torch.as_tensor(self._obs).dtype)
        recurrent = self.module.is_recurrent(policy_id)
        if recurrent and self._recurrent is None:
            self._recurrent = self.initial_recurrent_inputs(policy_id)
        for t in range(T):
            # The policy reads the copy in obs_buf, not numpy's memory: a matmul's rounding may
            # depend on its input's alignment, which numpy leaves to chance (exact resume).
            obs_buf[t] = torch.from_numpy(self._obs)
            obs = obs_buf[t]
            inputs = self.recurrent_inputs()
            out = self.module.policy_outputs(obs, policy_id, explore=True, generator=self.generator,
                                             device=self.sampling_device, inputs=inputs)
            state_out = out.pop(STATE_OUT, None)
            for key, value in {**out, **inputs}.items():
                if key not in cols:
                    cols[key] = torch.empty((T, *value.shape), dtype=value.dtype)
                cols[key][t] = value
            actions = out[SampleBatch.ACTIONS].cpu()
            _, rewards[t], terminateds[t], truncateds[t], valid[t] = self.step_envs(actions.numpy())
            if recurrent:
                self._next_recurrent_inputs(state_out.cpu(), actions, rewards[t], valid[t])
        rollout = SampleBatch(
            {
                SampleBatch.OBS: obs_buf,
                **cols,
                SampleBatch.REWARDS: torch.from_numpy(rewards),
                SampleBatch.TERMINATEDS: torch.from_numpy(terminateds),
                SampleBatch.TRUNCATEDS: torch.from_numpy(truncateds),
            }
        )
        return rollout, torch.from_numpy(valid)

    # ------------------------------------------------------------ recurrent policies
    def recurrent_inputs(self) -> dict[str, torch.Tensor]:
        """What a recurrent policy reads besides the observation, per env: its state, whether an
        episode starts (the state is zeroed there), the previous action and reward (zero at a
        start); empty for a feed-forward policy."""
        return {} if self._recurrent is None else dict(self._recurrent)

    def initial_recurrent_inputs(self, policy_id: str) -> dict[str, torch.Tensor]:
        N = self.num_envs
        action_shape = self.envs.single_action_space.shape or ()
        action_dtype = torch.float32 if isinstance(self.envs.single_action_space, gym.spaces.Box) else torch.int64
        return {STATE_IN: self.module.initial_state(policy_id, N), EPISODE_STARTS: torch.ones(N, dtype=torch.bool),
                PREV_ACTIONS: torch.zeros((N, *action_shape), dtype=action_dtype),
                PREV_REWARDS: torch.zeros(N, dtype=torch.float32)}

    def _next_recurrent_inputs(self, state: torch.Tensor, actions: torch.Tensor, rewards: np.ndarray,
                               valid: np.ndarray) -> None:
        # The inputs of the next row. After a done, that row is the reset step of next-step
        # autoreset: it holds the ended episode's final observation, whose value is what a
        # truncation bootstraps from, so it continues the episode (its state, the last action and
        # reward). The episode starts at the first real step after it (``valid`` False now): the
        # state, previous action and reward are zeroed there, as Stable-Baselines3's RecurrentPPO
        # values a final observation with the state its episode carried.
        starts = torch.from_numpy(~valid)
        keep = ~starts
        self._recurrent = {
            STATE_IN: state,
            EPISODE_STARTS: starts,
            PREV_ACTIONS: torch.where(keep.reshape(-1, *[1] * (actions.dim() - 1)), actions,
                                      torch.zeros_like(actions)),
            PREV_REWARDS: torch.from_numpy(rewards).float() * keep,
        }

    def local_state(self) -> dict[str, Any]:
        state = super().local_state()
        state["recurrent"] = None if self._recurrent is None else dict(self._recurrent)
        state["discounted_returns"] = self._returns.clone()
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        if state.get("recurrent") is not None:
            self._recurrent = {k: v.clone() for k, v in state["recurrent"].items()}
        if state.get("discounted_returns") is not None:
            self._returns = state["discounted_returns"].clone()

    def on_envs_ready(self) -> None:
        self._recurrent: dict[str, torch.Tensor] | None = None
        self._returns = torch.zeros(self.num_envs, dtype=torch.float64)

    def on_envs_reset(self) -> None:
        self._recurrent = None  # fresh episodes start from fresh states
        self._returns = torch.zeros(self.num_envs, dtype=torch.float64)
