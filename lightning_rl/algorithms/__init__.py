from lightning_rl.algorithms.a2c import A2C
from lightning_rl.algorithms.a3c import A3C
from lightning_rl.algorithms.apex import APEX
from lightning_rl.algorithms.appo import APPO
from lightning_rl.algorithms.base import Algorithm, RLModule
from lightning_rl.algorithms.dqn import DQN
from lightning_rl.algorithms.impala import IMPALA
from lightning_rl.algorithms.off_policy import OffPolicyModule
from lightning_rl.algorithms.on_policy import OnPolicyModule
from lightning_rl.algorithms.ppo import PPO
from lightning_rl.algorithms.sac import SAC
from lightning_rl.algorithms.td3 import DDPG, TD3

__all__ = [
    "A2C", "A3C", "APEX", "APPO", "DDPG", "DQN", "IMPALA", "PPO", "SAC", "TD3", "Algorithm", "OffPolicyModule",
    "OnPolicyModule", "RLModule",
]
