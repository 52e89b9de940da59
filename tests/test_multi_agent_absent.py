"""Agents absent from a multi-agent env's step: the rows IMPALA and APPO keep for them hold valid
observations and actions (spaces that start above 0), and an agent the env removes without a
done flag or a next observation is bootstrapped alike by PPO's GAE, IMPALA's V-trace and DQN's
n-step windows."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from pettingzoo import ParallelEnv

from lightning_rl import APPO, DQN, IMPALA, PPO
from lightning_rl.batch import SampleBatch
from tests.conftest import quiet_trainer, sample_once
from tests.multi_agent_envs import by_agent

GAMMA = 0.9


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


class Vanishing(ParallelEnv):
    """Episodes of 6 steps, observations ``[t, agent index, episode]``, rewards ``t + 10 * agent
    index``. ``stay`` acts throughout and is truncated at the end. ``gone`` is removed from
    ``agents`` after its step 3 with no done flag and no observation; ``cut`` is truncated at its
    step 2 with no observation."""

    def __init__(self) -> None:
        self.metadata = {"name": "vanishing_v0"}
        self.possible_agents = ["stay", "gone", "cut"]
        self.episode = -1
        self._observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
        self._action_space = gym.spaces.Discrete(2)

    def observation_space(self, agent: str) -> gym.Space:
        return self._observation_space

    def action_space(self, agent: str) -> gym.Space:
        return self._action_space

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent), self.episode], dtype=np.float32)

    def reset(self, seed=None, options=None):
        self.t, self.episode = 0, self.episode + 1
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {a: float(self.t + 10 * self.possible_agents.index(a)) for a in actions}
        terminations = dict.fromkeys(actions, False)
        truncations = {a: self.t >= 6 or (a == "cut" and self.t >= 2) for a in actions}
        self.agents = [a for a in self.agents if not truncations[a] and not (a == "gone" and self.t >= 3)]
        obs = {a: self._obs(a) for a in self.agents}
        if self.t >= 6:
            obs["stay"] = self._obs("stay")
        return obs, rewards, terminations, truncations, {a: {} for a in obs}


def test_ppo_and_impala_bootstrap_an_agent_removed_without_a_flag_or_an_observation_alike():
    """``gone`` acts at t = 0, 1, 2 and vanishes; ``cut`` acts at t = 0, 1 and is truncated with
    no observation. Both are truncations (no termination was declared) bootstrapped from the
    observation they last acted in: the last row's GAE target (PPO) and V-trace target (IMPALA)
    are its reward plus gamma times that observation's value, with the same weights."""
    settings = dict(env=Vanishing, policies=["p_stay", "p_gone", "p_cut"], policy_mapping_fn=by_agent, num_envs=1,
                    rollout_fragment_length=12, gamma=GAMMA, seed=0, hiddens=(8,), total_env_steps=10**6)
    impala = IMPALA(**settings, num_workers=0, train_batch_size=12, sampler_timeout_s=30.0)
    ppo = PPO(**settings, lambda_=0.8, sgd_minibatch_size=4)
    ppo.policies.load_state_dict(impala.policies.state_dict())
    fragments, rollout = sample_once(impala), sample_once(ppo)
    for pid, last_t in (("p_gone", 2), ("p_cut", 1)):
        policy = impala.policies[pid]
        final = torch.tensor([[last_t, 1.0 if pid == "p_gone" else 2.0, 0.0]])  # the observation it acted in
        with torch.no_grad():
            expected = last_t + 1 + 10 * float(final[0, 1]) + GAMMA * float(policy.value(final))

        ppo_rows = rollout.policy_batches[pid]
        row = int(torch.nonzero((ppo_rows["obs"][:, 0] == last_t) & (ppo_rows["obs"][:, 2] == 0))[0])
        assert not ppo_rows["terminateds"][row]
        assert float(ppo_rows["value_targets"][row]) == pytest.approx(expected, rel=1e-5)

        cols = fragments.policy_batches[pid]
        assert cols["valid"][:, 0].tolist()[: last_t + 2] == [True] * (last_t + 1) + [False]
        assert cols["truncateds"][last_t, 0] and not cols["terminateds"].any()
        assert torch.equal(cols["obs"][last_t + 1, 0], final[0])  # where V-trace reads the next value
        with torch.no_grad():
            _, _, values, bootstrap_value, _ = impala.time_major_forward(pid, cols, None)
            vs, _ = impala.vtrace_targets(cols, cols["action_logp"], values, bootstrap_value)
        assert float(vs[last_t, 0]) == pytest.approx(expected, rel=1e-5)


