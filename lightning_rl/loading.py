"""An algorithm back from a Lightning checkpoint without being told its class (``lightning-rl
record`` plays what it loads)."""

from __future__ import annotations

import inspect
from os import PathLike
from pathlib import Path
from typing import Any

from lightning_rl.algorithms.base import Algorithm
from lightning_rl.checkpoint import algorithm_class, read_checkpoint, resolve_algorithm
from lightning_rl.data.envs import env_spaces, env_spec

__all__ = ["load_model"]

PathLikeStr = str | PathLike[str]


def load_model(ckpt_path: PathLikeStr, algo: str | type[Algorithm] | None = None, **hparams: Any) -> Algorithm:
    """Load a lightning_rl algorithm from a Lightning checkpoint (``trainer.save_checkpoint`` or
    ``ModelCheckpoint``), on the CPU.

    ``algo`` names the class (``"PPO"``, case-insensitive) or is the class itself; without it
    the class is the one the checkpoint records, looked up among the algorithms defined in
    this process (nothing is imported because a file names it). The file is read with
    ``weights_only=True``. ``hparams`` override saved hyperparameters — needed for a callable
    ``env``, which a checkpoint does not hold. Raises ``FileNotFoundError`` for a missing file
    and ``CheckpointError`` (a ``ValueError``) for a file that is not a lightning_rl checkpoint
    or names an unknown algorithm (both name it).
    """
    path = Path(ckpt_path)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"checkpoint {str(path)!r} {what}")
    if algo is not None and not isinstance(algo, str):
        if not (inspect.isclass(algo) and issubclass(algo, Algorithm)):
            raise TypeError(f"algo must be an algorithm name or an Algorithm subclass, got {algo!r}")
    # The same safe reader as resuming: weights_only=True, errors that name the file.
    checkpoint = read_checkpoint(path)
    cls = resolve_algorithm(algo) if isinstance(algo, str) else algo or algorithm_class(checkpoint)
    saved = checkpoint.get("hyper_parameters", {})
    del checkpoint
    try:
        model = cls.load_from_checkpoint(path, map_location="cpu", weights_only=True, **hparams)
    except RuntimeError as err:
        if "size mismatch" not in str(err) or not {"env", "env_kwargs"} & set(hparams):
            raise
        raise ValueError(_spaces_mismatch(path, saved, hparams)) from None
    model.eval()
    return model


def _spaces_mismatch(path: Path, saved: dict[str, Any], overrides: dict[str, Any]) -> str:
    """Why a checkpoint's network does not fit the env given instead of its own: both envs' spaces."""
    def spaces(env: Any, env_kwargs: Any) -> str:
        try:
            observation_space, action_space = env_spaces(env_spec(env, env_kwargs))
        except Exception:  # a callable env the checkpoint kept only the name of, a multi-agent env ...
            return "spaces unknown"
        return " ".join(f"observation space {observation_space}, action space {action_space}".split())

    trained = saved.get("env"), saved.get("env_kwargs")
    given = overrides.get("env", trained[0]), overrides.get("env_kwargs", trained[1])
    return (f"checkpoint {str(path)!r} was trained on env {trained[0]!r} ({spaces(*trained)}); its network does not "
            f"fit env {given[0]!r} ({spaces(*given)})")
