"""IMPALA (Espeholt et al. 2018, https://arxiv.org/abs/1802.01561): an actor-critic learner fed
by asynchronous sampler workers, its policy lag corrected by V-trace."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lightning_rl.algorithms.base import Algorithm
from lightning_rl.algorithms.common import ActorCriticSettings, LearnerQueue, RecurrentSettings, SamplerWorkers
from lightning_rl.batch import (
    BOOTSTRAP,
    EPISODE_STARTS,
    PREV_ACTIONS,
    PREV_REWARDS,
    STATE_IN,
    MultiAgentBatch,
    SampleBatch,
)
from lightning_rl.data.async_sampling import AsyncSamplingDataModule
from lightning_rl.functional import explained_variance, masked_mean, vtrace
from lightning_rl.learner_info import LEARNER_STATS_KEY, LearnerInfoBuilder
from lightning_rl.nn.models import ActorCritic
from lightning_rl.nn.recurrent import RecurrentActorCritic
from lightning_rl.settings import Schedule, group_of, positive, setting, settings
from lightning_rl.update import call, policy_loss


@settings
class IMPALA(ActorCriticSettings, RecurrentSettings, SamplerWorkers, LearnerQueue, Algorithm):
    """IMPALA: one gradient step per training batch of time-major fragments from sampler workers.

    Loss, over the real (non-reset) rows of a ``[T, B]`` batch::

        pg_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy,
        pg_loss = -mean(log pi(a|s) * pg_advantage),  vf_loss = 0.5 * mean((V(s) - vs)^2)

    with ``vs`` and ``pg_advantage`` from V-trace (``functional.vtrace``) between the behaviour
    policy that sampled each fragment and the current one. Means rather than the reference's
    sums: Adam's step does not depend on the scale, and a loss does not grow with the batch.

    With ``use_lstm`` each fragment column is one sequence, run from the state recorded at its first
    step through its bootstrap step. Multi-agent (a PettingZoo env): each policy's batch has a
    time-major column per (env, agent mapped to it).
    """

    num_envs: int = 4
    """envs per sampler worker (of the learner process with ``num_workers=0``)."""
    total_env_steps: int | None = 500_000
    iterations_per_epoch: int = 20
    lr: float = 2e-3
    """Adam's learning rate (one step per batch: lower rates leave the value function unfit for long)."""
    lr_schedule: Schedule = None
    """``linear`` to 0 at ``total_env_steps`` (default if set), ``constant`` or ``[[env_step, lr], ...]``."""
    grad_clip: float | None = 40.0
    max_seq_len: int | None = None
    """with ``use_lstm``, backpropagate through at most this many steps; ``None``: the whole fragment."""
    rollout_fragment_length: int = 50
    """env steps per env in one worker fragment (the time axis of the ``[T, B]`` batch)."""
    lambda_: float = 1.0
    """V-trace's trace decay in [0, 1] (1: the paper's; lower trades bias for variance)."""
    entropy_coeff: float = 0.01
    train_batch_size: int = 500
    """env steps per training batch (whole fragments, rounded up)."""
    num_sgd_iter: int = 1
    """training iterations each batch is used for (the reference's ``num_passes``)."""
    minibatch_buffer_size: int = 1
    """batches handed out round robin, each ``num_sgd_iter`` times."""
    sgd_minibatch_size: int | None = None
    """env steps per gradient step, in whole env columns shuffled each pass (``None``: one step)."""
    vtrace_clip_rho_threshold: float | None = setting(default=1.0, check=positive)
    """V-trace's clip of the importance ratio in the value targets (``None``: no clip)."""
    vtrace_clip_pg_rho_threshold: float | None = setting(default=1.0, check=positive)
    """V-trace's clip of the importance ratio in the policy gradient (``None``: no clip)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        T = self.rollout_fragment_length
        self.default_datamodule = AsyncSamplingDataModule(
            self.env_settings(), T, self.train_batch_size, group_of(SamplerWorkers, self),
            group_of(LearnerQueue, self), num_sgd_iter=self.num_sgd_iter,
            minibatch_buffer_size=self.minibatch_buffer_size,
            **(dict(policy_mapping_fn=self.policy_mapping_fn, policy_agents=self.policy_agents,
                    policy_spaces=self.policy_spaces) if self.multi_agent else {}),
        )
        sgd_minibatch_size = self.sgd_minibatch_size
        if sgd_minibatch_size is not None:
            batch = self.default_datamodule.train_batch_size
            if sgd_minibatch_size % T or batch % sgd_minibatch_size:
                raise ValueError(
                    f"sgd_minibatch_size ({sgd_minibatch_size}) must be a multiple of rollout_fragment_length ({T}) "
                    f"that divides the train batch ({batch} env steps): minibatches are whole env columns"
                )
        self.clip_rho, self.clip_pg_rho = self.vtrace_clip_rho_threshold, self.vtrace_clip_pg_rho_threshold
        if self.max_seq_len is not None and (self.max_seq_len < 1 or T % self.max_seq_len):
            raise ValueError(f"max_seq_len ({self.max_seq_len}) must divide rollout_fragment_length ({T})")
        self.build_policies(RecurrentActorCritic if self.use_lstm else ActorCritic, **self.network_settings(),
                            **self.recurrent_settings())

    supports_multi_agent = True  # time-major columns per (env, agent): MultiAgentFragmentSampler
    lr_schedule_unset = "linear"  # with a constant rate the greedy policy swings to the end of a budget

    def configure_optimizers(self) -> Any:
        return [torch.optim.Adam(self.policies[pid].parameters(), lr=self.lr, fused=True)
                for pid in self.policies_to_train]

    def loss(
        self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None = None,
        scalars: dict[str, Any] | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        """The IMPALA loss on one time-major batch (``[T, B]`` columns and ``bootstrap_obs [B]``)."""
        dist, logp, values, bootstrap_value, mask = self.time_major_forward(policy_id, batch, params)
        vs, pg_advantages = self.vtrace_targets(batch, logp, values, bootstrap_value)

        pg_loss = -masked_mean((logp * pg_advantages).flatten(), mask)
        vf_loss = 0.5 * masked_mean((values - vs).pow(2).flatten(), mask)
        entropy = masked_mean(dist.entropy()[: mask.numel()], mask)
        total_loss = pg_loss + self.vf_loss_coeff * vf_loss - self.entropy_coeff * entropy
        return total_loss, self.loss_stats(batch, mask, logp, values, vs, total_loss=total_loss, pg_loss=pg_loss,
                                           vf_loss=vf_loss, entropy=entropy)

    def time_major_forward(
        self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None,
        policy: nn.Module | None = None,
    ) -> tuple[Any, Tensor, Tensor, Tensor, Tensor]:
        """One forward over every ``[T, B]`` observation and the ``[B]`` bootstrap ones: the action
        distribution (over all ``T * B + B`` rows), ``logp [T, B]`` of the taken actions, ``values
        [T, B]``, ``bootstrap_value [B]`` and the ``[T * B]`` 0/1 mask of real (non-reset) rows.
        ``policy`` defaults to the learned one (APPO passes its target policy)."""
        actions = batch[SampleBatch.ACTIONS]
        T, B = actions.shape[:2]
        n = T * B
        policy = self.policies[policy_id] if policy is None else policy
        if self.use_lstm:  # the fragment's steps, then the bootstrap step, from the recorded state
            def steps(key: str) -> Tensor:
                return torch.cat([batch[key], batch[BOOTSTRAP + key][None]])

            dist, values_all = call(policy, params, steps(SampleBatch.OBS), batch[STATE_IN][0], steps(EPISODE_STARTS),
                                    steps(PREV_ACTIONS), steps(PREV_REWARDS), detach_every=self.max_seq_len)
        else:
            obs = torch.cat([batch[SampleBatch.OBS].flatten(0, 1), batch[SampleBatch.BOOTSTRAP_OBS]])
            dist, values_all = call(policy, params, obs)
        # the bootstrap rows' actions are dummies (their log-probs are cut off)
        logp = dist.log_prob(torch.cat([actions.flatten(0, 1), actions[0]]))[:n].reshape(T, B)
        mask = batch[SampleBatch.VALID].flatten().to(values_all.dtype)  # reset rows of next-step autoreset count 0
        return dist, logp, values_all[:n].reshape(T, B), values_all[n:], mask

    def vtrace_targets(
        self, batch: SampleBatch, target_logp: Tensor, values: Tensor, bootstrap_value: Tensor
    ) -> tuple[Tensor, Tensor]:
        """V-trace ``(vs, pg_advantages)`` from the batch's behaviour policy to ``target_logp``
        (targets: no gradient flows through them). On reset rows, whose actions the env ignored,
        the ratio is set to 1: an unbounded one there would turn the masked loss into ``inf * 0``."""
        target_logp = target_logp.detach()
        behaviour_logp = torch.where(batch[SampleBatch.VALID], batch[SampleBatch.ACTION_LOGP], target_logp)
        return vtrace(
            behaviour_logp, target_logp, batch[SampleBatch.REWARDS], values.detach(),
            bootstrap_value.detach(), batch[SampleBatch.TERMINATEDS], batch[SampleBatch.TRUNCATEDS],
            self.gamma, self.clip_rho, self.clip_pg_rho, self.lambda_,
        )

    @torch.no_grad()
    def loss_stats(self, batch: SampleBatch, mask: Tensor, logp: Tensor, values: Tensor, vs: Tensor,
                   **terms: Tensor) -> dict[str, Tensor]:
        """The loss terms, value-function fit and behaviour-to-current ratios, detached."""
        rho = torch.exp(torch.where(batch[SampleBatch.VALID], logp - batch[SampleBatch.ACTION_LOGP], 0.0)).flatten()
        return {
            **{name: term.detach() for name, term in terms.items()},
            "vf_explained_var": explained_variance(values.flatten(), vs.flatten(), mask),
            "mean_rho": masked_mean(rho, mask),
            "max_rho": (rho * mask).max(),
        }

    def learn_on_batch(self, batch: MultiAgentBatch, builder: LearnerInfoBuilder) -> int:
        trained = 0
        for policy_id in self.policies_to_train:
            policy_batch = batch.policy_batches.get(policy_id)
            if policy_batch is None:
                continue
            optimizer = self.policy_optimizer(policy_id)
            lr = self.apply_lr(optimizer)
            step = self.update_step(f"loss/{policy_id}", dict(self.policies[policy_id].named_parameters()),
                                    optimizer, policy_loss(self.loss, policy_id), self.grad_clip)
            policy_batch = policy_batch.to(self.device)
            for minibatch in self.env_column_minibatches(policy_batch):
                stats = step(minibatch, {})
                self.counters["num_grad_updates"] += 1
                builder.add_learn_on_batch_results({LEARNER_STATS_KEY: {**stats, "cur_lr": lr}}, policy_id)
            # rows trained: every env step (reset rows too), or multi-agent the agents' steps
            valid = policy_batch[SampleBatch.VALID]
            trained += int(valid.sum() if self.multi_agent else valid.numel())
        return trained

    def env_column_minibatches(self, batch: SampleBatch) -> list[SampleBatch]:
        """The batch's env columns shuffled and cut into minibatches of ``sgd_minibatch_size`` env
        steps (whole columns: V-trace runs along time); the whole batch without a size."""
        B = batch[SampleBatch.VALID].shape[1]
        if self.sgd_minibatch_size is None:
            return [batch]
        columns = self.sgd_minibatch_size // batch[SampleBatch.VALID].shape[0]
        order = torch.randperm(B, generator=self.shuffle_generator).to(batch[SampleBatch.VALID].device)
        return [SampleBatch({k: v[:, cols] if v.dim() > 1 and not k.startswith(BOOTSTRAP) else v[cols]
                             for k, v in batch.items()}) for cols in order.split(columns)]

