"""Shared machinery of the policy-gradient methods: GAE post-processing and minibatch SGD."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor

from lightning_rl.algorithms.base import RLModule, check_gamma, check_positive
from lightning_rl.batch import DEFAULT_POLICY_ID, SampleBatch
from lightning_rl.data.envs import EnvSpec
from lightning_rl.data.rollout import RolloutDataModule
from lightning_rl.functional import gae, piecewise_linear, standardized
from lightning_rl.learner_info import LEARNER_STATS_KEY, LearnerInfoBuilder
from lightning_rl.nn.models import ActorCritic

Schedule = str | Sequence[Sequence[float]] | None


def resolve_schedule(
    name: str, schedule: Schedule, initial: float, total_env_steps: int | None
) -> list[tuple[float, float]] | None:
    """``"constant"``/``None`` -> no schedule; ``"linear"`` -> ``initial`` down to 0 over
    ``total_env_steps``; a list of ``[env_step, value]`` points -> piecewise linear."""
    if schedule is None or schedule == "constant":
        return None
    if schedule == "linear":
        if total_env_steps is None:
            raise ValueError(f"{name}='linear' decays to 0 over total_env_steps, which is None")
        return [(0.0, initial), (float(total_env_steps), 0.0)]
    if isinstance(schedule, str):
        raise ValueError(f"{name} must be 'constant', 'linear' or a list of [env_step, value], got {schedule!r}")
    points = [(float(t), float(v)) for t, v in schedule]
    if not points or any(b[0] <= a[0] for a, b in pairwise(points)):
        raise ValueError(f"{name} points must be non-empty with increasing env steps, got {schedule!r}")
    return points


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

    def current(self, points: list[tuple[float, float]] | None, constant: float) -> float:
        """Value of a schedule at the env steps sampled so far (global over ranks)."""
        if points is None:
            return constant
        return piecewise_linear(points, self.global_counters["num_env_steps_sampled"])

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
            batch[field] = standardized(batch[field])
        optimizer = self.policy_optimizer(policy_id)
        lr = self.current(self.lr_points, self.hparams.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
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
