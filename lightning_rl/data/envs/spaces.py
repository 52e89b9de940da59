"""Dict and Tuple observations, flattened at the env boundary into one float32 vector.

Samplers, batches, replay, evaluation and recording move one tensor per step; a structured
observation would touch all of them. So a ``Dict``/``Tuple`` observation space is encoded
once, where the envs are made, into a ``Box`` of float32: each sub-space in order (a Dict's
keys in the Dict's order, as gymnasium's ``spaces.flatten``), a ``Box`` flattened, a
``Discrete`` one-hot, a ``MultiDiscrete`` one one-hot per component, a ``MultiBinary``
flattened. The values equal ``gymnasium.spaces.flatten``'s, in float32 - or in uint8 when
every leaf is a ``uint8`` ``Box`` and one of them is an image (camera frames stay bytes). The
encoding's space (``FlatBox``) keeps the structure it encodes, so the network can cut the vector
back into its entries: a CNN per image entry, the rest to the MLP (``nn/cnn.py``,
``MultiInputEncoder``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.batch import SampleBatch
from lightning_rl.nn.cnn import image_layout

__all__ = [
    "FlatBox",
    "FlattenObservation",
    "FlattenVectorObservation",
    "flatten_env",
    "flatten_observation",
    "flatten_observation_space",
    "flatten_vector_env",
    "is_raw_observation",
    "is_structured",
    "leaf_slices",
    "valid_point",
]

SUPPORTED = "use Box, Discrete, MultiDiscrete, MultiBinary, or Dict/Tuple of them"


def is_structured(space: gym.Space) -> bool:
    """Whether ``space`` is a ``Dict`` or ``Tuple`` (observations lightning_rl flattens)."""
    return isinstance(space, gym.spaces.Dict | gym.spaces.Tuple)


def _children(space: gym.Space) -> list[tuple[Any, gym.Space]]:
    if isinstance(space, gym.spaces.Dict):
        return list(space.spaces.items())
    return list(enumerate(space.spaces))


def _path(keys: list[Any]) -> str:
    """``'a'[0]['b']``: where a sub-space sits (Dict keys quoted, Tuple indices bare)."""
    if not keys:
        return ""
    first = repr(keys[0]) if isinstance(keys[0], str) else f"[{keys[0]}]"
    return first + "".join(f"[{k!r}]" for k in keys[1:])


def _leaf_dim(space: gym.Space, root: gym.Space, keys: list[Any]) -> int:
    if isinstance(space, gym.spaces.Box):
        if not np.issubdtype(space.dtype, np.number):
            raise _unsupported(root, keys, space)
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, gym.spaces.MultiBinary):
        return int(np.prod(space.shape))
    raise _unsupported(root, keys, space)


def _unsupported(root: gym.Space, keys: list[Any], space: gym.Space) -> ValueError:
    if not keys:
        return ValueError(f"observation space {root} cannot be encoded by lightning_rl: {SUPPORTED}")
    return ValueError(f"observation space {root} has sub-space {_path(keys)} = {space}, which lightning_rl "
                      f"cannot encode: {SUPPORTED}")


def _leaves(space: gym.Space, root: gym.Space, keys: list[Any]) -> list[tuple[list[Any], gym.Space, int]]:
    """``(path, leaf space, encoded width)`` of every non-Dict/Tuple sub-space, in order."""
    if is_structured(space):
        out = []
        for key, sub in _children(space):
            out += _leaves(sub, root, [*keys, key])
        return out
    return [(keys, space, _leaf_dim(space, root, keys))]


class FlatBox(gym.spaces.Box):
    """The 1-dim ``Box`` of a ``Dict``/``Tuple`` space's encoding (equal to a plain ``Box`` of
    the same bounds and dtype). ``structure`` is the space it encodes, ``entries`` each leaf's
    ``(path, space, (first column, end column))`` in the encoding."""

    def __init__(self, low: np.ndarray, high: np.ndarray, dtype: Any, structure: gym.Space) -> None:
        super().__init__(low, high, dtype=dtype)
        self.structure = structure
        self.entries = leaf_slices(structure)


def _byte_images(space: gym.Space) -> bool:
    """Every leaf a ``uint8`` ``Box`` and one of them an image: encoded as uint8."""
    leaves = [leaf for _, leaf, _ in _leaves(space, space, [])]
    return (all(isinstance(leaf, gym.spaces.Box) and leaf.dtype == np.uint8 for leaf in leaves)
            and any(image_layout(leaf) is not None for leaf in leaves))


def flatten_observation_space(space: gym.Space) -> gym.Space:
    """A ``Dict``/``Tuple`` space -> the ``FlatBox`` of its encoding (float32, or uint8 for
    byte images, see the module docstring; any other space is returned as it is). Raises
    ``ValueError`` naming the first sub-space that cannot be encoded."""
    if not is_structured(space):
        return space
    lows, highs = [], []
    for _, leaf, dim in _leaves(space, space, []):
        if isinstance(leaf, gym.spaces.Box):
            lows.append(np.broadcast_to(leaf.low, leaf.shape).reshape(-1).astype(np.float32))
            highs.append(np.broadcast_to(leaf.high, leaf.shape).reshape(-1).astype(np.float32))
        else:  # one-hot or binary entries
            lows.append(np.zeros(dim, np.float32))
            highs.append(np.ones(dim, np.float32))
    if not lows:
        raise ValueError(f"observation space {space} has no sub-spaces to encode")
    dtype = np.uint8 if _byte_images(space) else np.float32
    return FlatBox(np.concatenate(lows).astype(dtype), np.concatenate(highs).astype(dtype), dtype, space)


def leaf_slices(space: gym.Space) -> list[tuple[str, gym.Space, tuple[int, int]]]:
    """``(path, leaf space, (first column, end column))`` of each leaf of a ``Dict``/``Tuple``
    space in its encoding (plain data: env state captures it)."""
    out, start = [], 0
    for keys, leaf, dim in _leaves(space, space, []):
        out.append((_path(keys), leaf, (start, start + dim)))
        start += dim
    return out


def _encode(x: np.ndarray, leaf: gym.Space, lead: tuple[int, ...], dim: int) -> np.ndarray:
    """One leaf's values ``[*lead, *leaf.shape]`` -> ``[*lead, dim]`` float32 (as they are for a
    uint8 ``Box``: concatenated with other bytes they stay bytes)."""
    if isinstance(leaf, gym.spaces.Discrete):
        index = x.reshape(*lead, 1).astype(np.int64) - int(leaf.start)
        return (index == np.arange(dim)).astype(np.float32)
    if isinstance(leaf, gym.spaces.MultiDiscrete):
        nvec = leaf.nvec.reshape(-1)
        index = (x.reshape(*lead, -1).astype(np.int64) - leaf.start.reshape(-1)) + np.cumsum(nvec) - nvec
        out = np.zeros((*lead, dim), np.float32)
        np.put_along_axis(out, index, 1.0, axis=-1)
        return out
    return x.reshape(*lead, dim) if x.dtype == np.uint8 else x.reshape(*lead, dim).astype(np.float32)


def flatten_observation(obs: Any, space: gym.Space, dtype: Any = None) -> np.ndarray:
    """One observation of the ``Dict``/``Tuple`` ``space`` -> ``[D]`` float32, or a batch (the
    same structure holding arrays with leading dims ``[*B]``, as vector envs return) ->
    ``[*B, D]``; ``D`` is ``flatten_observation_space(space).shape[0]``, ``dtype`` its dtype
    (found from ``space`` when not given)."""
    leaves = _leaves(space, space, [])
    parts, lead = [], None
    for keys, leaf, dim in leaves:
        x = obs
        for key in keys:
            x = x[key]
        x = np.asarray(x)
        if lead is None:  # the batch dims: what the first leaf has beyond its space's shape
            lead = x.shape[:x.ndim - len(leaf.shape)]
        parts.append(_encode(x, leaf, lead, dim))
    if dtype is None:
        dtype = np.uint8 if _byte_images(space) else np.float32
    return np.concatenate(parts, axis=-1).astype(dtype, copy=False)


class FlattenObservation(gym.ObservationWrapper):
    """One env whose ``Dict``/``Tuple`` observations are flattened (``flatten_observation``);
    ``raw_observation_space`` keeps the env's own space."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.raw_observation_space = env.observation_space
        self.observation_space = flatten_observation_space(env.observation_space)

    def observation(self, observation: Any) -> np.ndarray:
        return flatten_observation(observation, self.raw_observation_space, self.observation_space.dtype)


