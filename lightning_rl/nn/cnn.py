"""Convolutional encoders for image observations, by name: ``encoder="nature_cnn"`` (the
network of Mnih et al. 2015) and ``encoder="impala_cnn"`` (the residual network of Espeholt
et al. 2018). Either is the default encoder where the observations are images.

What an image is (``image_layout``): a ``Box`` of 3 dims that is ``uint8`` or ``bool``, or a
float ``Box`` whose bounds lie within ``[0, 255]``; its channel axis is the last one (HWC, as
gymnasium renders and ALE returns) unless the first axis is the smaller (CHW, as a
channels-first frame stack ``(4, 84, 84)``). A 2-dim ``Box`` of that kind is one grayscale
channel (HW). Observations stay in their dtype through sampling, rollouts, worker slots and
replay; the encoders make them float on the learner's device, ``uint8`` scaled to ``[0, 1]``.

A ``Dict``/``Tuple`` observation with image entries (flattened at the env boundary into a
``FlatBox`` that keeps its structure, ``data/envs/spaces.py``) gets ``MultiInputEncoder``: a CNN
per image entry and the other entries as they are, side by side (Stable-Baselines3's
``MultiInputPolicy``); the MLP of ``hiddens`` follows.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from lightning_rl.nn.init import orthogonal_

__all__ = ["ImpalaCNN", "MultiInputEncoder", "NatureCNN", "default_image_encoder", "image_layout", "image_shape"]


def image_layout(space: gym.Space) -> str | None:
    """``"HWC"``, ``"CHW"`` or ``"HW"`` for an image observation space (see the module
    docstring for the rule), ``None`` for anything else."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) not in (2, 3):
        return None
    dtype = np.dtype(space.dtype)
    if dtype not in (np.uint8, np.bool_):
        if not np.issubdtype(dtype, np.floating):
            return None
        if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))
                and space.low.min() >= 0 and space.high.max() <= 255):
            return None
    if len(space.shape) == 2:
        return "HW"
    return "CHW" if space.shape[0] < space.shape[-1] else "HWC"


def image_shape(space: gym.Space) -> tuple[int, int, int]:
    """``(channels, height, width)`` of an image observation space; raises naming it otherwise."""
    layout = image_layout(space)
    if layout is None:
        raise ValueError(f"observation space {space} is not an image: a CNN encoder takes a uint8 or bool Box "
                         "of 2 or 3 dims (HWC or CHW), or a float one bounded within [0, 255]")
    shape = tuple(int(n) for n in space.shape)
    if layout == "HW":
        return 1, shape[0], shape[1]
    return (shape[0], shape[1], shape[2]) if layout == "CHW" else (shape[2], shape[0], shape[1])


class ImageInput(nn.Module):
    """``[N, *obs_shape]`` observations -> ``[N, C, H, W]`` floats: channels first, ``uint8``
    scaled by 1/255 (bool and float as they are)."""

    def __init__(self, space: gym.Space) -> None:
        super().__init__()
        self.layout = image_layout(space)
        self.shape = image_shape(space)
        self.scale = 1.0 / 255.0 if np.dtype(space.dtype) == np.uint8 else 1.0

    def forward(self, obs: Tensor) -> Tensor:
        x = obs.reshape(obs.shape[0], *(self.shape if self.layout != "HWC" else (*self.shape[1:], self.shape[0])))
        if self.layout == "HWC":
            x = x.permute(0, 3, 1, 2)
        # channels last in memory: CPU convolutions (oneDNN) run about 10% faster on it
        x = x.float().contiguous(memory_format=torch.channels_last)
        return x * self.scale if self.scale != 1.0 else x


def _conv_init(module: nn.Module) -> None:
    # Orthogonal weights with gain sqrt(2) and zero biases, as the PPO/IMPALA reference code
    # (OpenAI baselines, CleanRL) initializes these networks.
    for m in module.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            orthogonal_(m.weight, float(np.sqrt(2)))
            nn.init.zeros_(m.bias)


def default_image_encoder(space: gym.Space) -> str | None:
    """The encoder an image observation space gets when none is given: ``nature_cnn``, or
    ``impala_cnn`` for images smaller than Nature's network takes (36x36); ``multi_input`` for
    a flattened ``Dict``/``Tuple`` with image entries; ``None`` otherwise."""
    if _image_entries(space):
        return "multi_input"
    if image_layout(space) is None:
        return None
    _, height, width = image_shape(space)
    return "nature_cnn" if min(height, width) >= 36 else "impala_cnn"


