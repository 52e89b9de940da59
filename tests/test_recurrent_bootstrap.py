"""A recurrent policy's value of a truncated episode's final observation: the bootstrap that GAE
and V-trace read must come from the state (and previous action and reward) the episode carried,
not from a zeroed state. Checked by value against a step-by-step loop that carries the LSTM state
through each episode up to its final observation, and zeroes it only at the next episode's first
step (as Stable-Baselines3's RecurrentPPO does)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl import A2C, APPO, IMPALA, PPO
from tests.conftest import sample_once

GAMMA = 0.9
EPISODE = 5  # every episode is cut by a time limit after this many steps
PERIOD = EPISODE + 1  # under next-step autoreset: the episode's rows, then its reset row


class TimeLimited(gym.Env):
    """Episodes cut (truncated, never terminated) after ``EPISODE`` steps. The observation is
    ``[steps taken / EPISODE, episode offset]``, the offset drawn at reset, so the final
    observation after a step is known from the observation before it; the reward is
    ``offset + action``."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self) -> np.ndarray:
        return np.array([self.t / EPISODE, self.offset], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.offset = 0, float(self.np_random.uniform(-1.0, 1.0))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), self.offset + float(action), False, self.t >= EPISODE, {}


SETTINGS = dict(env=TimeLimited, use_lstm=True, lstm_use_prev_action=True, lstm_use_prev_reward=True, num_envs=2,
                hiddens=(16,), lstm_cell_size=8, seed=0, vectorization="sync", gamma=GAMMA, total_env_steps=10**6)


def carried_values(policy: torch.nn.Module, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                   after: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values [T, N], value after the fragment [N])`` from a loop over each env's rows: the state
    starts from zeros at each episode's first step (row ``t % PERIOD == 0``) and is carried through
    every later row, the final observation's (the reset row, ``t % PERIOD == EPISODE``) included,
    with the previous row's action and reward as the previous-action and -reward inputs."""
    T, N = actions.shape[:2]
    values = torch.empty(T, N)
    following = torch.empty(N)
    with torch.no_grad():
        for n in range(N):
            state = prev_action = prev_reward = None
            for t in range(T + 1):
                if t % PERIOD == 0:  # an episode's first step
                    state = policy.initial_state(1)
                    prev_action, prev_reward = torch.zeros(1, dtype=torch.int64), torch.zeros(1)
                out = policy.compute_actions((obs[t, n] if t < T else after[n])[None], explore=False,
                                             state_in=state, episode_starts=torch.zeros(1, dtype=torch.bool),
                                             prev_actions=prev_action, prev_rewards=prev_reward)
                if t == T:
                    following[n] = out["vf_preds"][0]
                    break
                values[t, n] = out["vf_preds"][0]
                state, prev_action, prev_reward = out["state_out"], actions[t, n][None], rewards[t, n][None]
    return values, following


def check_schedule(truncateds: torch.Tensor, valid: torch.Tensor) -> None:
    """The rows are what ``carried_values`` assumes: a truncation at the episode's last row, then a reset row."""
    t = torch.arange(truncateds.shape[0])[:, None].expand_as(truncateds)
    assert torch.equal(truncateds, t % PERIOD == EPISODE - 1)
    assert torch.equal(~valid, t % PERIOD == EPISODE)


