"""Inference outside Lightning: Stable-Baselines3's ``predict`` and a TorchScript export.

Both go through ``RLModule.compute_actions``, the one action path that samplers,
evaluation and users share.
"""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_rl.batch import DEFAULT_POLICY_ID

if TYPE_CHECKING:
    from lightning_rl.algorithms.base import RLModule


def predict(
    module: RLModule,
    obs: np.ndarray | Tensor,
    state: Any = None,
    episode_start: np.ndarray | None = None,
    deterministic: bool = False,
    policy_id: str = DEFAULT_POLICY_ID,
) -> tuple[np.ndarray | Tensor, Any]:
    """``(actions, state)`` for one observation or a batch, with Stable-Baselines3's signature.

    ``state`` and ``episode_start`` are the recurrent state and episode starts (SB3's
    ``RecurrentPPO``); feed-forward policies take and return ``None``. ``deterministic``
    picks greedy actions; otherwise the policy explores as during training (DQN's epsilon
    included).
    """
    was_training = module.training
    module.eval()
    try:
        return module.compute_actions(obs, policy_id=policy_id, explore=not deterministic), state
    finally:
        module.train(was_training)


class _GreedyPolicy(nn.Module):
    """``obs -> greedy actions`` of a policy, as one traceable forward."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: Tensor) -> Tensor:
        return self.policy.compute_actions(obs, explore=False)["actions"].detach()


def export_policy(
    module: RLModule, path: str | os.PathLike[str], policy_id: str = DEFAULT_POLICY_ID
) -> torch.jit.ScriptModule:
    """Save the greedy policy as TorchScript: ``torch.jit.load(path)(obs_batch) -> actions``,
    runnable without Python, Lightning or this library."""
    greedy = _GreedyPolicy(copy.deepcopy(module.policies[policy_id]).cpu().eval())
    example = torch.as_tensor(np.stack([module.observation_space.sample() for _ in range(2)]))
    with torch.no_grad():
        scripted = torch.jit.trace(greedy, example, check_trace=False)
    scripted.save(str(path))
    return scripted
