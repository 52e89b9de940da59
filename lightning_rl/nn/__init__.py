from lightning_rl.nn.distributions import Categorical, DiagGaussian
from lightning_rl.nn.models import ActorCritic, mlp

__all__ = ["ActorCritic", "Categorical", "DiagGaussian", "mlp"]
