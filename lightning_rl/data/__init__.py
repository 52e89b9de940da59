from lightning_rl.data.async_sampling import AsyncSamplingDataModule, MinibatchBuffer
from lightning_rl.data.buffers.prioritized import PrioritizedReplayBuffer
from lightning_rl.data.buffers.ring import ReplayBuffer
from lightning_rl.data.envs.make import GymMake, make_env
from lightning_rl.data.envs.vector import make_vector_env
from lightning_rl.data.replay import ReplayDataModule
from lightning_rl.data.rollout import RolloutDataModule
from lightning_rl.data.settings import EnvSettings, LearnerQueue, ReplaySettings, SamplerWorkers

__all__ = [
    "AsyncSamplingDataModule",
    "EnvSettings",
    "GymMake",
    "LearnerQueue",
    "MinibatchBuffer",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
    "ReplayDataModule",
    "ReplaySettings",
    "RolloutDataModule",
    "SamplerWorkers",
    "make_env",
    "make_vector_env",
]
