"""Networks: MLP encoders and the actor-critic policy of the policy-gradient methods."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from lightning_rl.nn.cnn import default_image_encoder
from lightning_rl.nn.distributions import Bernoulli, Categorical, DiagGaussian, Distribution, MultiCategorical
from lightning_rl.nn.encoders import ACTIVATIONS, Activation, EncoderSpec, build_encoder, resolve_activation
from lightning_rl.nn.init import orthogonal_
from lightning_rl.nn.normalization import RunningMeanStd

__all__ = ["ACTIVATIONS", "MLP", "ActorCritic", "Float32Linear", "flat_obs_dim", "mlp", "preprocess_obs"]


class Float32Linear(nn.Linear):
    """``nn.Linear`` that computes in float32 under autocast: the output heads (logits, values,
    Q-values, Gaussian parameters) whose outputs losses compare across forwards.

    Under ``precision="bf16-mixed"`` a bf16 head rounds logits to 8 bits of mantissa, so PPO's
    ratio between the float32 actor and the learner is off 1 by about 0.5% per row before any
    step (``benchmarks/bf16_ratio.py``); the trunk stays in bf16, the head's few rows of matmul
    are float32 (standard mixed-precision practice: keep the logits' layer in full precision).
    Same parameters and names as ``nn.Linear``; without autocast it is ``nn.Linear``.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not torch.is_autocast_enabled(x.device.type):
            return nn.functional.linear(x, self.weight, self.bias)
        with torch.autocast(x.device.type, enabled=False):
            return nn.functional.linear(x.float(), self.weight, self.bias)


class MLP(nn.Sequential):
    """``nn.Sequential`` whose forward runs each layer's ``forward`` directly.

    An acting step runs these networks on a few rows per env step, where the time goes to
    per-call overhead rather than arithmetic; skipping each layer's ``__call__`` (its hook
    bookkeeping) saves about a third of an actor-critic's acting forward on CPU. Under
    ``torch.compile`` it calls the layers as ``nn.Sequential`` does (the trace removes that
    overhead anyway, and the graph stays the one measured). Same layers, parameter names and results as
    ``nn.Sequential``; in eager mode, hooks registered on the individual layers (not on the
    MLP itself) do not run.
    """

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():  # traced: nothing to gain, keep nn.Sequential's graph
            for layer in self._modules.values():
                x = layer(x)
            return x
        for layer in self._modules.values():
            x = layer.forward(x)  # type: ignore[union-attr]
        return x


def mlp(in_dim: int, hiddens: Sequence[int], activation: Activation, first: Sequence[nn.Module] = ()) -> MLP:
    """Fully connected layers ``in_dim -> hiddens...``, each followed by ``activation`` (a
    name such as ``"gelu"``, an import path or an ``nn.Module`` class), after the ``first``
    layers (a user's encoder)."""
    act = resolve_activation(activation)
    layers: list[nn.Module] = list(first)
    for size in hiddens:
        layers += [nn.Linear(in_dim, size), act()]
        in_dim = size
    return MLP(*layers)


def trunk(space: gym.Space, in_dim: int, hiddens: Sequence[int], activation: Activation,
          encoder: EncoderSpec) -> tuple[MLP, int, int]:
    """``(layers, output width, count of encoder layers first)``: ``encoder`` (reading the
    observations in their own shape; for an image space without one, ``nature_cnn`` or
    ``impala_cnn``, see ``nn/cnn.py``) then the MLP of ``hiddens``."""
    first: list[nn.Module] = []
    if encoder is None:
        encoder = default_image_encoder(space)
    if encoder is not None:
        box = isinstance(space, gym.spaces.Box)  # others arrive one-hot / flat
        shape = tuple(space.shape) if box else (in_dim,)
        user, in_dim = build_encoder(encoder, space, shape)
        first = [nn.Unflatten(1, shape), user] if len(shape) > 1 else [user]
    hiddens = list(hiddens)
    return mlp(in_dim, hiddens, activation, first), hiddens[-1] if hiddens else in_dim, len(first)


def _init_linear(module: nn.Module, gain: float) -> None:
    # Orthogonal init (Saxe et al. 2014) as in the PPO reference implementations:
    # sqrt(2) for hidden layers, 0.01 for the policy head, 1 for the value head.
    for m in module.modules():
        if isinstance(m, nn.Linear):
            orthogonal_(m.weight, gain)
            nn.init.zeros_(m.bias)


def flat_obs_dim(space: gym.Space) -> int:
    """Input width for an observation space; raises naming the space if unsupported."""
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete) and len(space.shape) == 1:
        return int(space.nvec.sum())
    if isinstance(space, gym.spaces.MultiBinary):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        raise ValueError(f"observation space {space} reached a network unflattened: lightning_rl flattens Dict and "
                         "Tuple observations where it makes single-agent envs (lightning_rl.data.envs.spaces); "
                         "flatten them yourself elsewhere (e.g. multi-agent envs)")
    raise ValueError(f"unsupported observation space {space}: use Box, Discrete, MultiDiscrete (1-D), MultiBinary, "
                     "or Dict/Tuple of them")


