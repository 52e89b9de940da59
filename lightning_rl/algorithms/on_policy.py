"""Shared machinery of the policy-gradient methods: GAE post-processing and minibatch SGD."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from lightning_rl.algorithms.base import Algorithm
from lightning_rl.algorithms.common import ActorCriticSettings, RecurrentSettings
from lightning_rl.batch import (
    BOOTSTRAP,
    DEFAULT_POLICY_ID,
    EPISODE_STARTS,
    PREV_ACTIONS,
    PREV_REWARDS,
    STATE_IN,
    MultiAgentBatch,
    SampleBatch,
    shuffled_rows,
    shuffled_sequences,
    standardize,
)
from lightning_rl.data.base import eval_mode
from lightning_rl.data.envs.spaces import placeholder_rollout
from lightning_rl.data.multi_agent import BOOTSTRAP_MASK, SEGMENT_LENGTHS, MultiAgentRolloutDataModule
from lightning_rl.data.rollout import DISCOUNTED_RETURNS, RolloutDataModule
from lightning_rl.distributed import all_reduce_max, sum_over_ranks
from lightning_rl.functional import gae_batch, gae_segments, gae_sequences
from lightning_rl.learner_info import LEARNER_STATS_KEY, LearnerInfoBuilder
from lightning_rl.nn.models import ActorCritic, preprocess_obs
from lightning_rl.nn.recurrent import RecurrentActorCritic
from lightning_rl.settings import one_of, positive, setting, settings
from lightning_rl.update import call, policy_loss


@settings
class OnPolicyModule(ActorCriticSettings, RecurrentSettings, Algorithm):
    """Actor-critic learner on rollouts: GAE, standardized fields, minibatch SGD.

    Each iteration's batch of ``num_envs * rollout_fragment_length`` env steps is
    shuffled and split into ``ceil(train_batch_size / sgd_minibatch_size)`` minibatches,
    ``num_sgd_iter`` times over. The count of minibatches is fixed by the hyperparameters,
    not by how many reset steps the rollout dropped, so every DDP rank takes the same
    number of optimizer steps.

    Multi-agent (a PettingZoo env): one batch per policy, its minibatches planned from its
    rows. ``count_steps_by="agent_steps"`` makes the train batch and ``total_env_steps``
    (and schedules) count agents' steps: each iteration steps the envs until
    ``num_envs * rollout_fragment_length`` agent steps were sampled (RLlib's
    ``count_steps_by``). Single-agent, both counts are the same.

    Recurrent (``use_lstm``): an LSTM cell of ``lstm_cell_size`` after each MLP encoder
    (``nn/recurrent.py``; ``lstm_use_prev_action``/``lstm_use_prev_reward`` add those inputs).
    Sampling carries each env's state and zeroes it at episode starts; each env's fragment is
    cut into sequences of ``max_seq_len`` steps (it must divide ``rollout_fragment_length``:
    nothing is padded), each trained from the state recorded at its first step, the reset
    steps masked (truncated backpropagation through time, as CleanRL's LSTM PPO). Minibatches
    are whole sequences.
    """

    sampling_device: str = "cpu"
    """device the policy acts on while sampling (the CPU beats a GPU round trip for small MLPs)."""
    num_sgd_iter: int = setting(default=10, check=positive)
    """epochs of minibatch SGD over each train batch."""
    sgd_minibatch_size: int | None = setting(default=64, check=positive)
    """rows per minibatch (whole ``max_seq_len`` sequences with ``use_lstm``; ``None``: the whole batch)."""
    standardize_fields: Sequence[str] = ("advantages",)
    """batch columns standardized per policy batch before SGD: ``(x - mean) / max(1e-4, std)``."""
    count_steps_by: Literal["env_steps", "agent_steps"] = setting(default="env_steps",
                                                                   check=one_of("env_steps", "agent_steps"))
    """``env_steps`` or ``agent_steps``: what the train batch, ``total_env_steps`` and schedules count."""
    normalize_observations: bool = False
    """standardize observations by running statistics kept in the policy."""
    observation_clip: float | None = 10.0
    """clip standardized observations to +- this (``None``: no clip)."""
    normalize_rewards: bool = False
    """divide rewards by the running std of the discounted return."""
    reward_clip: float | None = 10.0
    """clip normalized rewards to +- this (``None``: no clip)."""
    iterations_per_step: int = setting(default=1, check=positive, resumable=True)
    """training iterations (rollout, then update) run back to back in one Lightning training step, which pays
    Lightning's per-step loop once for all: the same results, faster where an iteration is small (A2C)."""

    # A2C: 1, one step on the whole batch
    minibatches_per_epoch: ClassVar[int | None] = None
    supports_multi_agent = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.count_steps_by == "agent_steps":
            self.budget_counter = "num_agent_steps_sampled"
        if self.normalize_rewards and self.multi_agent:
            raise ValueError("normalize_rewards with a multi-agent (PettingZoo) env is not supported yet "
                             "(normalize_observations is)")
        if self.multi_agent:
            self.default_datamodule = MultiAgentRolloutDataModule(
                self.env_settings(), self.policy_mapping_fn, self.rollout_fragment_length, self.count_steps_by,
                self.sampling_device,
            )
        else:
            self.default_datamodule = RolloutDataModule(
                self.env_settings(), self.rollout_fragment_length, self.sampling_device,
                return_discount=self.gamma if self.normalize_rewards else None,
            )
        self.iterations_per_step = int(self.iterations_per_step)
        self.default_datamodule.requested_iterations_per_step = self.iterations_per_step
        self.train_batch_size = self.default_datamodule.train_batch_size
        sgd_minibatch_size = self.sgd_minibatch_size
        if sgd_minibatch_size is not None and sgd_minibatch_size > self.train_batch_size:
            raise ValueError(
                f"sgd_minibatch_size ({sgd_minibatch_size}) is larger than the train batch "
                f"(num_envs * rollout_fragment_length = {self.train_batch_size})"
            )
        self.standardize_fields = tuple(self.standardize_fields)
        self.sgd_minibatch_size = sgd_minibatch_size or self.train_batch_size  # None: the whole batch
        self.num_minibatches = math.ceil(self.train_batch_size / self.sgd_minibatch_size)
        T, L = self.rollout_fragment_length, self.max_seq_len
        if L is not None and (L < 1 or T % L):  # each env's fragment is cut into sequences: no padding
            raise ValueError(f"max_seq_len ({L}) must divide rollout_fragment_length ({T}): each env's fragment "
                             f"is cut into sequences of that length")
        if L is not None and L > self.sgd_minibatch_size:
            raise ValueError(f"max_seq_len ({L}) is larger than sgd_minibatch_size ({self.sgd_minibatch_size}): "
                             f"a minibatch holds whole sequences")
        self.build_policies(RecurrentActorCritic if self.use_lstm else ActorCritic, **self.network_settings(),
                            **self.recurrent_settings(), normalize_observations=self.normalize_observations,
                            observation_clip=self.observation_clip, normalize_rewards=self.normalize_rewards,
                            reward_clip=self.reward_clip)

    @property
    def policy(self) -> ActorCritic:
        return self.policies[DEFAULT_POLICY_ID]

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        # Adam with eps=1e-5 as in the PPO reference implementations; fused kernels on CPU too.
        return torch.optim.Adam(params, lr=self.lr, eps=1e-5, fused=True)

    def configure_optimizers(self) -> Any:
        return [self.make_optimizer(self.policies[pid].parameters()) for pid in self.policies_to_train]

    # ------------------------------------------------------------ post-processing
    @torch.no_grad()
    def postprocess(self, batch: MultiAgentBatch) -> MultiAgentBatch:
        """GAE advantages and value targets for each policy's rows, from what the sampler gave:
        a time-major fragment (``postprocess_fragment``) or, multi-agent, each agent's
        trajectory segments (``postprocess_segments``). In place: callbacks after the step see
        the rows trained on. Values are read in eval mode, as they were sampled."""
        post = self.postprocess_segments if self.multi_agent else self.postprocess_fragment
        for policy_id, rows in batch.policy_batches.items():
            with eval_mode(self.policies[policy_id]):
                batch.policy_batches[policy_id] = post(policy_id, rows)
        return batch

    def postprocess_fragment(self, policy_id: str, fragment: SampleBatch) -> SampleBatch:
        """A time-major ``[T, N]`` fragment (``RolloutDataModule.fragment``) as a training batch:
        GAE from the value of ``bootstrap_obs`` (a recurrent policy's from its ``bootstrap_*``
        inputs), then the reset steps of next-step autoreset (``valid`` False) dropped; a
        recurrent policy's rows are cut into ``max_seq_len`` sequences instead, reset steps masked."""
        policy = self.policies[policy_id]
        rollout = dict(fragment)
        valid, last_obs = rollout.pop(SampleBatch.VALID), rollout.pop(SampleBatch.BOOTSTRAP_OBS)
        inputs = {k[len(BOOTSTRAP):]: rollout.pop(k) for k in [k for k in rollout if k.startswith(BOOTSTRAP)]}
        if policy.return_rms is not None:  # normalize_rewards: scaled by the std of the discounted return
            rollout[SampleBatch.REWARDS] = policy.return_rms.scale_only(rollout[SampleBatch.REWARDS]).float()
        bootstrap = policy.value(last_obs, **inputs)
        if self.max_seq_len is None:
            return SampleBatch(gae_batch(rollout, bootstrap, valid, self.gamma, self.lambda_))
        return SampleBatch(gae_sequences(rollout, bootstrap, valid, self.gamma, self.lambda_, self.max_seq_len))

    def postprocess_segments(self, policy_id: str, segments: SampleBatch) -> SampleBatch:
        """A policy's multi-agent rows (``MultiAgentRolloutDataModule``): each agent's trajectory
        segments one after another, ``segment_lengths [S]`` long, with GAE along each from the
        value of its ``bootstrap_obs`` where ``bootstrap_mask`` (the segment was cut, not ended)."""
        rows = dict(segments)
        lengths = rows.pop(SEGMENT_LENGTHS).tolist()
        last_obs, cut = rows.pop(SampleBatch.BOOTSTRAP_OBS), rows.pop(BOOTSTRAP_MASK)
        bootstrap = torch.where(cut, self.policies[policy_id].value(last_obs), 0.0)
        rows[SampleBatch.ADVANTAGES], rows[SampleBatch.VALUE_TARGETS] = gae_segments(
            rows[SampleBatch.REWARDS], rows[SampleBatch.VF_PREDS].float(), rows[SampleBatch.TERMINATEDS], lengths,
            bootstrap, self.gamma, self.lambda_)
        return SampleBatch(rows)

    def policy_forward(self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None) -> tuple:
        """``(action distribution, values)`` over a minibatch's rows. A recurrent policy's rows
        are ``max_seq_len`` time-major steps of whole sequences, run from each sequence's state
        recorded while sampling."""
        policy = self.policies[policy_id]
        if self.max_seq_len is None:
            return call(policy, params, batch[SampleBatch.OBS])

        def time_major(x: Tensor) -> Tensor:
            return x.reshape(self.max_seq_len, -1, *x.shape[1:])

        return call(policy, params, time_major(batch[SampleBatch.OBS]), time_major(batch[STATE_IN])[0],
                    time_major(batch[EPISODE_STARTS]), time_major(batch[PREV_ACTIONS]),
                    time_major(batch[PREV_REWARDS]))

    # ------------------------------------------------------------ minibatch SGD
    def loss(
        self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None = None,
        scalars: dict[str, Any] | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        """The algorithm's loss on one minibatch and the stats to report. ``params`` replaces
        the policy's parameters (the compiled step's functional call, see ``update.call``);
        ``scalars`` defaults to ``loss_scalars``."""
        raise NotImplementedError

    def loss_scalars(self, policy_id: str) -> dict[str, float]:
        """This iteration's schedule values the loss reads (tensors in the compiled step, so a
        schedule never recompiles)."""
        return {}

    def minibatch_plan(self, rows: int, policy_id: str = DEFAULT_POLICY_ID) -> tuple[int, int]:
        """``(minibatches per epoch, padded minibatch size)`` for a policy batch of ``rows``.
        Single-agent: fixed by the train batch (the rollout drops only reset steps). Multi-agent,
        where a policy's rows vary with its agents: ``ceil(rows / sgd_minibatch_size)`` of at
        most ``sgd_minibatch_size``; where an algorithm fixes ``minibatches_per_epoch`` (A2C),
        minibatches of ``rows / minibatches_per_epoch``, or with ``compile`` of the most rows
        the policy can have (one shape: one static graph, not one per row count)."""
        if not self.multi_agent:
            return self.num_minibatches, -(-self.train_batch_size // self.num_minibatches)
        if self.minibatches_per_epoch is not None:
            if self.compile:
                rows = max(rows, self.most_policy_rows(policy_id))
            return self.minibatches_per_epoch, -(-rows // self.minibatches_per_epoch)
        return max(1, math.ceil(rows / self.sgd_minibatch_size)), self.sgd_minibatch_size

    def most_policy_rows(self, policy_id: str) -> int:
        """The most rows one iteration can give ``policy_id``: each of its agents acts at most once
        per env step (counting agent steps, the envs stop within one step of the train batch)."""
        dm = self.default_datamodule
        if getattr(dm, "count_steps_by", "env_steps") == "agent_steps":
            return self.train_batch_size + dm.num_envs * len(self.policy_agents[policy_id])
        return self.train_batch_size * len(self.policy_agents[policy_id])

    def learn_on_batch(self, batch: MultiAgentBatch, builder: LearnerInfoBuilder) -> int:
        counts = [batch.policy_batches[p].count if p in batch.policy_batches else 0 for p in self.policies_to_train]
        plan_rows = counts
        if self.multi_agent and self.trainer.world_size > 1:
            # A policy's rows differ between ranks (its agents come and go): every rank plans its
            # minibatches from the largest count, so all take the same steps (and all-reduces);
            # a rank short of rows steps on masked-out padding.
            local = torch.tensor(counts, dtype=torch.float64, device=self.device)
            plan_rows = [int(c) for c in all_reduce_max(local).tolist()]
        trained = 0
        for policy_id, count, rows in zip(self.policies_to_train, counts, plan_rows):
            if rows == 0:
                continue
            policy_batch = batch.policy_batches[policy_id] if count else self.placeholder_batch(policy_id)
            returns = policy_batch.pop(DISCOUNTED_RETURNS, None)  # normalize_rewards' statistics only
            obs_rms = self.policies[policy_id].obs_rms
            first = obs_rms is not None and not obs_rms.count
            if first:  # nothing to stay consistent with yet: the first batch's statistics apply at once
                self.update_normalization(policy_id, policy_batch, returns)
            self.learn_on_policy_batch(policy_id, policy_batch, builder, rows, placeholder=not count)
            if not first:
                self.update_normalization(policy_id, policy_batch, returns)
            # a recurrent policy's sequences keep the reset steps, masked: they are not trained on
            trained += int(policy_batch[SampleBatch.MASK].sum()) if self.max_seq_len and count else count
        return trained

    @torch.no_grad()
    def update_normalization(self, policy_id: str, batch: SampleBatch, returns: Tensor | None) -> None:
        """Merge the batch's observations (and discounted returns) into the policy's running
        statistics, summed over DDP ranks. After the batch was learned on: the next rollout and
        its update then read the same statistics, as the batch's log-probs assume."""
        policy = self.policies[policy_id]
        reduce = sum_over_ranks if self.trainer.world_size > 1 else None
        mask = batch.get(SampleBatch.MASK)  # a recurrent batch's reset rows, a placeholder's one row
        if policy.obs_rms is not None:
            policy.obs_rms.update(preprocess_obs(batch[SampleBatch.OBS], policy.observation_space), mask, reduce)
        if policy.return_rms is not None:
            policy.return_rms.update(returns, mask, reduce)

    def placeholder_batch(self, policy_id: str) -> SampleBatch:
        """What a DDP rank without rows of a policy steps on: one masked-out row."""
        return placeholder_rollout(self.policies[policy_id], self.policy_spaces[policy_id][0], self.device)

    def learn_on_policy_batch(self, policy_id: str, batch: SampleBatch, builder: LearnerInfoBuilder,
                              plan_rows: int | None = None, placeholder: bool = False) -> None:
        """``num_sgd_iter`` epochs of shuffled minibatches: loss, backward, clip, step.
        ``plan_rows``: the rows the minibatches are planned for (multi-agent DDP: the largest
        count over the ranks); ``placeholder``: ``batch`` stands in for no rows, every
        minibatch masked out."""
        # Under DDP, standardized over the global batch (one all-reduce of three numbers per field),
        # so N ranks of B rows train like one process with N * B rows (a placeholder adds none).
        standardize(batch, self.standardize_fields, batch.get(SampleBatch.MASK) if self.max_seq_len else None,
                    sum_over_ranks if self.trainer.world_size > 1 else None, placeholder)
        optimizer = self.policy_optimizer(policy_id)
        lr = self.apply_lr(optimizer)
        step = self.update_step(f"loss/{policy_id}", dict(self.policies[policy_id].named_parameters()), optimizer,
                                policy_loss(self.loss, policy_id), self.grad_clip)
        scalars = self.loss_scalars(policy_id)
        num_minibatches, size = self.minibatch_plan(batch.count if plan_rows is None else plan_rows, policy_id)
        pad = step.compiled or (plan_rows is not None and plan_rows != batch.count)
        if self.max_seq_len:
            epoch = partial(shuffled_sequences, batch, num_minibatches, self.max_seq_len, self.shuffle_generator,
                            self.device)
        else:
            epoch = partial(shuffled_rows, batch, num_minibatches, size, self.shuffle_generator, self.device, pad,
                            placeholder)
        for _ in range(self.num_sgd_iter):
            for minibatch in epoch():
                stats = step(minibatch, scalars)
                self.counters["num_grad_updates"] += 1
                builder.add_learn_on_batch_results({LEARNER_STATS_KEY: {**stats, "cur_lr": lr}}, policy_id)
