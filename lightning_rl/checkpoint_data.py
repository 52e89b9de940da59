"""What a checkpoint holds as plain data beside the weights, below every layer that writes it:
callable hyperparameters as placeholders, and every DDP rank's sampler state gathered into the
one file rank 0 writes (``pack_rank_states``/``unpack_rank_state``). The data layer, the
settings and the encoders use these without importing the checkpoint registry
(``checkpoint.py``), which knows the algorithms."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from lightning_rl.distributed import gather_to_rank_zero

# ----------------------------------------------------------------------------- callable hyperparameters
_PLACEHOLDER = "<callable {}>"


def callable_placeholder(fn: Callable[..., Any]) -> str:
    """What a checkpoint keeps of a callable hyperparameter: its name, for the error message."""
    target = getattr(fn, "func", fn)  # functools.partial
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"
    return _PLACEHOLDER.format(name)


def is_callable_placeholder(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("<callable ") and value.endswith(">")


def check_not_placeholder(name: str, value: Any) -> None:
    """A hyperparameter restored from a checkpoint as a placeholder: the callable must be given again."""
    if is_callable_placeholder(value):
        raise ValueError(
            f"{name}={value}: the checkpoint was trained with this callable, which a checkpoint cannot hold "
            f"(loading one never runs code). Pass it again, e.g. Algo.load_from_checkpoint(path, {name}=...) "
            f"or --model.{name} on the command line"
        )


# ----------------------------------------------------------------------------- per-rank state
def pack_rank_states(local: dict[str, Any], interrupted: bool = False) -> dict[str, Any]:
    """Every rank's ``local`` state for the checkpoint rank 0 writes: ``{"world_size", "ranks"}``.

    Must be called on every rank together (it gathers), except when ``interrupted``: a
    Ctrl-C may reach one rank only, so that checkpoint keeps this rank's state alone and a
    resume from it re-seeds the samplers (``unpack_rank_state``)."""
    from lightning_rl.distributed import world_size

    size = world_size()
    ranks = [local] if interrupted or size == 1 else gather_to_rank_zero(local)
    return {"world_size": size, "ranks": ranks}


def unpack_rank_state(
    packed: dict[str, Any] | None, rank: int, world_size: int, what: str, warn: bool = True
) -> dict[str, Any] | None:
    """This rank's state from ``pack_rank_states``; ``None`` — with a warning when resuming a
    fit (``warn``) — when the checkpoint holds no state for it (another world size, an
    interrupted DDP run): the caller then re-seeds. Outside a fit (loading weights for
    inference) rank 0's state is taken silently."""
    if not packed:
        return None
    ranks = packed.get("ranks") or []
    if packed.get("world_size") == world_size and len(ranks) == world_size:
        return ranks[rank]
    if not warn:
        return ranks[0] if ranks else None
    if rank == 0:
        warnings.warn(
            f"the checkpoint holds the {what} of {len(ranks)} of {packed.get('world_size')} ranks, and this run has "
            f"{world_size}: weights, optimizer state and global counters are restored, but each rank's {what} "
            "restarts from fresh episodes seeded by seed + 1000 * rank + the restored iteration count, so the "
            "run will not match an uninterrupted one exactly",
            stacklevel=2,
        )
    return None
