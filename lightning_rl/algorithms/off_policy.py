"""Shared machinery of the replay-based methods: the replay loop, priorities, target networks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch

from lightning_rl.algorithms.base import Algorithm
from lightning_rl.batch import MultiAgentBatch, SampleBatch
from lightning_rl.data.envs import EnvSpec
from lightning_rl.data.envs.spaces import valid_point
from lightning_rl.data.multi_agent_replay import MultiAgentReplayDataModule
from lightning_rl.data.replay import ReplayDataModule
from lightning_rl.data.settings import ReplaySettings
from lightning_rl.distributed import all_reduce_max
from lightning_rl.learner_info import LEARNER_STATS_KEY, LearnerInfoBuilder
from lightning_rl.nn.encoders import Activation
from lightning_rl.policies import PolicyMapping
from lightning_rl.settings import at_least, group_of, interval, positive, setting, settings


@settings
class OffPolicyModule(ReplaySettings, Algorithm):
    """Learner on replay. Each iteration, ``num_gradient_steps`` times (the reference's order):

    1. sample ``train_batch_size`` transitions from the replay (prioritized: with importance
       weights at the current beta);
    2. one gradient step (``update``);
    3. set the priorities of exactly those rows from the step's ``td_error``;
    4. update the target networks when due: ``target_network_update_freq`` global env steps
       after the last update (0: after every gradient step), Polyak-averaged with ``tau`` —
       so ``tau`` is applied per gradient step as in Stable-Baselines3's SAC and RLlib.

    Subclasses implement ``update(policy_id, batch) -> results`` (results hold
    ``learner_stats`` and ``td_error``) and ``update_targets()``.
    """

    sampling_device: str = "cpu"
    """device the policy acts on while sampling (the CPU beats a GPU round trip for small MLPs)."""
    num_gradient_steps: int = setting(default=64, check=positive)
    """gradient steps per iteration (with ``train_freq``: the replay ratio)."""
    train_batch_size: int = setting(default=64, check=positive)
    """replayed rows per gradient step."""
    target_network_update_freq: int = setting(default=1000, check=at_least(0))
    """global env steps between target updates (0: after every gradient step)."""
    tau: float = setting(default=1.0, check=interval("(0, 1]"))
    """target update ``target <- (1 - tau) * target + tau * online`` (1: a hard copy)."""
    prioritized_replay_beta: float = setting(default=0.4, check=interval("[0, 1]"))
    """importance-weight exponent at the start, annealed to 1 over ``total_env_steps``."""
    iterations_per_step: int = setting(default=1, check=positive, resumable=True)
    """training iterations (sampling, then update) run back to back in one Lightning training step, which pays
    Lightning's per-step loop once for all: the same results, a little faster (SAC at 10: about 3%, its update
    dominating each env step)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.buffer_size < self.train_batch_size:
            raise ValueError(f"buffer_size ({self.buffer_size}) is smaller than train_batch_size "
                             f"({self.train_batch_size})")
        # Importance exponent annealed to 1 over the budget (constant without one).
        budget = self.total_env_steps
        self.beta_points = None if budget is None else [(0.0, self.prioritized_replay_beta), (float(budget), 1.0)]
        replay = group_of(ReplaySettings, self)
        if self.multi_agent:
            self.default_datamodule = MultiAgentReplayDataModule(self.env_settings(), self.policy_mapping_fn,
                                                                 self.policy_spaces, replay, gamma=self.gamma,
                                                                 sampling_device=self.sampling_device)
        else:
            self.default_datamodule = ReplayDataModule(self.env_settings(), replay, gamma=self.gamma,
                                                       sampling_device=self.sampling_device)
        self.iterations_per_step = int(self.iterations_per_step)
        self.default_datamodule.requested_iterations_per_step = self.iterations_per_step
        self._last_target_update = 0

    def update(self, policy_id: str, batch: SampleBatch) -> dict[str, Any]:
        """One gradient step on one replay minibatch; returns ``learner_stats`` and ``td_error``."""
        raise NotImplementedError

    def update_targets(self) -> None:
        """Move the target networks toward the online ones by ``tau``."""
        raise NotImplementedError

    def learn_on_batch(self, batch: MultiAgentBatch, builder: LearnerInfoBuilder) -> int:
        replay = batch.replay
        if replay is None:  # still filling the buffer (the same decision on every rank)
            return 0
        policy_ids, placeholders = self.policies_to_train, set()
        if self.multi_agent:  # a policy's agents may not have acted yet, here or on any rank
            counts = [replay.count(pid) for pid in policy_ids]
            most = counts
            if self.trainer.world_size > 1:
                most = [int(c) for c in all_reduce_max(torch.tensor(counts, dtype=torch.float64,
                                                                    device=self.device)).tolist()]
            placeholders = {pid for pid, c in zip(policy_ids, counts) if c == 0}
            policy_ids = [pid for pid, m in zip(policy_ids, most) if m > 0]
            if not policy_ids:
                return 0
        optimizers = self.optimizers()
        lr = self.apply_lr(*(optimizers if isinstance(optimizers, list) else [optimizers]))
        beta = self.current(self.beta_points, self.prioritized_replay_beta) if replay.prioritized_replay else None
        drawn = {} if replay.prioritized_replay else {
            # Uniform draws do not depend on the updates and the buffer does not change while the
            # learner trains: every minibatch of the iteration comes from one draw and one gather.
            policy_id: replay.sample_minibatch(policy_id, self.num_gradient_steps * self.train_batch_size)
            .to(self.device).minibatches(self.train_batch_size, shuffle=False)
            for policy_id in policy_ids if policy_id not in placeholders
        }
        for _ in range(self.num_gradient_steps):
            for policy_id in policy_ids:
                if policy_id in placeholders:  # DDP: no rows here, the other ranks' gradients count
                    minibatch = self.placeholder_batch(policy_id)
                elif drawn:
                    minibatch = next(drawn[policy_id])
                else:
                    minibatch = replay.sample_minibatch(policy_id, self.train_batch_size, beta).to(self.device)
                results = self.update(policy_id, minibatch)
                if replay.prioritized_replay and policy_id not in placeholders:
                    replay.update_priorities(policy_id, minibatch[SampleBatch.BATCH_INDEXES], results["td_error"])
                results[LEARNER_STATS_KEY].update(cur_lr=lr, replay_beta=beta)
                builder.add_learn_on_batch_results(results, policy_id)
            self.counters["num_grad_updates"] += 1
            if self.target_update_due():
                self.update_targets()
        return self.num_gradient_steps * self.train_batch_size * len(set(policy_ids) - placeholders)

    def placeholder_batch(self, policy_id: str) -> SampleBatch:
        """``train_batch_size`` rows of one valid transition with importance weight 0: what a DDP
        rank without transitions of a policy steps on (its gradient is zero; the all-reduce
        averages the others')."""
        obs_space, action_space = self.policy_spaces[policy_id]
        n = self.train_batch_size
        # valid points of the spaces, not zeros: a Discrete observation's one-hot reads ``obs - start``
        obs = valid_point(obs_space, torch.float32).to(self.device).expand(n, *(obs_space.shape or ())).clone()
        action_dtype = torch.float32 if isinstance(action_space, gym.spaces.Box) else torch.int64
        actions = valid_point(action_space, action_dtype).to(self.device).expand(n, *(action_space.shape or ())).clone()
        zeros = torch.zeros(n, device=self.device)
        return SampleBatch({
            SampleBatch.OBS: obs, SampleBatch.ACTIONS: actions, SampleBatch.REWARDS: zeros,
            SampleBatch.NEXT_OBS: obs, SampleBatch.TERMINATEDS: torch.ones(n, dtype=torch.bool, device=self.device),
            SampleBatch.DISCOUNTS: zeros, SampleBatch.WEIGHTS: zeros,
            SampleBatch.BATCH_INDEXES: torch.zeros(n, dtype=torch.int64, device=self.device),
        })

    def target_update_due(self) -> bool:
        """True when ``target_network_update_freq`` global env steps passed since the last update
        (always with 0); the same decision on every rank."""
        sampled = self.global_counters["num_env_steps_sampled"]
        if sampled - self._last_target_update < self.target_network_update_freq:
            return False
        self._last_target_update = sampled
        self.counters["num_target_updates"] += 1
        return True

    def extra_state(self) -> dict[str, Any]:
        return {"last_target_update": self._last_target_update}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self._last_target_update = state.get("last_target_update", 0)


