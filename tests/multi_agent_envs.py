"""Small scripted PettingZoo parallel envs for the multi-agent tests."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv


class Relay(ParallelEnv):
    """Episodes of ``length`` steps. ``runner`` acts from the start and terminates at step
    ``leave_at``; ``helper`` joins at step ``join_at`` (its first observation comes with that
    step's results) and is truncated when the episode ends. Observations are ``[t, agent index,
    episode]``; each agent's reward at step ``t`` is ``t + 10 * agent index``. Actions: 0/1,
    and action 1 adds 0.5 to the reward (so a policy can learn something)."""

    def __init__(self, length: int = 6, leave_at: int = 4, join_at: int = 2, same_spaces: bool = True) -> None:
        self.metadata = {"name": "relay_v0"}
        self.possible_agents = ["runner", "helper"]
        self.length, self.leave_at, self.join_at = length, leave_at, join_at
        self.same_spaces = same_spaces
        self.episode = -1
        self._observation_spaces = {
            a: gym.spaces.Box(-1e6, 1e6, (3 if same_spaces or a == "runner" else 4,), np.float32)
            for a in self.possible_agents
        }
        self._action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}

    def observation_space(self, agent: str) -> gym.Space:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._action_spaces[agent]

    def _obs(self, agent: str) -> np.ndarray:
        index = self.possible_agents.index(agent)
        values = [self.t, index, self.episode] + ([] if self.same_spaces or agent == "runner" else [0.0])
        return np.asarray(values, dtype=np.float32)

    def reset(self, seed=None, options=None):
        self.t, self.episode = 0, self.episode + 1
        self.agents = ["runner"]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {a: float(self.t + 10 * self.possible_agents.index(a) + 0.5 * int(actions[a])) for a in actions}
        terminations = {a: a == "runner" and self.t >= self.leave_at for a in actions}
        truncations = {a: self.t >= self.length for a in actions}
        live = [a for a in self.agents if not (terminations[a] or truncations[a])]
        if self.t == self.join_at and self.t < self.length:
            live.append("helper")
        obs = {a: self._obs(a) for a in set(actions) | set(live)}
        self.agents = live
        return obs, rewards, terminations, truncations, {a: {} for a in obs}


def by_agent(agent: str) -> str:
    """Each agent its own policy, ``p_<agent>``."""
    return "p_" + agent


class RankRelay(Relay):
    """Relay whose helper joins only in envs reset with a seed below 1000: under DDP (env seeds
    ``seed + 1000 * rank``) only rank 0 has helper rows."""

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.join_at = 2 if seed < 1000 else 10**9
        return super().reset(seed=seed, options=options)


class SilentRelay(Relay):
    """Relay whose episode ends with the helper removed from ``agents`` without a done flag
    (some envs do): the sampler must cut its trajectory there, as a truncation."""

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = super().step(actions)
        return obs, rewards, terminations, dict.fromkeys(truncations, False), infos
