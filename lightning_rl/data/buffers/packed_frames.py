"""Stacked frames stored once in a replay of whole transitions (APEX's), packet by packet.

An APEX worker sends n-step transitions ``(obs, ..., next_obs)`` whose observations are frame
stacks ``(K, H, W)``: a transition's two stacks share ``K - 1`` frames with each other when
``n_step = 1`` and with their neighbours' always, so whole stacks repeat each frame up to ``2K``
times. ``pack_frames`` ships a packet's distinct frames once, ``[F, H, W]``, and each stack as
``K`` indices into them; ``PackedFrameReplayBuffer`` keeps a ring of frames and, per transition,
the frame numbers of its two stacks, and rebuilds the stacks when sampling. Frames are matched by
content (bytes equal), so a rebuilt stack is the worker's observation bit for bit whatever the
env's padding at episode starts; nothing else about the stream is assumed.

A packet's frames enter the ring together; a transition is sampleable while every frame of its
packet is stored, so ``frame_capacity`` is sized for the frames per transition a packet brings
(``frames_per_transition``: one fragment of ``T`` steps per env needs at most ``T + n_step + K``
frames of each env: its own, the ``n_step`` steps before it that its first windows start from,
the ``K - 1`` older frames of their stacks and an episode's final frame).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.batch import SampleBatch
from lightning_rl.data.buffers.arrays import _as_numpy
from lightning_rl.data.buffers.frames import frame_stack_problem
from lightning_rl.data.buffers.transitions import TransitionReplayBuffer

__all__ = ["FRAMES", "NEXT_OBS_FRAMES", "OBS_FRAMES", "PackedFrameReplayBuffer", "concat_packets",
           "frame_capacity_for", "frames_per_transition", "pack_frames"]

FRAMES = "frames"  # [F, H, W] uint8: a packet's distinct frames
OBS_FRAMES = "obs_frames"  # [B, K] int32: index of each frame of ``obs`` in the packet's frames
NEXT_OBS_FRAMES = "next_obs_frames"  # [B, K] int32: likewise for ``next_obs``


def pack_frames(obs: torch.Tensor, next_obs: torch.Tensor) -> dict[str, torch.Tensor]:
    """``obs`` and ``next_obs`` ``[B, K, H, W]`` as their distinct frames ``[F, H, W]`` (in order of
    first appearance) and ``[B, K]`` indices into them (``FRAMES``, ``OBS_FRAMES``, ``NEXT_OBS_FRAMES``)."""
    seen: dict[bytes, int] = {}
    order: list[int] = []  # flat index (into obs and next_obs one after the other) of each distinct frame
    both = np.ascontiguousarray(np.concatenate([_as_numpy(obs), _as_numpy(next_obs)]))
    b, k = obs.shape[:2]
    flat = both.reshape(2 * b * k, -1)
    index = np.empty(2 * b * k, dtype=np.int32)
    for i, frame in enumerate(flat):
        key = frame.tobytes()
        j = seen.get(key)
        if j is None:
            j = seen[key] = len(order)
            order.append(i)
        index[i] = j
    frames = torch.from_numpy(flat[order].reshape(len(order), *both.shape[2:]))
    index_t = torch.from_numpy(index.reshape(2, b, k))
    return {FRAMES: frames, OBS_FRAMES: index_t[0], NEXT_OBS_FRAMES: index_t[1]}


def concat_packets(packets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Packets' columns one after the other, each packet's frame indices shifted past the frames before it."""
    offset, shifted = 0, []
    for packet in packets:
        packet = dict(packet)
        if FRAMES in packet:
            packet[OBS_FRAMES] = packet[OBS_FRAMES] + offset
            packet[NEXT_OBS_FRAMES] = packet[NEXT_OBS_FRAMES] + offset
            offset += len(packet[FRAMES])
        shifted.append(packet)
    return {key: torch.cat([p[key] for p in shifted]) for key in shifted[0]}


def frames_per_transition(rollout_fragment_length: int, n_step: int, stack: int) -> float:
    """The most frames a packet brings per transition it completes (the module docstring)."""
    return (rollout_fragment_length + n_step + stack) / rollout_fragment_length


