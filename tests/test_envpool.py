"""envpool as a vector backend (``vectorization="envpool"``, data/envs/envpool_env.py): the same
frames, episode ends, reset rows and raw scores as the gymnasium path on the same game; each
mapped Atari switch changes what it should; seeded streams; fits with it (PPO, a sampler
worker), resume, and bad input. DDP: tests/test_ddp.py (mode ``envpool``)."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl import IMPALA, PPO
from lightning_rl.batch import SampleBatch
from lightning_rl.data.envs import GymMake, env_spaces, gym_make, make_vector_env
from lightning_rl.data.samplers.engine import EnvSampler
from lightning_rl.evaluation import evaluate
from tests.conftest import quiet_trainer, spy_frames_and_rewards

pytest.importorskip("envpool")  # in the test extra, so CI runs these

# the gymnasium path and envpool play the same frames with these (module docstring of envpool_env.py)
SAME_FRAMES = dict(noop_max=1, fire_reset=False, episodic_life=False, clip_rewards=False,
                   repeat_action_probability=0.0)


def _play(venv: gym.vector.VectorEnv, actions: np.ndarray, seed: int = 0) -> list[tuple]:
    """Every step's ``(obs, rewards, terminateds, truncateds)`` under ``actions [T, N]``."""
    obs, _ = venv.reset(seed=seed)
    steps = [(obs, None, None, None)]
    for a in actions:
        obs, rewards, terminateds, truncateds, _ = venv.step(a)
        steps.append((obs, np.asarray(rewards, np.float64), terminateds, truncateds))
    return steps


def test_envpool_and_gymnasium_play_the_same_atari_game_frame_by_frame():
    """Breakout without sticky actions or random starts: the same frames, rewards, game ends,
    reset rows and whole-game raw scores and lengths, step for step, past the first game."""
    spec = GymMake("ALE/Breakout-v5", SAME_FRAMES)
    actions = np.random.default_rng(0).integers(0, 4, (450, 2))
    runs = {}
    for mode in ("sync", "envpool"):
        venv = make_vector_env(spec, 2, mode)
        runs[mode] = (_play(venv, actions), list(venv.return_queue), list(venv.length_queue))
        venv.close()
    (gym_steps, gym_returns, gym_lengths), (pool_steps, pool_returns, pool_lengths) = runs["sync"], runs["envpool"]
    assert pool_steps[0][0].shape == (2, 4, 84, 84) and pool_steps[0][0].dtype == np.uint8
    for t, (g, p) in enumerate(zip(gym_steps, pool_steps, strict=True)):
        assert np.array_equal(g[0], p[0]), t
        for a, b in zip(g[1:], p[1:], strict=True):
            assert (a is None and b is None) or np.array_equal(a, b), t
    ends = [t for t, s in enumerate(pool_steps[1:]) if s[2].any()]
    assert ends and all(pool_steps[t + 2][1][pool_steps[t + 1][2]].sum() == 0 for t in ends)  # reset rows: reward 0
    assert gym_returns == pool_returns and gym_lengths == pool_lengths and len(pool_returns) >= 2
    assert all(r > 0 and float(r).is_integer() for r in pool_returns)


def _ends(sampler: EnvSampler, steps: int, actions: Any = None) -> dict[str, Any]:
    """Per env: the dones between whole games, rows, and whether every reset row is invalid."""
    rng = np.random.default_rng(1)
    n = sampler.num_envs
    dones, rewards, valid_after_done = np.zeros(n, int), [], []
    lives_per_game: list[int] = []
    prev_done = np.zeros(n, bool)
    for _ in range(steps):
        a = rng.integers(0, sampler.envs.single_action_space.n, n) if actions is None else actions
        _, r, te, tr, valid = sampler.step(a)
        valid_after_done.extend(valid[prev_done].tolist())
        rewards.append(r)
        prev_done = te | tr
        dones += prev_done
        for env in sampler.envs.last_ended:
            lives_per_game.append(int(dones[env]))
            dones[env] = 0
    return {"dones_per_game": lives_per_game, "rewards": np.stack(rewards), "reset_rows_valid": valid_after_done,
            "games": sampler.episode_info()}


