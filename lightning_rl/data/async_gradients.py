"""Asynchronous gradients (A3C, Mnih et al. 2016): each sampler worker computes the actor-critic
gradient of its own fragment and sends it through its shared-memory slot; the learner applies
each packet as it arrives and the worker, which waits for its slot, then reads the weights
that already hold its own update.

The workers, slots, faults and shutdown are ``AsyncSamplingDataModule``'s; what differs is what
a worker makes of a fragment (``GradientTask``) and that a slot returns to its worker only after
the learner applied what was in it (``hold_slots``: one slot per worker).
"""

from __future__ import annotations

import queue
from typing import Any

import torch
from torch import nn

from lightning_rl.batch import MultiAgentBatch, SampleBatch
from lightning_rl.data.async_sampling import AsyncSamplingDataModule
from lightning_rl.data.base import env_settings
from lightning_rl.data.envs.make import EnvSpec
from lightning_rl.data.learner_queue import POLICY_VERSION
from lightning_rl.data.rollout import RolloutDataModule
from lightning_rl.data.samplers.engine import eval_mode, train_mode
from lightning_rl.data.settings import EnvSettings, LearnerQueue, SamplerWorkers
from lightning_rl.data.workers import Fragment
from lightning_rl.data.workers.task import FragmentTask
from lightning_rl.functional import a2c_loss, gae_batch

__all__ = ["GRADS", "A3CDataModule", "GradientTask"]

GRADS = "grads"


class GradientTask(FragmentTask):
    """An A3C worker's job: the gradient of the A2C loss (``functional.a2c_loss`` on GAE
    advantages) of its fragment, w.r.t. its copy of the policy's parameters, as one flat
    ``[num_params]`` tensor (``torch.autograd.grad``: the policy's ``.grad`` is not touched)."""

    def __init__(self, gamma: float, lambda_: float, vf_loss_coeff: float, entropy_coeff: float) -> None:
        self.gamma, self.lambda_ = gamma, lambda_
        self.vf_loss_coeff, self.entropy_coeff = vf_loss_coeff, entropy_coeff

    def columns(self, policy: nn.Module, sampler: RolloutDataModule) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {GRADS: ((sum(p.numel() for p in policy.parameters()),), torch.float32)}

    def make(self, policy: nn.Module, rollout: dict[str, torch.Tensor], valid: torch.Tensor,
             bootstrap_obs: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        grads, stats = self.gradient(policy, rollout, valid, bootstrap_obs)
        return {GRADS: grads}, {"stats": stats, "rows": int(valid.sum())}

    def gradient(self, policy: nn.Module, rollout: dict[str, torch.Tensor], valid: torch.Tensor,
                 bootstrap_obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """``(flat gradient, loss terms)`` of one ``[T, N]`` fragment: the bootstrap value read in
        eval mode, as the fragment's values were sampled, the loss in train mode (Dropout on,
        BatchNorm on the batch's statistics), as every learner computes its gradients; the
        policy's modes and buffers are given back after (only gradients travel to the learner,
        so the copy keeps acting with the running statistics the learner broadcast)."""
        rollout = {k: v.clone() for k, v in rollout.items()}  # ordinary tensors (a worker samples in inference mode)
        with torch.no_grad(), eval_mode(policy):
            batch = gae_batch(rollout, policy.value(bootstrap_obs.clone()), valid.clone(), self.gamma, self.lambda_)
        buffers = [(b, b.clone()) for b in policy.buffers()]
        with train_mode(policy):
            dist, values = policy(batch[SampleBatch.OBS])
        loss, stats = a2c_loss(dist.log_prob(batch[SampleBatch.ACTIONS]), values, dist.entropy(),
                               batch[SampleBatch.ADVANTAGES], batch[SampleBatch.VALUE_TARGETS], self.vf_loss_coeff,
                               self.entropy_coeff)
        params = list(policy.parameters())
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        with torch.no_grad():
            for buffer, broadcast in buffers:
                buffer.copy_(broadcast)
        flat = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for p, g in zip(params, grads)])
        return flat, {k: float(v) for k, v in stats.items()}


