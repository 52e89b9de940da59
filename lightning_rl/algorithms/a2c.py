"""Advantage Actor-Critic (Mnih et al. 2016, https://arxiv.org/abs/1602.01783), synchronous."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from lightning_rl.algorithms.on_policy import OnPolicyModule
from lightning_rl.batch import SampleBatch
from lightning_rl.data.envs import EnvSpec
from lightning_rl.functional import a2c_loss
from lightning_rl.nn.encoders import Activation, EncoderSpec
from lightning_rl.policies import PolicyMapping
from lightning_rl.settings import Schedule


class A2C(OnPolicyModule):
    """A2C: one gradient step per rollout on the whole batch, no ratio clipping.

    Loss::

        pg_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy,
        pg_loss = -mean(log pi(a|s) * advantage)

    Args:
        lr: learning rate of the ``optimizer``.
        optimizer: ``rmsprop`` (alpha 0.99, eps 1e-5, as in the paper's code) or ``adam``.
    """

    def __init__(
        self,
        env: EnvSpec = "CartPole-v1",
        env_kwargs: dict[str, Any] | None = None,
        num_envs: int = 8,
        rollout_fragment_length: int = 5,
        total_env_steps: int | None = 500_000,
        iterations_per_epoch: int = 100,
        seed: int | None = None,
        vectorization: str = "auto",
        sampling_device: str = "cpu",
        num_cpu_threads: int | None = 1,
        cpu_affinity: bool = True,
        evaluation_interval: int | None = None,
        evaluation_num_episodes: int = 10,
        check_finite: bool = True,
        compile: bool = False,
        lr: float = 7e-4,
        lr_schedule: Schedule = None,
        gamma: float = 0.99,
        lambda_: float = 1.0,
        grad_clip: float | None = 0.5,
        standardize_fields: Sequence[str] = (),
        hiddens: Sequence[int] = (64, 64),
        activation: Activation = "tanh",
        vf_share_layers: bool = False,
        log_std_init: float = 0.0,
        vf_loss_coeff: float = 0.5,
        entropy_coeff: float = 0.0,
        optimizer: Literal["rmsprop", "adam"] = "rmsprop",
        policies: Sequence[str] | dict[str, dict[str, Any]] | None = None,
        policy_mapping_fn: PolicyMapping | None = None,
        policies_to_train: Sequence[str] | None = None,
        count_steps_by: Literal["env_steps", "agent_steps"] = "env_steps",
        use_lstm: bool = False,
        lstm_cell_size: int = 64,
        max_seq_len: int = 16,
        lstm_use_prev_action: bool = False,
        lstm_use_prev_reward: bool = False,
        encoder: EncoderSpec = None,
        normalize_observations: bool = False,
        observation_clip: float | None = 10.0,
        normalize_rewards: bool = False,
        reward_clip: float | None = 10.0,
    ) -> None:
        super().__init__(
            env=env, env_kwargs=env_kwargs, num_envs=num_envs, rollout_fragment_length=rollout_fragment_length,
            total_env_steps=total_env_steps, iterations_per_epoch=iterations_per_epoch, seed=seed,
            vectorization=vectorization, sampling_device=sampling_device, num_cpu_threads=num_cpu_threads,
            cpu_affinity=cpu_affinity, evaluation_interval=evaluation_interval,
            evaluation_num_episodes=evaluation_num_episodes, check_finite=check_finite, compile=compile,
            lr=lr, lr_schedule=lr_schedule, gamma=gamma, lambda_=lambda_,
            num_sgd_iter=1, sgd_minibatch_size=num_envs * rollout_fragment_length,
            grad_clip=grad_clip, standardize_fields=standardize_fields, hiddens=hiddens, activation=activation,
            vf_share_layers=vf_share_layers, log_std_init=log_std_init, policies=policies,
            policy_mapping_fn=policy_mapping_fn, policies_to_train=policies_to_train,
            count_steps_by=count_steps_by, use_lstm=use_lstm, lstm_cell_size=lstm_cell_size,
            max_seq_len=max_seq_len, lstm_use_prev_action=lstm_use_prev_action,
            lstm_use_prev_reward=lstm_use_prev_reward,
            encoder=encoder, normalize_observations=normalize_observations, observation_clip=observation_clip,
            normalize_rewards=normalize_rewards, reward_clip=reward_clip,
        )
        self.save_hyperparameters()
        if optimizer not in ("rmsprop", "adam"):
            raise ValueError(f"optimizer must be 'rmsprop' or 'adam', got {optimizer!r}")
        self.optimizer_name = optimizer
        self.vf_loss_coeff, self.entropy_coeff = vf_loss_coeff, entropy_coeff

    minibatches_per_epoch = 1  # one step on the whole batch, whatever rows a policy's agents gave

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        if self.optimizer_name == "adam":
            return super().make_optimizer(params)
        return torch.optim.RMSprop(params, lr=self.lr, alpha=0.99, eps=1e-5)

    def loss(
        self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None = None,
        scalars: dict[str, Any] | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        dist, values = self.policy_forward(policy_id, batch, params)
        # padded rows of a compiled step's minibatch count 0 (the mask)
        return a2c_loss(dist.log_prob(batch[SampleBatch.ACTIONS]), values, dist.entropy(),
                        batch[SampleBatch.ADVANTAGES], batch[SampleBatch.VALUE_TARGETS], self.vf_loss_coeff,
                        self.entropy_coeff, batch.get(SampleBatch.MASK))
