"""lightning_rl: reinforcement learning as PyTorch Lightning modules and data modules.

The public names are imported when first used (``from lightning_rl import PPO`` imports the
algorithms, hence torch and Lightning): ``import lightning_rl`` alone, and the command line's
help and argument errors (``lightning_rl.cli``), import neither, and start in a fraction of a
second instead of seconds."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Each public name -> the module that defines it.
_EXPORTS = {
    **{name: "lightning_rl.algorithms" for name in (
        "A2C", "A3C", "APEX", "APPO", "DDPG", "DQN", "IMPALA", "PPO", "SAC", "TD3", "Algorithm", "RLModule")},
    "DEFAULT_POLICY_ID": "lightning_rl.batch",
    "MultiAgentBatch": "lightning_rl.batch",
    "SampleBatch": "lightning_rl.batch",
    "LearnerInfoCallback": "lightning_rl.callbacks",
    "RolloutMetricsCallback": "lightning_rl.callbacks",
    "AsyncSamplingDataModule": "lightning_rl.data",
    "ReplayDataModule": "lightning_rl.data",
    "RolloutDataModule": "lightning_rl.data",
    "evaluate": "lightning_rl.evaluation",
    "LearnerInfoBuilder": "lightning_rl.learner_info",
}

__all__ = [
    "A2C",
    "A3C",
    "APEX",
    "APPO",
    "DDPG",
    "DEFAULT_POLICY_ID",
    "DQN",
    "IMPALA",
    "PPO",
    "SAC",
    "TD3",
    "Algorithm",
    "AsyncSamplingDataModule",
    "LearnerInfoBuilder",
    "LearnerInfoCallback",
    "MultiAgentBatch",
    "RLModule",
    "ReplayDataModule",
    "RolloutDataModule",
    "RolloutMetricsCallback",
    "SampleBatch",
    "evaluate",
]

if TYPE_CHECKING:  # what editors and type checkers see
    from lightning_rl.algorithms import (
        A2C,
        A3C,
        APEX,
        APPO,
        DDPG,
        DQN,
        IMPALA,
        PPO,
        SAC,
        TD3,
        Algorithm,
        RLModule,
    )
    from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
    from lightning_rl.callbacks import LearnerInfoCallback, RolloutMetricsCallback
    from lightning_rl.data import AsyncSamplingDataModule, ReplayDataModule, RolloutDataModule
    from lightning_rl.evaluation import evaluate
    from lightning_rl.learner_info import LearnerInfoBuilder


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
