"""Agents absent from a multi-agent env's step: the rows IMPALA and APPO keep for them hold valid
observations and actions (spaces that start above 0)."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from pettingzoo import ParallelEnv

from lightning_rl import APPO, IMPALA
from tests.conftest import quiet_trainer, sample_once
from tests.multi_agent_envs import by_agent


class Started(ParallelEnv):
    """Episodes of 6 steps. ``disc`` observes a ``Discrete(3, start=2)`` and acts in
    ``Discrete(2)``; ``multi`` observes a ``MultiDiscrete([3, 4], start=[2, 5])``, acts in a
    ``MultiDiscrete([2, 2], start=[1, 3])``, joins at step 1 and terminates at step 3, so both
    have rows where they are absent. Both are truncated at the end."""

    def __init__(self) -> None:
        self.metadata = {"name": "started_v0"}
        self.possible_agents = ["disc", "multi"]
        self._observation_spaces = {"disc": gym.spaces.Discrete(3, start=2),
                                    "multi": gym.spaces.MultiDiscrete([3, 4], start=[2, 5])}
        self._action_spaces = {"disc": gym.spaces.Discrete(2), "multi": gym.spaces.MultiDiscrete([2, 2], start=[1, 3])}

    def observation_space(self, agent: str) -> gym.Space:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._action_spaces[agent]

    def _obs(self, agent: str) -> np.ndarray:
        if agent == "disc":
            return np.int64(2 + self.t % 3)
        return np.array([2 + self.t % 3, 5 + self.t % 4], dtype=np.int64)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, ["disc"]
        return {"disc": self._obs("disc")}, {"disc": {}}

    def step(self, actions):
        self.t += 1
        rewards = {a: float(self.t) + float(np.sum(actions[a])) for a in actions}
        terminations = {a: a == "multi" and self.t >= 3 for a in actions}
        truncations = {a: self.t >= 6 for a in actions}
        live = [a for a in self.agents if not (terminations[a] or truncations[a])]
        if self.t == 1:
            live.append("multi")
        obs = {a: self._obs(a) for a in set(actions) | set(live)}
        self.agents = live
        return obs, rewards, terminations, truncations, {a: {} for a in obs}


@pytest.mark.parametrize("algo", [IMPALA, APPO])
def test_impala_and_appo_fit_on_discrete_spaces_that_start_above_zero_with_absent_agents(algo):
    def make():
        return algo(env=Started, policies=["p_disc", "p_multi"], policy_mapping_fn=by_agent, num_workers=0,
                    num_envs=2, rollout_fragment_length=8, train_batch_size=16, total_env_steps=64, seed=0,
                    hiddens=(8,), sampler_timeout_s=30.0)

    batch, model = sample_once(make()), make()
    for pid, agent in (("p_disc", "disc"), ("p_multi", "multi")):
        cols = batch.policy_batches[pid]
        assert not cols["valid"].all()  # the agent is absent from some rows
        obs_space, action_space = model.policy_spaces[pid]
        for o in (*cols["obs"].flatten(0, 1), *cols["bootstrap_obs"]):
            assert obs_space.contains(o.numpy().astype(obs_space.dtype)), (agent, o)
        for a in cols["actions"].flatten(0, 1):
            assert action_space.contains(a.numpy().astype(action_space.dtype)), (agent, a)
    before = copy.deepcopy(model.policies.state_dict())
    trainer = quiet_trainer(max_epochs=-1)
    trainer.fit(model)
    assert model.counters["num_iterations"] == 4
    after = model.policies.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before if k.endswith("vf_head.weight"))
    assert all(torch.isfinite(p).all() for p in model.parameters())