@pytest.mark.parametrize("env_id", ["ALE/Breakout-v5"])
def test_default_atari_preprocessing_agrees_on_shapes_episode_ends_and_raw_scores(env_id):
    """The defaults (sticky actions, random no-ops, FIRE at reset, a lost life ends an episode,
    clipped rewards): on both paths uint8 (4, 84, 84) frames, one episode end per life (5 in
    Breakout) for each whole game, reset rows after every end, clipped rewards, and logged
    returns that are whole games' raw scores."""
    found = {}
    for mode in ("sync", "envpool"):
        sampler = EnvSampler(env_id, 2, mode, seed=0)
        sampler.open()
        sampler.reset(0)
        assert sampler.obs.shape == (2, 4, 84, 84) and sampler.obs.dtype == np.uint8, mode
        found[mode] = _ends(sampler, 400)
        sampler.close()
    for mode, got in found.items():
        assert got["dones_per_game"] and set(got["dones_per_game"]) == {5}, mode
        assert not any(got["reset_rows_valid"]), mode
        assert set(np.unique(got["rewards"]).tolist()) <= {0.0, 1.0}, mode
        returns = got["games"]["episode_returns"]
        assert len(returns) == len(got["dones_per_game"]) and all(float(r).is_integer() for r in returns), mode


def test_whole_game_scores_are_raw_when_the_learner_sees_clipped_rewards():
    """Space Invaders scores 5-30 points a hit: the learner's rewards are their signs, the
    logged game scores the raw sums (equal to the rewards' sums with clip_rewards=False)."""
    scores = {}
    for clip in (True, False):
        sampler = EnvSampler(GymMake("ALE/SpaceInvaders-v5", {"clip_rewards": clip, "episodic_life": False,
                                                              "repeat_action_probability": 0.0}),
                             1, "envpool", seed=0)
        sampler.open()
        sampler.reset(0)
        got = _ends(sampler, 900)
        sampler.close()
        games = got["games"]["episode_returns"]
        assert games, clip
        rows = got["rewards"][: got["games"]["episode_lengths"][0] + 1, 0]  # the first game (and a reset row)
        scores[clip] = (games[0], set(np.unique(rows).tolist()), rows.sum())
    clipped, raw = scores[True], scores[False]
    assert clipped[1] <= {0.0, 1.0} and clipped[0] > clipped[2]  # raw score above the sum of clipped rewards
    assert max(raw[1]) > 1 and raw[0] == raw[2]


def test_cartpole_dynamics_episode_ends_and_truncation_agree_with_gymnasium():
    """From the same state CartPole moves the same on both paths until the pole falls
    (terminated); with max_episode_steps a balancing controller's episodes are truncated at
    that length on both, with raw returns equal to it and invalid reset rows after them."""
    pool = make_vector_env("CartPole-v1", 1, "envpool")
    obs, _ = pool.reset(seed=3)
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    env.unwrapped.state = obs[0].astype(np.float64)
    for t in range(100):
        obs, reward, terminated, truncated, _ = pool.step(np.array([1]))
        g_obs, g_reward, g_terminated, g_truncated, _ = env.step(1)
        np.testing.assert_allclose(obs[0], g_obs, rtol=1e-5, atol=1e-6)
        assert (reward[0], terminated[0], truncated[0]) == (g_reward, g_terminated, g_truncated), t
        if g_terminated:
            break
    assert g_terminated and t < 20
    pool.close()
    env.close()
    for mode in ("sync", "envpool"):
        sampler = EnvSampler(GymMake("CartPole-v1", {"max_episode_steps": 25}), 2, mode, seed=0)
        sampler.open()
        sampler.reset(0)
        valid_after, ends = [], []
        for t in range(60):
            obs = sampler.obs
            _, _, te, tr, valid = sampler.step((obs[:, 2] + obs[:, 3] > 0).astype(np.int64))
            if t in (25, 51):
                valid_after.append(valid)
            ends.append((te.any(), tr.all()))
        assert [t for t, e in enumerate(ends) if e[1]] == [24, 50] and not any(e[0] for e in ends), mode
        assert not np.any(valid_after), mode
        assert sampler.episode_info()["episode_returns"] == [25.0] * 4, mode
        sampler.close()


