"""Asynchronous sampling: worker processes step envs with a slightly stale policy while the learner trains.

The reference runs SGD in a learner thread so its main thread can keep sampling; under
Lightning the roles invert: the training loop is the learner, and this DataModule owns

* ``num_workers`` sampler processes, each with ``num_envs`` vector envs and a CPU copy of the
  policy, writing time-major fragments of ``rollout_fragment_length`` steps into
  shared-memory slots it owns, stamped with the policy version they were sampled with;
* a bounded learner queue (``learner_queue_size``) that carries slot ids, not tensors;
* one background thread in the learner process that drains the queue, drops fragments more
  than ``max_policy_lag`` versions old, assembles ``train_batch_size`` env steps into one
  time-major batch and moves it to the learner's device (pinned, non-blocking) while the
  current batch trains (the reference's load/optimize overlap);
* the weights, broadcast to every worker through one shared flat tensor every
  ``broadcast_interval`` training iterations (a sequence lock; nothing pickled).

``num_workers=0`` samples in the learner process, fragment after fragment: the synchronous
baseline (like RLlib's ``num_env_runners=0``).

A batch is one policy's ``SampleBatch`` of time-major columns ``[T, B]`` (``B`` = envs of
all fragments in it): ``obs``, ``actions``, ``action_logp`` (behaviour), ``vf_preds``,
``rewards``, ``terminateds``, ``truncateds``, ``valid`` (False on the reset rows of next-step
autoreset) and ``policy_version`` ``[B]``, plus ``bootstrap_obs`` ``[B, *obs_shape]``, the
observation after the last step.

Faults: an env that raises in a worker reaches the learner as a ``RuntimeError`` naming the
worker and carrying the env's traceback, at its next pull; a worker killed by a signal is
detected within ``sampler_timeout_s`` and named with its exit code, or restarted with a new
seed when ``restart_failed_workers``. Workers exit when the learner process dies, and no
worker outlives ``fit`` (closed at its end, on an exception and on Ctrl-C).

Resume: envs in other processes are not bit-resumable. A restored run keeps its counters,
optimizer and policy; its workers start fresh episodes with seeds derived from the restored
counters.
"""

from __future__ import annotations

import copy
import functools
import math
import multiprocessing.connection
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import nn

from lightning_rl.batch import (
    BOOTSTRAP,
    DEFAULT_POLICY_ID,
    EPISODE_STARTS,
    PREV_ACTIONS,
    PREV_REWARDS,
    STATE_IN,
    STATE_OUT,
    MultiAgentBatch,
    SampleBatch,
)
from lightning_rl.data.base import EnvDataModule, policy_state, rank_seed
from lightning_rl.data.envs import EnvSpec, describe_exit_code, make_vector_env, stop_processes
from lightning_rl.data.multi_agent import MultiAgentEnvDataModule
from lightning_rl.data.rollout import RolloutDataModule
from lightning_rl.data.samplers.engine import EnvSampler, ExploringPolicy
from lightning_rl.data.samplers.multi_agent import MultiAgentFragmentSampler, split_policy_columns

__all__ = ["AsyncSamplingDataModule", "MinibatchBuffer"]

BOOTSTRAP_OBS, VALID = SampleBatch.BOOTSTRAP_OBS, SampleBatch.VALID
POLICY_VERSION = "policy_version"
_POLL_S = 0.05  # how often a blocked learner or worker looks at the world (stop, deaths)


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


def _acting(policy: nn.Module, exploration: dict[str, Any]) -> ExploringPolicy | dict[str, ExploringPolicy]:
    """A worker's acting policy: one ``ExploringPolicy``, or one per policy id (multi-agent: ``policy``
    is the ``Policies`` dict)."""
    if isinstance(policy, nn.ModuleDict):
        return {pid: ExploringPolicy(p, exploration) for pid, p in policy.items()}
    return ExploringPolicy(policy, exploration)