class A3CDataModule(AsyncSamplingDataModule):
    """Gradient packets from sampler workers (see the module docstring): each training
    iteration gets the next packet (waiting for one) and every other one already there, at
    most one per worker. A batch's policy batch holds ``grads`` ``[K, num_params]``; its
    ``info`` per packet the worker (``workers``), its loss terms (``worker_stats``) and the
    weights version it was computed with (``policy_version``), and the rows trained on
    (``rows``). Before the next packets are handed out the learner's new weights are written
    for the workers and the applied packets' slots go back to their workers, which so compute
    their next gradient with weights that hold their own last update.

    Args:
        env: the env settings, as ``EnvDataModule`` takes them (``num_envs`` per worker).
        rollout_fragment_length: env steps per env of one fragment; one fragment per packet.
        gamma, lambda_, vf_loss_coeff, entropy_coeff: the workers' loss (``GradientTask``).
        workers: as ``AsyncSamplingDataModule`` takes them; the learner queue holds one packet
            per worker.
    """

    hold_slots = True

    def __init__(
        self,
        env: EnvSettings | EnvSpec,
        rollout_fragment_length: int,
        *,
        gamma: float,
        lambda_: float,
        vf_loss_coeff: float,
        entropy_coeff: float,
        workers: SamplerWorkers | None = None,
    ) -> None:
        settings, workers = env_settings(env), SamplerWorkers() if workers is None else workers
        num_workers = workers.num_workers
        super().__init__(settings, rollout_fragment_length, settings.num_envs * rollout_fragment_length, workers,
                         LearnerQueue(learner_queue_size=max(num_workers, 1)))
        self.gradient_task = GradientTask(gamma, lambda_, vf_loss_coeff, entropy_coeff)
        self._ready = queue.Queue(maxsize=max(num_workers, 1))  # at most one packet per worker is in flight
        self._applied: list[tuple[int, tuple[int, int]]] = []  # (worker, (slot, incarnation)) of packets handed out

    def task(self, index: int) -> FragmentTask:
        return self.gradient_task

    def _assemble(self, fragments: list[Fragment], info: dict[str, Any], perf: dict[str, float]) -> MultiAgentBatch:
        (fragment,) = fragments  # one packet per batch
        info.update(perf=perf, agent_steps_sampled=self.train_batch_size, worker_stats=[fragment.extra["stats"]],
                    rows=fragment.extra["rows"], workers=[fragment.index], slots=[fragment.extra.get("slot")])
        info[POLICY_VERSION] = torch.tensor([fragment.version])
        batch = SampleBatch({GRADS: fragment.tensors[GRADS][None]})
        return MultiAgentBatch({self.policy_id: batch}, env_steps=self.train_batch_size, info=info)

    @staticmethod
    def _merge(batches: list[MultiAgentBatch]) -> MultiAgentBatch:
        """Several packets' batches as one (the first one's perf)."""
        if len(batches) == 1:
            return batches[0]
        infos = [b.info for b in batches]
        info = {**infos[0], POLICY_VERSION: torch.cat([i[POLICY_VERSION] for i in infos])}
        for key in ("worker_stats", "workers", "slots", "episode_returns", "episode_lengths"):
            info[key] = [x for i in infos for x in i.get(key, [])]
        for key in ("rows", "agent_steps_sampled", "sample_time_s"):
            info[key] = sum(i.get(key, 0) for i in infos)
        grads = torch.cat([b.policy_batches[pid][GRADS] for b in batches for pid in b.policy_batches])
        (policy_id,) = batches[0].policy_batches
        return MultiAgentBatch({policy_id: SampleBatch({GRADS: grads})}, env_steps=sum(b.env_steps for b in batches),
                               info=info)

    def _batch_versions(self, batch: MultiAgentBatch) -> torch.Tensor:
        return batch.info[POLICY_VERSION]

    def sample(self) -> MultiAgentBatch:
        """The next gradient packet (waiting for one), after the weights that hold the last one
        went to the workers and its worker got its slot back."""
        if self.num_workers:
            if self._applied:
                self.pool.broadcast(self.module.policies[self.policy_id], int(self.module.counters["num_iterations"]))
                for worker, (slot, incarnation) in self._applied:
                    self.release(worker, slot, incarnation)
                self._applied = []
        batches = [self._next_batch()]
        while len(batches) < self.num_workers:  # and the packets already there (each from another worker)
            try:
                batches.append(self._ready.get_nowait())
            except queue.Empty:
                break
        batch = self._merge(batches)
        self._applied += [(w, s) for w, s in zip(batch.info["workers"], batch.info["slots"]) if s is not None]
        # Staleness: learner iterations since the weights each gradient was computed with.
        lag = (int(self.module.counters["num_iterations"]) - batch.info[POLICY_VERSION]).float()
        batch.info["perf"] = {**batch.info["perf"], "policy_lag_mean": float(lag.mean()),
                              "policy_lag_max": float(lag.max()), "packets_per_iteration": float(len(batches))}
        return batch
