"""Checkpoints that never run code: safe reading, the algorithm registry, per-rank state.

- Files are read with ``torch.load(weights_only=True)``; everything lightning_rl writes is
  plain data (tensors, numbers, strings, containers), envs included (``data/envs/state.py``).
- The class that wrote a checkpoint is resolved from the algorithms defined in this process
  (``algorithm_registry``), never by importing a module the file names.
- Callable hyperparameters (an env factory, a lambda) cannot live in a file that loads
  without code; they are saved as a ``"<callable module.name>"`` placeholder and must be
  passed again when the checkpoint is loaded (``PPO.load_from_checkpoint(path, env=...)``).
- Under DDP every rank's sampler state (envs, RNG, replay) is gathered into the one file
  rank 0 writes, and each rank restores its own (``checkpoint_data.py``); an algorithm's own
  counters and schedules are ``algorithms/state.py``'s.
"""

from __future__ import annotations

import warnings
import weakref
import zipfile
from os import PathLike
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins import CheckpointIO
from pytorch_lightning.trainer.states import TrainerFn

# An algorithm's class: the registry holds LightningModule classes, so that this module (which the
# algorithms import) names none of them, not even for type hints.
AlgorithmClass = type[pl.LightningModule]


class CheckpointError(ValueError):
    """A checkpoint file that is missing, unreadable, or not from lightning_rl."""