class FragmentTask:
    """What a sampler worker makes of each fragment it samples and puts in its slot: for IMPALA
    and APPO the fragment itself. Subclasses turn it into other things (APEX: prioritized n-step
    transitions; A3C: a gradient). Runs in the worker; built in the learner process, so it must
    pickle (the spawn start method)."""

    def exploration(self) -> dict[str, Any]:
        """Keyword arguments of the worker's exploring ``compute_actions``."""
        return {}

    def columns(self, policy: nn.Module, sampler: RolloutDataModule) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Shapes and dtypes of a slot's tensors (learner side, before the workers start)."""
        if isinstance(sampler.sampler, MultiAgentFragmentSampler):
            return sampler.sampler.fragment_columns(_acting(policy, self.exploration()))
        return _fragment_columns(policy, sampler)

    def make(self, policy: nn.Module, rollout: dict[str, torch.Tensor], valid: torch.Tensor,
             bootstrap_obs: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors for the slot, a small picklable extra)`` from one time-major fragment
        (``rollout`` ``[T, N]`` columns, ``valid`` ``[T, N]``, ``bootstrap_obs`` ``[N, ...]``).
        Tensors shorter than their slot's first dimension fill its first rows (the extra then
        says how many: ``count``)."""
        return {**rollout, VALID: valid, BOOTSTRAP_OBS: bootstrap_obs}, {}


class _SharedWeights:
    """The policy's whole state, parameters and buffers (BatchNorm statistics, observation
    normalizers...), as shared tensors with a sequence lock: odd while the learner writes.
    ``version`` is the learner iteration the state is from."""

    def __init__(self, policy: nn.Module) -> None:
        self.tensors = [t.detach().cpu().clone().share_memory_() for t in policy_state(policy)]
        self.seq = torch.zeros(2, dtype=torch.int64).share_memory_()  # [sequence, version]

    def write(self, policy: nn.Module, version: int) -> None:
        self.seq[0] += 1
        for shared, tensor in zip(self.tensors, policy_state(policy), strict=True):
            shared.copy_(tensor.detach())
        self.seq[1] = version
        self.seq[0] += 1

    def read_into(self, policy: nn.Module, have: int) -> int:
        """Copy a newer state than version ``have`` into ``policy``; returns the version it has."""
        while True:
            start = int(self.seq[0])
            version = int(self.seq[1])
            if start % 2 or version == have:
                if start % 2:
                    time.sleep(0.0005)
                    continue
                return have
            snapshot = [t.clone() for t in self.tensors]
            if int(self.seq[0]) == start:
                with torch.no_grad():
                    for tensor, value in zip(policy_state(policy), snapshot, strict=True):
                        tensor.copy_(value)
                return version


def _fragment_columns(policy: nn.Module, dm: RolloutDataModule) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes of a fragment's columns, from one probe of the policy (learner side)."""
    T, N = dm.rollout_fragment_length, dm.num_envs
    space = dm.module.observation_space
    obs = torch.as_tensor(np.stack([np.asarray(space.sample()) for _ in range(N)]))
    with torch.inference_mode():
        out = policy.compute_actions(obs, explore=True, generator=torch.Generator().manual_seed(0))
    cols = {SampleBatch.OBS: ((T, N, *obs.shape[1:]), obs.dtype)}
    cols.update({k: ((T, *v.shape), v.dtype) for k, v in out.items() if k != STATE_OUT})
    if getattr(policy, "recurrent", False):  # its inputs, per step and after the fragment (the bootstrap step)
        action = cols[SampleBatch.ACTIONS]
        inputs = {STATE_IN: ((N, policy.state_size), torch.float32), EPISODE_STARTS: ((N,), torch.bool),
                  PREV_ACTIONS: (action[0][1:], action[1]), PREV_REWARDS: ((N,), torch.float32)}
        for key, (shape, dtype) in inputs.items():
            cols[key] = ((T, *shape), dtype)
            cols[BOOTSTRAP + key] = (shape, dtype)
    cols[SampleBatch.REWARDS] = ((T, N), torch.float32)
    cols[SampleBatch.TERMINATEDS] = ((T, N), torch.bool)
    cols[SampleBatch.TRUNCATEDS] = ((T, N), torch.bool)
    cols[VALID] = ((T, N), torch.bool)
    cols[BOOTSTRAP_OBS] = ((N, *obs.shape[1:]), obs.dtype)
    return cols


