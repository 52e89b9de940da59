"""Off-policy sampling: a DataModule that owns vector envs and a replay buffer."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from lightning_rl.data.base import EnvDataModule
from lightning_rl.data.envs import EnvSpec
from lightning_rl.data.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer
from lightning_rl.functional import piecewise_linear


class ReplayDataModule(EnvDataModule):
    """Each iteration: ``train_freq`` vector-env steps into the buffer, then one replay batch.

    Before ``learning_starts`` env steps (per process) actions are uniform random and the
    batch is empty (no gradient step). After it, the batch holds ``num_gradient_steps *
    train_batch_size`` rows — one slice per gradient step — with ``batch_indexes`` and
    importance ``weights``. ``num_gradient_steps / (train_freq * num_envs)`` is the replay
    ratio. After the step, ``update_priorities`` takes the ``td_error`` the module returned
    for exactly those rows (the learner -> replay priority loop).

    Args:
        buffer_size: transitions held (per process under DDP).
        n_step: steps summed into each target (``discounts`` carries ``gamma ** k``).
        prioritized_replay: sample proportionally to ``(|td_error| + eps) ** alpha``
            (Schaul et al. 2016) instead of uniformly; ``beta`` anneals linearly from
            ``prioritized_replay_beta`` to 1 over ``beta_annealing_env_steps``.
        checkpoint_replay_buffer: save the buffer in checkpoints (exact resume); off, a
            resumed run starts with an empty buffer and waits ``learning_starts`` again.
    """

    def __init__(
        self,
        env: EnvSpec,
        num_envs: int = 1,
        buffer_size: int = 100_000,
        learning_starts: int = 1000,
        train_freq: int = 1,
        num_gradient_steps: int = 1,
        train_batch_size: int = 256,
        n_step: int = 1,
        gamma: float = 0.99,
        prioritized_replay: bool = False,
        prioritized_replay_alpha: float = 0.6,
        prioritized_replay_beta: float = 0.4,
        prioritized_replay_eps: float = 1e-6,
        beta_annealing_env_steps: int | None = None,
        vectorization: str = "auto",
        seed: int | None = None,
        iterations_per_epoch: int = 1000,
        sampling_device: str = "cpu",
        checkpoint_replay_buffer: bool = True,
    ) -> None:
        super().__init__(env, num_envs, vectorization, seed, iterations_per_epoch, sampling_device)
        for name, value in (("train_freq", train_freq), ("num_gradient_steps", num_gradient_steps),
                            ("train_batch_size", train_batch_size), ("n_step", n_step)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if buffer_size < train_batch_size:
            raise ValueError(f"buffer_size ({buffer_size}) is smaller than train_batch_size ({train_batch_size})")
        if learning_starts < 0:
            raise ValueError(f"learning_starts must be >= 0, got {learning_starts}")
        self.buffer_size = buffer_size
        self.learning_starts = learning_starts
        self.train_freq = train_freq
        self.num_gradient_steps = num_gradient_steps
        self.train_batch_size = train_batch_size
        self.n_step = n_step
        self.gamma = gamma
        self.prioritized_replay = prioritized_replay
        self.alpha = prioritized_replay_alpha
        self.beta_points = [(0.0, prioritized_replay_beta), (float(beta_annealing_env_steps or 1), 1.0)]
        self.eps = prioritized_replay_eps
        self.buffer: ReplayBuffer | None = None
        self.env_steps = 0  # this process's env steps, which learning_starts and beta count
        self.checkpoint_replay_buffer = checkpoint_replay_buffer

    def on_envs_ready(self) -> None:
        kwargs = dict(
            capacity=self.buffer_size, observation_space=self.envs.single_observation_space,
            action_space=self.envs.single_action_space, num_envs=self.num_envs, n_step=self.n_step,
            gamma=self.gamma, seed=self.seed if self.seed is None else self.seed + 1000 * self._rank(),
        )
        if self.prioritized_replay:
            self.buffer = PrioritizedReplayBuffer(**kwargs, alpha=self.alpha, eps=self.eps)
        else:
            self.buffer = ReplayBuffer(**kwargs)

    def _rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    @property
    def beta(self) -> float:
        return piecewise_linear(self.beta_points, self.env_steps)

    def sample(self, policy_id: str = DEFAULT_POLICY_ID) -> MultiAgentBatch:
        assert self.module is not None and self.envs is not None, "call setup() first"
        start = time.perf_counter()
        policy = self.module.sampling_policy(policy_id, self.sampling_device)
        explore = self.module.exploration_kwargs(policy_id)
        agent_steps = 0
        with torch.inference_mode():
            for _ in range(self.train_freq):
                if self.env_steps < self.learning_starts:
                    actions = self.envs.action_space.sample()
                else:
                    obs = torch.from_numpy(self._obs).to(self.sampling_device)
                    out = policy.compute_actions(obs, explore=True, generator=self.generator, **explore)
                    actions = out[SampleBatch.ACTIONS].cpu().numpy()
                obs, rewards, terminateds, truncateds, valid = self.step_envs(actions)
                self.buffer.add(obs, actions, rewards, terminateds, truncateds, valid)
                agent_steps += int(valid.sum())
                self.env_steps += self.num_envs
        policy_batches = {}
        if self.env_steps >= self.learning_starts and len(self.buffer) >= self.train_batch_size:
            kwargs = {"beta": self.beta} if self.prioritized_replay else {}
            policy_batches[policy_id] = SampleBatch.concat_samples(
                [self.buffer.sample(self.train_batch_size, **kwargs) for _ in range(self.num_gradient_steps)]
            )
        info = self.episode_info()
        info["sample_time_s"] = time.perf_counter() - start
        info["replay_beta"] = self.beta if self.prioritized_replay else None
        info["buffer_size"] = len(self.buffer)
        info["agent_steps_sampled"] = agent_steps
        return MultiAgentBatch(policy_batches, env_steps=self.train_freq * self.num_envs, info=info)

    def update_priorities(self, batch: MultiAgentBatch, learner_info: Mapping[str, Mapping[str, Any]]) -> None:
        """Set the priorities of exactly the sampled rows from the ``td_error`` the module returned."""
        if not self.prioritized_replay:
            return
        for policy_id, policy_batch in batch.policy_batches.items():
            td_error = learner_info.get(policy_id, {}).get("td_error")
            if td_error is None:
                continue
            indexes = policy_batch[SampleBatch.BATCH_INDEXES].cpu().numpy()
            self.buffer.update_priorities(indexes, np.asarray(td_error))

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if state and self.envs is not None:
            state["env_steps"] = self.env_steps
            state["buffer"] = self.buffer.state_dict(tensors=True) if self.checkpoint_replay_buffer else None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if not state or self.buffer is None:
            return
        if state.get("buffer") is not None:
            self.buffer.load_state_dict(state["buffer"])
            self.env_steps = int(state["env_steps"])
        # else: an empty buffer; env_steps restarts so learning_starts fills it again

    def on_envs_reset(self) -> None:
        if self.buffer is not None:
            self.buffer.end_episodes()  # no n-step window may join the old stream to the new
