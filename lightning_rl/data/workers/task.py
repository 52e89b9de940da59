"""What a sampler worker makes of the fragments it samples (``FragmentTask``: the fragment itself
for IMPALA and APPO; subclasses make prioritized n-step transitions or a gradient of them) and how
it acts (``acting_policy``, with its task's exploration). Built in the learner process, which also
asks a task the shapes of what it ships (``columns``), and run in the worker."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from lightning_rl.batch import BOOTSTRAP, EPISODE_STARTS, PREV_ACTIONS, PREV_REWARDS, STATE_IN, STATE_OUT, SampleBatch
from lightning_rl.data.samplers.engine import ExploringPolicy
from lightning_rl.data.samplers.multi_agent import MultiAgentFragmentSampler

__all__ = ["FragmentTask", "acting_policy"]

BOOTSTRAP_OBS, VALID = SampleBatch.BOOTSTRAP_OBS, SampleBatch.VALID


def acting_policy(policy: nn.Module, exploration: dict[str, Any]) -> ExploringPolicy | dict[str, ExploringPolicy]:
    """A worker's acting policy: one ``ExploringPolicy``, or one per policy id (multi-agent:
    ``policy`` is the ``Policies`` dict)."""
    if isinstance(policy, nn.ModuleDict):
        return {pid: ExploringPolicy(p, exploration) for pid, p in policy.items()}
    return ExploringPolicy(policy, exploration)


class FragmentTask:
    """What a sampler worker makes of each fragment it samples and ships to the learner (in its
    slot, or through Ray's object store): for IMPALA and APPO the fragment itself. Subclasses turn
    it into other things (APEX: prioritized n-step transitions; A3C: a gradient). Runs in the
    worker; built in the learner process, so it must pickle (the spawn start method, Ray)."""

    def exploration(self) -> dict[str, Any]:
        """Keyword arguments of the worker's exploring ``compute_actions``."""
        return {}

    def columns(self, policy: nn.Module, sampler: Any) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Shapes and dtypes of a slot's tensors (learner side, before the workers start), from the
        learner process's own sampler DataModule (``AsyncSamplingDataModule._sampler``)."""
        if isinstance(sampler.sampler, MultiAgentFragmentSampler):
            return sampler.sampler.fragment_columns(acting_policy(policy, self.exploration()))
        return _fragment_columns(policy, sampler)

    def make(self, policy: nn.Module, rollout: dict[str, torch.Tensor], valid: torch.Tensor,
             bootstrap_obs: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors for the slot, a small picklable extra)`` from one time-major fragment
        (``rollout`` ``[T, N]`` columns, ``valid`` ``[T, N]``, ``bootstrap_obs`` ``[N, ...]``).
        Tensors shorter than their slot's first dimension fill its first rows (the extra then
        says how many: ``count``, and ``counts: {column: rows}`` for columns of other lengths)."""
        return {**rollout, VALID: valid, BOOTSTRAP_OBS: bootstrap_obs}, {}


def _fragment_columns(policy: nn.Module, dm: Any) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
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
