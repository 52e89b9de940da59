"""Stacked-frame observations stored one frame per step (the replay of Mnih et al. 2015).

A frame-stacked observation ``(K, H, W)`` (``uint8``, the K newest frames, oldest first) shares
``K - 1`` frames with the observation before it, so a replay ring keeps only each step's newest
frame, ``[rows, N, H, W]``, and rebuilds a stack from the frames of its row and the ``K - 1`` rows
before it (of the same env). Where an episode begins inside those ``K - 1`` rows, the frames
before its first row are what the env's frame stack pads with: copies of the episode's first
frame (gymnasium's ``FrameStackObservation`` with ``padding_type="reset"``, its default and
what ``data/envs/atari.py`` uses) or zeros (``padding_type="zero"``).

Where an episode begins is read from the observations themselves, so nothing about the env
is assumed: ``write`` checks every stack against the previous stack of its env. A stack that
is that one shifted by a frame *continues* it; otherwise it must be an episode's first stack
(its first ``K - 1`` frames repeat the last, or are zeros) and starts a new run of frames; any
other stack raises. A rebuilt stack is therefore the observation the env gave, bit for bit.

The rule for using it (``replay_frame_stack``, ``use_frame_storage``): ``"auto"`` stores frames
when the observation space is a ``uint8`` ``Box`` ``(K, H, W)`` with ``2 <= K < W`` (a CHW image,
``nn/cnn.py`` ``image_layout``) and the env declares a ``K``-frame stack in its metadata
(``metadata["frame_stack"] == K``, set by the Atari preprocessing for grayscale frames); ``True``
stores frames for any such space (and raises on a stream that is not a frame stack); ``False``
stores whole observations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

__all__ = ["StackedFrames", "check_frame_stack_setting", "frame_stack_problem", "use_frame_storage"]

CONTINUES, REPEATS, ZEROS = 0, 1, 2  # how a row's stack begins: after the previous row's, or padded


def check_frame_stack_setting(value: Any) -> None:
    """``replay_frame_stack`` is ``True``, ``False`` or ``"auto"``."""
    if not (isinstance(value, bool) or value == "auto"):
        raise ValueError(f"replay_frame_stack must be True, False or 'auto', got {value!r}")


def frame_stack_problem(space: gym.Space) -> str | None:
    """Why ``space`` cannot be stored as frames, or ``None`` when it can."""
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8 or len(space.shape) != 3:
        return f"a uint8 Box (K, H, W) of stacked frames, got {space}"
    stack, _, width = space.shape
    if not 2 <= stack < width:
        return f"K frames of H x W, channels first with 2 <= K < W, got shape {space.shape}"
    return None


def use_frame_storage(setting: bool | str, space: gym.Space, metadata: Mapping[str, Any]) -> bool:
    """Whether a replay stores ``space``'s observations as frames (the module docstring's rule)."""
    check_frame_stack_setting(setting)
    if setting is False:
        return False
    problem = frame_stack_problem(space)
    if setting is True:
        if problem is not None:
            raise ValueError(f"replay_frame_stack=True needs {problem}")
        return True
    return problem is None and metadata.get("frame_stack") == space.shape[0]


class StackedFrames:
    """The observations of a ``[rows, N]`` replay ring as one frame per slot.

    Arrays: ``frames [rows, N, H, W]`` (each step's newest frame), ``starts [rows, N]``
    (``CONTINUES``, or how the stack of an episode's first step is padded: ``REPEATS`` or
    ``ZEROS``), and each env's newest stack ``last [N, K, H, W]`` (``has_last [N]``), against
    which the next one is checked. Rebuilding a row's stack reads up to ``history = K - 1``
    rows before it: the ring must not sample a row whose ``history`` rows were overwritten.
    """

    def __init__(self, rows: int, num_envs: int, observation_space: gym.Space) -> None:
        self.stack, height, width = (int(n) for n in observation_space.shape)
        self.history = self.stack - 1
        self.num_envs = int(num_envs)
        self.size = int(rows) * self.num_envs
        self.frames = np.zeros((rows, num_envs, height, width), dtype=np.uint8)
        self.starts = np.zeros((rows, num_envs), dtype=np.uint8)
        self.last = np.zeros((num_envs, self.stack, height, width), dtype=np.uint8)
        self.has_last = np.zeros(num_envs, dtype=bool)
        self._frames_flat = self.frames.reshape(self.size, height, width)
        self._starts_flat = self.starts.reshape(self.size)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"frames": self.frames, "frame_starts": self.starts, "last_obs": self.last,
                "has_last_obs": self.has_last}

    def how_they_start(self, obs: np.ndarray) -> np.ndarray:
        """``[N]``: how each stack of ``obs [N, K, H, W]`` begins (see the class docstring);
        raises when one neither continues its env's last stack nor is padded as a first one."""
        n = self.num_envs
        kinds = np.full(n, CONTINUES, dtype=np.uint8)
        continues = self.has_last & (obs[:, :-1] == self.last[:, 1:]).reshape(n, -1).all(axis=1)
        if continues.all():
            return kinds
        for env in np.flatnonzero(~continues):
            older, newest = obs[env, :-1], obs[env, -1]
            if (older == newest).all():
                kinds[env] = REPEATS
            elif not older.any():
                kinds[env] = ZEROS
            else:
                raise ValueError(
                    f"replay_frame_stack: env {env}'s observation is neither its last one shifted by a frame nor an "
                    f"episode's first (its {self.history} older frames repeating the newest, or zeros): the "
                    "observations are not a frame stack along their first axis; use replay_frame_stack=False"
                )
        return kinds

    def write(self, slot: int, obs: np.ndarray, kinds: np.ndarray) -> None:
        """Store row ``slot`` of ``obs [N, K, H, W]`` with ``kinds`` from ``how_they_start``."""
        self.frames[slot] = obs[:, -1]
        self.starts[slot] = kinds
        self.last[...] = obs
        self.has_last[...] = True

    def gather(self, flat: np.ndarray) -> torch.Tensor:
        """``[B, K, H, W]`` stacks of flat slots ``flat`` (``slot * N + env``) as the env gave them."""
        b, n, k = len(flat), self.num_envs, self.stack
        source = np.empty((b, k), dtype=np.int64)  # flat slot of each frame of each stack
        source[:, k - 1] = row = flat
        kind = np.full(b, CONTINUES, dtype=np.uint8)
        zeros = np.zeros((b, k), dtype=bool)
        for back in range(1, k):
            kind = np.where(kind == CONTINUES, self._starts_flat.take(row), kind)
            # before an episode's first row: its first frame again (REPEATS), or zeros
            row = np.where(kind == CONTINUES, row - n, row)
            row = np.where(row < 0, row + self.size, row)
            source[:, k - 1 - back] = row
            zeros[:, k - 1 - back] = kind == ZEROS
        # torch's 64-byte-aligned memory, as the whole-observation replay gives (exact resume)
        out = torch.empty((b, k, *self.frames.shape[2:]), dtype=torch.uint8)
        np.take(self._frames_flat, source, axis=0, out=out.numpy())
        if zeros.any():
            out.numpy()[zeros] = 0
        return out
