"""Value-based and actor-critic networks for replay: Q heads (DQN), squashed Gaussian actors
(SAC), deterministic tanh actors (TD3, DDPG) and their Q(s, a) critics."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from lightning_rl.functional import ornstein_uhlenbeck_step
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


class BoxActor(nn.Module):
    """A policy over 1-D ``Box`` actions (SAC's and TD3's): ``encoder`` (a CNN by default for
    images) then the MLP, a linear head of ``OUTPUTS_PER_DIM`` outputs per action dimension, and
    the bounds' midpoint and half-width that map ``[-1, 1]`` to the env's actions."""

    OUTPUTS_PER_DIM, ALGORITHM = 1, "this policy"

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
            raise ValueError(f"unsupported action space {action_space}: {self.ALGORITHM} needs 1-D Box actions")
        self.observation_space = observation_space
        self.encoder, out_dim, _ = trunk(observation_space, flat_obs_dim(observation_space), hiddens, activation,
                                         encoder)
        self.head = Float32Linear(out_dim, self.OUTPUTS_PER_DIM * int(action_space.shape[0]))
        low, high = torch.as_tensor(action_space.low, dtype=torch.float32), torch.as_tensor(action_space.high)
        self.register_buffer("action_mid", (high.float() + low) / 2)
        self.register_buffer("action_half", (high.float() - low) / 2)

    def normalize(self, actions: Tensor) -> Tensor:
        """Env actions -> ``[-1, 1]``."""
        return (actions - self.action_mid) / self.action_half


class SquashedGaussianActor(BoxActor):
    """SAC's policy: a Gaussian squashed by tanh and scaled to the Box bounds."""

    LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
    OUTPUTS_PER_DIM, ALGORITHM = 2, "SAC"  # a mean and a log std per action dimension

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
    """Two independent Q(s, a) networks for continuous actions (clipped double Q, Fujimoto et al. 2018);
    ``num_q=1``: one (DDPG)."""

    def __init__(
        self, observation_space: gym.Space, action_dim: int, hiddens: Sequence[int] = (256, 256),
        activation: str = "relu", encoder: EncoderSpec = None, num_q: int = 2,
    ) -> None:
        super().__init__()
        if num_q not in (1, 2):
            raise ValueError(f"num_q must be 1 or 2, got {num_q}")
        self.observation_space = observation_space
        obs_dim = flat_obs_dim(observation_space)
        if encoder is None:
            encoder = default_image_encoder(observation_space)
        self.encoders: nn.ModuleList | None = None
        if encoder is not None:  # each critic reads the observation through an encoder of its own (a CNN for images)
            built = [trunk(observation_space, obs_dim, [], activation, encoder) for _ in range(num_q)]
            self.encoders, obs_dim = nn.ModuleList([layers for layers, _, _ in built]), built[0][1]
        in_dim = obs_dim + action_dim
        out_dim = hiddens[-1] if hiddens else in_dim
        self.q1 = nn.Sequential(mlp(in_dim, hiddens, activation), Float32Linear(out_dim, 1))
        self.q2 = nn.Sequential(mlp(in_dim, hiddens, activation), Float32Linear(out_dim, 1)) if num_q == 2 else None

    def forward(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, ...]:
        """``[N, *obs_shape]``, ``[N, dim]`` actions in ``[-1, 1]`` -> ``num_q`` (two) ``[N]`` Q-values."""
        x = preprocess_obs(obs, self.observation_space)
        heads = [self.q1] if self.q2 is None else [self.q1, self.q2]
        if self.encoders is None:
            x = torch.cat([x, actions], dim=-1)
            return tuple(q(x).squeeze(-1) for q in heads)
        return tuple(q(torch.cat([encoder(x), actions], dim=-1)).squeeze(-1)
                     for q, encoder in zip(heads, self.encoders, strict=True))


class OrnsteinUhlenbeckNoise:
    """Temporally correlated exploration noise, one process per env (Uhlenbeck & Ornstein 1930, as
    DDPG's paper explores): ``x <- x - theta * x * dt + sigma * sqrt(dt) * N(0, 1)``, from zero,
    and from zero again in an env whose episode ended (``reset``; Stable-Baselines3 resets its
    noise there too). Its state is per DDP rank (``states``, saved in checkpoints by TD3)."""

    def __init__(self, sigma: float, theta: float = 0.15, dt: float = 1e-2) -> None:
        self.sigma, self.theta, self.dt = sigma, theta, dt
        self.states: dict[tuple[int, ...], Tensor] = {}  # by batch shape: the sampler's, predict's ...

    def __call__(self, shape: torch.Size, generator: torch.Generator | None, device: torch.device) -> Tensor:
        """The next ``[N, dim]`` noise. Each batch shape has a process of its own (``predict`` on one
        observation leaves the sampler's ``[num_envs, dim]`` process alone)."""
        state = self.states.get(tuple(shape))
        state = torch.zeros(shape, device=device) if state is None else state.to(device)
        gaussian = torch.randn(shape, generator=generator, device=device)
        self.states[tuple(shape)] = ornstein_uhlenbeck_step(state, gaussian, self.sigma, self.theta, self.dt)
        return self.states[tuple(shape)]

    def reset(self, ended: np.ndarray) -> None:
        """The processes of the envs whose episode ended (``ended [N]`` bool) start again from zero."""
        for shape, state in self.states.items():
            if shape[0] == len(ended):
                self.states[shape] = state.masked_fill(torch.as_tensor(ended, device=state.device).unsqueeze(-1), 0.0)


class DeterministicActor(BoxActor):
    """TD3's and DDPG's policy: ``tanh(mu(s))``, in ``[-1, 1]``, scaled to the Box bounds.

    Exploring (``compute_actions(explore=True)``) adds ``action_noise`` in the ``[-1, 1]`` scale
    and clips there, as Stable-Baselines3 does: ``"normal"`` (``N(0, action_noise_sigma)`` per
    step), an ``OrnsteinUhlenbeckNoise`` or ``None``."""

    OUTPUTS_PER_DIM, ALGORITHM = 1, "TD3"

    def forward(self, obs: Tensor) -> Tensor:
        """``[N, *obs_shape]`` -> ``[N, dim]`` actions in ``[-1, 1]``."""
        return torch.tanh(self.head(self.encoder(preprocess_obs(obs, self.observation_space))).float())

    def compute_actions(
        self, obs: Tensor, explore: bool = True, generator: torch.Generator | None = None,
        action_noise: str | OrnsteinUhlenbeckNoise | None = None, action_noise_sigma: float = 0.1,
    ) -> dict[str, Tensor]:
        """Env-scaled actions for ``[N, *obs_shape]`` observations."""
        actions = self(obs)
        if explore and action_noise == "normal":
            noise = torch.randn(actions.shape, generator=generator, device=actions.device)
            actions = (actions + action_noise_sigma * noise).clamp(-1.0, 1.0)
        elif explore and isinstance(action_noise, OrnsteinUhlenbeckNoise):
            actions = (actions + action_noise(actions.shape, generator, actions.device)).clamp(-1.0, 1.0)
        return {"actions": self.action_mid + actions * self.action_half}