def _sample_fragment(sampler: Any, task: FragmentTask, policy: nn.Module | None, acting: Any,
                     length: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """One fragment of ``length`` steps (``EnvSampler.fragment``, acted by ``acting``), made into a
    slot's tensors by ``task`` (multi-agent, a ``MultiAgentFragmentSampler``: every policy's
    columns, ``{"<policy>/<column>": tensor}``, and the agent steps in them)."""
    if isinstance(sampler, MultiAgentFragmentSampler):  # ``acting``: every policy's
        tensors, agent_steps = sampler.fragment(acting)
        return tensors, {"agent_steps": agent_steps}
    fragment = sampler.fragment(acting, length)
    valid, bootstrap_obs = fragment.pop(VALID), fragment.pop(BOOTSTRAP_OBS)
    # a recurrent policy's inputs after the fragment: where its bootstrap step starts
    inputs = {k: fragment.pop(k) for k in [k for k in fragment if k.startswith(BOOTSTRAP)]}
    tensors, extra = task.make(policy, dict(fragment), valid, bootstrap_obs)
    tensors.update(inputs)
    return tensors, extra


def _worker_main(
    index: int, seed: int | None, make_sampler: Callable[[int | None], Any], length: int, policy: nn.Module,
    task: FragmentTask, weights: _SharedWeights, slots: list[dict[str, torch.Tensor]], free: Any,
    out: Any, stop: Any, parent_pid: int,
) -> None:
    """A sampler process: take a free slot id from ``free``, read the newest weights, sample a
    fragment, fill the slot with what ``task`` makes of it, send its id on ``out``; until
    stopped or orphaned. Each worker has its own two pipes: a worker killed mid-write can
    corrupt only its own (a shared queue's lock would hang the others)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the learner, which stops us
    torch.set_num_threads(1)
    sampler = None
    try:
        sampler = make_sampler(seed)
        acting = _acting(policy, task.exploration())
        version = -1
        while not stop.is_set() and os.getppid() == parent_pid:
            if not free.poll(_POLL_S * 4):
                continue
            slot = free.recv()
            version = weights.read_into(policy, version)
            start = time.perf_counter()
            tensors, extra = _sample_fragment(sampler, task, policy, acting, length)
            buf = slots[slot]
            for key, value in tensors.items():
                buf[key][: len(value)].copy_(value)
            out.send(("fragment", index, slot, version, time.perf_counter() - start, sampler.episode_info(), extra))
    except BaseException:  # everything, KeyboardInterrupt included, goes to the learner
        try:
            out.send(("error", index, traceback.format_exc()))
        except OSError:
            pass
    finally:
        if sampler is not None:
            sampler.close(terminate=True)


class AsyncSamplingDataModule(EnvDataModule):
    """Sampler workers feeding the learner time-major batches (see the module docstring).

    Args:
        env: a registered gymnasium id or a callable returning a ``gymnasium.Env``.
        num_workers: sampler processes (per rank under DDP); 0 samples in the learner process.
        num_envs: envs per worker (per process with 0 workers).
        rollout_fragment_length: steps of one fragment, per env.
        train_batch_size: env steps per training batch (whole fragments: rounded up).
        learner_queue_size: fragments that may wait for the learner.
        broadcast_interval: training iterations between weight broadcasts.
        max_policy_lag: drop (and count) fragments sampled more than this many policy versions
            (learner iterations) before the learner would train on them; ``None`` keeps all.
        sampler_timeout_s: how long the learner waits for a fragment before it raises.
        restart_failed_workers: restart a worker that died (new seed) instead of raising.
        num_sgd_iter: training iterations each batch is handed out for (the reference's
            ``num_passes``); only its first counts its env steps as sampled.
        minibatch_buffer_size: batches handed out round robin (``MinibatchBuffer``).
        seed: as for ``RolloutDataModule``.
        vectorization: as for ``RolloutDataModule``.
        iterations_per_epoch: as for ``RolloutDataModule``.
        check_finite: as for ``RolloutDataModule``.
        policy_id: the policy the workers sample with.
        policy_mapping_fn: a multi-agent env (PettingZoo): agent id -> policy id; fragments
            then hold every policy's columns (``MultiAgentFragmentSampler``) and the workers
            every policy.
        policy_agents: a multi-agent env: each policy's possible agents.
        policy_spaces: a multi-agent env: each policy's spaces.
    """

    def __init__(
        self,
        env: EnvSpec,
        num_workers: int = 2,
        num_envs: int = 4,
        rollout_fragment_length: int = 50,
        train_batch_size: int = 500,
        learner_queue_size: int = 16,
        broadcast_interval: int = 1,
        max_policy_lag: int | None = None,
        sampler_timeout_s: float = 60.0,
        restart_failed_workers: bool = False,
        num_sgd_iter: int = 1,
        minibatch_buffer_size: int = 1,
        vectorization: str = "auto",
        seed: int | None = None,
        iterations_per_epoch: int = 10,
        check_finite: bool = True,
        policy_id: str = DEFAULT_POLICY_ID,
        policy_mapping_fn: Callable[[str], str] | None = None,
        policy_agents: dict[str, list[str]] | None = None,
        policy_spaces: dict[str, tuple[Any, Any]] | None = None,
    ) -> None:
        super().__init__(env, num_envs, "sync" if policy_mapping_fn else vectorization, seed, iterations_per_epoch,
                         "cpu", check_finite)
        for name, value in dict(rollout_fragment_length=rollout_fragment_length, train_batch_size=train_batch_size,
                                learner_queue_size=learner_queue_size, broadcast_interval=broadcast_interval,
                                num_sgd_iter=num_sgd_iter, minibatch_buffer_size=minibatch_buffer_size).items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if max_policy_lag is not None and max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be >= 0 or None, got {max_policy_lag}")
        if sampler_timeout_s <= 0:
            raise ValueError(f"sampler_timeout_s must be positive, got {sampler_timeout_s}")
        self.num_workers = num_workers
        self.rollout_fragment_length = rollout_fragment_length
        self.fragments_per_batch = math.ceil(train_batch_size / (num_envs * rollout_fragment_length))
        self.train_batch_size = self.fragments_per_batch * num_envs * rollout_fragment_length
        self.learner_queue_size = learner_queue_size
        self.broadcast_interval = broadcast_interval
        self.max_policy_lag = max_policy_lag
        self.sampler_timeout_s = sampler_timeout_s
        self.restart_failed_workers = restart_failed_workers
        self.policy_id = policy_id
        # multi-agent (a PettingZoo env): every policy's time-major columns (MultiAgentFragmentSampler)
        self.policy_mapping_fn, self.policy_agents, self.policy_spaces = policy_mapping_fn, policy_agents, policy_spaces
        self.multi_agent = policy_mapping_fn is not None
        self.minibatch_buffer = MinibatchBuffer(self._next_batch, minibatch_buffer_size, num_sgd_iter)
        self.counters = {"num_worker_restarts": 0, "num_fragments_dropped": 0}
        # The loader thread and the learner's both count and both talk to the workers: a restart
        # (new pipes, every slot handed to the new worker) and a slot handed back are one step each.
        self._counters_lock = threading.Lock()
        self._pool_lock = threading.RLock()
        self._local: RolloutDataModule | None = None
        self._active = False
        self._workers: list[Any] = []
        self._thread: threading.Thread | None = None
        self._ready: queue.Queue = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._closing = threading.Event()

    # Subclasses whose workers must wait for the learner to use what they sent (A3C: its
    # gradient applied, then the new weights read) set this: a slot goes back to its worker
    # only through ``release``, and each worker has one.
    hold_slots = False

    def task(self, index: int) -> FragmentTask:
        """What worker ``index`` makes of its fragments (``num_workers=0``: index 0, in this process)."""
        return FragmentTask()

    # ------------------------------------------------------------ set-up
    @property
    def envs(self) -> Any:
        """The learner process's own envs with ``num_workers=0`` (the workers' live elsewhere)."""
        return self._local.envs if self._local is not None and self.num_workers == 0 else None

    def _sampler(self, seed: int | None) -> RolloutDataModule | MultiAgentEnvDataModule:
        """The learner process's own sampler (``num_workers=0``, and the probe of the columns)."""
        if self.multi_agent:
            engine = MultiAgentFragmentSampler(self.env, self.policy_mapping_fn, self.policy_agents, self.policy_spaces,
                                               self.num_envs, self.rollout_fragment_length, seed)
            return MultiAgentEnvDataModule(self.env, self.policy_mapping_fn, self.num_envs, seed, 1, "cpu", engine)
        return RolloutDataModule(self.env, self.num_envs, self.rollout_fragment_length, self.vectorization, seed, 1,
                                 "cpu", self.check_finite)

    def _sampler_factory(self) -> Callable[[int | None], Any]:
        """What makes a worker's sampler from a seed (picklable: the spawn start method): the
        sampling engine, or for a PettingZoo env the multi-agent fragment sampler."""
        if self.multi_agent:
            return functools.partial(_open_multi_agent_sampler, self.env, self.policy_mapping_fn, self.policy_agents,
                                     self.policy_spaces, self.num_envs, self.rollout_fragment_length)
        return functools.partial(_open_sampler, self.env, self.num_envs, self.vectorization, self.check_finite)

    def _worker_policy(self) -> nn.Module:
        """What the workers sample with and the weights broadcast: the policy, or every policy."""
        return self.module.policies if self.multi_agent else self.module.policies[self.policy_id]

    def _worker_seed(self, index: int, restarts: int = 0) -> int | None:
        # Worker i's envs get seeds rank_seed + i * num_envs + j: disjoint from every other worker's.
        # A resumed run offsets them by the env steps it had sampled: fresh episodes, new seeds.
        base = rank_seed(self.seed, self.rank)
        if base is None:
            return None
        resumed_at = int(self.module.counters["num_env_steps_sampled"]) if self.num_workers else 0
        return base + (index + restarts * self.num_workers) * self.num_envs + resumed_at

    def setup(self, stage: str) -> None:
        if self.module is None and self.trainer is not None:
            self.connect(self.trainer.lightning_module)
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__} needs a module: call connect(module) or use it with a Trainer")
        if self._active:
            return
        self._active = True
        self.rank = self.trainer.global_rank if self.trainer is not None else 0
        self._local = self._sampler(self._worker_seed(0))
        self._local.trainer = self.trainer  # its rank, and its checkpoint state gathered over ranks
        self._local.connect(self.module)
        if self.num_workers == 0:
            self._local.setup(stage)
            return
        self._start_workers()

    def _start_workers(self) -> None:
        module = self.module
        assert module is not None
        policy = self._worker_policy()
        if not self.multi_agent:  # (a PettingZoo env's spaces were checked when the module was built)
            probe = make_vector_env(self.env, 1, self.vectorization)  # spaces, checked against the module's
            try:
                module.check_spaces(probe.single_observation_space, probe.single_action_space)
            finally:
                probe.close()
        self._cpu_policy = _cpu_copy(policy)
        self._columns = self.task(0).columns(self._cpu_policy, self._local)
        self._weights = _SharedWeights(self._cpu_policy)
        self._weights.write(policy, int(module.counters["num_iterations"]))
        self._last_broadcast = module.policies.version
        per_worker = 1 if self.hold_slots else 1 + math.ceil(self.learner_queue_size / self.num_workers)
        self._slots = [
            {k: torch.zeros(shape, dtype=dtype).share_memory_() for k, (shape, dtype) in self._columns.items()}
            for _ in range(per_worker * self.num_workers)
        ]
        self._owner = [i // per_worker for i in range(len(self._slots))]
        # fork where it is safe (no CUDA in this process yet): no pickling, quick start.
        method = "fork" if "fork" in mp.get_all_start_methods() and not torch.cuda.is_initialized() else "spawn"
        self._ctx = mp.get_context(method)
        self._stop = self._ctx.Event()
        self._workers = [None] * self.num_workers
        self._conns: list[Any] = [None] * self.num_workers  # (free-slot sender, fragment receiver)
        self._restarts = [0] * self.num_workers
        for i in range(self.num_workers):
            self._spawn(i)
        self._closing.clear()
        self._thread = threading.Thread(target=self._load_loop, name="lightning_rl-batch-loader", daemon=True)
        self._thread.start()

    def _spawn(self, index: int) -> None:
        """Start worker ``index`` with new pipes, holding every slot it owns."""
        free_recv, free_send = self._ctx.Pipe(duplex=False)
        out_recv, out_send = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=_worker_main, name=f"lightning_rl-sampler-{index}", daemon=True,
            args=(index, self._worker_seed(index, self._restarts[index]), self._sampler_factory(),
                  self.rollout_fragment_length, self._cpu_policy, self.task(index), self._weights, self._slots,
                  free_recv, out_send, self._stop, os.getpid()),
        )
        process.start()
        free_recv.close()  # the worker's ends live in the worker now
        out_send.close()
        self._close_conns(index)
        self._workers[index] = process
        self._conns[index] = (free_send, out_recv)
        for slot, owner in enumerate(self._owner):
            if owner == index:
                free_send.send(slot)

    def _close_conns(self, index: int) -> None:
        if self._conns[index] is not None:
            for conn in self._conns[index]:
                conn.close()
            self._conns[index] = None

    # ------------------------------------------------------------ the learner's side
    def sample(self) -> MultiAgentBatch:
        """The next training batch from the minibatch buffer (a new one blocks until there is one)."""
        if self.num_workers:
            self.maybe_broadcast()  # every iteration, reused batch or not: the workers' lag counts iterations
        batch, new = self.minibatch_buffer.get()
        if not new:  # handed out again: its env steps and episodes were counted the first time
            batch = MultiAgentBatch(batch.policy_batches, env_steps=0, info={"perf": {}, "agent_steps_sampled": 0})
        # Policy lag: learner iterations since the weights that sampled each fragment.
        lag = int(self.module.counters["num_iterations"]) - self._batch_versions(batch)
        batch.info["perf"] = {**batch.info["perf"], "policy_lag_mean": float(lag.float().mean()),
                              "policy_lag_max": float(lag.max())}
        return batch

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
                        f"{self.sampler_timeout_s:g} s (workers alive: "
                        f"{[p.is_alive() for p in self._workers]})"
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

    def maybe_broadcast(self) -> None:
        """Write the learner's weights for the workers when ``broadcast_interval`` iterations passed."""
        module = self.module
        if module.policies.version - self._last_broadcast >= self.broadcast_interval:
            self._weights.write(self._worker_policy(), int(module.counters["num_iterations"]))
            self._last_broadcast = module.policies.version

    def _sample_here(self) -> MultiAgentBatch:
        assert self._local is not None and self.module is not None
        start = time.perf_counter()
        version = int(self.module.counters["num_iterations"])
        policy = None
        if self.multi_agent:
            acting = self._local.acting_policies()
        else:
            policy = self.module.sampling_policy(self.policy_id, torch.device("cpu"))
            acting = ExploringPolicy(policy, self.module.exploration_kwargs(self.policy_id))
        sampler = self._local.sampler
        fragments = []
        for _ in range(self.fragments_per_batch):
            tensors, extra = _sample_fragment(sampler, self.task(0), policy, acting, self.rollout_fragment_length)
            fragments.append(_Fragment(tensors, version, 0, extra))
        info = self._local.episode_info()
        info["sample_time_s"] = time.perf_counter() - start
        return self._assemble(fragments, info, {"learner_wait_ms": 1000.0 * info["sample_time_s"]})

    def _assemble(self, fragments: list[_Fragment], info: dict[str, Any], perf: dict[str, float]) -> MultiAgentBatch:
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
            waiting: list[_Fragment] = []  # the learner queue
            returns: list[float] = []
            lengths: list[int] = []
            sample_s, load_wait = 0.0, 0.0
            per_worker_steps = [0] * self.num_workers
            started = time.perf_counter()
            # The learner queue holds at most this many fragments; beyond it messages stay in the
            # pipes and their slots with the workers, which then wait: the policy lag stays bounded.
            capacity = max(self.learner_queue_size, self.fragments_per_batch)
            while not self._closing.is_set():
                self._check_workers()
                receivers = {c[1]: i for i, c in enumerate(self._conns) if c is not None}
                wait_start = time.perf_counter()
                readable = multiprocessing.connection.wait(list(receivers), timeout=_POLL_S)
                load_wait += time.perf_counter() - wait_start
                for conn in readable:
                    try:
                        while len(waiting) < capacity and conn.poll():
                            message = conn.recv()
                            fragment, seconds, episodes = self._receive(message)
                            index, version = fragment.index, fragment.version
                            self.on_episodes(index, episodes)
                            returns += episodes["episode_returns"]
                            lengths += episodes["episode_lengths"]
                            sample_s += seconds
                            per_worker_steps[index] += self.num_envs * self.rollout_fragment_length
                            if self._too_old(version):
                                self._count("num_fragments_dropped", 1)
                            else:
                                waiting.append(fragment)
                    except (EOFError, OSError):  # the worker died: _check_workers names it
                        continue
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

    def _receive(self, message: tuple) -> tuple[_Fragment, float, dict[str, list]]:
        """A worker's message: ``(fragment, seconds it took, episodes it finished)`` (copied out,
        its slot handed back unless ``hold_slots``: then ``release`` does), or its error raised."""
        if message[0] == "error":
            _, index, trace = message
            raise RuntimeError(
                f"sampler worker {index} (pid {self._workers[index].pid}) failed:\n\n"
                f"Traceback in the worker process:\n{trace}"
            )
        _, index, slot, version, seconds, episodes, extra = message
        count = extra.get("count")
        tensors = {k: (v if count is None else v[:count]).clone() for k, v in self._slots[slot].items()}
        if self.hold_slots:  # and which incarnation of the worker it is from (see release)
            extra["slot"] = (slot, self._restarts[index])
        else:
            self.release(index, slot)
        return _Fragment(tensors, version, index, extra), seconds, episodes

    def release(self, index: int, slot: int, incarnation: int | None = None) -> None:
        """Hand slot ``slot`` back to worker ``index`` (it may sample into it again); not if the
        worker was restarted since ``incarnation`` (its successor got all its slots at start)."""
        with self._pool_lock:  # no restart between the check and the send: its successor has the slot already
            if incarnation is not None and incarnation != self._restarts[index]:
                return
            try:
                self._conns[index][0].send(slot)
            except (OSError, TypeError):  # that worker just died: the slot is its successor's
                pass

    def _count(self, name: str, n: int) -> None:
        """Add ``n`` to a counter (``+=`` on a dict entry is a read then a write: two threads count)."""
        with self._counters_lock:
            self.counters[name] += n

    def on_episodes(self, index: int, episodes: dict[str, list]) -> None:
        """Hook (loader thread): worker ``index`` finished these episodes."""

    def _raise_sent_error(self, index: int) -> None:
        """Raise the error a dead worker sent before it exited, if any (the rest of what it sent is dropped)."""
        if self._conns[index] is None:
            return
        receiver = self._conns[index][1]
        try:
            while receiver.poll():
                message = receiver.recv()
                if message[0] == "error":
                    self._receive(message)
        except (EOFError, OSError):
            pass

    def _too_old(self, version: int) -> bool:
        lag = int(self.module.counters["num_iterations"]) - version
        return self.max_policy_lag is not None and lag > self.max_policy_lag

    def _hand_over(self, batch: MultiAgentBatch) -> None:
        while not self._closing.is_set():
            try:
                self._ready.put(batch, timeout=_POLL_S)
                return
            except queue.Full:
                self._check_workers()

    def _check_workers(self) -> None:
        for i, process in enumerate(self._workers):
            code = process.exitcode
            if code is None or self._closing.is_set():
                continue
            self._raise_sent_error(i)  # an env error it sent before exiting names the env, not "died"
            if not self.restart_failed_workers:
                raise RuntimeError(f"sampler worker {i} (pid {process.pid}) died: {describe_exit_code(code)}")
            with self._pool_lock:
                self._restarts[i] += 1
                self._spawn(i)
            self._count("num_worker_restarts", 1)

    # ------------------------------------------------------------ shutdown
    def close(self, terminate: bool = False) -> None:
        """Stop the loader thread and every worker (SIGTERM, then SIGKILL); idempotent."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if self._workers:
            self._stop.set()
            stop_processes([p for p in self._workers if p is not None], timeout=0.5 if terminate else 2.0)
            for i in range(len(self._conns)):
                self._close_conns(i)
            self._workers = []
        if self._local is not None:
            self._local.close(terminate)  # keeps what a checkpoint saved after fit must hold
        self._active = False

    def state_dict(self) -> dict[str, Any]:
        """The fault counters and, with ``num_workers=0``, the learner process's own sampler
        (envs, RNG: exact resume). Workers' envs live in other processes and are not saved."""
        local = self._local.state_dict() if self.num_workers == 0 and self._local is not None else None
        with self._counters_lock:
            counters = dict(self.counters)
        return {"counters": counters, "local": local}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counters.update(state.get("counters", {}))
        if state.get("local") and self._local is not None and self.num_workers == 0:
            self._local.load_state_dict(state["local"])