@settings
class ContinuousOffPolicyModule(OffPolicyModule):
    """The replay actor-critics of continuous control (SAC, TD3, DDPG), with the defaults
    rl-zoo and their papers share: one env, a replay of a million transitions from 100 random
    steps on, one gradient step on 256 rows per env step, Polyak-averaged targets after every
    update, ReLU MLPs, no gradient clipping; single-agent."""

    env: EnvSpec = setting(default="Pendulum-v1", kw_only=False)
    num_envs: int = 1
    total_env_steps: int | None = 20_000
    iterations_per_epoch: int = 1000
    grad_clip: float | None = None
    hiddens: Sequence[int] = (256, 256)
    """MLP layer sizes of the actor and of each critic."""
    activation: Activation = "relu"
    """the MLPs' activation: a name such as ``relu`` or an import path."""
    policies: Sequence[str] | dict[str, dict[str, Any]] | None = setting(default=None, init=False)  # type: ignore[assignment]
    policy_mapping_fn: PolicyMapping | None = setting(default=None, init=False)
    policies_to_train: Sequence[str] | None = setting(default=None, init=False)
    buffer_size: int = 1_000_000
    learning_starts: int = 100
    train_freq: int = 1
    num_gradient_steps: int = 1
    train_batch_size: int = 256
    n_step: int = 1
    target_network_update_freq: int = 0
    """global env steps between Polyak updates (0: after every gradient step)."""
