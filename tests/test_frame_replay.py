"""A replay that stores stacked frames once per step (data/buffers/frames.py): it hands out exactly
what a replay of whole observations hands out for the same stream and the same rows, keeps
uint8, fits a (4, 84, 84) transition in under 7.5 KB, works with prioritized replay, n-step
windows, several envs, ring wrap-around, DQN, resume and the checkpoint setting."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl import DQN
from lightning_rl.batch import SampleBatch
from lightning_rl.data.buffers import replay_buffer
from lightning_rl.data.buffers.frames import use_frame_storage
from lightning_rl.data.buffers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer
from lightning_rl.data.envs import make_vector_env
from tests.conftest import quiet_trainer
from tests.image_envs import BrightSide, RandomFrames, frame_stacked, stacked_bright_side
from tests.multi_agent_envs import RankRelay, by_agent


def random_frame_stack(stack: int = 4, size: int = 6, padding_type: str = "reset") -> gym.Env:
    return frame_stacked(RandomFrames(size=size), stack, padding_type)


class Stream:
    """A vector env of frame stacks stepped as the sampling engine steps it (next-step autoreset:
    ``obs`` is what the actions were taken in, ``valid`` False on the reset steps), into buffers."""

    def __init__(self, num_envs: int, seed: int = 0, **env_kwargs) -> None:
        self.envs = make_vector_env(partial(random_frame_stack, **env_kwargs), num_envs, "sync")
        self.num_envs, self.seed = num_envs, seed
        self.rng = np.random.default_rng(seed)
        self.ends = {"terminated": 0, "truncated": 0}
        self.restart()

    def restart(self) -> None:
        self.obs, _ = self.envs.reset(seed=int(self.rng.integers(1 << 30)))
        self.prev_done = np.zeros(self.num_envs, dtype=bool)

    def feed(self, buffers: list[ReplayBuffer], steps: int) -> None:
        for _ in range(steps):
            actions = self.rng.integers(0, 3, self.num_envs)
            obs, rewards, terminateds, truncateds, _ = self.envs.step(actions)
            for buffer in buffers:
                buffer.add(self.obs, actions, rewards, terminateds, truncateds, ~self.prev_done)
            self.obs, self.prev_done = obs, terminateds | truncateds
            self.ends["terminated"] += int(terminateds.sum())
            self.ends["truncated"] += int(truncateds.sum())


def assert_same_rows(frames: ReplayBuffer, whole: ReplayBuffer, flat: np.ndarray) -> None:
    a, b = frames._transitions(flat), whole._transitions(flat)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def expected_sampleable(frames: ReplayBuffer, whole: ReplayBuffer) -> np.ndarray:
    """The whole-observation replay's sampleable slots less those whose stack reads an overwritten row."""
    newest = frames.num_added - 1
    row = newest - (newest - np.arange(frames.rows)) % frames.rows  # the step each slot holds
    oldest = newest - frames.rows + 1  # the oldest step stored, once the ring wrapped
    fresh = (row - (frames.obs_shape[0] - 1) >= oldest) | (oldest <= 0)
    return whole._sampleable & fresh[:, None]


@pytest.mark.parametrize("num_envs, n_step, padding_type", [(1, 1, "reset"), (3, 3, "reset"), (2, 3, "zero")])
def test_the_frame_replay_hands_out_what_a_whole_observation_replay_does(num_envs, n_step, padding_type):
    """The same stream (terminations, truncations, a restart of the envs mid-stream, the ring
    wrapping four times) into both: every sampleable row's obs, next_obs, action, n-step return,
    discount and terminated are equal; the sampleable rows are the other's less the K - 1 oldest
    per env; before the ring wraps, the same seed draws the same batches."""
    stream = Stream(num_envs, seed=0, padding_type=padding_type)
    kwargs = dict(capacity=20 * num_envs, observation_space=stream.envs.single_observation_space,
                  action_space=stream.envs.single_action_space, num_envs=num_envs, n_step=n_step, gamma=0.9, seed=3)
    frames, whole = ReplayBuffer(**kwargs, frame_stack=True), ReplayBuffer(**kwargs)
    assert frames.frames is not None and whole.frames is None
    stream.feed([frames, whole], 12)
    assert len(frames) == len(whole) > 0
    for _ in range(2):  # not wrapped yet: the same seed draws the same rows
        first, second = frames.sample(64), whole.sample(64)
        assert all(torch.equal(first[k], second[k]) for k in first)
    for chunk in range(12):
        stream.feed([frames, whole], 7)
        if chunk == 6:  # the envs restart without an episode end (as after a resume without the buffer)
            frames.end_episodes(), whole.end_episodes()
            stream.restart()
        np.testing.assert_array_equal(frames._sampleable, expected_sampleable(frames, whole))
        assert len(frames) == int(frames._sampleable.sum()) > 0
        flat = np.flatnonzero(frames._sampleable_flat)
        assert_same_rows(frames, whole, flat)
        batch = frames.sample(32)  # drawn from the frame replay, the same rows from the other
        assert_same_rows(frames, whole, batch[SampleBatch.BATCH_INDEXES].numpy())
    assert frames.num_added == 12 + 84 > 4 * frames.rows
    assert stream.ends["terminated"] >= 3 and stream.ends["truncated"] >= 2, stream.ends
    # stacks whose first frames are padding were replayed: episode starts inside the K - 1 rows before
    flat = np.flatnonzero(frames._sampleable_flat)
    obs = frames._transitions(flat)[SampleBatch.OBS]
    padded = (obs[:, 0] == (obs[:, 3] if padding_type == "reset" else 0)).flatten(1).all(1)
    assert padded.any() and not padded.all()


