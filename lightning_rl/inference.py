"""Inference outside Lightning: Stable-Baselines3's ``predict`` and a TorchScript export.

Both go through ``Algorithm.compute_actions``, the one action path that samplers,
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
    from lightning_rl.algorithms.base import Algorithm


def predict(
    module: Algorithm,
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
        if not module.policies.is_recurrent(policy_id):
            return module.compute_actions(obs, policy_id=policy_id, explore=not deterministic), state
        policy = module.policies[policy_id]
        if policy.use_prev_action or policy.use_prev_reward:
            raise ValueError("predict does not know the previous action and reward this policy reads "
                             "(lstm_use_prev_action/lstm_use_prev_reward): call compute_actions(obs, state=..., "
                             "episode_start=..., prev_action=..., prev_reward=...)")
        return module.compute_actions(obs, policy_id=policy_id, explore=not deterministic, state=state,
                                      episode_start=episode_start)
    finally:
        module.train(was_training)


class Acting:
    """Acts in envs with a module's policy, for evaluation and recording: ``act(obs [N, ...])``
    then ``observe(rewards, dones)`` after each step. A recurrent policy's state, previous
    action and reward are carried from step to step and reset where an episode ended."""

    def __init__(self, module: Algorithm, policy_id: str = DEFAULT_POLICY_ID, explore: bool = False) -> None:
        self.module, self.policy_id, self.explore = module, policy_id, explore
        self.recurrent = module.policies.is_recurrent(policy_id)
        self.state: np.ndarray | None = None
        self.starts: np.ndarray | None = None
        self.prev_action: np.ndarray | None = None
        self.prev_reward: np.ndarray | None = None

    def act(self, obs: np.ndarray) -> np.ndarray:
        if not self.recurrent:
            return self.module.compute_actions(obs, policy_id=self.policy_id, explore=self.explore)
        if self.starts is None:
            self.starts = np.ones(len(obs), dtype=bool)
        actions, self.state = self.module.compute_actions(
            obs, policy_id=self.policy_id, explore=self.explore, state=self.state, episode_start=self.starts,
            prev_action=self.prev_action, prev_reward=self.prev_reward)
        self.prev_action = actions
        return actions

    def observe(self, rewards: Any, dones: Any) -> None:
        if not self.recurrent:
            return
        dones = np.asarray(dones, dtype=bool).reshape(-1)
        self.starts = dones.copy()
        self.prev_reward = np.where(dones, 0.0, np.asarray(rewards, dtype=np.float32).reshape(-1))
        keep = (~dones).reshape(-1, *[1] * (np.ndim(self.prev_action) - 1))
        self.prev_action = np.where(keep, self.prev_action, np.zeros_like(self.prev_action))


class _GreedyPolicy(nn.Module):
    """``obs -> greedy actions`` of a policy, as one traceable forward."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: Tensor) -> Tensor:
        return self.policy.compute_actions(obs, explore=False)["actions"].detach()


def export_policy(
    module: Algorithm, path: str | os.PathLike[str], policy_id: str = DEFAULT_POLICY_ID
) -> torch.jit.ScriptModule:
    """Save the greedy policy as TorchScript: ``torch.jit.load(path)(obs_batch) -> actions``,
    runnable without Python, Lightning or this library."""
    if module.policies.is_recurrent(policy_id):
        raise ValueError("export_policy exports a feed-forward policy (obs -> actions); a recurrent one needs its "
                         "state: use predict or compute_actions")
    greedy = _GreedyPolicy(copy.deepcopy(module.policies[policy_id]).cpu().eval())
    example = torch.as_tensor(np.stack([module.observation_space.sample() for _ in range(2)]))
    with torch.no_grad():
        scripted = torch.jit.trace(greedy, example, check_trace=False)
    scripted.save(str(path))
    return scripted
