"""Value-based and soft actor-critic networks: Q heads (DQN) and squashed Gaussian actors (SAC)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import torch
from torch import Tensor, nn

from lightning_rl.nn.cnn import default_image_encoder
from lightning_rl.nn.encoders import EncoderSpec
from lightning_rl.nn.models import Float32Linear, flat_obs_dim, mlp, preprocess_obs, trunk


class QNetwork(nn.Module):
    """Q-values of every discrete action; optionally dueling (Wang et al. 2016):
    ``Q = V + A - mean(A)``."""

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hiddens: Sequence[int] = (256, 256),
        activation: str = "relu",
        dueling: bool = False,
        encoder: EncoderSpec = None,
    ) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"unsupported action space {action_space}: DQN needs Discrete actions")
        self.observation_space = observation_space
        self.num_actions = int(action_space.n)
        # ``encoder`` (a CNN by default for images) then the MLP
        self.encoder, out_dim, _ = trunk(observation_space, flat_obs_dim(observation_space), hiddens, activation,
                                         encoder)
        self.advantage_head = Float32Linear(out_dim, self.num_actions)
        self.value_head = Float32Linear(out_dim, 1) if dueling else None

    def forward(self, obs: Tensor) -> Tensor:
        """``[N, *obs_shape]`` -> ``[N, num_actions]`` Q-values."""
        features = self.encoder(preprocess_obs(obs, self.observation_space))
        advantages = self.advantage_head(features)
        if self.value_head is None:
            return advantages
        return self.value_head(features) + advantages - advantages.mean(-1, keepdim=True)

    def compute_actions(
        self, obs: Tensor, explore: bool = True, generator: torch.Generator | None = None, epsilon: float = 0.0
    ) -> dict[str, Tensor]:
        """Epsilon-greedy actions (greedy when ``explore`` is False or ``epsilon`` is 0); the
        algorithm passes its scheduled epsilon (``DQN.exploration_kwargs``)."""
        greedy = self(obs).argmax(-1)
        eps = epsilon if explore else 0.0
        if eps <= 0:
            return {"actions": greedy}
        n = greedy.shape[0]
        random_actions = torch.randint(self.num_actions, (n,), generator=generator, device=greedy.device)
        take_random = torch.rand(n, generator=generator, device=greedy.device) < eps
        return {"actions": torch.where(take_random, random_actions, greedy)}


class SquashedGaussianActor(nn.Module):
    """SAC's policy: a Gaussian squashed by tanh and scaled to the Box bounds."""

    LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hiddens: Sequence[int] = (256, 256),
        activation: str = "relu",
        encoder: EncoderSpec = None,
    ) -> None:
        super().__init__()
        if not (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1):
            raise ValueError(f"unsupported action space {action_space}: SAC needs 1-D Box actions")
        self.observation_space = observation_space
        dim = int(action_space.shape[0])
        # ``encoder`` (a CNN by default for images) then the MLP
        self.encoder, out_dim, _ = trunk(observation_space, flat_obs_dim(observation_space), hiddens, activation,
                                         encoder)
        self.head = Float32Linear(out_dim, 2 * dim)
        low, high = torch.as_tensor(action_space.low, dtype=torch.float32), torch.as_tensor(action_space.high)
        self.register_buffer("action_mid", (high.float() + low) / 2)
        self.register_buffer("action_half", (high.float() - low) / 2)

    def normalize(self, actions: Tensor) -> Tensor:
        """Env actions -> ``[-1, 1]``."""
        return (actions - self.action_mid) / self.action_half

    def forward(
        self, obs: Tensor, deterministic: bool = False, generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Reparameterized ``[N, dim]`` actions in ``[-1, 1]`` and their ``[N]`` log-probs; the
        standard-normal ``noise`` is drawn from ``generator`` unless given (the compiled update
        draws it outside the graph)."""
        mean, log_std = self.head(self.encoder(preprocess_obs(obs, self.observation_space))).chunk(2, dim=-1)
        log_std = log_std.clamp(self.LOG_STD_MIN, self.LOG_STD_MAX)
        if deterministic:
            pre_tanh = mean
        else:
            if noise is None:
                noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            pre_tanh = mean + noise * log_std.exp()
        z = (pre_tanh - mean) * torch.exp(-log_std)
        logp = (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # tanh change of variables, in the stable form 2 (log 2 - x - softplus(-2x)).
        logp = logp - (2 * (math.log(2) - pre_tanh - nn.functional.softplus(-2 * pre_tanh))).sum(-1)
        return torch.tanh(pre_tanh), logp

    def compute_actions(
        self, obs: Tensor, explore: bool = True, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """Env-scaled actions for ``[N, *obs_shape]`` observations."""
        actions, _ = self(obs, deterministic=not explore, generator=generator)
        return {"actions": self.action_mid + actions * self.action_half}


class TwinQ(nn.Module):
    """Two independent Q(s, a) networks for continuous actions (clipped double Q, Fujimoto et al. 2018)."""

    def __init__(
        self, observation_space: gym.Space, action_dim: int, hiddens: Sequence[int] = (256, 256),
        activation: str = "relu", encoder: EncoderSpec = None,
    ) -> None:
        super().__init__()
        self.observation_space = observation_space
        obs_dim = flat_obs_dim(observation_space)
        if encoder is None:
            encoder = default_image_encoder(observation_space)
        self.encoders: nn.ModuleList | None = None
        if encoder is not None:  # each critic reads the observation through an encoder of its own (a CNN for images)
            built = [trunk(observation_space, obs_dim, [], activation, encoder) for _ in range(2)]
            self.encoders, obs_dim = nn.ModuleList([layers for layers, _, _ in built]), built[0][1]
        in_dim = obs_dim + action_dim
        out_dim = hiddens[-1] if hiddens else in_dim
        self.q1 = nn.Sequential(mlp(in_dim, hiddens, activation), Float32Linear(out_dim, 1))
        self.q2 = nn.Sequential(mlp(in_dim, hiddens, activation), Float32Linear(out_dim, 1))

    def forward(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """``[N, *obs_shape]``, ``[N, dim]`` actions in ``[-1, 1]`` -> two ``[N]`` Q-values."""
        x = preprocess_obs(obs, self.observation_space)
        if self.encoders is None:
            x = torch.cat([x, actions], dim=-1)
            return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)
        x1, x2 = (torch.cat([encoder(x), actions], dim=-1) for encoder in self.encoders)
        return self.q1(x1).squeeze(-1), self.q2(x2).squeeze(-1)