def preprocess_obs(obs: Tensor, space: gym.Space) -> Tensor:
    """``[N, *obs_shape]`` env observations -> ``[N, flat_obs_dim]`` float network input:
    Discrete one-hot, MultiDiscrete one one-hot per component, anything else flattened."""
    if isinstance(space, gym.spaces.Discrete):
        return nn.functional.one_hot(obs.long().reshape(-1) - int(space.start), int(space.n)).float()
    if isinstance(space, gym.spaces.MultiDiscrete):
        index = obs.long().reshape(obs.shape[0], -1) - torch.as_tensor(space.start, device=obs.device)
        width = int(space.nvec.max())
        hot = nn.functional.one_hot(index, width).float()  # [N, k, width], then each component's n columns
        rows, cols = _one_hot_columns(space)
        return hot[:, rows, cols]
    return obs.reshape(obs.shape[0], -1).float()


def _one_hot_columns(space: gym.spaces.MultiDiscrete) -> tuple[Tensor, Tensor]:
    """Indices into ``[k, max(nvec)]`` that keep component ``i``'s first ``nvec[i]`` columns."""
    nvec = [int(n) for n in space.nvec]
    rows = torch.tensor([i for i, n in enumerate(nvec) for _ in range(n)])
    cols = torch.tensor([j for n in nvec for j in range(n)])
    return rows, cols


def action_head_size(space: gym.Space) -> int:
    """Policy-head outputs for an action space: logits of each Discrete/MultiDiscrete value,
    one logit per MultiBinary entry, a mean per Box dimension; raises naming the space if
    unsupported."""
    if isinstance(space, gym.spaces.Discrete):
        if int(space.start) != 0:
            raise ValueError(f"unsupported action space {space}: Discrete actions must start at 0")
        return int(space.n)
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return int(space.shape[0])
    if isinstance(space, gym.spaces.MultiDiscrete) and len(space.shape) == 1:
        return int(space.nvec.sum())
    if isinstance(space, gym.spaces.MultiBinary) and len(space.shape) == 1:
        return int(space.shape[0])
    raise ValueError(f"unsupported action space {space}: use Discrete, 1-D Box, 1-D MultiDiscrete or 1-D "
                     "MultiBinary actions")


