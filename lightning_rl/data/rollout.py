"""On-policy sampling: a DataModule that owns vector envs and yields one policy batch per step."""

from __future__ import annotations

import time
from typing import Any

import torch

from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from lightning_rl.data.base import EnvDataModule, check_at_least_one, rank_seed
from lightning_rl.data.envs import EnvSpec
from lightning_rl.data.samplers.engine import ExploringPolicy
from lightning_rl.data.settings import EnvSettings
from lightning_rl.functional import discounted_returns

__all__ = ["DISCOUNTED_RETURNS", "RolloutDataModule", "rank_seed"]

DISCOUNTED_RETURNS = "discounted_returns"


class RolloutDataModule(EnvDataModule):
    """Steps ``num_envs`` gymnasium envs for ``rollout_fragment_length`` steps per iteration
    (``env``: the env settings, as ``EnvDataModule`` takes them).

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
        env: EnvSettings | EnvSpec,
        rollout_fragment_length: int,
        sampling_device: str = "cpu",
        return_discount: float | None = None,
    ) -> None:
        super().__init__(env, sampling_device)
        check_at_least_one(rollout_fragment_length=rollout_fragment_length)
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
        """The next ``rollout_fragment_length`` steps of every env as a time-major fragment
        (``EnvSampler.fragment``), acted by the module's exploring policy on ``sampling_device``."""
        policy = ExploringPolicy(self.module.sampling_policy(policy_id, self.sampling_device),
                                 self.module.exploration_kwargs(policy_id), self.sampling_device)
        return self.sampler.fragment(policy, self.rollout_fragment_length)

    def local_state(self) -> dict[str, Any]:
        state = super().local_state()
        state["discounted_returns"] = self._returns.clone()
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        if state.get("discounted_returns") is not None:
            self._returns = state["discounted_returns"].clone()

    def on_envs_ready(self) -> None:
        self._returns = torch.zeros(self.num_envs, dtype=torch.float64)

    def on_envs_reset(self) -> None:
        self._returns = torch.zeros(self.num_envs, dtype=torch.float64)