class _Fragment(NamedTuple):
    """What a worker sent, in the learner process: its slot's tensors, copied out."""

    tensors: dict[str, torch.Tensor]
    version: int  # the learner iteration of the weights it was sampled with
    index: int  # the worker
    extra: dict[str, Any]


def _cpu_copy(policy: nn.Module) -> nn.Module:
    return copy.deepcopy(policy).cpu().eval()


def _open_sampler(env: EnvSpec, num_envs: int, vectorization: str, check_finite: bool,
                  seed: int | None) -> EnvSampler:
    """A worker's sampling engine, its envs reset (env ``j`` seeded ``seed + j``)."""
    sampler = EnvSampler(env, num_envs, vectorization, seed, "cpu", check_finite)
    sampler.open()
    sampler.reset(seed)
    return sampler


def _open_multi_agent_sampler(env: Any, policy_mapping_fn: Callable[[str], str], policy_agents: dict[str, list[str]],
                              policy_spaces: dict[str, tuple[Any, Any]], num_envs: int, rollout_fragment_length: int,
                              seed: int | None) -> MultiAgentFragmentSampler:
    """A worker's multi-agent sampling engine, its envs reset (env ``i`` seeded ``seed + i``)."""
    sampler = MultiAgentFragmentSampler(env, policy_mapping_fn, policy_agents, policy_spaces, num_envs,
                                        rollout_fragment_length, seed)
    sampler.open()
    sampler.reset(seed)
    return sampler
