from lightning_rl.data.envs import make_env, make_vector_env
from lightning_rl.data.rollout import RolloutDataModule

__all__ = ["RolloutDataModule", "make_env", "make_vector_env"]
