"""Process settings during ``fit``: torch threads and, under DDP on CPU, per-rank CPU pinning.

Applied at the start of ``fit`` and undone at its end — and when it fails or is
interrupted, which never reaches ``on_fit_end``.
"""

from __future__ import annotations

import os

import torch


def rank_cpus(available: set[int], local_rank: int, local_world_size: int) -> set[int]:
    """The CPUs of ``local_rank``: an equal, disjoint share of ``available`` (empty when there
    are more ranks than CPUs, where pinning would only stack ranks on shared cores)."""
    share = len(available) // local_world_size
    return set(sorted(available)[local_rank * share : (local_rank + 1) * share])


def set_process_affinity(cpus: set[int]) -> None:
    """Pin every thread of this process (gloo's too) to ``cpus``; threads started later inherit it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass


class ProcessSettings:
    """Torch intra-op threads and CPU pinning for the duration of a fit.

    Args:
        num_cpu_threads: torch threads during ``fit``; ``None`` leaves torch alone.
        cpu_affinity: pin each local rank to its own share of the CPUs (DDP on CPU, Linux).
    """

    def __init__(self, num_cpu_threads: int | None, cpu_affinity: bool) -> None:
        if num_cpu_threads is not None and num_cpu_threads < 1:
            raise ValueError(f"num_cpu_threads must be positive or None, got {num_cpu_threads}")
        self.num_cpu_threads = num_cpu_threads
        self.cpu_affinity = cpu_affinity
        self._saved_threads: int | None = None
        self._saved_affinity: set[int] | None = None

    def apply(self, local_rank: int, local_world_size: int, on_cpu: bool) -> None:
        if self.num_cpu_threads is not None:
            self._saved_threads = torch.get_num_threads()
            torch.set_num_threads(self.num_cpu_threads)
        if not self.cpu_affinity or local_world_size == 1 or not on_cpu or not hasattr(os, "sched_setaffinity"):
            return
        available = os.sched_getaffinity(0)
        cpus = rank_cpus(available, local_rank, local_world_size)
        if cpus:
            self._saved_affinity = available
            set_process_affinity(cpus)

    def restore(self) -> None:
        """Undo ``apply`` (safe to call twice)."""
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None
        if self._saved_affinity is not None:
            set_process_affinity(self._saved_affinity)
            self._saved_affinity = None
