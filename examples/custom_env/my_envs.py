"""A custom gymnasium env, registered so that ``"my_envs:GridTarget-v0"`` names it.

``gymnasium.make("my_envs:GridTarget-v0", size=5)`` imports this module (which registers the
id) and passes ``size`` to the env: the same string and ``env_kwargs`` work in lightning_rl's
Python API, its CLI (``--model.env my_envs:GridTarget-v0 --model.env_kwargs '{size: 5}'``),
and its checkpoints, which keep both and make the same env again.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

CELL = 16  # pixels per grid cell in rendered frames


class GridTarget(gym.Env):
    """Walk to the target on a ``size`` x ``size`` grid.

    Observation: agent and target cells scaled to [0, 1] (float32, shape (4,)). Actions: 0 up,
    1 right, 2 down, 3 left. Reward: 1 on reaching the target (the episode ends), -0.01 per
    other step; episodes are truncated after ``4 * size`` steps.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(self, size: int = 5, render_mode: str | None = None) -> None:
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        self.size = size
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self._moves = np.array([[0, -1], [1, 0], [0, 1], [-1, 0]])
        self._agent = np.zeros(2, dtype=np.int64)
        self._target = np.zeros(2, dtype=np.int64)
        self._steps = 0

    def _obs(self) -> np.ndarray:
        return (np.concatenate([self._agent, self._target]) / (self.size - 1)).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._agent = self.np_random.integers(0, self.size, 2)
        self._target = self._agent
        while (self._target == self._agent).all():
            self._target = self.np_random.integers(0, self.size, 2)
        self._steps = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._agent = np.clip(self._agent + self._moves[int(action)], 0, self.size - 1)
        self._steps += 1
        reached = bool((self._agent == self._target).all())
        reward = 1.0 if reached else -0.01
        return self._obs(), reward, reached, self._steps >= 4 * self.size, {}

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        frame = np.full((self.size * CELL, self.size * CELL, 3), 235, dtype=np.uint8)
        for (x, y), color in ((self._target, (40, 170, 60)), (self._agent, (40, 90, 220))):
            frame[y * CELL + 2:(y + 1) * CELL - 2, x * CELL + 2:(x + 1) * CELL - 2] = color
        return frame


gym.register(id="GridTarget-v0", entry_point=GridTarget)
