"""lightning_rl: reinforcement learning as PyTorch Lightning modules and data modules."""

from lightning_rl.algorithms import A2C, A3C, APEX, APPO, DQN, IMPALA, PPO, SAC, Algorithm, RLModule
from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from lightning_rl.callbacks import LearnerInfoCallback, RolloutMetricsCallback
from lightning_rl.data import AsyncSamplingDataModule, ReplayDataModule, RolloutDataModule
from lightning_rl.evaluation import evaluate
from lightning_rl.learner_info import LearnerInfoBuilder

__version__ = "0.1.0"

__all__ = [
    "A2C",
    "A3C",
    "APEX",
    "APPO",
    "DEFAULT_POLICY_ID",
    "DQN",
    "IMPALA",
    "PPO",
    "SAC",
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
