"""Synthetic image envs for the pixel tests: small, fast, with a known best policy."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class BrightSide(gym.Env):
    """Each step shows a dark frame with one bright square in its left or right half; action 1
    says "right", 0 "left"; reward 1 for the right answer, else 0. An episode is ``length``
    frames, so a perfect policy returns ``length`` and a random one about half of it.

    ``layout`` ``"HWC"``, ``"CHW"`` or ``"HW"``; ``dtype`` ``uint8`` (0/255), ``bool`` or
    ``float32`` (0/1)."""

    def __init__(self, size: int = 16, channels: int = 1, layout: str = "HWC", dtype: Any = np.uint8,
                 length: int = 20) -> None:
        self.size, self.channels, self.layout, self.length = size, channels, layout, length
        self.dtype = np.dtype(dtype)
        high = 255 if self.dtype == np.uint8 else 1
        shape = {"HWC": (size, size, channels), "CHW": (channels, size, size), "HW": (size, size)}[layout]
        self.observation_space = gym.spaces.Box(0, high, shape, self.dtype)
        self.action_space = gym.spaces.Discrete(2)
        self._side = 0
        self._t = 0

    def _frame(self) -> np.ndarray:
        frame = np.zeros((self.size, self.size), dtype=np.float32)
        half = self.size // 2
        row = int(self.np_random.integers(0, self.size - 3))
        col = int(self.np_random.integers(0, half - 3)) + (half if self._side else 0)
        frame[row:row + 3, col:col + 3] = 1.0
        if self.layout == "HWC":
            frame = np.repeat(frame[:, :, None], self.channels, axis=2)
        elif self.layout == "CHW":
            frame = np.repeat(frame[None], self.channels, axis=0)
        if self.dtype == np.uint8:
            return (frame * 255).astype(np.uint8)
        return frame.astype(self.dtype)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        self._side = int(self.np_random.integers(0, 2))
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == self._side)
        self._t += 1
        self._side = int(self.np_random.integers(0, 2))
        return self._frame(), reward, False, self._t >= self.length, {}


class RandomFrames(gym.Env):
    """Random ``size x size`` uint8 frames (a few values, so that frames repeat now and then);
    each step ends the episode by termination with probability ``p_terminated``, else by
    truncation with ``p_truncated``; the reward is the action plus the step's index."""

    def __init__(self, size: int = 6, p_terminated: float = 0.1, p_truncated: float = 0.06) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.size, self.p_terminated, self.p_truncated = size, p_terminated, p_truncated
        self._t = 0

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 3, (self.size, self.size)).astype(np.uint8)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._t += 1
        u = float(self.np_random.random())
        terminated = u < self.p_terminated
        truncated = not terminated and u < self.p_terminated + self.p_truncated
        return self._frame(), float(action) + self._t, terminated, truncated, {}


def frame_stacked(env: gym.Env, stack: int = 4, padding_type: str = "reset") -> gym.Env:
    """``env`` under gymnasium's ``FrameStackObservation`` (``(stack, H, W)``), declared as a
    frame stack in its metadata as the Atari preprocessing declares it."""
    env = gym.wrappers.FrameStackObservation(env, stack, padding_type=padding_type)
    env.metadata = {**env.metadata, "frame_stack": stack}
    return env


def stacked_bright_side(stack: int = 4, size: int = 16) -> gym.Env:
    """``BrightSide`` in grayscale (HW), ``stack`` frames stacked: ``(stack, size, size)`` uint8."""
    return frame_stacked(BrightSide(size=size, layout="HW"), stack)