class PackedFrameReplayBuffer(TransitionReplayBuffer):
    """``TransitionReplayBuffer`` of frame-stack observations stored as frames (the module docstring).

    ``add`` takes ``pack_frames``' columns (``FRAMES``, ``OBS_FRAMES``, ``NEXT_OBS_FRAMES``) in
    place of ``obs`` and ``next_obs``; ``sample`` returns whole ``obs`` and ``next_obs`` again.

    Args:
        capacity: transitions held.
        observation_space: a uint8 ``Box`` ``(K, H, W)`` of stacked frames.
        action_space, alpha, eps, seed: as ``TransitionReplayBuffer``'s.
        frame_capacity: frames held (``None``: ``2 * capacity``); size it with ``frames_per_transition``.
    """

    def __init__(self, capacity: int, observation_space: gym.Space, action_space: gym.Space, alpha: float = 0.6,
                 eps: float = 1e-6, seed: int | None = None, frame_capacity: int | None = None) -> None:
        problem = frame_stack_problem(observation_space)
        if problem is not None:
            raise ValueError(f"PackedFrameReplayBuffer needs {problem}")
        self.frame_capacity = 2 * int(capacity) if frame_capacity is None else int(frame_capacity)
        if self.frame_capacity < 1:
            raise ValueError(f"frame_capacity must be >= 1, got {frame_capacity}")
        self.stack, height, width = observation_space.shape
        super().__init__(capacity, observation_space, action_space, alpha, eps, seed)
        self.frames = np.zeros((self.frame_capacity, height, width), dtype=np.uint8)
        self.frames_added = 0
        self.first_live = 0  # insertion number of the oldest transition whose packet's frames are all stored

    def _layout(self, layout: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, tuple[tuple[int, ...], Any]]:
        del layout[SampleBatch.OBS], layout[SampleBatch.NEXT_OBS]
        # frame numbers (insertion order of the frames) of each stack, and the first frame of the packet
        return {OBS_FRAMES: ((self.stack,), np.dtype(np.int64)), NEXT_OBS_FRAMES: ((self.stack,), np.dtype(np.int64)),
                "packet_first_frame": ((), np.dtype(np.int64)), **layout}

    def __len__(self) -> int:
        return self.num_added - max(self.num_added - self.capacity, self.first_live, 0)

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.frames.nbytes

    def _live(self, ids: np.ndarray) -> np.ndarray:
        return super()._live(ids) & (ids >= self.first_live)

    def add(self, transitions: dict[str, Any], td_errors: Any = None) -> np.ndarray:
        """Insert a packet: ``[F, H, W]`` ``FRAMES``, ``[K]`` rows of ``OBS_FRAMES`` and ``NEXT_OBS_FRAMES``
        (indices into the packet's frames) and the other ``TransitionReplayBuffer.COLUMNS``; the oldest
        transitions whose frames the packet overwrites stop being sampled."""
        frames = _as_numpy(transitions[FRAMES])
        count = len(frames)
        if count > self.frame_capacity:
            raise ValueError(f"add: a packet of {count} frames does not fit frame_capacity={self.frame_capacity}")
        rows = {key: value for key, value in transitions.items() if key != FRAMES}
        for key in (OBS_FRAMES, NEXT_OBS_FRAMES):
            index = _as_numpy(rows[key]).astype(np.int64)
            if index.size and (index.min() < 0 or index.max() >= count):
                raise ValueError(f"add: {key} must index the packet's {count} frames")
            rows[key] = index + self.frames_added
        rows["packet_first_frame"] = np.full(len(rows[OBS_FRAMES]), self.frames_added, dtype=np.int64)
        ids = super().add(rows, td_errors)
        self.frames[(self.frames_added + np.arange(count)) % self.frame_capacity] = frames
        self.frames_added += count
        self._drop_overwritten()
        return ids

    def _drop_overwritten(self) -> None:
        """Stop sampling the oldest transitions whose packet lost a frame to the ring."""
        oldest_frame = self.frames_added - self.frame_capacity
        start, chunk = max(self.first_live, self.num_added - self.capacity), 1024
        while start < self.num_added:  # the stale ones are the oldest: read from there, a growing chunk at a time
            ids = np.arange(start, min(start + chunk, self.num_added))
            firsts = self._columns["packet_first_frame"][ids % self.capacity]
            stale = int(np.searchsorted(firsts, oldest_frame))  # packets enter in order: firsts never decrease
            if stale:
                self.prio.clear(ids[:stale] % self.capacity)
            start += stale
            if stale < len(ids):
                break
            chunk *= 2
        self.first_live = start

    def _rows(self, slots: np.ndarray) -> dict[str, torch.Tensor]:
        rows = super()._rows(slots)
        for whole, numbers in ((SampleBatch.OBS, OBS_FRAMES), (SampleBatch.NEXT_OBS, NEXT_OBS_FRAMES)):
            index = rows.pop(numbers).numpy() % self.frame_capacity
            out = torch.empty((*index.shape, *self.frames.shape[1:]), dtype=torch.uint8)
            np.take(self.frames, index, axis=0, out=out.numpy())
            rows[whole] = out
        del rows["packet_first_frame"]
        return rows

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "frame_capacity": self.frame_capacity}

    def state_dict(self, tensors: bool = False) -> dict[str, Any]:
        frames = torch.from_numpy(self.frames) if tensors else self.frames
        return {**super().state_dict(tensors), FRAMES: frames, "frames_added": self.frames_added,
                "first_live": self.first_live}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first_live = 0  # the ring's fill decides which slots the parent restores as live
        super().load_state_dict(state)
        np.copyto(self.frames, _as_numpy(state[FRAMES]))
        self.frames_added, self.first_live = int(state["frames_added"]), int(state["first_live"])
        dead = np.arange(max(self.num_added - self.capacity, 0), self.first_live) % self.capacity
        if dead.size:  # load sets the min tree from the ring's fill alone
            self.prio.clear(dead)


def frame_capacity_for(capacity: int, rollout_fragment_length: int, n_step: int, stack: int,
                       packet_frames: int) -> int:
    """Frames a ``PackedFrameReplayBuffer`` of ``capacity`` transitions holds: ``capacity`` times
    ``frames_per_transition``, and at least one packet of ``packet_frames``."""
    per = frames_per_transition(rollout_fragment_length, n_step, stack)
    return max(math.ceil(capacity * per), packet_frames)
