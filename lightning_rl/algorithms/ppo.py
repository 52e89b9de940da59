"""Proximal Policy Optimization (Schulman et al. 2017, https://arxiv.org/abs/1707.06347)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from lightning_rl.algorithms.on_policy import OnPolicyModule
from lightning_rl.batch import SampleBatch
from lightning_rl.distributed import mean_over_ranks
from lightning_rl.functional import explained_variance, masked_mean, ppo_surrogate_loss, value_loss
from lightning_rl.settings import Schedule, resolve_schedule, settings

# Under bf16-mixed the learner's CNN trunk rounds (its heads are float32), so the ratio starts an
# update off 1 by up to about 0.01 (90th percentile) for a trained policy (benchmarks/bf16_ratio.py).
BF16_MIN_CLIP = 0.02


@settings
class PPO(OnPolicyModule):
    """PPO with the clipped surrogate, optional value clipping and an adaptive KL penalty.

    Loss per minibatch (eq. 9 of the paper, with the KL penalty of its section 4)::

        pg_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy + kl_coeff * kl
    """

    clip_param: float = 0.2
    """surrogate clip range epsilon."""
    clip_param_schedule: Schedule = None
    """``constant``/``None``, ``linear`` (to 0 at ``total_env_steps``) or ``[[step, clip], ...]``."""
    vf_clip_param: float | None = None
    """clip value predictions to ``old +- vf_clip_param`` (``None``: no clipping)."""
    kl_coeff: float = 0.0
    """initial weight of the KL(old || new) penalty (0: no penalty)."""
    kl_target: float = 0.01
    """the KL weight is multiplied by 1.5 above ``2 * kl_target`` and by 0.5 below ``kl_target / 2``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        clip_param, vf_clip_param, kl_coeff, kl_target = (self.clip_param, self.vf_clip_param, self.kl_coeff,
                                                          self.kl_target)
        if clip_param <= 0 or (vf_clip_param is not None and vf_clip_param <= 0):
            raise ValueError(f"clip_param and vf_clip_param must be positive, got {clip_param}, {vf_clip_param}")
        if kl_coeff < 0 or kl_target <= 0:
            raise ValueError(f"kl_coeff must be >= 0 and kl_target > 0, got {kl_coeff}, {kl_target}")
        self.clip_points = resolve_schedule("clip_param_schedule", self.clip_param_schedule, self.clip_param,
                                            self.total_env_steps)
        self.kl_coeff = {policy_id: float(self.kl_coeff) for policy_id in self.policies}  # type: ignore[assignment]

    def on_fit_start(self) -> None:
        super().on_fit_start()
        lowest = min(v for _, v in self.clip_points) if self.clip_points else self.clip_param
        if self.trainer.precision == "bf16-mixed" and lowest < BF16_MIN_CLIP and self.trainer.is_global_zero:
            warnings.warn(f"PPO's clip range goes down to {lowest:g} under bf16-mixed: the learner's log-probs differ "
                          f"from the float32 actor's by bf16 rounding, so below about {BF16_MIN_CLIP} rounding, not "
                          "the update, decides which rows are clipped (docs/guides/compile.md); keep "
                          "clip_param_schedule above it or train in float32", UserWarning, stacklevel=2)

    def loss_scalars(self, policy_id: str) -> dict[str, float]:
        return {"clip_param": self.current(self.clip_points, self.clip_param), "kl_coeff": self.kl_coeff[policy_id]}

    def loss(
        self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None = None,
        scalars: dict[str, Any] | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        scalars = self.loss_scalars(policy_id) if scalars is None else scalars
        clip_param, kl_coeff = scalars["clip_param"], scalars["kl_coeff"]
        dist, values = self.policy_forward(policy_id, batch, params)
        logp = dist.log_prob(batch[SampleBatch.ACTIONS])
        mask = batch.get(SampleBatch.MASK)  # padded rows of a compiled step's minibatch count 0

        old_logp = batch[SampleBatch.ACTION_LOGP]
        pg_loss, ratio = ppo_surrogate_loss(logp, old_logp, batch[SampleBatch.ADVANTAGES], clip_param, mask)
        vf_loss = value_loss(values, batch[SampleBatch.VALUE_TARGETS], batch[SampleBatch.VF_PREDS], self.vf_clip_param,
                             mask)
        entropy = masked_mean(dist.entropy(), mask)
        # KL(old || new) by the non-negative, unbiased estimator (r - 1) - log r (Schulman 2020, "Approximating KL").
        log_ratio = logp - old_logp
        kl = masked_mean((ratio - 1) - log_ratio, mask)

        # Branch-free (one compiled graph whatever the coefficient); a zero coefficient adds 0.
        total_loss = pg_loss + self.vf_loss_coeff * vf_loss - self.entropy_coeff * entropy + kl_coeff * kl

        with torch.no_grad():
            stats = {
                "total_loss": total_loss.detach(),
                "pg_loss": pg_loss.detach(),
                "vf_loss": vf_loss.detach(),
                "entropy": entropy.detach(),
                "kl": kl.detach(),
                "kl_coeff": kl_coeff,
                "cur_clip_param": clip_param,
                "clip_fraction": masked_mean(((ratio - 1).abs() > clip_param).float(), mask),
                "vf_explained_var": explained_variance(values, batch[SampleBatch.VALUE_TARGETS], mask),
                "max_ratio": ratio.max() if mask is None else torch.where(mask > 0, ratio, 0.0).max(),
            }
        return total_loss, stats

    def on_iteration_end(self, learner_info: Mapping[str, Any]) -> None:
        """Adapt the KL coefficient toward ``kl_target`` (paper, section 4), from the mean KL
        over minibatches and DDP ranks, so every rank adapts identically."""
        for policy_id, coeff in self.kl_coeff.items():
            if coeff == 0 or policy_id not in learner_info:  # (reading learner_info reduces it)
                continue
            kl = mean_over_ranks(learner_info[policy_id]["learner_stats"]["kl"], self.device)
            if kl > 2.0 * self.kl_target:
                self.kl_coeff[policy_id] = coeff * 1.5
            elif kl < 0.5 * self.kl_target:
                self.kl_coeff[policy_id] = coeff * 0.5

    def extra_state(self) -> dict[str, Any]:
        return {"kl_coeff": dict(self.kl_coeff)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.kl_coeff.update(state.get("kl_coeff", {}))
