"""Asynchronous sampling: sampler workers step envs with a slightly stale policy while the learner trains.

The reference runs SGD in a learner thread so its main thread can keep sampling; under
Lightning the roles invert: the training loop is the learner, and this DataModule owns

* ``num_workers`` sampler workers (``data/workers/``), each with ``num_envs`` vector envs and a
  CPU copy of the policy, sampling time-major fragments of ``rollout_fragment_length`` steps
  stamped with the policy version they were sampled with: child processes writing into
  shared-memory slots they own (``sampler_backend="processes"``), or Ray actors on any node of
  a Ray cluster returning them through Ray's object store (``"ray"``);
* a bounded learner queue (``learner_queue_size``): a worker may run that far ahead and no further;
* one background thread in the learner process that drains the workers, drops fragments more
  than ``max_policy_lag`` versions old, assembles ``train_batch_size`` env steps into one
  time-major batch and moves it to the learner's device (pinned, non-blocking) while the
  current batch trains (the reference's load/optimize overlap);
* the weights, broadcast to every worker every ``broadcast_interval`` training iterations (one
  shared flat state with a sequence lock, or one ``ray.put``).

``num_workers=0`` samples in the learner process, fragment after fragment: the synchronous
baseline (like RLlib's ``num_env_runners=0``).

A batch is one policy's ``SampleBatch`` of time-major columns ``[T, B]`` (``B`` = envs of
all fragments in it): ``obs``, ``actions``, ``action_logp`` (behaviour), ``vf_preds``,
``rewards``, ``terminateds``, ``truncateds``, ``valid`` (False on the reset rows of next-step
autoreset) and ``policy_version`` ``[B]``, plus ``bootstrap_obs`` ``[B, *obs_shape]``, the
observation after the last step.

Faults: an env that raises in a worker reaches the learner as a ``RuntimeError`` naming the
worker and carrying the env's traceback, at its next pull; a worker killed (a signal; for a
Ray actor also its node lost) is named with its exit code or cause (and node), or restarted
with a new seed when ``restart_failed_workers``; every wait is bounded by ``sampler_timeout_s``.
Worker processes exit when the learner process dies, and no worker outlives ``fit`` (closed at
its end, on an exception and on Ctrl-C).

Resume: envs in other processes are not bit-resumable. A restored run keeps its counters,
optimizer and policy; its workers start fresh episodes with seeds derived from the restored
counters.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch
from lightning_rl.data.base import EnvDataModule, check_at_least_one, env_settings, rank_seed
from lightning_rl.data.envs.make import EnvSpec
from lightning_rl.data.envs.vector import make_vector_env
from lightning_rl.data.learner_queue import LearnerQueueLoading, MinibatchBuffer
from lightning_rl.data.multi_agent import MultiAgentEnvDataModule
from lightning_rl.data.rollout import RolloutDataModule
from lightning_rl.data.samplers.engine import ExploringPolicy
from lightning_rl.data.samplers.multi_agent import MultiAgentFragmentSampler
from lightning_rl.data.settings import EnvSettings, LearnerQueue, SamplerWorkers, check_backend
from lightning_rl.data.workers import Fragment, PoolSpec, WorkerPool, sample_fragment
from lightning_rl.data.workers.processes import ProcessPool
from lightning_rl.data.workers.task import FragmentTask
from lightning_rl.data.workers.worker import _open_multi_agent_sampler, _open_sampler
from lightning_rl.settings import check_group

__all__ = ["AsyncSamplingDataModule", "MinibatchBuffer"]


class AsyncSamplingDataModule(LearnerQueueLoading, EnvDataModule):
    """Sampler workers feeding the learner time-major batches (see the module docstring).

    Args:
        env: the env settings, as ``EnvDataModule`` takes them (``num_envs``: envs per worker, or
            of the learner process with no workers).
        rollout_fragment_length: steps of one fragment, per env.
        train_batch_size: env steps per training batch (whole fragments: rounded up).
        workers: the sampler workers' settings (``data/settings.SamplerWorkers``: how many, their
            timeout, restarts, and the ``processes`` or ``ray`` backend with its placement);
            ``None``: their defaults.
        learner_queue: the learner queue's settings (``data/settings.LearnerQueue``: its size,
            the broadcast interval, ``max_policy_lag``); ``None``: their defaults.
        num_sgd_iter: training iterations each batch is handed out for (the reference's
            ``num_passes``); only its first counts its env steps as sampled.
        minibatch_buffer_size: batches handed out round robin (``MinibatchBuffer``).
        policy_id: the policy the workers sample with.
        policy_mapping_fn: a multi-agent env (PettingZoo): agent id -> policy id; fragments
            then hold every policy's columns (``MultiAgentFragmentSampler``) and the workers
            every policy.
        policy_agents: a multi-agent env: each policy's possible agents.
        policy_spaces: a multi-agent env: each policy's spaces.
    """

    def __init__(
        self,
        env: EnvSettings | EnvSpec,
        rollout_fragment_length: int,
        train_batch_size: int,
        workers: SamplerWorkers | None = None,
        learner_queue: LearnerQueue | None = None,
        num_sgd_iter: int = 1,
        minibatch_buffer_size: int = 1,
        policy_id: str = DEFAULT_POLICY_ID,
        policy_mapping_fn: Callable[[str], str] | None = None,
        policy_agents: dict[str, list[str]] | None = None,
        policy_spaces: dict[str, tuple[Any, Any]] | None = None,
    ) -> None:
        settings = env_settings(env)
        super().__init__(dataclasses.replace(settings, vectorization="sync") if policy_mapping_fn else settings, "cpu")
        workers = SamplerWorkers() if workers is None else workers
        learner_queue = LearnerQueue() if learner_queue is None else learner_queue
        check_group(workers)
        check_group(learner_queue)
        check_at_least_one(rollout_fragment_length=rollout_fragment_length, train_batch_size=train_batch_size,
                           num_sgd_iter=num_sgd_iter, minibatch_buffer_size=minibatch_buffer_size)
        check_backend(workers)
        self.sampler_backend, self.ray_address = workers.sampler_backend, workers.ray_address
        self.num_cpus_per_worker = workers.num_cpus_per_worker
        self.custom_resources_per_worker = workers.custom_resources_per_worker
        self.num_workers = workers.num_workers
        self.sampler_timeout_s = workers.sampler_timeout_s
        self.restart_failed_workers = workers.restart_failed_workers
        self.rollout_fragment_length = rollout_fragment_length
        fragment = self.num_envs * rollout_fragment_length
        self.fragments_per_batch = math.ceil(train_batch_size / fragment)
        self.train_batch_size = self.fragments_per_batch * fragment
        self.learner_queue_size = learner_queue.learner_queue_size
        self.broadcast_interval = learner_queue.broadcast_interval
        self.max_policy_lag = learner_queue.max_policy_lag
        self.policy_id = policy_id
        # multi-agent (a PettingZoo env): every policy's time-major columns (MultiAgentFragmentSampler)
        self.policy_mapping_fn, self.policy_agents, self.policy_spaces = policy_mapping_fn, policy_agents, policy_spaces
        self.multi_agent = policy_mapping_fn is not None
        self.minibatch_buffer = MinibatchBuffer(self._next_batch, minibatch_buffer_size, num_sgd_iter)
        self.counters = {"num_worker_restarts": 0, "num_fragments_dropped": 0}
        # The loader thread and the learner's both count.
        self._counters_lock = threading.Lock()
        self._local: RolloutDataModule | None = None
        self._active = False
        self.pool: WorkerPool | None = None
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
                                               self.num_envs, self.rollout_fragment_length, seed, self.check_finite)
            return MultiAgentEnvDataModule(self._local_settings(seed), self.policy_mapping_fn, "cpu", engine)
        return RolloutDataModule(self._local_settings(seed), self.rollout_fragment_length)

    def _local_settings(self, seed: int | None) -> EnvSettings:
        """The env settings of the learner process's own sampler: this DataModule's envs, seeded ``seed``
        (``self.seed`` is the one ``setup`` may have taken since; each worker's is ``_worker_seed``'s)."""
        return EnvSettings(self.env, num_envs=self.num_envs, vectorization=self.vectorization, seed=seed,
                           iterations_per_epoch=1, check_finite=self.check_finite)

    def _sampler_factory(self) -> Callable[[int | None], Any]:
        """What makes a worker's sampler from a seed (picklable: the spawn start method): the
        sampling engine, or for a PettingZoo env the multi-agent fragment sampler."""
        if self.multi_agent:
            return functools.partial(_open_multi_agent_sampler, self.env, self.policy_mapping_fn, self.policy_agents,
                                     self.policy_spaces, self.num_envs, self.rollout_fragment_length,
                                     self.check_finite)
        return functools.partial(_open_sampler, self.env, self.num_envs, self.vectorization, self.check_finite)

    def _worker_policy(self) -> nn.Module:
        """What the workers sample with and the weights broadcast: the policy, or every policy."""
        return self.module.policies if self.multi_agent else self.module.policies[self.policy_id]

    def _worker_seed(self, index: int, restarts: int = 0) -> int | None:
        """The seed of worker ``index``'s envs after ``restarts`` restarts (env ``j``: this plus
        ``j``): disjoint from every other worker's, of every rank, incarnations included.

        Incarnation ``b = index + restarts * num_workers`` of rank ``r`` starts at ``rank_seed(seed,
        r, span) + b * num_envs`` (``seed + 1000 * r + b * num_envs`` while a rank's workers seed at
        most 1000 envs) as long as it fits in the rank's range of ``span`` seeds (``num_workers *
        num_envs`` rounded up to a multiple of 1000); later incarnations come after every rank's
        range, interleaved by rank. A resumed run offsets them all by the env steps it had sampled
        (the same on every rank): fresh episodes, new seeds."""
        if self.seed is None:
            return None
        world_size = self.trainer.world_size if self.trainer is not None else 1
        span = 1000 * math.ceil(max(self.num_workers, 1) * self.num_envs / 1000)
        block = index + restarts * self.num_workers
        fits = span // self.num_envs
        if block < fits:
            first = rank_seed(self.seed, self.rank, span) + block * self.num_envs
        else:
            first = self.seed + world_size * span + ((block - fits) * world_size + self.rank) * self.num_envs
        resumed_at = int(self.module.counters["num_env_steps_sampled"]) if self.num_workers else 0
        return first + resumed_at

    def setup(self, stage: str) -> None:
        if self.module is None and self.trainer is not None:
            self.connect(self.trainer.lightning_module)
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__} needs a module: call connect(module) or use it with a Trainer")
        if self._active:
            return
        self._active = True
        self.take_lightning_seed()
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
        cpu_policy = _cpu_copy(policy)
        spec = PoolSpec(
            num_workers=self.num_workers, make_sampler=self._sampler_factory(), length=self.rollout_fragment_length,
            policy=cpu_policy, tasks=[self.task(i) for i in range(self.num_workers)], seed=self._worker_seed,
            columns=self.task(0).columns(cpu_policy, self._local),
            credits=1 if self.hold_slots else 1 + math.ceil(self.learner_queue_size / self.num_workers),
            hold=self.hold_slots, restart_failed_workers=self.restart_failed_workers,
            timeout_s=self.sampler_timeout_s, on_restart=lambda: self._count("num_worker_restarts", 1),
        )
        if self.sampler_backend == "ray":
            from lightning_rl.data.workers.ray_actors import RayPool

            self.pool = RayPool(spec, self.ray_address, self.num_cpus_per_worker or 1.0,
                                self.custom_resources_per_worker)
        else:
            self.pool = ProcessPool(spec)
        try:
            self.pool.start(policy, int(module.counters["num_iterations"]))
        except BaseException:
            self.pool.close(terminate=True)
            raise
        self._last_broadcast = module.policies.version
        self._closing.clear()
        self._thread = threading.Thread(target=self._load_loop, name="lightning_rl-batch-loader", daemon=True)
        self._thread.start()

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

    def maybe_broadcast(self) -> None:
        """Write the learner's weights for the workers when ``broadcast_interval`` iterations passed."""
        module = self.module
        if module.policies.version - self._last_broadcast >= self.broadcast_interval:
            self.pool.broadcast(self._worker_policy(), int(module.counters["num_iterations"]))
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
            tensors, extra = sample_fragment(sampler, self.task(0), policy, acting, self.rollout_fragment_length)
            fragments.append(Fragment(tensors, version, 0, extra))
        info = self._local.episode_info()
        info["sample_time_s"] = time.perf_counter() - start
        return self._assemble(fragments, info, {"learner_wait_ms": 1000.0 * info["sample_time_s"]})

    def release(self, index: int, slot: Any, incarnation: int | None = None) -> None:
        """Hand worker ``index`` back the credit of a fragment it sent (``hold_slots``: its slot,
        ``fragment.extra["slot"]``); not if the worker was restarted since ``incarnation``."""
        self.pool.release(index, slot, incarnation)

    # ------------------------------------------------------------ shutdown
    def close(self, terminate: bool = False) -> None:
        """Stop the loader thread and every worker (SIGTERM, then SIGKILL); idempotent."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if self.pool is not None:
            self.pool.close(terminate)  # (kept: what it was, for whoever looks after fit)
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


def _cpu_copy(policy: nn.Module) -> nn.Module:
    return copy.deepcopy(policy).cpu().eval()
