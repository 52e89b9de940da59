"""APEX's replay of whole transitions with stacked frames stored once (data/buffers/packed_frames.py):
a packet's stacks are rebuilt exactly; the replay hands out what the whole-transition replay hands
out for the same packets, draws and priorities, across ring wrap-around; a packet that overwrites
frames stops the transitions that need them from being sampled; checkpoints restore it exactly;
an Atari transition takes about a fifth of the bytes; APEX uses it by default on frame stacks, with
workers and without, learns the same weights as with whole transitions, and resumes exactly."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import torch

from lightning_rl import APEX
from lightning_rl.batch import SampleBatch
from lightning_rl.data.async_replay import NStepPriorityTask
from lightning_rl.data.buffers import packed_frames as pf
from lightning_rl.data.buffers.replay_buffer import NStepWindows, TransitionReplayBuffer
from tests.conftest import quiet_trainer
from tests.image_envs import BrightSide, stacked_bright_side
from tests.test_frame_replay import Stream

SPACE = gym.spaces.Box(0, 255, (4, 6, 6), np.uint8)
ACTIONS = gym.spaces.Discrete(3)


def packets(num_envs: int, n_step: int, steps: int, count: int, seed: int = 0, **env_kwargs) -> list:
    """``count`` packets of n-step transitions (as an APEX worker makes them) of a random frame-stack stream."""
    stream = Stream(num_envs, seed, **env_kwargs)
    windows = NStepWindows(stream.envs.single_observation_space, ACTIONS, num_envs, steps, n_step, 0.9)
    out = []
    for _ in range(count):
        stream.feed([windows], steps)
        out.append(windows.drain())
    assert stream.ends["terminated"] and stream.ends["truncated"]  # episode ends inside the packets
    return out


def add_both(packed: pf.PackedFrameReplayBuffer, whole: TransitionReplayBuffer, batch: SampleBatch, rng) -> None:
    td = rng.normal(size=len(batch[SampleBatch.REWARDS]))
    columns = {k: batch[k] for k in TransitionReplayBuffer.COLUMNS}
    whole.add(columns, td)
    packed.add({**{k: v for k, v in columns.items() if k not in (SampleBatch.OBS, SampleBatch.NEXT_OBS)},
                **pf.pack_frames(batch[SampleBatch.OBS], batch[SampleBatch.NEXT_OBS])}, td)


def assert_same(a: SampleBatch, b: SampleBatch) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_pack_frames_rebuilds_every_stack_and_ships_each_distinct_frame_once():
    (batch,) = packets(num_envs=3, n_step=3, steps=20, count=1)
    obs, next_obs = batch[SampleBatch.OBS], batch[SampleBatch.NEXT_OBS]
    packed = pf.pack_frames(obs, next_obs)
    frames = packed[pf.FRAMES]
    assert frames.dtype == torch.uint8 and packed[pf.OBS_FRAMES].dtype == torch.int32
    assert torch.equal(frames[packed[pf.OBS_FRAMES].long()], obs)
    assert torch.equal(frames[packed[pf.NEXT_OBS_FRAMES].long()], next_obs)
    distinct = {f.numpy().tobytes() for f in torch.cat([obs, next_obs]).flatten(0, 1)}
    assert len(frames) == len(distinct) < 0.25 * 2 * obs.shape[0] * obs.shape[1]
    # two packets side by side index their own frames
    both = pf.concat_packets([packed, pf.pack_frames(next_obs, obs)])
    assert len(both[pf.FRAMES]) == 2 * len(frames)
    assert torch.equal(both[pf.FRAMES][both[pf.OBS_FRAMES].long()], torch.cat([obs, next_obs]))


@pytest.mark.parametrize("num_envs, n_step, padding_type", [(1, 1, "reset"), (3, 3, "reset"), (2, 3, "zero")])
def test_the_packed_replay_hands_out_what_the_whole_transition_replay_does(num_envs, n_step, padding_type):
    """The same packets, td errors and seed: identical draws (obs, next_obs and every column,
    weights, batch_indexes) before and after a priority update, the ring wrapped several times."""
    stream = packets(num_envs, n_step, steps=10, count=12, padding_type=padding_type)
    capacity = 25 * num_envs
    frames = pf.frame_capacity_for(capacity, 10, n_step, 4, 2 * 4 * 13 * num_envs)
    packed = pf.PackedFrameReplayBuffer(capacity, SPACE, ACTIONS, seed=3, frame_capacity=frames)
    whole = TransitionReplayBuffer(capacity, SPACE, ACTIONS, seed=3)
    rng = np.random.default_rng(0)
    for batch in stream:
        add_both(packed, whole, batch, rng)
    assert whole.num_added > 3 * capacity and len(packed) == len(whole) == capacity
    for _ in range(3):
        a, b = packed.sample(32, beta=0.5), whole.sample(32, beta=0.5)
        assert_same(a, b)
        td = rng.normal(size=32)
        packed.update_priorities(a[SampleBatch.BATCH_INDEXES], td)
        whole.update_priorities(b[SampleBatch.BATCH_INDEXES], td)
    pixels = sum(whole._columns[k].nbytes for k in (SampleBatch.OBS, SampleBatch.NEXT_OBS))
    assert packed.frames.nbytes < 0.6 * pixels


def test_transitions_whose_frames_were_overwritten_are_never_drawn():
    """A frame ring of two packets: the transitions of older packets stop being sampleable (priority
    0, out of ``len``) though their rows are still in the transition ring; what is drawn is exact."""
    stream = packets(num_envs=2, n_step=3, steps=10, count=8)
    per_packet = max(len(pf.pack_frames(b[SampleBatch.OBS], b[SampleBatch.NEXT_OBS])[pf.FRAMES]) for b in stream)
    packed = pf.PackedFrameReplayBuffer(1000, SPACE, ACTIONS, seed=1, frame_capacity=2 * per_packet)
    whole = TransitionReplayBuffer(1000, SPACE, ACTIONS, seed=1)
    rng = np.random.default_rng(0)
    for batch in stream:
        add_both(packed, whole, batch, rng)
    newest = sum(len(b[SampleBatch.REWARDS]) for b in stream[-2:])
    assert whole.num_added == len(whole) > len(packed) >= len(stream[-1][SampleBatch.REWARDS])
    assert len(packed) <= newest and packed.first_live == packed.num_added - len(packed)
    ids = np.arange(packed.num_added)
    live = ids >= packed.first_live
    assert (packed.priorities(ids)[~live] == 0).all() and (packed.priorities(ids)[live] > 0).all()
    drawn = packed.sample(256)
    rows = drawn[SampleBatch.BATCH_INDEXES].numpy()
    assert (rows >= packed.first_live).all()
    for key in (SampleBatch.OBS, SampleBatch.NEXT_OBS, SampleBatch.REWARDS):
        assert torch.equal(drawn[key], torch.tensor(whole._columns[key][rows])), key
    with pytest.raises(ValueError, match="does not fit frame_capacity"):
        small = pf.PackedFrameReplayBuffer(10, SPACE, ACTIONS, frame_capacity=4)
        add_both(small, TransitionReplayBuffer(10, SPACE, ACTIONS), stream[0], rng)


def test_a_checkpointed_packed_replay_continues_exactly():
    stream = packets(num_envs=2, n_step=3, steps=10, count=10)
    make = partial(pf.PackedFrameReplayBuffer, 60, SPACE, ACTIONS, seed=5, frame_capacity=100)
    first, whole = make(), TransitionReplayBuffer(60, SPACE, ACTIONS, seed=5)
    rng = np.random.default_rng(0)
    for batch in stream[:6]:
        add_both(first, whole, batch, rng)
    assert first.first_live > first.num_added - first.capacity  # frames overwritten before rows
    second = make()
    second.load_state_dict(first.state_dict(tensors=True))
    assert len(second) == len(first) and second.frames_added == first.frames_added
    for buffer in (first, second):
        rng = np.random.default_rng(1)
        for batch in stream[6:]:
            add_both(buffer, TransitionReplayBuffer(60, SPACE, ACTIONS), batch, rng)
    for _ in range(3):
        assert_same(first.sample(16), second.sample(16))
    with pytest.raises(ValueError, match="replay buffer state is for"):
        make(frame_capacity=101).load_state_dict(first.state_dict())


def test_an_atari_transition_takes_a_fifth_of_the_bytes():
    """(4, 84, 84) frames, APEX's fragments of 16 steps and 3-step returns: at most 23 frames per 16
    transitions stored, about 10.2 KB a transition against 56.5 KB whole."""
    atari = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    capacity = 2000
    task = NStepPriorityTask(atari, gym.spaces.Discrete(4), 4, 16, 3, 0.99, 0.4, frame_stack=True)
    frames = pf.frame_capacity_for(capacity, 16, 3, 4, task.packet_frames())
    assert frames == capacity * 23 // 16
    packed = pf.PackedFrameReplayBuffer(capacity, atari, gym.spaces.Discrete(4), frame_capacity=frames)
    whole = TransitionReplayBuffer(capacity, atari, gym.spaces.Discrete(4))
    assert packed.frames.dtype == np.uint8
    assert 10_100 < packed.nbytes / capacity < 10_300 and 56_400 < whole.nbytes / capacity < 56_600


APEX_FRAMES = dict(env=stacked_bright_side, num_envs=2, rollout_fragment_length=8, learning_starts=16,
                   train_batch_size=8, num_gradient_steps=2, hiddens=(16,), seed=0, iterations_per_epoch=2,
                   target_network_update_freq=64)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_apex_stores_frames_once_by_default_and_learns_the_same(num_workers):
    """On (4, 16, 16) frame stacks APEX's replay stores frames (with a sampler worker, through its
    slot), uint8 to the storage; with a replay that never drops a transition it draws the same rows
    as with whole transitions, so both fits end with the same weights, bit for bit."""
    models = {}
    for setting in ("auto", False):
        model = APEX(**APEX_FRAMES, num_workers=num_workers, buffer_size=512, total_env_steps=160,
                     replay_frame_stack=setting)
        quiet_trainer(max_epochs=-1).fit(model)
        models[setting] = model
    packed, whole = (models[s].default_datamodule for s in ("auto", False))
    assert packed.frame_stack is True and isinstance(packed.buffer, pf.PackedFrameReplayBuffer)
    assert whole.frame_stack is False and type(whole.buffer) is TransitionReplayBuffer
    assert packed.buffer.frames.dtype == np.uint8 and packed.buffer.num_added == whole.buffer.num_added > 100
    assert models["auto"].counters["num_grad_updates"] > 0
    assert packed.buffer.nbytes < 0.6 * whole.buffer.nbytes
    a, b = (torch.cat([p.detach().flatten() for p in m.parameters()]) for m in models.values())
    if num_workers == 0:  # with a worker, which fragments an iteration gets depends on timing
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_apex_frame_setting_rule():
    """``auto`` stores frames only for a declared frame stack; ``True`` on other images is refused."""
    hwc = APEX(env=BrightSide, num_workers=0, num_envs=2, rollout_fragment_length=8, learning_starts=16,
               buffer_size=64, train_batch_size=8, num_gradient_steps=1, hiddens=(16,), total_env_steps=32, seed=0)
    quiet_trainer(max_epochs=-1).fit(hwc)
    assert hwc.default_datamodule.frame_stack is False
    assert type(hwc.default_datamodule.buffer) is TransitionReplayBuffer
    with pytest.raises(ValueError, match="replay_frame_stack=True needs"):
        quiet_trainer(max_epochs=-1).fit(APEX(env=BrightSide, num_workers=0, replay_frame_stack=True, hiddens=(8,)))
    with pytest.raises(ValueError, match="replay_frame_stack must be"):
        APEX(env=stacked_bright_side, replay_frame_stack="yes")


def test_apex_resume_with_the_packed_replay(tmp_path):
    """Half a fit, a checkpoint holding the packed replay (frames overwritten), the other half: with
    ``num_workers=0`` the same counters, weights and replay, bit for bit, as one straight fit."""
    from tests.test_resume import straight_and_resumed, weights

    kwargs = {**APEX_FRAMES, "num_workers": 0, "buffer_size": 40, "total_env_steps": None}
    straight, resumed, _ = straight_and_resumed(APEX, kwargs, tmp_path, epochs=(2, 4))
    assert resumed.counters == straight.counters
    torch.testing.assert_close(weights(resumed), weights(straight), rtol=0, atol=0)
    a, b = (m.default_datamodule.buffer for m in (straight, resumed))
    assert isinstance(a, pf.PackedFrameReplayBuffer) and a.frames_added > a.frame_capacity
    assert np.array_equal(a.frames, b.frames) and a.first_live == b.first_live


def test_resuming_a_whole_transition_replay_into_a_packed_one_names_the_setting(tmp_path):
    kwargs = {**APEX_FRAMES, "num_workers": 0, "buffer_size": 40, "total_env_steps": None}
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(APEX(**kwargs, replay_frame_stack=False))
    trainer.save_checkpoint(tmp_path / "whole.ckpt")
    with pytest.raises(ValueError, match=r"the checkpoint's replay holds whole transitions: resume with "
                                         r"replay_frame_stack=False"):
        quiet_trainer(max_epochs=2).fit(APEX(**kwargs), ckpt_path=tmp_path / "whole.ckpt")


def test_a_packet_that_overwrites_thousands_of_transitions_stops_them_all():
    """Packets of 2,000 transitions and 2,000 frames in a ring of 3,000 frames: each packet leaves
    only the one before it sampleable, however many rows that is."""
    buffer = pf.PackedFrameReplayBuffer(10_000, SPACE, ACTIONS, seed=0, frame_capacity=3000)
    rng = np.random.default_rng(0)
    n = 2000
    for packet in range(3):
        frames = torch.from_numpy(rng.integers(0, 256, (n, 6, 6), dtype=np.uint8))
        index = torch.from_numpy(np.stack([np.arange(n) - k for k in range(3, -1, -1)], 1).clip(0).astype(np.int32))
        buffer.add({pf.FRAMES: frames, pf.OBS_FRAMES: index, pf.NEXT_OBS_FRAMES: index,
                    SampleBatch.ACTIONS: np.zeros(n, np.int64), SampleBatch.REWARDS: np.zeros(n, np.float32),
                    SampleBatch.TERMINATEDS: np.zeros(n, bool), SampleBatch.DISCOUNTS: np.ones(n, np.float32)})
        assert len(buffer) == n and buffer.first_live == packet * n
        drawn = buffer.sample(64)
        rows = drawn[SampleBatch.BATCH_INDEXES].numpy() - packet * n
        assert torch.equal(drawn[SampleBatch.OBS][:, -1], frames[rows])
    assert (buffer.priorities(np.arange(2 * n)) == 0).all()