class ActorCritic(nn.Module):
    """Policy and value function; separate networks unless ``vf_share_layers``.

    Each trunk is ``encoder`` (a user's network, see ``nn/encoders.py``; none by default)
    then the ``hiddens`` MLP. Discrete actions get a categorical distribution over logits,
    MultiDiscrete one categorical per component, MultiBinary one Bernoulli per entry; Box
    actions a diagonal Gaussian with a state-independent learned log std (actions are clipped
    to the bounds only when sent to the env, so log-probabilities stay exact).

    ``normalize_observations``: the input is standardized by the running mean and std of the
    observations the learner has trained on (``obs_rms``, updated by the algorithm, clipped
    to ``+-observation_clip``); ``normalize_rewards``: ``return_rms`` keeps the std of the
    discounted return the algorithm scales rewards by. Both are buffers of this module, so
    checkpoints, ``predict`` and ``export_policy`` apply the same statistics.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hiddens: Sequence[int] = (64, 64),
        activation: Activation = "tanh",
        vf_share_layers: bool = False,
        log_std_init: float = 0.0,
        encoder: EncoderSpec = None,
        normalize_observations: bool = False,
        observation_clip: float | None = 10.0,
        normalize_rewards: bool = False,
        reward_clip: float | None = 10.0,
    ) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        in_dim = flat_obs_dim(observation_space)
        self.obs_rms = RunningMeanStd(in_dim, observation_clip) if normalize_observations else None
        self.return_rms = RunningMeanStd((), reward_clip) if normalize_rewards else None
        num_outputs = action_head_size(action_space)
        self.log_std = (nn.Parameter(torch.full((num_outputs,), float(log_std_init)))
                        if isinstance(action_space, gym.spaces.Box) else None)
        if isinstance(action_space, gym.spaces.MultiDiscrete):
            # plain ints: torch.compile would trace the space's numpy nvec as a tensor
            self.action_nvec = tuple(int(n) for n in action_space.nvec)
            start = torch.as_tensor(action_space.start, dtype=torch.int64)
            # a buffer, so it follows the module's device (not saved: the space defines it)
            self.register_buffer("action_start", start if bool(start.any()) else None, persistent=False)
        hiddens = list(hiddens)
        self.pi_encoder = self._trunk(in_dim, hiddens, activation, encoder)
        self.vf_encoder = None if vf_share_layers else self._trunk(in_dim, hiddens, activation, encoder)
        out_dim = self.features_dim
        self.pi_head = Float32Linear(out_dim, num_outputs)
        self.vf_head = Float32Linear(out_dim, 1)
        # the user's encoder keeps its own initialization
        _init_linear(self.pi_encoder[self._user_layers:], math.sqrt(2))
        if self.vf_encoder is not None:
            _init_linear(self.vf_encoder[self._user_layers:], math.sqrt(2))
        _init_linear(self.pi_head, 0.01)
        _init_linear(self.vf_head, 1.0)

    def _trunk(self, in_dim: int, hiddens: list[int], activation: Activation, encoder: EncoderSpec) -> MLP:
        """``trunk``; sets ``features_dim`` and ``_user_layers``."""
        layers, self.features_dim, self._user_layers = trunk(self.observation_space, in_dim, hiddens, activation,
                                                             encoder)
        return layers

    def encoder_input(self, obs: Tensor) -> Tensor:
        """``[N, *obs_shape]`` observations -> ``[N, flat_obs_dim]`` floats, standardized when
        ``normalize_observations``: what each trunk reads."""
        x = preprocess_obs(obs, self.observation_space)
        return x if self.obs_rms is None else self.obs_rms.normalize(x)

    def distribution(self, pi_out: Tensor) -> Distribution:
        """The action distribution over the policy head's ``[N, num_outputs]`` outputs."""
        if self.log_std is not None:
            return DiagGaussian(pi_out, self.log_std)
        if isinstance(self.action_space, gym.spaces.MultiDiscrete):
            return MultiCategorical(pi_out, self.action_nvec, self.action_start)
        if isinstance(self.action_space, gym.spaces.MultiBinary):
            return Bernoulli(pi_out)
        return Categorical(pi_out)

    def forward(self, obs: Tensor) -> tuple[Distribution, Tensor]:
        """``[N, *obs_shape]`` -> (action distribution over ``N`` rows, ``[N]`` values)."""
        x = self.encoder_input(obs)
        features = self.pi_encoder(x)
        vf_features = features if self.vf_encoder is None else self.vf_encoder(x)
        return self.distribution(self.pi_head(features)), self.vf_head(vf_features).squeeze(-1)

    def value(self, obs: Tensor) -> Tensor:
        x = self.encoder_input(obs)
        return self.vf_head((self.pi_encoder if self.vf_encoder is None else self.vf_encoder)(x)).squeeze(-1)

    def compute_actions(
        self, obs: Tensor, explore: bool = True, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """Actions for ``[N, *obs_shape]`` observations, with their log-probs and values."""
        dist, values = self(obs)
        actions = dist.sample(generator) if explore else dist.deterministic_sample()
        return {"actions": actions, "action_logp": dist.log_prob(actions), "vf_preds": values}