def test_dqn_cuts_the_n_step_windows_of_an_agent_removed_without_a_flag_or_an_observation_alike():
    """The same rule for DQN's n-step windows (n = 2), over two episodes: ``gone`` (acts at t = 0,
    1, 2, then vanishes) and ``cut`` (acts at t = 0, 1, truncated with no observation) end their
    windows at their last step as truncations: not terminated, discounted (a bootstrap), with the
    observation they last acted in as the next observation; ``stay``'s last windows bootstrap from
    the final observation the env gave (t = 6). No window runs into the next episode."""
    model = DQN(env=Vanishing, policies=["p_stay", "p_gone", "p_cut"], policy_mapping_fn=by_agent, num_envs=1,
                train_freq=12, learning_starts=10**6, n_step=2, gamma=GAMMA, buffer_size=100, seed=0, hiddens=(8,),
                total_env_steps=10**6)
    sample_once(model)
    scripts = (("p_stay", 0, range(6), 6), ("p_gone", 1, range(3), 2), ("p_cut", 2, range(2), 1))
    for pid, index, acts, final_t in scripts:  # (policy, agent index, steps it acts at, its final observation's t)
        buffer = model.default_datamodule.buffers[pid]
        cols = {k: v[: len(buffer)] for k, v in buffer._columns.items()}
        assert len(buffer) == 2 * len(acts)  # every step of both episodes
        assert sorted(int(o[0]) for o in cols["obs"]) == sorted([*acts, *acts])
        assert sorted({int(o[2]) for o in cols["obs"]}) == [0, 1]
        assert not cols["terminateds"].any()  # no termination was declared
        for n in range(len(buffer)):
            t, episode = int(cols["obs"][n][0]), int(cols["obs"][n][2])
            assert cols["obs"][n].tolist() == [t, index, episode]
            window = [s for s in (t, t + 1) if s in acts]
            expected = sum(GAMMA ** k * (s + 1 + 10 * index) for k, s in enumerate(window))  # Vanishing's rewards
            assert float(cols["rewards"][n]) == pytest.approx(expected, rel=1e-6)
            assert float(cols["discounts"][n]) == pytest.approx(GAMMA ** len(window), rel=1e-6)  # bootstrapped
            # the step after the window; past the agent's last step, its final observation
            assert cols["next_obs"][n].tolist() == [min(window[-1] + 1, final_t), index, episode]


class StartedDiscreteActions(Started):
    """``Started`` with ``Discrete(2)`` actions for both agents (what DQN takes)."""

    def __init__(self) -> None:
        super().__init__()
        self._action_spaces["multi"] = gym.spaces.Discrete(2)


@pytest.mark.parametrize("algo", [PPO, DQN])
def test_ddp_placeholder_rows_are_valid_points_of_spaces_that_start_above_zero(algo):
    """A DDP rank without rows of a policy steps on a placeholder batch: its observations and
    actions lie in the policy's spaces, so the loss runs on ``Discrete(start=2)`` and
    ``MultiDiscrete(start=...)`` observations (zeros would one-hot ``0 - start``)."""
    kwargs = dict(num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8) if algo is PPO else {}
    env = Started if algo is PPO else StartedDiscreteActions
    model = algo(env=env, policies=["p_disc", "p_multi"], policy_mapping_fn=by_agent, seed=0, hiddens=(8,), **kwargs)
    for pid in ("p_disc", "p_multi"):
        obs_space, action_space = model.policy_spaces[pid]
        batch = model.placeholder_batch(pid)
        for o in batch[SampleBatch.OBS]:
            assert obs_space.contains(o.numpy().astype(obs_space.dtype)), (pid, o)
        if algo is DQN:
            for a in batch[SampleBatch.ACTIONS]:
                assert action_space.contains(a.numpy().astype(action_space.dtype)), (pid, a)
            loss, _ = model.loss(pid, batch)
        else:
            loss, _ = model.loss(pid, batch, scalars=model.loss_scalars(pid))
        assert torch.isfinite(loss)
