"""The body of a sampler worker, whichever backend runs it (a process or a Ray actor): its
sampling engine (opened by ``_open_sampler`` or ``_open_multi_agent_sampler``), its CPU copy of
the policy and its task (``FragmentTask``, ``task.py``). No transport here: the backend feeds it
weights and ships what it returns."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lightning_rl.batch import BOOTSTRAP, SampleBatch
from lightning_rl.data.envs.make import EnvSpec
from lightning_rl.data.samplers.engine import EnvSampler, policy_state
from lightning_rl.data.samplers.multi_agent import MultiAgentFragmentSampler
from lightning_rl.data.workers.task import FragmentTask, acting_policy

BOOTSTRAP_OBS, VALID = SampleBatch.BOOTSTRAP_OBS, SampleBatch.VALID


def sample_fragment(sampler: Any, task: FragmentTask, policy: nn.Module | None, acting: Any,
                    length: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """One fragment of ``length`` steps (``EnvSampler.fragment``, acted by ``acting``), made into
    what ``task`` ships (multi-agent, a ``MultiAgentFragmentSampler`` acted by every policy of
    ``acting``: every policy's columns, ``{"<policy>/<column>": tensor}``, and the agent steps in them)."""
    if isinstance(sampler, MultiAgentFragmentSampler):
        tensors, agent_steps = sampler.fragment(acting)
        return tensors, {"agent_steps": agent_steps}
    fragment = sampler.fragment(acting, length)
    valid, bootstrap_obs = fragment.pop(VALID), fragment.pop(BOOTSTRAP_OBS)
    # a recurrent policy's inputs after the fragment: where its bootstrap step starts
    inputs = {k: fragment.pop(k) for k in [k for k in fragment if k.startswith(BOOTSTRAP)]}
    tensors, extra = task.make(policy, dict(fragment), valid, bootstrap_obs)
    tensors.update(inputs)
    return tensors, extra


class SamplerWorker:
    """One sampler worker: ``make_sampler(seed)`` (the sampling engine, or the multi-agent
    fragment sampler), ``policy`` (a CPU copy, loaded with each broadcast) and ``task``.
    ``version`` is the learner iteration of the weights it holds (-1: the ones it was built with)."""

    def __init__(self, make_sampler: Callable[[int | None], Any], seed: int | None, policy: nn.Module,
                 task: FragmentTask, length: int) -> None:
        torch.set_num_threads(1)
        self.policy, self.task, self.length = policy, task, length
        self.version = -1
        self.sampler = make_sampler(seed)
        self.acting = acting_policy(policy, task.exploration())

    def load(self, state: list[torch.Tensor], version: int) -> None:
        """The policy's whole state (``policy_state`` order) of learner iteration ``version``."""
        with torch.no_grad():
            for tensor, value in zip(policy_state(self.policy), state, strict=True):
                tensor.copy_(value)
        self.version = version

    def sample(self) -> tuple[dict[str, torch.Tensor], dict[str, Any], float, dict[str, list]]:
        """``(tensors, extra, seconds it took, episodes finished)`` of the next fragment."""
        start = time.perf_counter()
        tensors, extra = sample_fragment(self.sampler, self.task, self.policy, self.acting, self.length)
        return tensors, extra, time.perf_counter() - start, self.sampler.episode_info()

    def close(self) -> None:
        self.sampler.close(terminate=True)


def _open_sampler(env: EnvSpec, num_envs: int, vectorization: str, check_finite: bool,
                  seed: int | None) -> EnvSampler:
    """A worker's sampling engine, its envs reset (env ``j`` seeded ``seed + j``)."""
    sampler = EnvSampler(env, num_envs, vectorization, seed, "cpu", check_finite)
    sampler.open()
    sampler.reset(seed)
    return sampler


def _open_multi_agent_sampler(env: Any, policy_mapping_fn: Callable[[str], str], policy_agents: dict[str, list[str]],
                              policy_spaces: dict[str, tuple[Any, Any]], num_envs: int, rollout_fragment_length: int,
                              check_finite: bool, seed: int | None) -> MultiAgentFragmentSampler:
    """A worker's multi-agent sampling engine, its envs reset (env ``i`` seeded ``seed + i``)."""
    sampler = MultiAgentFragmentSampler(env, policy_mapping_fn, policy_agents, policy_spaces, num_envs,
                                        rollout_fragment_length, seed, check_finite)
    sampler.open()
    sampler.reset(seed)
    return sampler