def _image_entries(space: gym.Space) -> list[tuple[str, gym.Space, tuple[int, int]]]:
    """The image entries of a flattened ``Dict``/``Tuple`` (``FlatBox``): ``(path, space, columns)``."""
    return [entry for entry in getattr(space, "entries", ()) if image_layout(entry[1]) is not None]


class ConvEncoder(nn.Module):
    """Frames (``ImageInput``), ``convs`` to a flat vector, then ``features`` units with a ReLU."""

    input: ImageInput

    def finish(self, convs: nn.Sequential, features: int) -> None:
        """Set the convolutions and the fully connected layer after them, initialized."""
        self.convs = convs
        with torch.no_grad():
            flat = convs(torch.zeros(1, *self.input.shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, features), nn.ReLU())
        self.out_features = features
        _conv_init(self)
        self.convs.to(memory_format=torch.channels_last)

    def forward(self, obs: Tensor) -> Tensor:
        return self.fc(self.convs(self.input(obs)))


class NatureCNN(ConvEncoder):
    """The DQN network of Mnih et al. 2015 (Nature): 32 8x8 filters with stride 4, 64 4x4 with
    stride 2, 64 3x3 with stride 1, each with a ReLU, then a fully connected layer of
    ``features`` (512) units with a ReLU. On ``84x84x4`` frames: 1,684,128 parameters."""

    def __init__(self, observation_space: gym.Space, features: int = 512) -> None:
        super().__init__()
        self.input = ImageInput(observation_space)
        channels, height, width = self.input.shape
        if min(height, width) < 36:
            raise ValueError(f"nature_cnn needs images of at least 36x36 pixels, got {height}x{width}: "
                             "use encoder='impala_cnn' for smaller ones")
        self.finish(nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        ), features)


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(ConvEncoder):
    """The residual network of Espeholt et al. 2018 (IMPALA, figure 3): per entry of
    ``channels`` (16, 32, 32) a 3x3 convolution, a 3x3 max-pool with stride 2 and two residual
    blocks (ReLU, 3x3 conv, ReLU, 3x3 conv, plus the input), then a ReLU and a fully connected
    layer of ``features`` (256) units with a ReLU. On ``84x84x4`` frames: 1,089,232 parameters."""

    def __init__(self, observation_space: gym.Space, channels: Sequence[int] = (16, 32, 32),
                 features: int = 256) -> None:
        super().__init__()
        self.input = ImageInput(observation_space)
        in_channels = self.input.shape[0]
        layers: list[nn.Module] = []
        for out in channels:
            layers += [nn.Conv2d(in_channels, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       _Residual(out), _Residual(out)]
            in_channels = out
        self.finish(nn.Sequential(*layers, nn.ReLU(), nn.Flatten()), features)


_CNNS: dict[str, type[ConvEncoder]] = {"nature_cnn": NatureCNN, "impala_cnn": ImpalaCNN}


class MultiInputEncoder(nn.Module):
    """A CNN per image entry of a flattened ``Dict``/``Tuple`` observation (``cnn``:
    ``"nature_cnn"`` or ``"impala_cnn"``, or ``None`` for each image's default), the other
    entries' encoded columns as they are; outputs ``[N, sum of CNN features + other columns]``.

    Reads ``[N, D]`` rows of the encoding (``data/envs/spaces.py``): each image's columns are
    cut out and reshaped to its own space, so a ``uint8`` image is scaled to ``[0, 1]`` inside
    its CNN whatever dtype the encoding has."""

    def __init__(self, observation_space: gym.Space, cnn: str | None = None) -> None:
        super().__init__()
        if not _image_entries(observation_space):
            raise ValueError(f"multi_input takes a flattened Dict or Tuple observation with image entries, got "
                             f"{observation_space}")
        self.cnns = nn.ModuleDict()
        self.image_columns: list[slice] = []
        rest: list[int] = []
        for i, (_, space, (start, end)) in enumerate(observation_space.entries):
            if image_layout(space) is None:
                rest += range(start, end)
                continue
            name = cnn or default_image_encoder(space)
            if name not in _CNNS:
                raise ValueError(f"multi_input: cnn must be one of {sorted(_CNNS)} or None, got {name!r}")
            self.cnns[str(i)] = _CNNS[name](space)
            self.image_columns.append(slice(start, end))
        self.register_buffer("rest", torch.tensor(rest, dtype=torch.long), persistent=False)
        self.out_features = sum(c.out_features for c in self.cnns.values()) + len(rest)

    def forward(self, obs: Tensor) -> Tensor:
        parts = [cnn(obs[:, columns]) for cnn, columns in zip(self.cnns.values(), self.image_columns)]
        if len(self.rest):
            parts.append(obs.index_select(1, self.rest).float())
        return torch.cat(parts, dim=1)
