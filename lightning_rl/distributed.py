"""What crosses DDP ranks: sums, per-rank checkpoint state, and the gradients each optimizer steps.

Lightning launches the ranks and owns the process group; the collectives our learners
need are here, in one place. Gradients are not synchronized by ``DistributedDataParallel``'s
reducer: an algorithm with several optimizers (SAC's actor, critic and temperature) backs
up losses that reach only some parameters, which the reducer rejects without
``find_unused_parameters`` and, with it, all-reduces gradients the step then throws away.
Instead each optimizer step all-reduces exactly the gradients it is about to apply, as one
flat tensor whose layout is fixed once (``FlatGradients``).
"""

from __future__ import annotations

import atexit
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

_EXIT_HOOK_REGISTERED = False


def _destroy_gloo_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_backend() == "gloo":
        torch.distributed.destroy_process_group()


def destroy_gloo_group_at_exit() -> None:
    """Destroy the default process group when the interpreter exits, where it is gloo's (the
    CPU backend). Left to the interpreter's own shutdown, a gloo group is torn down after the
    objects its threads use, and a rank that finished its run sometimes aborts ("terminate
    called without an active exception", exit status -6): 2 of 6 two-rank APEX runs on 2 busy
    cores, none of 8 with the group destroyed first. Registered once per process, at the
    learner's setup under DDP; other backends are left as they are."""
    global _EXIT_HOOK_REGISTERED
    if not _EXIT_HOOK_REGISTERED:
        atexit.register(_destroy_gloo_group)
        _EXIT_HOOK_REGISTERED = True


def world_size() -> int:
    """Ranks in the default process group (1 when none is initialized)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def global_rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def sum_over_ranks(tensor: Tensor) -> Tensor:
    """``tensor`` summed over ranks (itself in one process). One all-reduce and no barrier:
    Lightning's ``strategy.reduce`` adds a barrier, a second round trip that costs about
    1 ms with gloo on a small machine."""
    if world_size() == 1:
        return tensor
    total = tensor.clone()
    torch.distributed.all_reduce(total)
    return total


def mean_over_ranks(value: float, device: torch.device) -> float:
    """``value`` averaged over ranks (itself in one process): for what is adapted from learner
    info (PPO's KL coefficient), so every rank adapts identically."""
    size = world_size()
    if size == 1:
        return value
    return float(sum_over_ranks(torch.tensor([value], dtype=torch.float64, device=device)).item()) / size


def all_reduce_max(tensor: Tensor) -> Tensor:
    """Elementwise maximum of ``tensor`` over ranks (itself in one process)."""
    if world_size() == 1:
        return tensor
    out = tensor.clone()
    torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.MAX)
    return out


def gather_to_rank_zero(obj: Any) -> list[Any] | None:
    """``[obj of rank 0, obj of rank 1, ...]`` on rank 0, ``None`` elsewhere; ``[obj]`` in one process.

    For checkpoint state: Lightning computes a checkpoint on every rank but only rank 0
    writes it, so what each rank must restore for itself is gathered into rank 0's copy.
    ``obj`` is sent with ``pickle`` between our own processes; what is written to the file
    is still plain data (tensors, numbers, strings, containers)."""
    size = world_size()
    if size == 1:
        return [obj]
    rank = global_rank()
    out: list[Any] | None = [None] * size if rank == 0 else None
    torch.distributed.gather_object(obj, out, dst=0)
    return out


def check_strategy(trainer: pl.Trainer) -> None:
    """Several processes must come from Lightning's DDP strategy, ``strategy="ddp"``."""
    if trainer.world_size > 1 and not isinstance(trainer.model, DistributedDataParallel):
        raise ValueError(
            f"lightning_rl trains on several processes with strategy='ddp' only (see docs/guides/ddp.md), got "
            f"{type(trainer.strategy).__name__}"
        )


def multiprocessing_refused(start_method: str) -> str:
    """The one line refusing ranks that Lightning starts with ``multiprocessing`` (``strategy="ddp_spawn"``,
    ``"ddp_fork"``): a fit's state (counters, ``global_step``, envs, replay) would stay in those processes."""
    return (f"strategy='ddp_{start_method}' is not supported (the counters, global_step, envs and replay of a fit "
            "would stay in its child processes): use strategy='ddp' (processes started by Lightning's launcher), "
            "see docs/guides/ddp.md")


def check_launcher(trainer: pl.Trainer) -> None:
    """Refuse a rank forked by Lightning (``strategy="ddp_fork"``, ``"ddp_notebook"``), as the module is
    attached: the first point lightning_rl runs in it. ``"ddp_spawn"`` is refused earlier, in the main
    process, when the module is pickled for the spawned ranks (``Algorithm.__getstate__``)."""
    launcher = trainer.strategy.launcher
    # of Lightning's launchers, only the one that forks the ranks is interactive-compatible
    if launcher is not None and launcher.is_interactive_compatible:
        raise ValueError(multiprocessing_refused("fork"))


def bypass_ddp_gradient_sync(trainer: pl.Trainer) -> None:
    """Keep the ``DistributedDataParallel`` wrapper Lightning puts around the module from
    synchronizing gradients itself in this training step: our optimizer steps synchronize
    exactly what they step (``FlatGradients.all_reduce``). Lightning turns the wrapper's sync
    back on after every forward, so this runs at the start of each step."""
    model = trainer.model
    if isinstance(model, DistributedDataParallel):
        model.require_backward_grad_sync = False


class FlatGradients:
    """The gradients of ``params`` as views into one flat tensor, laid out once.

    ``zero()`` clears them without freeing (backward then accumulates into the views in
    place), and ``all_reduce()`` averages them over ranks with a single collective.
    """

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("FlatGradients needs at least one parameter that requires grad")
        first = self.params[0]
        self.flat = torch.zeros(sum(p.numel() for p in self.params), dtype=first.dtype, device=first.device)
        self._attach()

    def _attach(self) -> None:
        offset = 0
        for p in self.params:
            part = self.flat[offset : offset + p.numel()]
            # in the parameter's own memory layout (a CNN's channels-last weights), as backward
            # lays out the gradients it accumulates into them
            dense = p.is_contiguous() or (p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last))
            p.grad = part.as_strided(p.shape, p.stride()) if dense else part.view_as(p)
            offset += p.numel()

    def zero(self) -> None:
        """Clear the gradients in place (re-laying them out if someone replaced or moved them)."""
        first = self.params[0]
        if self.flat.device != first.device:
            self.flat = torch.zeros_like(self.flat, device=first.device)
            self._attach()
        elif any(p.grad is None for p in self.params) or first.grad.data_ptr() != self.flat.data_ptr():
            self._attach()
        self.flat.zero_()

    def all_reduce(self) -> None:
        """Average over ranks (no-op in one process)."""
        size = world_size()
        if size > 1:
            torch.distributed.all_reduce(self.flat)
            self.flat.div_(size)
