"""Every evaluation, test and ``record`` episode is capped: at the env's own time limit, else at
``evaluation_max_episode_steps``; a cut is said once, naming the env. Training on an env that
never ends is safe and says that the episode statistics will not report (issue 35, item 1)."""

from __future__ import annotations

import warnings
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest

from lightning_rl import PPO, evaluate, evaluation
from lightning_rl.recording import record
from tests.conftest import quiet_trainer


class GoRight(gym.Env):
    """Never terminates nor truncates: reward 1 a step, the position as observation."""

    metadata: ClassVar = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, render_mode=None):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.render_mode = render_mode
        self.x = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.x += 1
        return np.array([self.x % 7], np.float32), 1.0, False, False, {}

    def render(self):
        return np.zeros((4, 4, 3), np.uint8)


def go_right_limited():
    return gym.wrappers.TimeLimit(GoRight(), max_episode_steps=30)


def go_right_short():
    return gym.wrappers.TimeLimit(GoRight(), max_episode_steps=10)


def go_right_rendered():
    return GoRight(render_mode="rgb_array")


@pytest.fixture(autouse=True)
def _fresh_said():
    evaluation._CUT_SAID.clear()
    yield
    evaluation._CUT_SAID.clear()


@pytest.mark.timeout(60)
def test_an_env_without_time_limit_is_cut_at_the_setting_and_said_once():
    model = PPO(env=GoRight, evaluation_max_episode_steps=25, seed=0)
    with pytest.warns(UserWarning, match=r"2 of 2 episodes of env <class '.*GoRight'> were cut at "
                                         r"evaluation_max_episode_steps=25"):
        assert evaluate(model, num_episodes=2, seed=0) == [25.0, 25.0]  # the returns so far
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per env
        assert evaluate(model, num_episodes=3, seed=0, max_episode_steps=10) == [10.0, 10.0, 10.0]


@pytest.mark.timeout(60)
def test_the_envs_own_limit_applies_where_it_has_one():
    model = PPO(env=go_right_limited, evaluation_max_episode_steps=10, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert evaluate(model, num_episodes=2, seed=0) == [30.0, 30.0]  # not cut at 10


@pytest.mark.timeout(120)
def test_sanity_check_validate_and_test_end_on_an_env_that_never_ends():
    model = PPO(env=GoRight, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=16, total_env_steps=32,
                iterations_per_epoch=1, evaluation_interval=1, evaluation_num_episodes=2,
                evaluation_max_episode_steps=20, seed=0)
    trainer = quiet_trainer(num_sanity_val_steps=1)
    with pytest.warns(UserWarning, match="were cut at evaluation_max_episode_steps=20"):
        trainer.fit(model)
    assert trainer.callback_metrics["val/episode_return_mean"] == 20.0
    assert trainer.validate(model, verbose=False)[0]["val/episode_return_mean"] == 20.0
    assert trainer.test(model, verbose=False)[0]["test/episode_return_mean"] == 20.0


@pytest.mark.timeout(60)
def test_record_cuts_its_episodes_too(tmp_path):
    pytest.importorskip("PIL")
    model = PPO(env=go_right_rendered, evaluation_max_episode_steps=15, seed=0)
    with pytest.warns(UserWarning, match=r"record: 2 of 2 episodes of env .*go_right_rendered.* cut at "
                                         r"evaluation_max_episode_steps=15"):
        returns = record(model, tmp_path / "go.gif", num_episodes=2, max_frames=1000)
    assert returns == [15.0, 15.0]


@pytest.mark.timeout(60)
def test_training_on_an_env_that_never_ends_says_the_statistics_will_not_report():
    model = PPO(env=GoRight, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=16, total_env_steps=64,
                iterations_per_epoch=2, evaluation_max_episode_steps=16, seed=0)
    with pytest.warns(UserWarning, match=r"no episode of env <class '.*GoRight'> ended in the first 16 steps of each "
                                         r"of its 2 envs") as said:
        quiet_trainer().fit(model)
    assert sum("no episode of env" in str(w.message) for w in said) == 1  # once
    assert model.global_counters["num_env_steps_sampled"] == 64  # and training went on to its budget


def test_an_env_whose_episodes_end_is_not_warned_about():
    model = PPO(env=go_right_short, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=16,
                total_env_steps=64, iterations_per_epoch=2, evaluation_max_episode_steps=16, seed=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_trainer().fit(model)
    assert not [w for w in seen if "no episode of env" in str(w.message)]


@pytest.mark.parametrize("bad", [0, -5])
def test_a_bad_cap_is_rejected_when_the_module_is_built(bad):
    with pytest.raises(ValueError, match="evaluation_max_episode_steps must be positive"):
        PPO(evaluation_max_episode_steps=bad)
