"""The learner queue of asynchronous sampling (``data/async_sampling.py``): a background thread
in the learner process drains the worker pool, drops fragments more than ``max_policy_lag``
versions old, assembles ``fragments_per_batch`` of them side by side into one time-major batch
(moved to a CUDA learner's device there) and hands it over through a one-slot queue; the
learner takes batches from a ``MinibatchBuffer``."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from lightning_rl.batch import BOOTSTRAP, MultiAgentBatch, SampleBatch
from lightning_rl.data.samplers.multi_agent import split_policy_columns
from lightning_rl.data.workers import Fragment, WorkerPool

__all__ = ["LearnerQueueLoading", "MinibatchBuffer"]

VALID = SampleBatch.VALID
POLICY_VERSION = "policy_version"
_POLL_S = 0.05  # how often a blocked learner looks at the world (stop, deaths)


class MinibatchBuffer:
    """Hands out ``size`` batches round robin, each exactly ``num_passes`` times, then replaces it
    with the next from ``source`` (the reference's ``MinibatchBuffer``): with ``num_passes`` > 1
    the learner trains on a batch again rather than waiting for a new one."""

    def __init__(self, source: Callable[[], Any], size: int, num_passes: int) -> None:
        self.source, self.size, self.num_passes = source, size, num_passes
        self.batches: list[Any] = [None] * size
        self.ttl = [0] * size
        self.index = 0

    def get(self) -> tuple[Any, bool]:
        """``(batch, new)``: ``new`` on the first of its ``num_passes`` hand-outs."""
        i = self.index
        new = self.ttl[i] == 0
        if new:
            self.batches[i] = None  # let the old one go before waiting for the next
            self.batches[i], self.ttl[i] = self.source(), self.num_passes
        self.ttl[i] -= 1
        self.index = (i + 1) % self.size
        return self.batches[i], new


class LearnerQueueLoading:
    """The loader thread (``_load_loop``) and the learner's pull (``_next_batch``) of
    ``AsyncSamplingDataModule``, which sets the attributes below and starts the thread."""

    module: Any
    pool: WorkerPool | None
    num_workers: int
    num_envs: int
    rollout_fragment_length: int
    fragments_per_batch: int
    train_batch_size: int
    learner_queue_size: int
    max_policy_lag: int | None
    sampler_timeout_s: float
    multi_agent: bool
    policy_id: str
    counters: dict[str, int]
    _counters_lock: threading.Lock
    _ready: queue.Queue
    _error: BaseException | None
    _closing: threading.Event

    def _sample_here(self) -> MultiAgentBatch:
        """A batch sampled in the learner process (``num_workers=0``): the DataModule's."""
        raise NotImplementedError

    def _next_batch(self) -> MultiAgentBatch:
        if self.num_workers == 0:
            return self._sample_here()
        start = time.perf_counter()
        deadline = time.monotonic() + self.sampler_timeout_s
        while True:
            if self._error is not None:
                raise self._error
            try:
                batch = self._ready.get(timeout=_POLL_S)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"no batch from the {self.num_workers} sampler workers within sampler_timeout_s="
                        f"{self.sampler_timeout_s:g} s ({self.pool.describe()})"
                    ) from None
                continue
            if not self._too_old(int(self._batch_versions(batch).min())):
                break
            self._count("num_fragments_dropped", self.fragments_per_batch)  # loaded before the learner moved on
        batch.info["perf"]["learner_wait_ms"] = 1000.0 * (time.perf_counter() - start)
        return batch

    def _batch_versions(self, batch: MultiAgentBatch) -> torch.Tensor:
        """The policy versions of a batch's fragments (per column)."""
        return torch.cat([b[POLICY_VERSION] for b in batch.policy_batches.values()])

    def _assemble(self, fragments: list[Fragment], info: dict[str, Any], perf: dict[str, float]) -> MultiAgentBatch:
        """Fragments side by side along the env axis: ``[T, B]`` columns."""
        cols = {}
        for key in fragments[0].tensors:
            dim = 0 if key.rsplit("/", 1)[-1].startswith(BOOTSTRAP) else 1  # [B] columns, [T, B] columns
            cols[key] = torch.cat([f.tensors[key] for f in fragments], dim=dim)
        by_policy = split_policy_columns(cols) if self.multi_agent else {self.policy_id: cols}
        batches = {}
        for pid, policy_cols in by_policy.items():
            columns = policy_cols[VALID].shape[1] // len(fragments)  # env columns (or agent columns) per fragment
            policy_cols[POLICY_VERSION] = torch.cat(
                [torch.full((columns,), f.version, dtype=torch.int64) for f in fragments])
            batches[pid] = SampleBatch(policy_cols)  # time-major: [T, B] columns, and [B] ones (bootstrap_obs, ...)
        info["perf"] = perf
        info["agent_steps_sampled"] = (sum(f.extra["agent_steps"] for f in fragments) if self.multi_agent
                                       else self.train_batch_size)
        return MultiAgentBatch(batches, env_steps=self.train_batch_size, info=info)

    def _load_loop(self) -> None:
        """The loader thread: fragments -> batches, worker deaths -> errors or restarts."""
        try:
            waiting: list[Fragment] = []  # the learner queue
            returns: list[float] = []
            lengths: list[int] = []
            sample_s, load_wait = 0.0, 0.0
            per_worker_steps = [0] * self.num_workers
            started = time.perf_counter()
            # The learner queue holds at most this many fragments; beyond it fragments stay with
            # the workers, which then wait for their credits: the policy lag stays bounded.
            capacity = max(self.learner_queue_size, self.fragments_per_batch)
            while not self._closing.is_set():
                wait_start = time.perf_counter()
                received = self.pool.receive(capacity - len(waiting), timeout=_POLL_S)
                load_wait += time.perf_counter() - wait_start
                for fragment, seconds, episodes in received:
                    self.on_episodes(fragment.index, episodes)
                    returns += episodes["episode_returns"]
                    lengths += episodes["episode_lengths"]
                    sample_s += seconds
                    per_worker_steps[fragment.index] += self.num_envs * self.rollout_fragment_length
                    if self._too_old(fragment.version):
                        self._count("num_fragments_dropped", 1)
                    else:
                        waiting.append(fragment)
                while len(waiting) >= self.fragments_per_batch and not self._closing.is_set():
                    elapsed = max(time.perf_counter() - started, 1e-9)
                    fragments, waiting = waiting[: self.fragments_per_batch], waiting[self.fragments_per_batch:]
                    perf = {
                        "learner_queue_size": float(len(waiting)),
                        "load_wait_ms": 1000.0 * load_wait,
                        **{f"worker_{i}_env_steps_per_s": n / elapsed for i, n in enumerate(per_worker_steps)},
                        "num_worker_restarts": float(self.counters["num_worker_restarts"]),
                        "num_fragments_dropped": float(self.counters["num_fragments_dropped"]),
                    }
                    info = {"episode_returns": returns, "episode_lengths": lengths, "sample_time_s": sample_s}
                    batch = self._assemble(fragments, info, perf)
                    if self.module.device.type == "cuda":
                        batch = batch.to(self.module.device)
                    returns, lengths, sample_s, load_wait = [], [], 0.0, 0.0
                    self._hand_over(batch)
        except BaseException as err:  # handed to the learner's next pull
            self._error = err

    def _count(self, name: str, n: int) -> None:
        """Add ``n`` to a counter (``+=`` on a dict entry is a read then a write: two threads count)."""
        with self._counters_lock:
            self.counters[name] += n

    def on_episodes(self, index: int, episodes: dict[str, list]) -> None:
        """Hook (loader thread): worker ``index`` finished these episodes."""

    def _too_old(self, version: int) -> bool:
        lag = int(self.module.counters["num_iterations"]) - version
        return self.max_policy_lag is not None and lag > self.max_policy_lag

    def _hand_over(self, batch: MultiAgentBatch) -> None:
        while not self._closing.is_set():
            try:
                self._ready.put(batch, timeout=_POLL_S)
                return
            except queue.Full:
                self.pool.check()
