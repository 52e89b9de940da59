"""APPO: asynchronous PPO, IMPALA's actor-learner setup with PPO's clipped surrogate on V-trace
advantages and a target policy for the importance ratios (Luo et al. 2020, IMPACT,
https://arxiv.org/abs/1912.00167)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lightning_rl.algorithms.impala import IMPALA
from lightning_rl.batch import SampleBatch
from lightning_rl.data.envs import EnvSpec
from lightning_rl.functional import masked_mean, ppo_surrogate_loss
from lightning_rl.nn.encoders import Activation, EncoderSpec
from lightning_rl.policies import PolicyMapping
from lightning_rl.settings import Schedule, check_positive


class APPO(IMPALA):
    """APPO: V-trace corrects the samplers' lag up to a target policy, PPO's clip bounds the step
    from the target policy to the current one.

    Loss, over the real rows of a ``[T, B]`` batch::

        pg_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy [+ kl_coeff * kl],
        pg_loss = -mean(min(r A, clip(r, 1 - clip_param, 1 + clip_param) A)),  r = pi / pi_target

    with ``A`` and the value targets from V-trace between each fragment's behaviour policy and
    the target policy ``pi_target``, a copy of the policy refreshed every
    ``target_network_update_freq`` trained env steps; ``kl = KL(pi_target || pi)``.

    Args:
        num_envs: envs per sampler worker (of the learner process with ``num_workers=0``).
        rollout_fragment_length: env steps per env in one worker fragment (the time axis of the ``[T, B]`` batch).
        train_batch_size: env steps per training batch (whole fragments, rounded up).
        lr_schedule: ``linear`` to 0 at ``total_env_steps`` (default if set), ``constant`` or ``[[env_step, lr], ...]``.
        lambda_: V-trace's trace decay in [0, 1] (1: the paper's; lower trades bias for variance).
        clip_param: PPO's clip range of the ratio between the current and the target policy.
        use_kl_loss: add ``kl_coeff * KL(pi_target || pi)`` to the loss.
        kl_coeff: weight of the KL term (with ``use_kl_loss``).
        target_network_update_freq: trained env steps between target-policy refreshes.
        max_seq_len: with ``use_lstm``, backpropagate through at most this many steps; ``None``: the whole fragment.
    """

    def __init__(
        self,
        env: EnvSpec = "CartPole-v1",
        env_kwargs: dict[str, Any] | None = None,
        num_workers: int = 2,
        num_envs: int = 4,
        rollout_fragment_length: int = 50,
        train_batch_size: int = 500,
        learner_queue_size: int = 16,
        broadcast_interval: int = 1,
        max_policy_lag: int | None = None,
        sampler_timeout_s: float = 60.0,
        restart_failed_workers: bool = False,
        num_sgd_iter: int = 1,
        minibatch_buffer_size: int = 1,
        sgd_minibatch_size: int | None = None,
        total_env_steps: int | None = 500_000,
        iterations_per_epoch: int = 20,
        seed: int | None = None,
        vectorization: str = "auto",
        num_cpu_threads: int | None = 1,
        cpu_affinity: bool = True,
        evaluation_interval: int | None = None,
        evaluation_num_episodes: int = 10,
        check_finite: bool = True,
        compile: bool = False,
        lr: float = 5e-4,
        lr_schedule: Schedule = None,
        gamma: float = 0.99,
        lambda_: float = 1.0,
        grad_clip: float | None = 40.0,
        vf_loss_coeff: float = 0.5,
        entropy_coeff: float = 0.01,
        vtrace_clip_rho_threshold: float | None = 1.0,
        vtrace_clip_pg_rho_threshold: float | None = 1.0,
        hiddens: Sequence[int] = (64, 64),
        activation: Activation = "tanh",
        vf_share_layers: bool = False,
        log_std_init: float = 0.0,
        clip_param: float = 0.4,
        use_kl_loss: bool = False,
        kl_coeff: float = 1.0,
        target_network_update_freq: int = 1000,
        use_lstm: bool = False,
        lstm_cell_size: int = 64,
        max_seq_len: int | None = None,
        lstm_use_prev_action: bool = False,
        lstm_use_prev_reward: bool = False,
        policies: Sequence[str] | dict[str, dict[str, Any]] | None = None,
        policy_mapping_fn: PolicyMapping | None = None,
        policies_to_train: Sequence[str] | None = None,
        encoder: EncoderSpec = None,
    ) -> None:
        super().__init__(
            env=env, env_kwargs=env_kwargs, num_workers=num_workers, num_envs=num_envs,
            rollout_fragment_length=rollout_fragment_length, train_batch_size=train_batch_size,
            learner_queue_size=learner_queue_size, broadcast_interval=broadcast_interval,
            max_policy_lag=max_policy_lag, sampler_timeout_s=sampler_timeout_s,
            restart_failed_workers=restart_failed_workers, num_sgd_iter=num_sgd_iter,
            minibatch_buffer_size=minibatch_buffer_size, sgd_minibatch_size=sgd_minibatch_size,
            total_env_steps=total_env_steps,
            iterations_per_epoch=iterations_per_epoch, seed=seed, vectorization=vectorization,
            num_cpu_threads=num_cpu_threads, cpu_affinity=cpu_affinity, evaluation_interval=evaluation_interval,
            evaluation_num_episodes=evaluation_num_episodes, check_finite=check_finite, compile=compile, lr=lr,
            lr_schedule=lr_schedule, gamma=gamma, lambda_=lambda_, grad_clip=grad_clip, vf_loss_coeff=vf_loss_coeff,
            entropy_coeff=entropy_coeff, vtrace_clip_rho_threshold=vtrace_clip_rho_threshold,
            vtrace_clip_pg_rho_threshold=vtrace_clip_pg_rho_threshold, hiddens=hiddens, activation=activation,
            vf_share_layers=vf_share_layers, log_std_init=log_std_init, use_lstm=use_lstm,
            lstm_cell_size=lstm_cell_size, max_seq_len=max_seq_len, lstm_use_prev_action=lstm_use_prev_action,
            lstm_use_prev_reward=lstm_use_prev_reward, policies=policies,
            policy_mapping_fn=policy_mapping_fn, policies_to_train=policies_to_train,
            encoder=encoder,
        )
        self.save_hyperparameters()
        check_positive(clip_param=clip_param, target_network_update_freq=target_network_update_freq)
        if kl_coeff < 0:
            raise ValueError(f"kl_coeff must be >= 0, got {kl_coeff}")
        self.clip_param, self.use_kl_loss, self.kl_coeff = clip_param, use_kl_loss, kl_coeff
        self.target_network_update_freq = target_network_update_freq
        self.target_policies = nn.ModuleDict(
            {pid: copy.deepcopy(policy).requires_grad_(False) for pid, policy in self.policies.items()}
        )
        self._last_target_update = 0

    def loss(
        self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None = None,
        scalars: dict[str, Any] | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        dist, logp, values, bootstrap_value, mask = self.time_major_forward(policy_id, batch, params)
        n = mask.numel()
        with torch.no_grad():
            target_dist, target_logp, *_ = self.time_major_forward(policy_id, batch, None,
                                                                   self.target_policies[policy_id])
        vs, pg_advantages = self.vtrace_targets(batch, target_logp, values, bootstrap_value)

        # log pi / pi_target: 0 on reset rows (the env ignored their actions), and bounded, so that
        # neither a reset row nor a far-moved Gaussian makes the masked mean inf * 0.
        valid = batch[SampleBatch.VALID].flatten()
        log_ratio = torch.where(valid, (logp - target_logp).flatten(), 0.0).clamp(-20.0, 20.0)
        pg_loss, ratio = ppo_surrogate_loss(log_ratio, torch.zeros_like(log_ratio), pg_advantages.flatten(),
                                            self.clip_param, mask)
        vf_loss = 0.5 * masked_mean((values - vs).pow(2).flatten(), mask)
        entropy = masked_mean(dist.entropy()[:n], mask)
        kl = masked_mean(target_dist.kl(dist)[:n], mask)
        total_loss = pg_loss + self.vf_loss_coeff * vf_loss - self.entropy_coeff * entropy
        if self.use_kl_loss:
            total_loss = total_loss + self.kl_coeff * kl
        stats = self.loss_stats(batch, mask, logp, values, vs, total_loss=total_loss, pg_loss=pg_loss,
                                vf_loss=vf_loss, entropy=entropy, kl=kl)
        stats["mean_ratio_to_target"] = masked_mean(ratio.detach(), mask)
        return total_loss, stats

    def on_iteration_end(self, learner_info: dict[str, Any]) -> None:
        trained = self.global_counters["num_env_steps_trained"]
        if trained - self._last_target_update >= self.target_network_update_freq:
            for pid, target in self.target_policies.items():
                target.load_state_dict(self.policies[pid].state_dict())
            self._last_target_update = trained
            self.counters["num_target_updates"] += 1

    def extra_state(self) -> dict[str, Any]:
        return {"last_target_update": self._last_target_update}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self._last_target_update = state.get("last_target_update", 0)
