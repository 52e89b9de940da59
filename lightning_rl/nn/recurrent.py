"""A recurrent actor-critic: MLP encoder, then an LSTM cell, then the heads.

The state of one env is one row ``[state_size]``: each trunk's ``(h, c)`` side by side (one
trunk with ``vf_share_layers``, else a policy and a value trunk). It is zeroed wherever an
episode starts (``episode_starts``), during sampling and in training alike, so a training
sequence started from the state recorded while sampling reproduces the sampling forward step
for step.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor, nn

from lightning_rl.nn.init import orthogonal_
from lightning_rl.nn.models import ActorCritic, Float32Linear, _init_linear, preprocess_obs

__all__ = ["RecurrentActorCritic"]


class RecurrentActorCritic(ActorCritic):
    """``ActorCritic`` with an LSTM cell of ``lstm_cell_size`` after each encoder (whose input
    may add the previous action, one-hot for Discrete and per component for MultiDiscrete, and
    the previous reward)."""

    recurrent = True

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        vf_share_layers: bool = False,
        lstm_cell_size: int = 64,
        lstm_use_prev_action: bool = False,
        lstm_use_prev_reward: bool = False,
        **settings: Any,
    ) -> None:
        """``settings``: ``ActorCritic``'s (``hiddens``, ``activation``, ``encoder``...)."""
        if lstm_cell_size < 1:
            raise ValueError(f"lstm_cell_size must be >= 1, got {lstm_cell_size}")
        super().__init__(observation_space, action_space, vf_share_layers=vf_share_layers, **settings)
        self.use_prev_action, self.use_prev_reward = lstm_use_prev_action, lstm_use_prev_reward
        self.cell_size = lstm_cell_size
        self.action_dim = self.pi_head.out_features  # a previous action's encoding has the head's width
        extra = (self.action_dim if lstm_use_prev_action else 0) + (1 if lstm_use_prev_reward else 0)
        lstm_in = self.features_dim + extra
        self.pi_lstm = nn.LSTMCell(lstm_in, lstm_cell_size)
        self.vf_lstm = None if vf_share_layers else nn.LSTMCell(lstm_in, lstm_cell_size)
        num_outputs = self.pi_head.out_features
        self.pi_head = Float32Linear(lstm_cell_size, num_outputs)
        self.vf_head = Float32Linear(lstm_cell_size, 1)
        _init_linear(self.pi_head, 0.01)
        _init_linear(self.vf_head, 1.0)
        for lstm in (self.pi_lstm, self.vf_lstm):
            if lstm is not None:  # orthogonal weights and zero biases, as CleanRL's LSTM PPO
                for name, param in lstm.named_parameters():
                    (orthogonal_(param, math.sqrt(2)) if "weight" in name else nn.init.zeros_(param))

    @property
    def state_size(self) -> int:
        return (1 if self.vf_lstm is None else 2) * 2 * self.cell_size

    def initial_state(self, n: int, device: torch.device | str | None = None) -> Tensor:
        """``[n, state_size]`` zeros: the state at an episode's start."""
        return torch.zeros(n, self.state_size, device=device)

    def _extra(self, prev_actions: Tensor | None, prev_rewards: Tensor | None, n: int, like: Tensor) -> list[Tensor]:
        parts = []
        if self.use_prev_action:
            if prev_actions is None:
                parts.append(like.new_zeros(n, self.action_dim))
            elif isinstance(self.action_space, gym.spaces.Discrete):  # one-hot
                parts.append(nn.functional.one_hot(prev_actions.long().reshape(n), self.action_dim).to(like.dtype))
            elif isinstance(self.action_space, gym.spaces.MultiDiscrete):  # one one-hot per component
                # the zeros standing for "no previous action" may lie below a non-zero start: clamp
                first = torch.as_tensor(self.action_space.start, device=prev_actions.device)
                index = torch.maximum(prev_actions.reshape(n, -1), first)
                parts.append(preprocess_obs(index, self.action_space).to(like.dtype))
            else:  # Box values, MultiBinary 0/1
                parts.append(prev_actions.reshape(n, self.action_dim).to(like.dtype))
        if self.use_prev_reward:
            parts.append(like.new_zeros(n, 1) if prev_rewards is None else prev_rewards.reshape(n, 1).to(like.dtype))
        return parts

    def step(
        self, obs: Tensor, state: Tensor, episode_starts: Tensor, prev_actions: Tensor | None = None,
        prev_rewards: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One time step for ``N`` envs: ``(pi features, vf features, next state)``; the state is
        zeroed first where ``episode_starts``."""
        n = obs.shape[0]
        x = self.encoder_input(obs)
        keep = (~episode_starts.reshape(n, 1).bool()).to(state.dtype)
        state = state * keep
        pi_x = self.pi_encoder(x)
        extra = self._extra(prev_actions, prev_rewards, n, pi_x)
        h = self.cell_size
        pi_h, pi_c = self.pi_lstm(torch.cat([pi_x, *extra], -1), (state[:, :h], state[:, h:2 * h]))
        if self.vf_lstm is None:
            return pi_h, pi_h, torch.cat([pi_h, pi_c], -1)
        vf_x = self.vf_encoder(x)
        vf_h, vf_c = self.vf_lstm(torch.cat([vf_x, *extra], -1), (state[:, 2 * h:3 * h], state[:, 3 * h:]))
        return pi_h, vf_h, torch.cat([pi_h, pi_c, vf_h, vf_c], -1)

    def forward(
        self, obs: Tensor, state_in: Tensor, episode_starts: Tensor, prev_actions: Tensor | None = None,
        prev_rewards: Tensor | None = None, detach_every: int | None = None,
    ) -> tuple:
        """``[L, B, ...]`` time-major sequences from ``[B, state_size]`` initial states ->
        (action distribution over the ``L * B`` rows in time-major order, ``[L * B]`` values).
        ``detach_every``: truncate backpropagation through time to that many steps."""
        pi_out, vf_out = [], []
        state = state_in
        for t in range(obs.shape[0]):
            if detach_every and t and t % detach_every == 0:
                state = state.detach()
            pi_h, vf_h, state = self.step(obs[t], state, episode_starts[t],
                                          None if prev_actions is None else prev_actions[t],
                                          None if prev_rewards is None else prev_rewards[t])
            pi_out.append(pi_h)
            vf_out.append(vf_h)
        pi_features, vf_features = torch.cat(pi_out), torch.cat(vf_out)
        return self.distribution(self.pi_head(pi_features)), self.vf_head(vf_features).squeeze(-1)

    def compute_actions(
        self, obs: Tensor, explore: bool = True, generator: torch.Generator | None = None,
        state_in: Tensor | None = None, episode_starts: Tensor | None = None, prev_actions: Tensor | None = None,
        prev_rewards: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """Actions for ``[N, ...]`` observations from ``state_in`` (zeros if None), with their
        log-probs, values and the next state (``state_out``)."""
        n = obs.shape[0]
        if state_in is None:
            state_in = self.initial_state(n, obs.device)
        if episode_starts is None:
            episode_starts = torch.zeros(n, dtype=torch.bool, device=obs.device)
        pi_h, vf_h, state_out = self.step(obs, state_in, episode_starts, prev_actions, prev_rewards)
        dist = self.distribution(self.pi_head(pi_h))
        actions = dist.sample(generator) if explore else dist.deterministic_sample()
        return {"actions": actions, "action_logp": dist.log_prob(actions), "vf_preds": self.vf_head(vf_h).squeeze(-1),
                "state_out": state_out}

    def value(self, obs: Tensor, state_in: Tensor | None = None, episode_starts: Tensor | None = None,
              prev_actions: Tensor | None = None, prev_rewards: Tensor | None = None) -> Tensor:
        return self.compute_actions(obs, False, None, state_in, episode_starts, prev_actions,
                                    prev_rewards)["vf_preds"]
