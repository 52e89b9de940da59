"""The worker pool: what the learner's side of asynchronous sampling asks of its sampler
workers, whatever transport connects them (``processes.py``: child processes and shared memory;
``ray_actors.py``: Ray actors and the object store). Each worker runs a ``SamplerWorker``
(``worker.py``); the DataModule (``async_sampling.py``) keeps the learner queue, the policy lag
and the batches (``learner_queue.py``), the same for every backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

if TYPE_CHECKING:
    from lightning_rl.data.workers.task import FragmentTask

BACKENDS = ("processes", "ray")


class Fragment(NamedTuple):
    """What a worker sent, in the learner process: its tensors, copied out of the transport."""

    tensors: dict[str, torch.Tensor]
    version: int  # the learner iteration of the weights it was sampled with
    index: int  # the worker
    extra: dict[str, Any]


class Received(NamedTuple):
    """A fragment as it arrived, with the seconds its worker took and the episodes it finished."""

    fragment: Fragment
    seconds: float
    episodes: dict[str, list]


@dataclass
class PoolSpec:
    """What every backend builds its workers from."""

    num_workers: int
    make_sampler: Callable[[int | None], Any]  # a worker's sampler from its seed (pickles)
    length: int  # steps per fragment
    policy: nn.Module  # the CPU copy each worker starts from
    tasks: list[FragmentTask]  # worker i's task
    seed: Callable[[int, int], int | None]  # (worker, restarts) -> its seed
    columns: dict[str, tuple[tuple[int, ...], torch.dtype]]  # what a fragment holds (shapes of the largest)
    credits: int  # fragments a worker may have sampled and not yet handed over
    hold: bool  # a credit returns only through ``release`` (A3C), else when its fragment is received
    restart_failed_workers: bool
    timeout_s: float  # bound of every wait on a worker
    on_restart: Callable[[], None]  # called once per restarted worker


class WorkerPool:
    """``num_workers`` sampler workers: started, fed weights, drained of fragments, restarted or
    named when they fail, stopped. Every method is called from the learner process; ``receive``
    and ``check`` from its loader thread, ``broadcast`` and ``release`` from the training loop."""

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.restarts = [0] * spec.num_workers  # each worker's incarnation

    def start(self, policy: nn.Module, version: int) -> None:
        """Start every worker with ``policy``'s weights of learner iteration ``version``."""
        raise NotImplementedError

    def broadcast(self, policy: nn.Module, version: int) -> None:
        """Make ``policy``'s whole state (``policy_state``) the newest weights: each worker loads
        them before its next fragment."""
        raise NotImplementedError

    def receive(self, limit: int, timeout: float) -> list[Received]:
        """At most ``limit`` fragments, waiting up to ``timeout`` s for the first. A worker's error
        raises (``RuntimeError`` naming it, with its traceback); a dead worker is restarted
        (``restart_failed_workers``) or raises."""
        raise NotImplementedError

    def check(self) -> None:
        """Find dead workers (restart or raise) without receiving."""

    def release(self, index: int, token: Any, incarnation: int | None = None) -> None:
        """Give worker ``index`` back the credit ``token`` (``hold``), unless it was restarted since
        ``incarnation`` (its successor got all its credits at start)."""
        raise NotImplementedError

    def describe(self) -> str:
        """The workers' state, for an error message."""
        raise NotImplementedError

    def close(self, terminate: bool = False) -> None:
        """Stop every worker (and what the pool started for them); idempotent."""
        raise NotImplementedError