def _pool(kwargs: dict[str, Any], num_envs: int = 2, game: str = "ALE/Breakout-v5") -> gym.vector.VectorEnv:
    return make_vector_env(GymMake(game, kwargs), num_envs, "envpool")


def _first_done(venv: gym.vector.VectorEnv, action: int, limit: int, seed: int = 0) -> int | None:
    venv.reset(seed=seed)
    for t in range(limit):
        _, _, te, tr, _ = venv.step(np.full(venv.num_envs, action))
        if (te | tr).any():
            return t
    return None


def test_atari_frames_are_laid_out_as_on_the_gymnasium_path():
    for kwargs in ({}, {"frame_stack": 1}, {"screen_size": 64}, {"grayscale": False, "frame_stack": 2},
                   {"grayscale": False, "frame_stack": 1}):
        pool_space, _ = env_spaces(GymMake("ALE/Breakout-v5", kwargs), "envpool")
        gym_env = gym_make("ALE/Breakout-v5", **kwargs)
        assert pool_space == gym_env.observation_space, kwargs
        gym_env.close()
    assert env_spaces(GymMake("ALE/Breakout-v5", {"full_action_space": True}), "envpool")[1] == gym.spaces.Discrete(18)
    # color frames, channels last: the same pixels as the gymnasium path, frame for frame
    for kwargs in ({"grayscale": False, "frame_stack": 2}, {"frame_stack": 1}):
        spec = GymMake("ALE/Breakout-v5", {**SAME_FRAMES, **kwargs})
        actions = np.random.default_rng(0).integers(0, 4, (20, 1))
        frames = [_play(make_vector_env(spec, 1, mode), actions)[-1][0] for mode in ("sync", "envpool")]
        assert frames[1].dtype == np.uint8 and np.array_equal(*frames), kwargs


def test_envpool_frame_stacks_are_stored_once_in_the_replay():
    """envpool's grayscale stack declares itself as the gymnasium path's does, so DQN's replay stores
    one frame per step; over 2 x 600 steps of Breakout (lost lives: envpool's stack runs on; game
    overs: a stack of the first frame) every sampleable row equals a whole-observation replay's."""
    from lightning_rl.data.buffers.frames import use_frame_storage
    from lightning_rl.data.buffers.replay_buffer import ReplayBuffer

    envs = make_vector_env("ALE/Breakout-v5", 2, "envpool")
    space = envs.single_observation_space
    assert envs.metadata["frame_stack"] == 4 and use_frame_storage("auto", space, envs.metadata)
    color = make_vector_env(GymMake("ALE/Breakout-v5", {"grayscale": False}), 1, "envpool")
    assert "frame_stack" not in color.metadata  # channels last: whole observations
    color.close()
    kwargs = dict(capacity=2 * 120, observation_space=space, action_space=envs.single_action_space, num_envs=2,
                  n_step=3)
    frames, whole = ReplayBuffer(**kwargs, frame_stack=True), ReplayBuffer(**kwargs)
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=0)
    prev_done, ends = np.zeros(2, dtype=bool), 0
    for _ in range(600):
        actions = rng.integers(0, envs.single_action_space.n, 2)
        next_obs, rewards, terminateds, truncateds, _ = envs.step(actions)
        for buffer in (frames, whole):
            buffer.add(obs, actions, rewards, terminateds, truncateds, ~prev_done)
        obs, prev_done = next_obs, terminateds | truncateds
        ends += int(prev_done.sum())
    envs.close()
    assert ends >= 10
    flat = np.flatnonzero(frames._sampleable_flat)
    assert len(flat) > 150
    a, b = frames._transitions(flat), whole._transitions(flat)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert whole.storage_nbytes / frames.storage_nbytes > 3.8