def test_stored_frames_stay_uint8_and_take_under_7_5_kb_per_transition():
    """(4, 84, 84) uint8 stacks in a prioritized replay: one 84x84 frame per transition plus its
    action, reward, flags and priorities; the whole-observation replay holds 4 times the pixels."""
    stream = Stream(1, size=84)
    kwargs = dict(capacity=4096, observation_space=stream.envs.single_observation_space,
                  action_space=stream.envs.single_action_space, n_step=3, seed=0)
    frames, whole = PrioritizedReplayBuffer(**kwargs, frame_stack=True), PrioritizedReplayBuffer(**kwargs)
    stream.feed([frames, whole], 40)
    state = frames.state_dict()
    assert state["frames"].dtype == np.uint8 and state["frames"].shape == (4096, 1, 84, 84)
    assert "obs" not in state and frames.sample(8)[SampleBatch.NEXT_OBS].dtype == torch.uint8
    per_transition = frames.nbytes / frames.capacity
    assert 84 * 84 < per_transition <= 7_500, per_transition
    assert whole.nbytes / frames.nbytes > 3.9


def test_prioritized_replay_on_frames():
    """Before the ring wraps, the same draws, weights and priorities as over whole observations;
    after it, rows whose stack lost a frame have priority 0 and are never drawn, and the drawn
    rows equal the other replay's; priority updates reach exactly the drawn slots."""
    stream = Stream(2, seed=1)
    kwargs = dict(capacity=48, observation_space=stream.envs.single_observation_space,
                  action_space=stream.envs.single_action_space, num_envs=2, n_step=2, seed=5)
    frames, whole = PrioritizedReplayBuffer(**kwargs, frame_stack=True), PrioritizedReplayBuffer(**kwargs)
    stream.feed([frames, whole], 20)
    td = np.random.default_rng(0)
    for _ in range(3):
        a, b = frames.sample(16, beta=0.5), whole.sample(16, beta=0.5)
        assert all(torch.equal(a[k], b[k]) for k in a)
        errors = td.standard_normal(16)
        frames.update_priorities(a[SampleBatch.BATCH_INDEXES], errors)
        whole.update_priorities(b[SampleBatch.BATCH_INDEXES], errors)
        np.testing.assert_array_equal(frames.priorities(np.arange(48)), whole.priorities(np.arange(48)))
    stream.feed([frames, whole], 30)
    dead = ~frames._sampleable_flat
    assert (frames.priorities(np.flatnonzero(dead)) == 0).all() and (dead & whole._sampleable_flat).any()
    batch = frames.sample(64, beta=0.5)
    flat = batch[SampleBatch.BATCH_INDEXES].numpy()
    assert frames._sampleable_flat[flat].all()
    assert_same_rows(frames, whole, flat)
    frames.update_priorities(flat, np.full(64, 7.0))
    assert np.allclose(frames.priorities(flat), (7.0 + frames.eps) ** frames.alpha)


def test_a_stream_that_is_not_a_frame_stack_is_refused_before_anything_changes():
    space = gym.spaces.Box(0, 255, (4, 6, 6), np.uint8)
    buffer = ReplayBuffer(32, space, gym.spaces.Discrete(2), frame_stack=True)
    rng = np.random.default_rng(0)
    step = dict(actions=np.zeros(1), rewards=np.zeros(1), terminateds=np.zeros(1, bool),
                truncateds=np.zeros(1, bool), valid=np.ones(1, bool))
    first = np.repeat(rng.integers(1, 255, (1, 1, 6, 6), dtype=np.uint8), 4, axis=1)
    buffer.add(first, **step)  # an episode's first stack: the first frame four times
    with pytest.raises(ValueError, match="not a frame stack along their first axis; use replay_frame_stack=False"):
        buffer.add(rng.integers(1, 255, (1, 4, 6, 6), dtype=np.uint8), **step)
    assert buffer.num_added == 1
    with pytest.raises(ValueError, match="n_step=3 with 4 stacked frames needs at least 8"):
        ReplayBuffer(7, space, gym.spaces.Discrete(2), n_step=3, frame_stack=True)


