"""Atari (issue 25): the preprocessing of data/envs/atari.py on a scripted fake ALE game, then on
real ALE games (ale-py is in the test extra): shapes, switches, raw game scores in the
statistics and evaluation, clipped rewards for the learner, a short PPO fit with the CNN."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from lightning_rl import PPO
from lightning_rl.data.envs import EpisodeStatistics, gym_make, make_vector_env
from lightning_rl.data.envs.atari import GameScore, LifeLossEnds
from lightning_rl.evaluation import evaluate
from lightning_rl.nn.cnn import NatureCNN
from tests.conftest import spy_frames_and_rewards


class ScriptedGame(gym.Env):
    """A game of 3 lives: every step scores 5 points, every 4th step loses a life."""

    observation_space = gym.spaces.Box(0, 255, (2,), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.ale = SimpleNamespace(lives=lambda: self.lives)
        self.lives, self.t, self.resets = 3, 0, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        self.lives, self.t = 3, 0
        self.resets += 1
        return np.zeros(2, np.uint8), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        if self.t % 4 == 0:
            self.lives -= 1
        return np.full(2, self.t, np.uint8), 5.0, self.lives == 0, False, {}


def _preprocessed() -> gym.Env:
    return gym.wrappers.TransformReward(LifeLossEnds(GameScore(ScriptedGame())), np.sign)


def test_a_lost_life_ends_the_episode_for_learning_but_not_the_game():
    env = _preprocessed()
    env.reset(seed=0)
    steps = [env.step(0) for _ in range(4)]
    assert [s[2] for s in steps] == [False, False, False, True]  # the 4th step lost a life
    assert all(s[1] == 1.0 for s in steps)  # clipped: the learner sees the sign of 5
    assert "game_score" not in steps[-1][4]
    obs, _ = env.reset()  # the game goes on: a no-op step, no real reset
    game = env.unwrapped
    assert game.resets == 1 and game.t == 5 and int(obs[0]) == 5
    while True:
        _, _, terminated, _, info = env.step(0)
        if "game_score" in info:
            break
    assert terminated and info["game_score"] == 5.0 * 12 and info["game_length"] == 12  # raw, whole game
    env.reset()
    assert game.resets == 2  # after game over, a real reset


def test_the_statistics_and_evaluation_count_whole_games_with_raw_scores():
    venv = make_vector_env(_preprocessed, 2, "sync")
    assert isinstance(venv, EpisodeStatistics) and venv.game_scores  # GameScore says so in its metadata
    venv.reset(seed=0)
    dones = 0
    while venv.episode_count < 2:
        _, rewards, terminateds, truncateds, _ = venv.step(np.zeros(2, np.int64))
        dones += int((terminateds | truncateds).sum())
        assert set(rewards.tolist()) <= {0.0, 1.0}
    assert list(venv.return_queue) == [60.0, 60.0] and list(venv.length_queue) == [12, 12]
    assert dones == 6  # three lives each: six learning episodes, two games
    model = PPO(env=_preprocessed, seed=0, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8)
    assert evaluate(model, num_episodes=3) == [60.0, 60.0, 60.0]  # whole games, raw


# ale-py is in the test extra, so CI runs these
requires_ale = pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="needs ale-py")


@requires_ale
def test_ale_ids_get_the_standard_preprocessing_and_each_step_switches():
    env = gym_make("ALE/Breakout-v5")
    assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
    assert env.unwrapped._frameskip == 1  # the wrapper skips frames, with max-pooling
    assert env.spec.kwargs["repeat_action_probability"] == 0.25  # v5's sticky actions stay
    env.close()
    for kwargs, shape in [({"frame_stack": 1}, (84, 84)), ({"screen_size": 64}, (4, 64, 64)),
                          ({"grayscale": False, "frame_stack": 2}, (84, 84, 6)),
                          ({"grayscale": False, "frame_stack": 1}, (84, 84, 3))]:
        env = gym_make("ALE/Breakout-v5", **kwargs)
        obs, _ = env.reset(seed=0)
        assert env.observation_space.shape == shape == obs.shape, kwargs
        env.close()
    env = gym_make("ALE/Breakout-v5", clip_rewards=False, episodic_life=False, repeat_action_probability=0.0)
    assert env.spec.kwargs["repeat_action_probability"] == 0.0
    assert not any(isinstance(e, LifeLossEnds) for e in _wrappers(env))
    env.close()


def _wrappers(env: gym.Env) -> list[gym.Env]:
    found = [env]
    while hasattr(found[-1], "env"):
        found.append(found[-1].env)
    return found


@requires_ale
def test_a_short_ppo_fit_on_breakout_logs_raw_game_scores_and_trains_on_clipped_rewards():
    model = PPO(env="ALE/Breakout-v5", seed=0, num_envs=2, rollout_fragment_length=128, sgd_minibatch_size=64,
                num_sgd_iter=1, total_env_steps=768, hiddens=(), vf_share_layers=True, iterations_per_epoch=1)
    assert isinstance(model.policy.pi_encoder[1], NatureCNN)
    seen = spy_frames_and_rewards(model)
    pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(model)
    assert [s[:2] for s in seen] == [(torch.uint8, (4, 84, 84))] * 3
    assert set().union(*(s[2] for s in seen)) <= {0.0, 1.0}
    games = [r for s in seen for r in s[3]]
    assert games and all(r >= 0 and float(r).is_integer() for r in games)  # whole games were logged
    assert model.counters["num_env_steps_sampled"] == 768


@requires_ale
def test_record_plays_whole_atari_games_to_a_gif(tmp_path):
    from PIL import Image

    from lightning_rl.recording import record

    model = PPO(env="ALE/Breakout-v5", seed=0, num_envs=1, rollout_fragment_length=16, sgd_minibatch_size=16)
    returns = record(model, tmp_path / "breakout.gif", num_episodes=1, seed=0, max_frames=5000)
    assert len(returns) == 1 and returns[0] >= 0 and float(returns[0]).is_integer()  # one game, raw score
    with Image.open(tmp_path / "breakout.gif") as gif:
        assert gif.size == (160, 210) and gif.n_frames > 5  # the game's own screen, not the 84x84 input


@requires_ale
def test_resuming_an_atari_run_continues_with_fresh_games_and_says_so(tmp_path):
    """ALE's emulator state is no plain data: a checkpoint keeps the counters, weights and
    optimizer, and the resumed run restarts its games with a warning naming the env."""
    from tests.conftest import quiet_trainer

    kwargs = dict(env="ALE/Breakout-v5", seed=0, num_envs=2, rollout_fragment_length=32, sgd_minibatch_size=32,
                  num_sgd_iter=1, hiddens=(), vf_share_layers=True, iterations_per_epoch=2)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(PPO(**kwargs))
    trainer.save_checkpoint(tmp_path / "half.ckpt")
    resumed = PPO(**kwargs)
    with pytest.warns(UserWarning, match=r"the checkpoint holds no env state of 'ALE/Breakout-v5'.*ALEInterface"):
        quiet_trainer(max_epochs=2).fit(resumed, ckpt_path=tmp_path / "half.ckpt")
    assert resumed.global_counters["num_env_steps_sampled"] == 256 and resumed.counters["num_iterations"] == 4


@requires_ale
def test_breakout_frames_are_stored_once_and_replayed_as_the_game_gave_them():
    """The grayscale stack declares itself (``metadata["frame_stack"]``), so the replay stores one
    84x84 frame per step; over 2 x 300 steps of Breakout (lost lives end episodes; each new
    episode's stack repeats its first frame) and a ring that wraps, every sampleable row's
    obs and next_obs equal those of a replay of whole observations."""
    from lightning_rl.data.buffers.frames import use_frame_storage
    from lightning_rl.data.buffers.replay_buffer import ReplayBuffer

    envs = make_vector_env("ALE/Breakout-v5", 2, "sync")
    space = envs.single_observation_space
    assert envs.metadata["frame_stack"] == 4 and use_frame_storage("auto", space, envs.metadata)
    assert "frame_stack" not in gym_make("ALE/Breakout-v5", grayscale=False).metadata  # color: whole observations
    kwargs = dict(capacity=2 * 120, observation_space=space, action_space=envs.single_action_space, num_envs=2,
                  n_step=3)
    frames, whole = ReplayBuffer(**kwargs, frame_stack=True), ReplayBuffer(**kwargs)
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=0)
    prev_done, ends, starts = np.zeros(2, dtype=bool), 0, 0
    for _ in range(300):
        actions = rng.integers(0, envs.single_action_space.n, 2)
        next_obs, rewards, terminateds, truncateds, _ = envs.step(actions)
        for buffer in (frames, whole):
            buffer.add(obs, actions, rewards, terminateds, truncateds, ~prev_done)
        starts += int(sum((o[:3] == o[3]).all() for o in next_obs[prev_done]))  # after a reset step
        obs, prev_done = next_obs, terminateds | truncateds
        ends += int(prev_done.sum())
    envs.close()
    assert ends >= 4 and starts == ends - int(prev_done.sum())  # every new episode's stack: its first frame 4 times
    flat = np.flatnonzero(frames._sampleable_flat)
    assert len(flat) > 150
    a, b = frames._transitions(flat), whole._transitions(flat)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert whole.storage_nbytes / frames.storage_nbytes > 3.8  # 4 less the flags and each env's last stack
