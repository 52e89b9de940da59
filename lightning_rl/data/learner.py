"""The one door between ``data/`` and an algorithm: what a DataModule, its samplers and its
sampler workers read of the module they sample for (docs/design.md, "Layers").

``data/`` imports nothing from ``algorithms/``, not even for type hints: a DataModule is given
an object with these members (``connect(module)``, or the Trainer's module at ``setup``), and
every ``Algorithm`` is one (``tests/test_layers.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import gymnasium as gym
import torch
from torch import nn

if TYPE_CHECKING:
    from lightning_rl.policies import Policies


@runtime_checkable
class Learner(Protocol):
    """The acting policies and their version, the spaces they were built for, and what to count."""

    @property
    def policies(self) -> Policies:
        """The trained policies; ``policies.version`` counts their updates (workers' weights lag it)."""

    @property
    def counters(self) -> dict[str, int]:
        """The run's counters (``num_iterations``, ``num_env_steps_sampled``, ...; counters.py)."""

    @property
    def observation_space(self) -> gym.Space:
        """The (first) policy's observation space."""

    @property
    def action_space(self) -> gym.Space:
        """The (first) policy's action space."""

    @property
    def device(self) -> torch.device:
        """Where the learner's parameters live (a batch goes there)."""

    def check_spaces(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        """Raise if the envs' spaces differ from those the policies were built for."""

    def sampling_policy(self, policy_id: str, device: torch.device) -> nn.Module:
        """The policy ``policy_id`` on ``device``, to act with."""

    def exploration_kwargs(self, policy_id: str) -> dict[str, Any]:
        """Extra keyword arguments of an exploring ``compute_actions`` (DQN's epsilon)."""
