"""APPO: asynchronous PPO, IMPALA's actor-learner setup with PPO's clipped surrogate on V-trace
advantages and a target policy for the importance ratios (Luo et al. 2020, IMPACT,
https://arxiv.org/abs/1912.00167)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from lightning_rl.algorithms.impala import IMPALA
from lightning_rl.batch import SampleBatch
from lightning_rl.functional import masked_mean, ppo_surrogate_loss
from lightning_rl.settings import at_least, positive, setting, settings


@settings
class APPO(IMPALA):
    """APPO: V-trace corrects the samplers' lag up to a target policy, PPO's clip bounds the step
    from the target policy to the current one.

    Loss, over the real rows of a ``[T, B]`` batch::

        pg_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy [+ kl_coeff * kl],
        pg_loss = -mean(min(r A, clip(r, 1 - clip_param, 1 + clip_param) A)),  r = pi / pi_target

    with ``A`` and the value targets from V-trace between each fragment's behaviour policy and
    the target policy ``pi_target``, a copy of the policy refreshed every
    ``target_network_update_freq`` trained env steps; ``kl = KL(pi_target || pi)``.
    """

    lr: float = 5e-4
    clip_param: float = setting(default=0.4, check=positive)
    """PPO's clip range of the ratio between the current and the target policy."""
    use_kl_loss: bool = False
    """add ``kl_coeff * KL(pi_target || pi)`` to the loss."""
    kl_coeff: float = setting(default=1.0, check=at_least(0))
    """weight of the KL term (with ``use_kl_loss``)."""
    target_network_update_freq: int = setting(default=1000, check=positive)
    """trained env steps between target-policy refreshes."""

    def __post_init__(self) -> None:
        super().__post_init__()
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

    def on_iteration_end(self, learner_info: Mapping[str, Any]) -> None:
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
