"""Shared machinery of the replay-based methods: the replay DataModule, gradient steps, priorities."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from lightning_rl.algorithms.base import RLModule, Schedule, check_gamma, check_positive, resolve_schedule
from lightning_rl.batch import MultiAgentBatch, SampleBatch
from lightning_rl.data.envs import EnvSpec
from lightning_rl.data.replay import ReplayDataModule
from lightning_rl.learner_info import LearnerInfoBuilder


class OffPolicyModule(RLModule):
    """Learner on replay batches: ``num_gradient_steps`` updates per iteration, each on its
    own ``train_batch_size`` slice of the batch; the ``td_error`` of every update goes back
    to the replay buffer as priorities after the step.

    Subclasses implement ``update(policy_id, batch) -> results`` (one gradient step; results
    hold ``learner_stats`` and ``td_error``) and ``on_iteration_end`` for target networks.
    """

    def __init__(
        self,
        *,
        env: EnvSpec,
        num_envs: int,
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
        buffer_size: int,
        learning_starts: int,
        train_freq: int,
        num_gradient_steps: int,
        train_batch_size: int,
        n_step: int,
        prioritized_replay: bool,
        prioritized_replay_alpha: float,
        prioritized_replay_beta: float,
        prioritized_replay_eps: float,
    ) -> None:
        super().__init__(
            env=env, num_envs=num_envs, total_env_steps=total_env_steps, iterations_per_epoch=iterations_per_epoch,
            seed=seed, vectorization=vectorization, sampling_device=sampling_device, num_cpu_threads=num_cpu_threads,
            cpu_affinity=cpu_affinity,
        )
        check_positive(lr=lr, train_freq=train_freq, num_gradient_steps=num_gradient_steps,
                       train_batch_size=train_batch_size, n_step=n_step, prioritized_replay_eps=prioritized_replay_eps)
        check_gamma(gamma)
        if buffer_size < train_batch_size:
            raise ValueError(f"buffer_size ({buffer_size}) is smaller than train_batch_size ({train_batch_size})")
        if not 0.0 <= prioritized_replay_beta <= 1.0 or prioritized_replay_alpha < 0:
            raise ValueError("prioritized_replay_beta must be in [0, 1] and prioritized_replay_alpha >= 0, got "
                             f"{prioritized_replay_beta}, {prioritized_replay_alpha}")
        self.lr_points = resolve_schedule("lr_schedule", lr_schedule, lr, total_env_steps)
        self._last_target_update = 0

    def build_datamodule(self) -> pl.LightningDataModule:
        hp = self.hparams
        return ReplayDataModule(
            hp.env, num_envs=hp.num_envs, buffer_size=hp.buffer_size, learning_starts=hp.learning_starts,
            train_freq=hp.train_freq, num_gradient_steps=hp.num_gradient_steps, train_batch_size=hp.train_batch_size,
            n_step=hp.n_step, gamma=hp.gamma, prioritized_replay=hp.prioritized_replay,
            prioritized_replay_alpha=hp.prioritized_replay_alpha, prioritized_replay_beta=hp.prioritized_replay_beta,
            prioritized_replay_eps=hp.prioritized_replay_eps, beta_annealing_env_steps=hp.total_env_steps,
            vectorization=hp.vectorization, seed=hp.seed, iterations_per_epoch=hp.iterations_per_epoch,
            sampling_device=hp.sampling_device, checkpoint_replay_buffer=hp.get("checkpoint_replay_buffer", True),
        )

    def update(self, policy_id: str, batch: SampleBatch) -> dict[str, Any]:
        """One gradient step on one replay minibatch; returns ``learner_stats`` and ``td_error``."""
        raise NotImplementedError

    def learn_on_policy_batch(self, policy_id: str, batch: SampleBatch, builder: LearnerInfoBuilder) -> None:
        optimizers = self.optimizers()
        self.apply_lr_schedule(*(optimizers if isinstance(optimizers, list) else [optimizers]))
        size = self.hparams.train_batch_size
        for start in range(0, batch.count, size):
            builder.add_learn_on_batch_results(self.update(policy_id, batch.select(slice(start, start + size))),
                                               policy_id)
            self.counters["num_grad_updates"] += 1

    def target_update_due(self) -> bool:
        """True once every ``target_network_update_freq`` env steps (this process's count)."""
        sampled = self.counters["num_env_steps_sampled"]
        if sampled - self._last_target_update < self.hparams.target_network_update_freq:
            return False
        self._last_target_update = sampled
        self.counters["num_target_updates"] += 1
        return True

    def on_train_batch_end(self, outputs: Any, batch: MultiAgentBatch, batch_idx: int) -> None:
        dm = self.active_datamodule
        if outputs and hasattr(dm, "update_priorities"):
            dm.update_priorities(batch, outputs["learner_info"])

    def extra_state(self) -> dict[str, Any]:
        return {"last_target_update": self._last_target_update}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self._last_target_update = state.get("last_target_update", 0)
