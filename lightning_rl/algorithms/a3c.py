"""Asynchronous Advantage Actor-Critic (Mnih et al. 2016, https://arxiv.org/abs/1602.01783):
sampler workers compute gradients on their own rollouts; the learner applies each as it comes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from lightning_rl.algorithms.base import Algorithm
from lightning_rl.algorithms.common import ActorCriticSettings, SamplerWorkers
from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch
from lightning_rl.data.async_gradients import GRADS, A3CDataModule
from lightning_rl.learner_info import LEARNER_STATS_KEY, LearnerInfoBuilder
from lightning_rl.nn.models import ActorCritic
from lightning_rl.nonfinite import NonFiniteLossError
from lightning_rl.policies import PolicyMapping
from lightning_rl.settings import group_of, one_of, setting, settings


@settings
class A3C(ActorCriticSettings, SamplerWorkers, Algorithm):
    """A3C: each training iteration applies the gradient packets that arrived from the sampler
    workers (at least one, at most one per worker), each with its own optimizer step.

    A worker samples ``num_envs * rollout_fragment_length`` env steps with its copy of the
    policy, computes the gradient of A2C's loss on them (``functional.a2c_loss``: ``pg_loss +
    vf_loss_coeff * vf_loss - entropy_coeff * entropy`` on GAE advantages) and sends it; the
    learner sets it as the parameters' gradient, clips it to ``grad_clip`` and steps its own
    optimizer. There is no ``manual_backward`` on the learner: the backward passes ran in the
    workers. The worker then reads the new weights (its own update included) before its next
    rollout; ``perf/policy_lag_*`` is the staleness: learner iterations (not optimizer steps:
    an iteration applies every packet already there, one step each) since the weights a
    gradient was computed with. ``num_workers=0`` computes each gradient in the learner
    process (synchronous: A2C on one rollout per step).

    Not supported: Lightning DDP (the packets are one learner's stream; a clear error says
    so) and ``compile`` (there is no loss on the learner to compile). Resume restores the
    counters, policy and optimizer; the workers start fresh episodes.
    """

    num_envs: int = 8
    """envs per worker (of the learner process with ``num_workers=0``)."""
    total_env_steps: int | None = 500_000
    iterations_per_epoch: int = 100
    # no loss runs on the learner to compile
    compile: bool = setting(default=False, init=False)  # type: ignore[assignment]
    lr: float = 7e-4
    """learning rate of the learner's ``optimizer``."""
    grad_clip: float | None = 0.5
    """maximum global norm of each gradient packet before its step (``None``: no clipping)."""
    # the packets are one policy's
    policies: Sequence[str] | dict[str, dict[str, Any]] | None = setting(default=None, init=False)  # type: ignore[assignment]
    policy_mapping_fn: PolicyMapping | None = setting(default=None, init=False)
    policies_to_train: Sequence[str] | None = setting(default=None, init=False)
    rollout_fragment_length: int = 5
    """env steps per env behind each gradient packet a worker sends."""
    lambda_: float = 1.0
    num_workers: int = 2
    """worker processes that compute gradients; 0 computes them in the learner process."""
    optimizer: Literal["rmsprop", "adam"] = setting(default="rmsprop", check=one_of("rmsprop", "adam"))
    """the learner's: ``rmsprop`` (alpha 0.99, eps 1e-5, as ``A2C``) or ``adam``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.default_datamodule = A3CDataModule(
            self.env_settings(), self.rollout_fragment_length, gamma=self.gamma, lambda_=self.lambda_,
            vf_loss_coeff=self.vf_loss_coeff, entropy_coeff=self.entropy_coeff, workers=group_of(SamplerWorkers, self),
        )
        with torch.random.fork_rng():
            if self.seed is not None:
                torch.manual_seed(self.seed)
            self.policies[DEFAULT_POLICY_ID] = ActorCritic(self.observation_space, self.action_space,
                                                           **self.network_settings())

    def configure_optimizers(self) -> Any:
        params = self.policies[DEFAULT_POLICY_ID].parameters()
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        return torch.optim.RMSprop(params, lr=self.lr, alpha=0.99, eps=1e-5)

    def on_fit_start(self) -> None:
        if self.trainer.world_size > 1:
            raise RuntimeError(
                "A3C does not run under DDP: its learner applies one stream of gradient packets as they arrive. "
                "Use more sampler workers (num_workers) on one learner, or IMPALA/APPO for DDP"
            )
        super().on_fit_start()

    def learn_on_batch(self, batch: MultiAgentBatch, builder: LearnerInfoBuilder) -> int:
        policy_id = DEFAULT_POLICY_ID
        optimizer = self.policy_optimizer(policy_id)
        lr = self.apply_lr(optimizer)
        params = list(self.policies[policy_id].parameters())
        packets = batch.policy_batches[policy_id][GRADS]
        for flat, worker, worker_stats in zip(packets, batch.info["workers"], batch.info["worker_stats"]):
            if not torch.isfinite(flat).all():
                raise NonFiniteLossError(
                    f"non-finite gradient from sampler worker {worker} at iteration "
                    f"{self.counters['num_iterations']} (its loss terms: {worker_stats}); the weights were not "
                    "stepped with it"
                )
            flat = flat.to(self.device)
            offset = 0
            for p in params:
                p.grad = flat[offset: offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            stats: dict[str, Any] = {}
            if self.grad_clip is not None:
                stats["grad_gnorm"] = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
            optimizer.step()
            self.counters["num_grad_updates"] += 1
            builder.add_learn_on_batch_results(
                {LEARNER_STATS_KEY: {**worker_stats, **stats, "cur_lr": lr}}, policy_id
            )
        return int(batch.info["rows"])
