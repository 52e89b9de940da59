"""Small envs with structured spaces for tests/test_spaces.py and the DDP worker."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class CueMatch(gym.Env):
    """Each step shows a cue ``{"cue": Discrete(3), "pos": Box(-1, 1, (2,))}``; the action is
    ``MultiDiscrete([3, 2], start=[1, 0])`` (or ``MultiBinary(2)`` with ``binary=True``).
    Reward 0.5 for each matching component: the first ``cue + 1`` (MultiBinary: ``cue > 0``),
    the second ``pos[0] > 0``. Episodes last ``length`` steps; a random policy earns
    ``(1/3 + 1/2) * 0.5`` a step (MultiBinary: 0.5), a perfect one 1."""

    def __init__(self, length: int = 8, binary: bool = False) -> None:
        self.length, self.binary = length, binary
        self.observation_space = gym.spaces.Dict({"cue": gym.spaces.Discrete(3),
                                                  "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
        self.action_space = (gym.spaces.MultiBinary(2) if binary
                             else gym.spaces.MultiDiscrete([3, 2], start=[1, 0]))
        self._t = 0

    def _observe(self) -> dict[str, Any]:
        self._obs = {"cue": int(self.np_random.integers(3)),
                     "pos": self.np_random.uniform(-1, 1, 2).astype(np.float32)}
        return self._obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._observe(), {}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        action = np.asarray(action)
        assert self.action_space.contains(action.astype(self.action_space.dtype)), action
        want0 = int(self._obs["cue"] > 0) if self.binary else self._obs["cue"] + 1
        reward = 0.5 * (int(action[0]) == want0) + 0.5 * (int(action[1]) == int(self._obs["pos"][0] > 0))
        self._t += 1
        return self._observe(), float(reward), False, self._t >= self.length, {}


def binary_cue_match() -> CueMatch:
    return CueMatch(binary=True)