@pytest.mark.parametrize("algo", [PPO, A2C])
def test_gae_bootstraps_a_truncation_from_the_state_the_episode_carried(algo):
    """11-step fragments: rows 0-4 an episode truncated at row 4, row 5 its final observation (the
    reset row), rows 6-10 the next episode, truncated at the fragment's last row, so its final
    observation comes after the fragment (the bootstrap value)."""
    T = 11
    extra = dict(sgd_minibatch_size=2 * T) if algo is PPO else {}
    model = algo(**SETTINGS, rollout_fragment_length=T, max_seq_len=T, lambda_=0.8, **extra)
    batch = sample_once(model).policy_batches["default_policy"]

    def time_major(x: torch.Tensor) -> torch.Tensor:  # sequences are env columns: rows n * T + t
        return x.reshape(2, T, *x.shape[1:]).transpose(0, 1)

    obs, actions, rewards = (time_major(batch[k]) for k in ("obs", "actions", "rewards"))
    check_schedule(time_major(batch["truncateds"]), time_major(batch["mask"]).bool())
    final = torch.stack([torch.ones(2), obs[-1, :, 1]], dim=1)  # after the last row: [5 / 5, its offset]
    values, following = carried_values(model.policies["default_policy"], obs, actions, rewards, final)

    torch.testing.assert_close(time_major(batch["vf_preds"]), values, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the training forward runs the same states (the sequences are the env columns)
        rows = (torch.arange(2)[None, :] * T + torch.arange(T)[:, None]).flatten()
        _, train_values = model.policy_forward("default_policy", batch.select(rows), None)
    torch.testing.assert_close(train_values.reshape(T, 2), values, rtol=1e-5, atol=1e-6)
    targets = time_major(batch["value_targets"])
    # a truncated row's target is its reward plus the discounted value of the final observation
    torch.testing.assert_close(targets[EPISODE - 1], rewards[EPISODE - 1] + GAMMA * values[EPISODE],
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(targets[T - 1], rewards[T - 1] + GAMMA * following, rtol=1e-5, atol=1e-6)
    # and a zeroed state would have given another value there
    zeroed = model.policies["default_policy"].value(obs[EPISODE])
    assert not torch.allclose(zeroed, values[EPISODE], atol=1e-4)
    # what sampling recorded, for the training forward: the episode starts at its first step only
    assert torch.equal(time_major(batch["episode_starts"])[:, 0], torch.arange(T) % PERIOD == 0)


@pytest.mark.parametrize(("algo", "workers"), [(IMPALA, 0), (APPO, 0), (IMPALA, 1)])
def test_vtrace_bootstraps_a_truncation_from_the_state_the_episode_carried(algo, workers):
    """The same 11-step fragments, sampled in the learner process or by a sampler worker: the
    sampled values and the learner's recomputed ones (the V-trace inputs) equal the carried
    state's, and a truncated row's target is its reward plus the discounted final value."""
    from tests.test_async import children
    from tests.test_env_faults import live_pids

    T = 11
    processes = set(children())
    model = algo(**SETTINGS, num_workers=workers, rollout_fragment_length=T, train_batch_size=2 * T,
                 sampler_timeout_s=30.0)
    batch = sample_once(model).policy_batches["default_policy"]
    assert not live_pids([p for p in children() if p not in processes], grace_s=3.0)  # no worker outlives it
    check_schedule(batch["truncateds"], batch["valid"])
    policy = model.policies["default_policy"]
    values, following = carried_values(policy, batch["obs"], batch["actions"], batch["rewards"],
                                       batch["bootstrap_obs"])
    torch.testing.assert_close(batch["vf_preds"], values, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        _, _, learner_values, bootstrap_value, _ = model.time_major_forward("default_policy", batch, None)
        vs, _ = model.vtrace_targets(batch, batch["action_logp"], learner_values, bootstrap_value)
    torch.testing.assert_close(learner_values, values, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bootstrap_value, following, rtol=1e-5, atol=1e-6)
    rewards = batch["rewards"]
    torch.testing.assert_close(vs[EPISODE - 1], rewards[EPISODE - 1] + GAMMA * values[EPISODE], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(vs[T - 1], rewards[T - 1] + GAMMA * following, rtol=1e-5, atol=1e-6)
    assert torch.equal(batch["episode_starts"][:, 0], torch.arange(T) % PERIOD == 0)
    assert not batch["bootstrap_episode_starts"].any()  # the fragment ended an episode: it continues
