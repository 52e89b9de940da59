"""Distributed prioritized replay (APEX, Horgan et al. 2018): sampler workers explore with their
own epsilons, turn their fragments into n-step transitions with initial priorities from their
own copy of the Q-network, and the learner process inserts them into one prioritized replay.

The workers, slots, weight broadcasts, faults and shutdown are ``AsyncSamplingDataModule``'s;
what differs is what a worker makes of a fragment (``NStepPriorityTask``) and what the learner
does with it (insert into a ``TransitionReplayBuffer`` rather than train on it).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from pytorch_lightning.trainer.states import TrainerStatus
from torch import nn

from lightning_rl.batch import MultiAgentBatch, SampleBatch
from lightning_rl.checkpoint_data import pack_rank_states, unpack_rank_state
from lightning_rl.data.async_sampling import AsyncSamplingDataModule
from lightning_rl.data.base import env_settings, rank_seed
from lightning_rl.data.buffers.frames import check_frame_stack_setting, frame_stack_problem, use_frame_storage
from lightning_rl.data.buffers.packed_frames import (
    FRAMES,
    NEXT_OBS_FRAMES,
    OBS_FRAMES,
    PackedFrameReplayBuffer,
    concat_packets,
    frame_capacity_for,
    pack_frames,
)
from lightning_rl.data.buffers.replay_buffer import check_checkpoint_replay_setting, keeps_replay
from lightning_rl.data.buffers.ring import ReplayBuffer
from lightning_rl.data.buffers.sum_tree import ProportionalPriorities
from lightning_rl.data.buffers.transitions import NStepWindows, TransitionReplayBuffer
from lightning_rl.data.envs.make import EnvSpec
from lightning_rl.data.envs.vector import make_vector_env
from lightning_rl.data.learner_queue import POLICY_VERSION
from lightning_rl.data.rollout import RolloutDataModule
from lightning_rl.data.settings import EnvSettings, LearnerQueue, ReplaySettings, SamplerWorkers
from lightning_rl.data.workers import Fragment
from lightning_rl.data.workers.task import FragmentTask
from lightning_rl.functional import double_q_target
from lightning_rl.settings import check_group

__all__ = ["ApexDataModule", "NStepPriorityTask", "worker_epsilons"]

TD_ERROR = "td_error"


def worker_epsilons(num_workers: int, epsilon: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Ape-X's exploration: worker ``i`` of ``N`` acts epsilon-greedily with ``epsilon ** (1 +
    alpha * i / (N - 1))`` (one worker, or none: ``epsilon``)."""
    if num_workers <= 1:
        return [float(epsilon)]
    return [float(epsilon ** (1 + alpha * i / (num_workers - 1))) for i in range(num_workers)]