class FlattenVectorObservation(gym.vector.VectorObservationWrapper):
    """A vector env whose batched ``Dict``/``Tuple`` observations are flattened to ``[N, D]``."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.raw_observation_space = env.single_observation_space
        self.single_observation_space = flatten_observation_space(env.single_observation_space)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, env.num_envs)

    def observations(self, observations: Any) -> np.ndarray:
        return flatten_observation(observations, self.raw_observation_space, self.single_observation_space.dtype)


def flatten_env(env: gym.Env) -> gym.Env:
    """``env`` with its ``Dict``/``Tuple`` observations flattened; any other env as it is."""
    return FlattenObservation(env) if is_structured(env.observation_space) else env


def flatten_vector_env(envs: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    """``envs`` with batched ``Dict``/``Tuple`` observations flattened; other vector envs as they are."""
    return FlattenVectorObservation(envs) if is_structured(envs.single_observation_space) else envs


def is_raw_observation(obs: Any) -> bool:
    """Whether ``obs`` is a structured (mapping or tuple) observation rather than an array."""
    return isinstance(obs, Mapping | tuple)


def valid_point(space: gym.Space, dtype: torch.dtype) -> torch.Tensor:
    """One fixed element of ``space``: a Discrete's or MultiDiscrete's ``start``, a Box's zeros
    clipped into its bounds, zeros otherwise (MultiBinary)."""
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        return torch.as_tensor(np.asarray(space.start)).to(dtype)
    if isinstance(space, gym.spaces.Box):
        return torch.as_tensor(np.clip(np.zeros(space.shape), space.low, space.high)).to(dtype)
    return torch.zeros(space.shape or (), dtype=dtype)


@torch.no_grad()
def placeholder_rollout(policy: Any, observation_space: gym.Space, device: torch.device) -> SampleBatch:
    """What a DDP rank without rows of a policy steps on: one row of a valid observation (not
    zeros: a ``Discrete`` observation's one-hot reads ``obs - start``) and ``policy``'s greedy
    action, with a zero ``mask``."""
    obs = valid_point(observation_space, torch.float32).to(device).expand(1, *(observation_space.shape or ())).clone()
    actions = policy.compute_actions(obs, explore=False)[SampleBatch.ACTIONS]
    zeros = torch.zeros(1, device=device)
    return SampleBatch({
        SampleBatch.OBS: obs, SampleBatch.ACTIONS: actions.detach(), SampleBatch.ACTION_LOGP: zeros,
        SampleBatch.VF_PREDS: zeros, SampleBatch.ADVANTAGES: zeros, SampleBatch.VALUE_TARGETS: zeros,
        SampleBatch.MASK: zeros,
    })
