"""Advantage Actor-Critic (Mnih et al. 2016, https://arxiv.org/abs/1602.01783), synchronous."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from lightning_rl.algorithms.on_policy import OnPolicyModule
from lightning_rl.batch import SampleBatch
from lightning_rl.functional import a2c_loss
from lightning_rl.settings import one_of, setting, settings


@settings
class A2C(OnPolicyModule):
    """A2C: one gradient step per rollout on the whole batch, no ratio clipping.

    Loss::

        pg_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy,
        pg_loss = -mean(log pi(a|s) * advantage)
    """

    # inherited defaults A2C changes (the paper's and rl-zoo's)
    rollout_fragment_length: int = 5
    total_env_steps: int | None = 500_000
    iterations_per_epoch: int = 100
    iterations_per_step: int = 10
    lr: float = 7e-4
    """learning rate of the ``optimizer``."""
    lambda_: float = 1.0
    standardize_fields: Sequence[str] = ()
    # one gradient step on the whole batch per iteration, whatever rows a policy's agents gave
    num_sgd_iter: int = setting(default=1, init=False)
    sgd_minibatch_size: int | None = setting(default=None, init=False)
    optimizer: Literal["rmsprop", "adam"] = setting(default="rmsprop", check=one_of("rmsprop", "adam"))
    """``rmsprop`` (alpha 0.99, eps 1e-5, as in the paper's code) or ``adam``."""

    minibatches_per_epoch = 1

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return super().make_optimizer(params)
        # foreach: one kernel per op over all parameters, on the CPU too (the same results)
        return torch.optim.RMSprop(params, lr=self.lr, alpha=0.99, eps=1e-5, foreach=True)

    def loss(
        self, policy_id: str, batch: SampleBatch, params: dict[str, Tensor] | None = None,
        scalars: dict[str, Any] | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        dist, values = self.policy_forward(policy_id, batch, params)
        # padded rows of a compiled step's minibatch count 0 (the mask)
        return a2c_loss(dist.log_prob(batch[SampleBatch.ACTIONS]), values, dist.entropy(),
                        batch[SampleBatch.ADVANTAGES], batch[SampleBatch.VALUE_TARGETS], self.vf_loss_coeff,
                        self.entropy_coeff, batch.get(SampleBatch.MASK))