def test_fire_reset_and_episodic_life_switch():
    """With NOOPs only, Breakout's ball is launched (and a life lost soon) only by the FIRE at
    reset; a lost life ends an episode (5 per game) or only game over does (1 per game)."""
    still = {"repeat_action_probability": 0.0}  # a sticky NOOP may replace envpool's one FIRE frame
    assert _first_done(_pool({**still, "fire_reset": False}), 0, 200) is None
    assert _first_done(_pool({**still, "fire_reset": True}), 0, 200) is not None
    for episodic, per_game in ((True, {5}), (False, {1})):
        sampler = EnvSampler(GymMake("ALE/Breakout-v5", {"episodic_life": episodic}), 2, "envpool", seed=0)
        sampler.open()
        sampler.reset(0)
        assert set(_ends(sampler, 400)["dones_per_game"]) == per_game
        sampler.close()


def test_frame_skip_noop_max_and_sticky_actions_switch():
    # frame_skip with the frame limit: 400 frames are 100 agent steps at frame_skip=4, 200 at 2 (truncated)
    for skip, steps in ((4, 100), (2, 200)):
        venv = _pool({"frame_skip": skip, "max_num_frames_per_episode": 400, "fire_reset": False}, 1)
        assert _first_done(venv, 0, 250) == steps - 1
        venv.close()
    # noop_max: random no-ops at the start (before FIRE launches the ball) tell seeded envs apart; 1 plays none
    for noop_max, differ in ((30, True), (1, False)):
        venv = _pool({"noop_max": noop_max, "repeat_action_probability": 0.0}, 4)
        obs = _play(venv, np.zeros((3, 4), np.int64))[-1][0]
        assert any(not np.array_equal(obs[0], o) for o in obs[1:]) == differ, noop_max
        venv.close()
    # repeat_action_probability: sticky actions make seeded envs part under the same actions
    for sticky, differ in ((0.25, True), (0.0, False)):
        venv = _pool({"noop_max": 0, "repeat_action_probability": sticky}, 2, "ALE/Pong-v5")
        obs = _play(venv, np.repeat(np.random.default_rng(0).integers(0, 6, (60, 1)), 2, axis=1))[-1][0]
        assert (not np.array_equal(obs[0], obs[1])) == differ, sticky
        venv.close()


def _stream(env: Any, seed: int | None, steps: int = 40, num_envs: int = 2) -> np.ndarray:
    """The observations of ``steps`` seeded random actions, then those of a reset with the same seed."""
    sampler = EnvSampler(env, num_envs, "envpool", seed=seed)
    sampler.open()
    sampler.reset(seed)
    rng = np.random.default_rng(0)
    out = [sampler.obs.copy()]
    for _ in range(steps):
        sampler.step(rng.integers(0, sampler.envs.single_action_space.n, num_envs))
        out.append(sampler.obs.copy())
    sampler.reset(seed)
    out.append(sampler.obs.copy())
    sampler.close()
    return np.stack(out)


@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "CartPole-v1"])
def test_a_seed_gives_reproducible_streams_and_env_j_gets_seed_plus_j(env_id):
    """Pong with its sticky actions and random no-ops, CartPole with its random starts."""
    a, b, c = _stream(env_id, 0), _stream(env_id, 0), _stream(env_id, 1, num_envs=1)
    assert np.array_equal(a, b) and not np.array_equal(a[:, 0], c[:, 0])
    assert np.array_equal(a[0, 1], c[0, 0])  # env 1 of seed 0 starts as env 0 of seed 1
    assert np.array_equal(a[-1], a[0])  # a reset with the same seed restarts the same streams
    if env_id == "CartPole-v1":  # no seed: OS entropy
        assert not np.array_equal(_stream(env_id, None), _stream(env_id, None))


def test_a_short_ppo_fit_on_atari_with_envpool_and_its_evaluation():
    # games of at most 2,000 frames: a greedy policy may never press FIRE (envpool_env.py's docstring)
    model = PPO(env="ALE/Breakout-v5", env_kwargs={"max_num_frames_per_episode": 2000}, vectorization="envpool",
                seed=0, num_envs=2, rollout_fragment_length=128, sgd_minibatch_size=64, num_sgd_iter=1,
                total_env_steps=512, hiddens=(), vf_share_layers=True, iterations_per_epoch=1)
    seen = spy_frames_and_rewards(model)
    quiet_trainer(max_epochs=-1).fit(model)
    assert [s[:2] for s in seen] == [(torch.uint8, (4, 84, 84))] * 2
    assert set().union(*(s[2] for s in seen)) <= {0.0, 1.0}
    games = [r for s in seen for r in s[3]]
    assert games and all(r >= 0 and float(r).is_integer() for r in games)  # whole games, raw
    assert model.counters["num_env_steps_sampled"] == 512
    returns = evaluate(model, num_episodes=2, seed=0, vectorization="envpool")
    assert len(returns) == 2 and all(r >= 0 and float(r).is_integer() for r in returns)


