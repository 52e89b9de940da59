"""Reading lightning_rl checkpoints safely (``weights_only=True``) with errors that name the file."""

from __future__ import annotations

import importlib
from os import PathLike
from pathlib import Path
from typing import Any

import torch
from lightning_fabric.plugins import CheckpointIO


class CheckpointError(ValueError):
    """A checkpoint file that is missing, unreadable, or not from lightning_rl."""


def read_checkpoint(path: str | PathLike[str]) -> dict[str, Any]:
    """The checkpoint dict of a lightning_rl checkpoint, loaded with ``weights_only=True``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} {'is a directory' if path.is_dir() else 'does not exist'}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, random bytes, a pickle with unsafe globals ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        message = f"checkpoint {str(path)!r} is corrupt or truncated, or not a checkpoint: {first}"
        raise CheckpointError(message) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"checkpoint {str(path)!r} is not a Lightning checkpoint (no 'state_dict')")
    if "lightning_rl" not in checkpoint:
        raise CheckpointError(
            f"checkpoint {str(path)!r} was not written by lightning_rl (no 'lightning_rl' state): "
            "it belongs to another model"
        )
    return checkpoint


def algorithm_path(checkpoint: dict[str, Any]) -> str | None:
    """``module.Class`` of the algorithm that wrote the checkpoint, when recorded."""
    return checkpoint.get("lightning_rl", {}).get("algorithm")


def algorithm_class(checkpoint: dict[str, Any]) -> type | None:
    """The algorithm class that wrote the checkpoint (imported from ``algorithm_path``)."""
    name = algorithm_path(checkpoint)
    if not name:
        return None
    module, _, cls = name.rpartition(".")
    return getattr(importlib.import_module(module), cls)


def check_compatible(path: str | PathLike[str], module: torch.nn.Module) -> dict[str, Any]:
    """Raise ``CheckpointError`` naming ``path`` unless it is a readable checkpoint of ``type(module)``."""
    checkpoint = read_checkpoint(path)
    written_by = algorithm_path(checkpoint)
    expected = f"{type(module).__module__}.{type(module).__qualname__}"
    if written_by is not None and written_by != expected:
        raise CheckpointError(f"checkpoint {str(path)!r} was written by {written_by}, not {expected}")
    missing = set(module.state_dict()) ^ set(checkpoint["state_dict"])
    if missing:
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not fit this {type(module).__name__}: parameters differ "
            f"({', '.join(sorted(missing)[:5])}{' ...' if len(missing) > 5 else ''})"
        )
    return checkpoint


class CheckedCheckpointIO(CheckpointIO):
    """Wraps a strategy's checkpoint IO so that resuming reads the file with
    ``weights_only=True`` and fails with a ``CheckpointError`` naming it (corrupt, truncated,
    foreign, or from another algorithm) instead of deep inside ``torch.load``."""

    def __init__(self, inner: CheckpointIO, module: torch.nn.Module) -> None:
        self.inner = inner
        self.module = module

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        # Read on the CPU: Lightning moves weights and optimizer state to the module's device.
        return check_compatible(path, self.module)

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()
