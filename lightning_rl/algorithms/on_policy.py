"""Shared machinery of the policy-gradient methods: GAE post-processing and minibatch SGD."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor

from lightning_rl.algorithms.base import RLModule, Schedule, check_gamma, check_positive, resolve_schedule
from lightning_rl.batch import DEFAULT_POLICY_ID, SampleBatch
from lightning_rl.data.envs import EnvSpec
from lightning_rl.data.rollout import RolloutDataModule
from lightning_rl.functional import gae, moments, standardized
from lightning_rl.learner_info import LEARNER_STATS_KEY, LearnerInfoBuilder
from lightning_rl.nn.models import ActorCritic


class OnPolicyModule(RLModule):
    """Actor-critic learner on rollouts: GAE, standardized fields, minibatch SGD.

    Each iteration's batch of ``num_envs * rollout_fragment_length`` env steps is
    shuffled and split into ``ceil(train_batch_size / sgd_minibatch_size)`` minibatches,
    ``num_sgd_iter`` times over. The count of minibatches is fixed by the hyperparameters,
    not by how many reset steps the rollout dropped, so every DDP rank takes the same
    number of optimizer steps.
    """

    def __init__(
        self,
        *,
        env: EnvSpec,
        num_envs: int,
        rollout_fragment_length: int,
        total_env_steps: int | None,
        iterations_per_epoch: int,
        seed: int | None,
        vectorization: str,
        sampling_device: str,
        num_cpu_threads: int | None,
        cpu_affinity: bool,
        lr: float,
        lr_schedule: Schedule,
        gamma: float,
        lambda_: float,
        num_sgd_iter: int,
        sgd_minibatch_size: int,
        grad_clip: float | None,
        standardize_fields: Sequence[str],
        hiddens: Sequence[int],
        activation: str,
        vf_share_layers: bool,
        log_std_init: float,
    ) -> None:
        super().__init__(
            env=env, num_envs=num_envs, total_env_steps=total_env_steps, iterations_per_epoch=iterations_per_epoch,
            seed=seed, vectorization=vectorization, sampling_device=sampling_device, num_cpu_threads=num_cpu_threads,
            cpu_affinity=cpu_affinity,
        )
        check_positive(lr=lr, grad_clip=grad_clip, rollout_fragment_length=rollout_fragment_length)
        check_positive(num_sgd_iter=num_sgd_iter, sgd_minibatch_size=sgd_minibatch_size)
        check_gamma(gamma)
        if not 0.0 <= lambda_ <= 1.0:
            raise ValueError(f"lambda_ must be in [0, 1], got {lambda_}")
        self.train_batch_size = num_envs * rollout_fragment_length
        if sgd_minibatch_size > self.train_batch_size:
            raise ValueError(
                f"sgd_minibatch_size ({sgd_minibatch_size}) is larger than the train batch "
                f"(num_envs * rollout_fragment_length = {self.train_batch_size})"
            )
        self.num_sgd_iter = num_sgd_iter
        self.num_minibatches = math.ceil(self.train_batch_size / sgd_minibatch_size)
        self.lr_points = resolve_schedule("lr_schedule", lr_schedule, lr, total_env_steps)
        with torch.random.fork_rng():
            if seed is not None:
                torch.manual_seed(seed)
            self.policies[DEFAULT_POLICY_ID] = ActorCritic(
                self.observation_space, self.action_space, hiddens, activation, vf_share_layers, log_std_init
            )

    @property
    def policy(self) -> ActorCritic:
        return self.policies[DEFAULT_POLICY_ID]

    def build_datamodule(self) -> pl.LightningDataModule:
        hp = self.hparams
        return RolloutDataModule(
            hp.env, hp.num_envs, hp.rollout_fragment_length, hp.vectorization, hp.seed,
            hp.iterations_per_epoch, hp.sampling_device,
        )

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        # Adam with eps=1e-5 as in the PPO reference implementations; fused kernels on CPU too.
        return torch.optim.Adam(params, lr=self.hparams.lr, eps=1e-5, fused=True)

    def configure_optimizers(self) -> Any:
        return [self.make_optimizer(self.policies[pid].parameters()) for pid in self.policies_to_train]

    # ------------------------------------------------------------ post-processing
    @torch.no_grad()
    def postprocess_rollout(
        self, policy_id: str, rollout: SampleBatch, last_obs: Tensor, valid: Tensor
    ) -> SampleBatch:
        """Add GAE advantages and value targets, then flatten and drop the reset steps."""
        policy = self.sampling_policy(policy_id, rollout[SampleBatch.OBS].device)
        bootstrap = policy.value(last_obs.to(rollout[SampleBatch.OBS].device))
        advantages, targets = gae(
            rollout[SampleBatch.REWARDS],
            rollout[SampleBatch.VF_PREDS],
            bootstrap,
            rollout[SampleBatch.TERMINATEDS],
            rollout[SampleBatch.TRUNCATEDS],
            self.hparams.gamma,
            self.hparams.lambda_,
        )
        rollout[SampleBatch.ADVANTAGES] = advantages
        rollout[SampleBatch.VALUE_TARGETS] = targets
        return super().postprocess_rollout(policy_id, rollout, last_obs, valid)

    # ------------------------------------------------------------ minibatch SGD
    def loss(self, policy_id: str, batch: SampleBatch) -> tuple[Tensor, dict[str, Any]]:
        """The algorithm's loss on one minibatch and the stats to report."""
        raise NotImplementedError

    def learn_on_policy_batch(self, policy_id: str, batch: SampleBatch, builder: LearnerInfoBuilder) -> None:
        for field in self.hparams.standardize_fields:
            # Under DDP, standardize over the global batch (one all-reduce of three numbers),
            # so N ranks of B rows train like one process with N * B rows.
            stats = self.sum_over_ranks(moments(batch[field])) if self.trainer.world_size > 1 else None
            batch[field] = standardized(batch[field], moments=stats)
        optimizer = self.policy_optimizer(policy_id)
        lr = self.apply_lr_schedule(optimizer)
        for _ in range(self.num_sgd_iter):
            order = torch.randperm(batch.count, generator=self.shuffle_generator).to(self.device)
            for rows in order.tensor_split(self.num_minibatches):
                loss, stats = self.loss(policy_id, batch.select(rows))
                optimizer.zero_grad(set_to_none=True)
                self.manual_backward(loss)
                if self.hparams.grad_clip is not None:
                    self.clip_gradients(optimizer, self.hparams.grad_clip, gradient_clip_algorithm="norm")
                optimizer.step()
                self.counters["num_grad_updates"] += 1
                builder.add_learn_on_batch_results({LEARNER_STATS_KEY: {**stats, "cur_lr": lr}}, policy_id)
