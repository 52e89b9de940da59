from lightning_rl.algorithms.a2c import A2C
from lightning_rl.algorithms.base import RLModule
from lightning_rl.algorithms.on_policy import OnPolicyModule
from lightning_rl.algorithms.ppo import PPO

__all__ = ["A2C", "PPO", "OnPolicyModule", "RLModule"]