class NStepPriorityTask(FragmentTask):
    """An APEX worker's job: its fragment as n-step transitions with their TD errors under the
    worker's own Q-network (online and target alike: a worker has one copy), from which the
    replay sets the initial priorities ``(|td| + eps)**alpha``."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, num_envs: int,
                 rollout_fragment_length: int, n_step: int, gamma: float, epsilon: float,
                 frame_stack: bool = False) -> None:
        self.spaces = (observation_space, action_space)
        self.num_envs, self.rollout_fragment_length = num_envs, rollout_fragment_length
        self.n_step, self.gamma, self.epsilon = n_step, gamma, epsilon
        self.frame_stack = frame_stack  # ship stacked frames once (packed_frames.pack_frames)
        self._windows: NStepWindows | None = None  # made in the worker, on first use

    def exploration(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon}

    def columns(self, policy: nn.Module, sampler: RolloutDataModule) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        rows = (self.rollout_fragment_length + self.n_step) * self.num_envs  # the most one fragment completes
        probe = NStepWindows(*self.spaces, 1, 1, self.n_step, self.gamma)._transitions(np.zeros(1, dtype=np.int64))
        cols = {k: ((rows, *v.shape[1:]), v.dtype) for k, v in probe.items() if k in TransitionReplayBuffer.COLUMNS}
        cols[TD_ERROR] = ((rows,), torch.float32)
        if self.frame_stack:  # at most every frame of every stack distinct
            stack, height, width = self.spaces[0].shape
            del cols[SampleBatch.OBS], cols[SampleBatch.NEXT_OBS]
            cols.update({FRAMES: ((2 * stack * rows, height, width), torch.uint8),
                         OBS_FRAMES: ((rows, stack), torch.int32), NEXT_OBS_FRAMES: ((rows, stack), torch.int32)})
        return cols

    def packet_frames(self) -> int:
        """The most frames one packet ships."""
        return 2 * self.spaces[0].shape[0] * (self.rollout_fragment_length + self.n_step) * self.num_envs

    def windows(self) -> NStepWindows:
        if self._windows is None:
            self._windows = NStepWindows(*self.spaces, self.num_envs, self.rollout_fragment_length, self.n_step,
                                          self.gamma)
        return self._windows

    def make(self, policy: nn.Module, rollout: dict[str, torch.Tensor], valid: torch.Tensor,
             bootstrap_obs: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        batch = self.windows().add_fragment(rollout, valid)
        with torch.no_grad():
            tensors = {k: batch[k] for k in TransitionReplayBuffer.COLUMNS}
            tensors[TD_ERROR] = td_errors(policy, batch)
        if not self.frame_stack:
            return tensors, {"count": len(tensors[TD_ERROR])}
        tensors.update(pack_frames(tensors.pop(SampleBatch.OBS), tensors.pop(SampleBatch.NEXT_OBS)))
        return tensors, {"count": len(tensors[TD_ERROR]), "counts": {FRAMES: len(tensors[FRAMES])}}


def td_errors(q_net: nn.Module, batch: SampleBatch) -> torch.Tensor:
    """``[B]`` TD errors of n-step transitions under one Q-network (online and target)."""
    q = q_net(batch[SampleBatch.OBS]).gather(-1, batch[SampleBatch.ACTIONS].long().unsqueeze(-1)).squeeze(-1)
    next_q = q_net(batch[SampleBatch.NEXT_OBS])
    return q - double_q_target(batch[SampleBatch.REWARDS], batch[SampleBatch.DISCOUNTS],
                               batch[SampleBatch.TERMINATEDS], next_q, next_q)


class ApexDataModule(AsyncSamplingDataModule):
    """APEX's replay fed by sampler workers (see the module docstring).

    Each training iteration inserts ``max(num_workers, 1)`` worker fragments (``num_envs *
    rollout_fragment_length`` env steps each; it waits for them) into the prioritized replay,
    then hands the learner this DataModule (``batch.replay``) once ``learning_starts`` env steps
    were inserted: the learner samples, learns and updates the priorities of exactly the
    sampled rows (``sample_minibatch``/``update_priorities``, as ``ReplayDataModule``). A fixed
    number of env steps per iteration keeps the replayed-to-sampled ratio (``training_intensity``)
    exact and the gradient steps the same on every DDP rank.

    Args:
        env: the env settings, as ``EnvDataModule`` takes them (``num_envs`` per worker).
        replay: the replay settings (``data/settings.ReplaySettings``): ``buffer_size``
            transitions (per process under DDP), ``learning_starts`` env steps inserted before
            learning, the workers' ``n_step`` returns, proportional prioritization's ``alpha`` and
            ``eps`` (the replay is always prioritized; ``train_freq`` is not read),
            ``checkpoint_replay_buffer`` (``"auto"``: when it takes at most 1 GiB,
            ``keeps_replay``) and ``replay_frame_stack`` (the workers ship each packet's distinct
            frames once and the replay stores them once, ``PackedFrameReplayBuffer``: ``"auto"`` for
            a uint8 ``(K, H, W)`` space whose env declares a ``K``-frame stack,
            ``frames.use_frame_storage``; ``frame_stack`` is what was decided).
        gamma: the discount of the workers' n-step returns.
        rollout_fragment_length: env steps per env of one worker fragment.
        epsilon, epsilon_alpha: the workers' epsilons (``worker_epsilons``); the learner
            process samples with worker 0's when ``num_workers=0``.
        workers, learner_queue: as ``AsyncSamplingDataModule`` takes them.
    """

    prioritized_replay = True  # the learner's replay loop updates priorities

    def __init__(
        self,
        env: EnvSettings | EnvSpec,
        replay: ReplaySettings,
        *,
        gamma: float,
        rollout_fragment_length: int,
        epsilon: float,
        epsilon_alpha: float,
        workers: SamplerWorkers | None = None,
        learner_queue: LearnerQueue | None = None,
    ) -> None:
        settings, workers = env_settings(env), SamplerWorkers() if workers is None else workers
        super().__init__(settings, rollout_fragment_length,
                         max(workers.num_workers, 1) * settings.num_envs * rollout_fragment_length, workers,
                         learner_queue)
        check_group(replay)
        ReplayBuffer.check_config(replay.n_step + 2, 1, replay.n_step, gamma)  # n_step and gamma
        ProportionalPriorities(1, replay.prioritized_replay_alpha, replay.prioritized_replay_eps)  # alpha and eps
        if replay.learning_starts < 0:
            raise ValueError(f"learning_starts must be >= 0, got {replay.learning_starts}")
        check_checkpoint_replay_setting(replay.checkpoint_replay_buffer)
        check_frame_stack_setting(replay.replay_frame_stack)
        self.replay_frame_stack = replay.replay_frame_stack
        self.frame_stack: bool | None = None  # decided in setup, from the env's space and metadata
        self.buffer_size, self.learning_starts = replay.buffer_size, replay.learning_starts
        self.n_step, self.gamma = replay.n_step, gamma
        self.alpha, self.eps = replay.prioritized_replay_alpha, replay.prioritized_replay_eps
        self.epsilons = worker_epsilons(workers.num_workers, epsilon, epsilon_alpha)
        self.checkpoint_replay_buffer = replay.checkpoint_replay_buffer
        self.buffer: TransitionReplayBuffer | None = None
        self.env_steps = 0  # env steps inserted in this process (learning_starts counts them)
        self._local_task: NStepPriorityTask | None = None
        self._drawn_at: int | None = None
        self._latencies: list[int] = []
        self._replayed = 0
        self._last_sample = time.perf_counter()
        self._returns: dict[int, list[float]] = {}

    def task(self, index: int) -> FragmentTask:
        if self.num_workers == 0:  # the learner process's own windows persist between fragments
            if self._local_task is None:
                self._local_task = self._new_task(0)
            return self._local_task
        return self._new_task(index)

    def _new_task(self, index: int) -> NStepPriorityTask:
        module = self.module
        return NStepPriorityTask(module.observation_space, module.action_space, self.num_envs,
                                 self.rollout_fragment_length, self.n_step, self.gamma, self.epsilons[index],
                                 bool(self.frame_stack))

    def setup(self, stage: str) -> None:
        if self.buffer is None:
            self.take_lightning_seed()
            module = self.module if self.module is not None else self.trainer.lightning_module
            rank = self.trainer.global_rank if self.trainer is not None else 0
            space, seed = module.observation_space, rank_seed(self.seed, rank)
            self.frame_stack = self._stores_frames(space)
            if self.frame_stack:
                task = self._new_task(0)
                frames = frame_capacity_for(self.buffer_size, self.rollout_fragment_length, self.n_step,
                                            space.shape[0], task.packet_frames() * max(self.num_workers, 1))
                self.buffer = PackedFrameReplayBuffer(self.buffer_size, space, module.action_space, self.alpha,
                                                      self.eps, seed=seed, frame_capacity=frames)
            else:
                self.buffer = TransitionReplayBuffer(self.buffer_size, space, module.action_space, self.alpha,
                                                     self.eps, seed=seed)
        super().setup(stage)

    def _stores_frames(self, space: gym.Space) -> bool:
        """``replay_frame_stack``'s rule (``use_frame_storage``), with the env's metadata from a probe env."""
        if self.replay_frame_stack is False or (self.replay_frame_stack == "auto" and frame_stack_problem(space)):
            return False
        probe = make_vector_env(self.env, 1, self.vectorization)
        try:
            return use_frame_storage(self.replay_frame_stack, space, probe.metadata)
        finally:
            probe.close()

    # ------------------------------------------------------------ the learner's side
    def _assemble(self, fragments: list[Fragment], info: dict[str, Any], perf: dict[str, float]) -> MultiAgentBatch:
        """Fragments' transitions one after the other (``[K]`` rows, ``K`` varying), and the
        fragments' ``policy_version`` (one each)."""
        cols = concat_packets([f.tensors for f in fragments])
        versions = torch.tensor([f.version for f in fragments], dtype=torch.int64)
        info["perf"] = perf
        info["agent_steps_sampled"] = self.train_batch_size
        info[POLICY_VERSION] = versions
        return MultiAgentBatch({self.policy_id: SampleBatch(cols)}, env_steps=self.train_batch_size, info=info)

    def _batch_versions(self, batch: MultiAgentBatch) -> torch.Tensor:
        return batch.info[POLICY_VERSION]

    def on_episodes(self, index: int, episodes: dict[str, list]) -> None:
        self._returns.setdefault(index, []).extend(episodes["episode_returns"])

    def sample(self) -> MultiAgentBatch:
        """Insert the next ``max(num_workers, 1)`` fragments' transitions (waiting for them); the
        batch carries no rows, and ``replay`` is this DataModule once learning may start."""
        assert self.buffer is not None, "call setup() first"
        if self.num_workers:
            self.maybe_broadcast()
        batch = self._next_batch()
        cols = batch.policy_batches[self.policy_id]
        inserted = len(cols[TD_ERROR])
        self.buffer.add({k: v for k, v in cols.items() if k != TD_ERROR}, cols[TD_ERROR])
        self.env_steps += batch.env_steps
        now = time.perf_counter()
        elapsed = max(now - self._last_sample, 1e-9)
        perf = batch.info.setdefault("perf", {})
        lag = int(self.module.counters["num_iterations"]) - batch.info[POLICY_VERSION]
        perf.update(replay_size=float(len(self.buffer)), insert_rows_per_s=inserted / elapsed,
                    replay_rows_per_s=self._replayed / elapsed, policy_lag_mean=float(lag.float().mean()),
                    policy_lag_max=float(lag.max()))
        if self._latencies:
            perf["priority_update_latency"] = float(np.mean(self._latencies))
            self._latencies = []
        for i, epsilon in enumerate(self.epsilons):
            perf[f"worker_{i}_epsilon"] = epsilon
            returns = self._returns.pop(i, None) if self.num_workers else batch.info.get("episode_returns")
            if returns:
                perf[f"worker_{i}_episode_return"] = float(np.mean(returns))
        self._last_sample, self._replayed = now, 0
        batch.info["buffer_size"] = len(self.buffer)
        ready = self.env_steps >= self.starts and len(self.buffer) > 0
        return MultiAgentBatch({}, env_steps=batch.env_steps, info=batch.info, replay=self if ready else None)

    def sample_minibatch(self, policy_id: str, batch_size: int, beta: float | None = None) -> SampleBatch:
        """``batch_size`` prioritized transitions with ``weights`` and ``batch_indexes``."""
        assert self.buffer is not None
        self._drawn_at = int(self.module.counters["num_iterations"])
        self._replayed += batch_size
        return self.buffer.sample(batch_size, beta=0.4 if beta is None else beta)

    def update_priorities(self, policy_id: str, batch_indexes: Any, td_error: Any) -> None:
        """The new priorities of exactly the sampled rows (overwritten ones skipped)."""
        assert self.buffer is not None
        self.buffer.update_priorities(batch_indexes, td_error)
        if self._drawn_at is not None:  # learner iterations between drawing the rows and updating them
            self._latencies.append(int(self.module.counters["num_iterations"]) - self._drawn_at)

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The base's, and every rank's env steps inserted, replay (``checkpoint_replay_buffer``)
        and, with ``num_workers=0``, open n-step windows (exact resume then). Gathers over DDP
        ranks: call it on every rank together, as Lightning's checkpointing does."""
        keep = self.buffer is not None and keeps_replay(self.checkpoint_replay_buffer, self.buffer.nbytes)
        local = {
            "env_steps": self.env_steps,
            "buffer": self.buffer.state_dict(tensors=True) if keep else None,
            "windows": self._local_task.windows().state_dict(tensors=True) if keep and self._local_task else None,
        }
        interrupted = self.trainer is not None and self.trainer.state.status == TrainerStatus.INTERRUPTED
        return {**super().state_dict(), "replay": pack_rank_states(local, interrupted)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        world_size = self.trainer.world_size if self.trainer is not None else 1
        mine = unpack_rank_state(state.get("replay"), self.rank, world_size, "replay buffer")
        if mine is None or mine["buffer"] is None or self.buffer is None:
            return  # an empty replay: learning_starts counts from here
        packed = "frame_capacity" in mine["buffer"]["config"]
        if packed != isinstance(self.buffer, PackedFrameReplayBuffer):
            kind = "stores stacked frames once" if packed else "holds whole transitions"
            raise ValueError(f"the checkpoint's replay {kind}: resume with replay_frame_stack={packed}")
        self.buffer.load_state_dict(mine["buffer"])
        self.env_steps = int(mine["env_steps"])
        if mine["windows"] is not None and self.num_workers == 0:
            self.task(0).windows().load_state_dict(mine["windows"])
