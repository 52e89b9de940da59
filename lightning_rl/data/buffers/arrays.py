"""What the replay buffers store their columns as: a space's per-env shape and storage dtype, and
numpy arrays from what callers pass (numpy arrays or tensors, on any device)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch


def _space_layout(space: gym.Space, what: str, action: bool) -> tuple[tuple[int, ...], np.dtype]:
    """Per-env shape and storage dtype of a Box or Discrete space."""
    if isinstance(space, gym.spaces.Box):
        return tuple(space.shape), np.dtype(np.float32) if action else np.dtype(space.dtype)
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    raise ValueError(f"ReplayBuffer supports Box and Discrete {what} spaces, got {space!r}")


def _as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)