def read_checkpoint(path: str | PathLike[str]) -> dict[str, Any]:
    """The checkpoint dict of a lightning_rl checkpoint, loaded with ``weights_only=True``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} {'is a directory' if path.is_dir() else 'does not exist'}")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; torch.load's errors for others mislead
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt or truncated, or not a checkpoint: "
                              f"{_not_zip_kind(path)}, not the zip archive torch.save writes")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a damaged zip, a pickle with unsafe globals ...
        raise CheckpointError(f"checkpoint {str(path)!r} {_load_error(err)}") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"checkpoint {str(path)!r} is not a Lightning checkpoint (no 'state_dict')")
    if "lightning_rl" not in checkpoint:
        raise CheckpointError(
            f"checkpoint {str(path)!r} was not written by lightning_rl (no 'lightning_rl' state): "
            "it belongs to another model"
        )
    return checkpoint


def _not_zip_kind(path: Path) -> str:
    with path.open("rb") as file:
        head = file.read(4096)
    if not head:
        return "an empty file"
    return "binary data" if b"\0" in head else "a text file"


def _load_error(err: Exception) -> str:
    """What is wrong with a file ``torch.load(weights_only=True)`` refused, without torch's advice
    to load it with ``weights_only=False`` (which would run whatever code the file holds)."""
    text = str(err).strip()
    if "Weights only load failed" in text:
        skip = ("Weights only load failed", "Please file an issue", "Check the documentation")
        lines = [line.replace("WeightsUnpickler error:", "").strip() for line in text.splitlines()]
        reasons = [line for line in lines if line and not line.startswith(skip) and "weights_only" not in line]
        return ("holds objects other than plain data, which a safe load (weights_only=True) refuses"
                + (f": {reasons[0]}" if reasons else ""))
    return f"is corrupt or truncated, or not a checkpoint: {text.splitlines()[0] if text else type(err).__name__}"


# ----------------------------------------------------------------------------- the algorithm registry
def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_DEFINED: weakref.WeakValueDictionary[str, AlgorithmClass] = weakref.WeakValueDictionary()


def register_algorithm(cls: AlgorithmClass) -> None:
    """Record ``cls`` under ``module.QualName``: ``Algorithm.__init_subclass__`` calls it for every
    subclass as it is defined (a later class of the same path replaces the earlier one)."""
    _DEFINED[class_path(cls)] = cls


def algorithm_registry() -> dict[str, AlgorithmClass]:
    """Every ``Algorithm`` subclass defined in this process (and still alive), by ``module.QualName``.

    Classes get here by being defined (imported by the user's own code), never because a
    checkpoint names them."""
    return dict(_DEFINED)


def multi_agent_algorithms() -> list[str]:
    """The names of lightning_rl's algorithms whose ``supports_multi_agent`` is set, sorted."""
    return sorted(path.rsplit(".", 1)[-1] for path, cls in algorithm_registry().items()
                  if path.startswith("lightning_rl.algorithms.") and not path.endswith("Module")
                  and cls.supports_multi_agent)


# The package's shared bases of several algorithms: registered like any subclass, named by none.
SHARED_BASES = ("OnPolicyModule", "OffPolicyModule", "ContinuousOffPolicyModule")


def algorithm_names() -> list[str]:
    """The class names of the algorithms defined in this process (``A2C``, ..., ``SAC``, then any
    subclass a user's code defined), for help texts and errors."""
    paths = [p for p in algorithm_registry() if p.rsplit(".", 1)[-1] not in SHARED_BASES]
    own = sorted({p.rsplit(".", 1)[-1] for p in paths if p.startswith("lightning_rl.")})
    return own + sorted({p.rsplit(".", 1)[-1] for p in paths} - set(own))  # the built-in ones first


def algorithm_path(checkpoint: dict[str, Any]) -> str | None:
    """``module.Class`` of the algorithm that wrote the checkpoint, when recorded."""
    return checkpoint.get("lightning_rl", {}).get("algorithm")


def resolve_algorithm(name: str) -> AlgorithmClass:
    """The algorithm class for ``name`` — ``module.QualName`` or a unique class name like
    ``"PPO"`` — among the classes defined in this process."""
    registry = algorithm_registry()
    if name in registry:
        return registry[name]
    by_name = [cls for path, cls in registry.items() if path.rsplit(".", 1)[-1].lower() == name.lower()]
    if len(by_name) == 1:
        return by_name[0]
    known = ", ".join(algorithm_names())
    raise CheckpointError(
        f"algorithm {name!r} is not defined in this process (known: {known}); lightning_rl never imports a "
        "module a checkpoint names: import the module that defines it first"
    )


def builtin_algorithm(cls: type) -> type:
    """The first lightning_rl algorithm in ``cls``'s MRO (``PPO`` for a user's ``class MyPPO(PPO)``)."""
    return next(c for c in cls.__mro__ if c.__module__.startswith("lightning_rl."))


def base_algorithm_path(checkpoint: dict[str, Any]) -> str | None:
    """``module.Class`` of the lightning_rl algorithm the writing class derives from, when recorded."""
    return checkpoint.get("lightning_rl", {}).get("base_algorithm")


def algorithm_class(checkpoint: dict[str, Any]) -> AlgorithmClass | None:
    """The algorithm class that wrote the checkpoint, from the registry (``None`` if unrecorded).

    A subclass not defined in this process (one defined in a training script's ``__main__``,
    which ``record`` or ``validate`` cannot see) is loaded as the lightning_rl algorithm it
    derives from, with a warning: the weights and hyperparameters are the same, the subclass's
    own methods are not run. Nothing is imported because the file names it."""
    name = algorithm_path(checkpoint)
    if not name:
        return None
    try:
        return resolve_algorithm(name)
    except CheckpointError:
        base = base_algorithm_path(checkpoint)
        if not base or base == name:
            raise
    cls = resolve_algorithm(base)
    warnings.warn(
        f"algorithm {name!r} is not defined in this process: loading it as the lightning_rl algorithm it derives "
        f"from, {cls.__name__} (its weights and hyperparameters; the subclass's own methods are not run). Import "
        "the module that defines it first to use them",
        stacklevel=2,
    )
    return cls


def loading_class(cls: AlgorithmClass, path: str | PathLike[str]) -> AlgorithmClass:
    """The class ``cls.load_from_checkpoint(path)`` builds, after reading ``path`` safely (a
    ``CheckpointError`` naming it when it is missing, truncated, foreign or of another algorithm):
    the class the file records where that is a ``cls`` (``Algorithm.load_from_checkpoint`` loads
    any algorithm's file), else ``cls`` where both derive from the same lightning_rl algorithm
    (``MyPPO`` loads a ``PPO`` file)."""
    checkpoint = read_checkpoint(path)
    written = algorithm_class(checkpoint)
    if written is None or issubclass(written, cls):
        return written or cls
    if (base_algorithm_path(checkpoint) or class_path(written)) == class_path(builtin_algorithm(cls)):
        return cls
    name = written.__name__
    raise CheckpointError(f"checkpoint {str(path)!r} holds a {name}, not a {cls.__name__}: load it with "
                          f"{name}.load_from_checkpoint or Algorithm.load_from_checkpoint")


def check_compatible(path: str | PathLike[str], module: torch.nn.Module, resuming: bool = True) -> dict[str, Any]:
    """Raise ``CheckpointError`` naming ``path`` unless it is a readable checkpoint of ``type(module)``.

    Outside a resumed fit (``validate``, ``test``, ``predict``) a checkpoint of a subclass that
    is not defined in this process also fits the algorithm it derives from (see
    ``algorithm_class``); a resumed fit continues only the class that wrote it."""
    checkpoint = read_checkpoint(path)
    written_by = algorithm_path(checkpoint)
    expected = class_path(type(module))
    as_base = (not resuming and base_algorithm_path(checkpoint) == expected
               and written_by not in algorithm_registry())
    if written_by is not None and written_by != expected and not as_base:
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
        trainer = getattr(self.module, "_trainer", None)
        resuming = trainer is None or trainer.state.fn == TrainerFn.FITTING
        checkpoint = check_compatible(path, self.module, resuming)
        if trainer is not None:
            drop_foreign_callback_states(checkpoint, trainer, resuming)
        return checkpoint

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


def drop_foreign_callback_states(checkpoint: dict[str, Any], trainer: Any, resuming: bool) -> None:
    """Callback states that the run restoring ``checkpoint`` has no use for, removed before
    Lightning restores them (and prints notices about them):

    - evaluating (validate, test, predict): every one; evaluation restores the weights, and a
      fit's ModelCheckpoint or EarlyStopping has nothing to act on;
    - resuming a fit into another folder (the CLI's next version folder): the state of a
      ModelCheckpoint whose folder was another one. Lightning would keep only its
      ``best_model_path``, a file of the other folder, and not its scores or top-k files."""
    states = checkpoint.get("callbacks")
    if not states:
        return
    if not resuming:
        del checkpoint["callbacks"]
        return
    from pytorch_lightning.callbacks import ModelCheckpoint

    for callback in trainer.checkpoint_callbacks:
        state = states.get(callback.state_key) if isinstance(callback, ModelCheckpoint) else None
        if isinstance(state, dict) and state.get("dirpath") != callback.dirpath:
            del states[callback.state_key]