def test_the_rule_for_storing_frames():
    stacked = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert use_frame_storage("auto", stacked, {"frame_stack": 4})
    assert not use_frame_storage("auto", stacked, {})  # the env does not say it stacks frames
    assert not use_frame_storage("auto", stacked, {"frame_stack": 3})
    assert not use_frame_storage(False, stacked, {"frame_stack": 4})
    assert use_frame_storage(True, stacked, {})
    color = gym.spaces.Box(0, 255, (84, 84, 12), np.uint8)  # color frames stacked HWC: whole observations
    assert not use_frame_storage("auto", color, {"frame_stack": 4})
    floats, one_frame = gym.spaces.Box(0.0, 1.0, (4, 84, 84), np.float32), gym.spaces.Box(0, 255, (1, 8, 8), np.uint8)
    for space in (color, floats, one_frame):
        with pytest.raises(ValueError, match="replay_frame_stack=True needs"):
            use_frame_storage(True, space, {})
    with pytest.raises(ValueError, match="replay_frame_stack must be True, False or 'auto', got 1"):
        DQN(env=stacked_bright_side, replay_frame_stack=1)
    with pytest.raises(ValueError, match="checkpoint_replay_buffer must be True, False or 'auto', got 'yes'"):
        DQN(env="CartPole-v1", checkpoint_replay_buffer="yes")
    with pytest.raises(ValueError, match=r"frame_stack=True needs a uint8 Box \(K, H, W\) of stacked frames"):
        ReplayBuffer(16, gym.spaces.Discrete(3), gym.spaces.Discrete(2), frame_stack=True)
    with pytest.raises(ValueError, match="replay_frame_stack=True: a multi-agent replay stores whole transitions"):
        DQN(env=RankRelay, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent, replay_frame_stack=True)


DQN_FRAMES = dict(env=stacked_bright_side, seed=0, num_envs=2, learning_starts=32, train_freq=16, num_gradient_steps=2,
                  train_batch_size=16, hiddens=(16,), target_network_update_freq=64, vectorization="sync",
                  iterations_per_epoch=2, total_env_steps=None)


def test_dqn_on_stacked_frames_stores_each_frame_once_and_learns_the_same():
    """DQN on (4, 16, 16) stacks: by default the replay stores frames; a replay that never wraps
    then draws the same rows as one of whole observations, so both fits end with the same weights,
    bit for bit, the frame replay a quarter of the pixels."""
    models = {}
    for setting in ("auto", False):
        model = DQN(**{**DQN_FRAMES, "buffer_size": 512, "total_env_steps": 320}, replay_frame_stack=setting)
        quiet_trainer(max_epochs=-1).fit(model)
        models[setting] = model
    frames, whole = (models[s].default_datamodule for s in ("auto", False))
    assert frames.frame_stack is True and frames.buffer.frames is not None
    assert whole.frame_stack is False and whole.buffer.frames is None
    assert models["auto"].counters["num_grad_updates"] == 2 * 10 > 0
    assert frames.buffer.storage_nbytes < 0.3 * whole.buffer.storage_nbytes
    a, b = (torch.cat([p.detach().flatten() for p in m.parameters()]) for m in models.values())
    assert torch.equal(a, b)
    before = DQN(**DQN_FRAMES, buffer_size=512)
    assert not torch.equal(a, torch.cat([p.detach().flatten() for p in before.parameters()]))  # it trained


def test_dqn_resume_with_the_frame_replay_is_exact(tmp_path):
    """Half a fit, a checkpoint holding the frame replay (wrapped several times), the other half:
    the same counters, weights and replay, bit for bit, as one straight fit."""
    from tests.test_resume import straight_and_resumed, weights

    kwargs = {**DQN_FRAMES, "buffer_size": 48, "prioritized_replay": True}
    straight, resumed, _ = straight_and_resumed(DQN, kwargs, tmp_path, epochs=(2, 4))
    assert resumed.counters == straight.counters and straight.counters["num_env_steps_sampled"] == 4 * 2 * 32
    torch.testing.assert_close(weights(resumed), weights(straight), rtol=0, atol=0)
    a, b = (m.default_datamodule.state_dict()["ranks"][0]["buffer"] for m in (straight, resumed))
    assert "frames" in a and a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key


def test_checkpoint_replay_buffer_auto_keeps_buffers_up_to_1_gib(monkeypatch):
    model = DQN(**{**DQN_FRAMES, "buffer_size": 64, "total_env_steps": 64})
    quiet_trainer(max_epochs=-1).fit(model)
    dm = model.default_datamodule
    assert dm.checkpoint_replay_buffer == "auto" and replay_buffer.REPLAY_CHECKPOINT_AUTO_BYTES == 2**30
    assert dm.local_state()["buffer"] is not None
    monkeypatch.setattr(replay_buffer, "REPLAY_CHECKPOINT_AUTO_BYTES", dm.buffer.nbytes - 1)
    assert dm.local_state()["buffer"] is None
    dm.checkpoint_replay_buffer = True
    assert dm.local_state()["buffer"] is not None
    dm.checkpoint_replay_buffer = False
    assert dm.local_state()["buffer"] is None


def test_plain_images_keep_whole_observations():
    """An image that is no declared frame stack (HWC, one frame) is stored whole (APEX's replay of
    whole transitions: tests/test_packed_frames.py)."""
    dqn = DQN(env=BrightSide, seed=0, buffer_size=64, learning_starts=16, train_freq=16, total_env_steps=32,
              num_gradient_steps=1, train_batch_size=8)
    quiet_trainer(max_epochs=-1).fit(dqn)
    assert dqn.default_datamodule.frame_stack is False