def test_resuming_an_envpool_run_continues_with_fresh_episodes_and_says_so(tmp_path):
    """envpool has no API for its envs' state: a checkpoint keeps the counters, weights and
    optimizer, and the resumed run restarts its episodes with a warning that says why."""
    kwargs = dict(env="CartPole-v1", vectorization="envpool", seed=0, num_envs=2, rollout_fragment_length=32,
                  sgd_minibatch_size=32, num_sgd_iter=1, iterations_per_epoch=2)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(PPO(**kwargs))
    trainer.save_checkpoint(tmp_path / "half.ckpt")
    resumed = PPO(**kwargs)
    with pytest.warns(UserWarning, match=r"the checkpoint holds no env state of 'CartPole-v1'.*is envpool's, which "
                                         r"keeps its envs' state in C\+\+"):
        quiet_trainer(max_epochs=2).fit(resumed, ckpt_path=tmp_path / "half.ckpt")
    assert resumed.global_counters["num_env_steps_sampled"] == 256 and resumed.counters["num_iterations"] == 4


def test_impala_with_a_sampler_worker_on_envpool_atari():
    model = IMPALA(env="ALE/Breakout-v5", vectorization="envpool", encoder="nature_cnn", num_workers=1, num_envs=2,
                   rollout_fragment_length=32, train_batch_size=64, hiddens=(), total_env_steps=128, seed=0,
                   sampler_timeout_s=60.0, iterations_per_epoch=2)
    seen: list[Any] = []
    post = model.postprocess

    def spy(batch: Any) -> Any:
        seen.append(batch.policy_batches["default_policy"][SampleBatch.OBS])
        return post(batch)

    model.postprocess = spy
    quiet_trainer(max_epochs=-1).fit(model)
    assert seen and all(obs.dtype == torch.uint8 and tuple(obs.shape[2:]) == (4, 84, 84) for obs in seen)
    assert model.counters["num_env_steps_sampled"] == 128 and model.counters["num_grad_updates"] > 0


def test_bad_input_is_a_one_line_error():
    with pytest.raises(ValueError, match="envpool provides no env 'LunarLander-v9'"):
        PPO(env="LunarLander-v9", vectorization="envpool")
    with pytest.raises(ValueError, match="name Atari games as gymnasium does, 'ALE/Pong-v5'"):
        PPO(env="Pong-v5", vectorization="envpool")
    with pytest.raises(ValueError, match="builds its envs from an env id"):
        PPO(env=lambda: gym.make("CartPole-v1"), vectorization="envpool")
    with pytest.raises(ValueError, match="envpool takes no stickiness; it takes clip_rewards, "):
        PPO(env="ALE/Pong-v5", env_kwargs={"stickiness": 0.1}, vectorization="envpool")
    with pytest.raises(ValueError, match="frame_skip, frame_stack and screen_size must be >= 1"):
        PPO(env="ALE/Pong-v5", env_kwargs={"frame_skip": 0}, vectorization="envpool")
    venv = make_vector_env("CartPole-v1", 2, "envpool")
    with pytest.raises(ValueError, match="resets all its envs together"):
        venv.reset(seed=0, options={"reset_mask": np.array([True, False])})
    venv.close()


def test_classic_control_and_mujoco_ids_run_on_envpool():
    """Continuous actions (Pendulum, Hopper: float64 spaces as envpool declares them) through
    the engine, with Box actions clipped and raw returns."""
    for env_id in ("Pendulum-v1", "Hopper-v4"):
        sampler = EnvSampler(env_id, 2, "envpool", seed=0)
        sampler.open()
        sampler.reset(0)
        space = sampler.envs.single_action_space
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(220):
                sampler.step(np.full((2, *space.shape), 5.0))
        assert sampler.episode_info()["episode_returns"], env_id
        sampler.close()
