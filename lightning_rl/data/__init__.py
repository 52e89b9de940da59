from lightning_rl.data.async_sampling import AsyncSamplingDataModule, MinibatchBuffer
from lightning_rl.data.buffers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer
from lightning_rl.data.envs import GymMake, make_env, make_vector_env
from lightning_rl.data.replay import ReplayDataModule
from lightning_rl.data.rollout import RolloutDataModule

__all__ = [
    "AsyncSamplingDataModule",
    "GymMake",
    "MinibatchBuffer",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
    "ReplayDataModule",
    "RolloutDataModule",
    "make_env",
    "make_vector_env",
]
