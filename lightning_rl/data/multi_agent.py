"""Multi-agent sampling over PettingZoo's Parallel API: the Lightning adapter of the multi-agent
engine (``samplers/multi_agent.py``) and the synchronous on-policy DataModule.

``env`` is a zero-argument callable returning a ``pettingzoo.ParallelEnv`` (an AEC env is
converted with PettingZoo's own ``aec_to_parallel``). Agents may appear and leave within an
episode; each agent's spaces come from the env. ``policy_mapping_fn(agent_id)`` names the
policy that acts for an agent; the sampler emits one ``SampleBatch`` per policy with the rows
of every agent mapped to it, GAE computed along each agent's own trajectory by the learner.

``pettingzoo`` is an optional extra (``pip install lightning-rl[multiagent]``).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lightning_rl.batch import MultiAgentBatch, SampleBatch
from lightning_rl.checkpoint_data import unpack_rank_state
from lightning_rl.data.base import EnvDataModule, check_at_least_one, env_settings
from lightning_rl.data.envs.pettingzoo import agent_spaces, is_multi_agent_env, make_parallel_env, policy_spaces
from lightning_rl.data.samplers.engine import ExploringPolicy
from lightning_rl.data.samplers.multi_agent import MultiAgentEnvSampler
from lightning_rl.data.settings import EnvSettings

__all__ = [
    "MultiAgentEnvDataModule",
    "MultiAgentRolloutDataModule",
    "agent_spaces",
    "is_multi_agent_env",
    "make_parallel_env",
    "policy_spaces",
]

SEGMENT_LENGTHS = "segment_lengths"  # [S]: rows of each agent's trajectory segment in a policy's batch
BOOTSTRAP_MASK = SampleBatch.BOOTSTRAP_OBS.replace("obs", "mask")  # [S]: the segment bootstraps from its obs


class MultiAgentEnvDataModule(EnvDataModule):
    """The Lightning adapter of a ``MultiAgentEnvSampler``: ``num_envs`` copies of a PettingZoo
    parallel env, each policy acting for all its live agents in one forward. Subclasses are the
    ``AgentSteps`` the engine hands each agent step to (``record``, ``drop``, ``open_agents``)
    and implement ``sample``. Episode returns are the team's (summed over agents);
    ``policy_returns`` has each policy's share. ``check_finite`` as ``EnvDataModule``'s, per agent
    (the error names the env, the agent, the field and the step)."""

    def __init__(
        self,
        env: EnvSettings | Callable[[], Any],
        policy_mapping_fn: Callable[[str], str],
        sampling_device: str = "cpu",
        sampler: MultiAgentEnvSampler | None = None,
    ) -> None:
        super().__init__(dataclasses.replace(env_settings(env), vectorization="sync"), sampling_device)
        self.policy_mapping_fn = policy_mapping_fn
        self.sampler = sampler or MultiAgentEnvSampler(self.env, policy_mapping_fn, self.num_envs, self.seed,
                                                       self.sampling_device, check_finite=self.check_finite)

    def check_spaces(self) -> None:
        """(A PettingZoo env's spaces were checked when the module was built.)"""

    def acting_policies(self) -> dict[str, ExploringPolicy]:
        """Every policy's exploring acting policy on ``sampling_device``, taken once per iteration."""
        module, device = self.module, self.sampling_device
        return {pid: ExploringPolicy(module.sampling_policy(pid, device), module.exploration_kwargs(pid), device)
                for pid in module.policies}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's envs, observations and RNG (call after ``setup``); envs whose state
        was not captured continue from where they are, with a warning."""
        if not state or self.envs is None:
            return
        world_size = self.trainer.world_size if self.trainer is not None else 1
        mine = unpack_rank_state(state, self.rank, world_size, "envs")
        if mine is None:
            return
        self.load_local_state(mine)
        if not self.sampler.load_local_state(mine):
            warnings.warn(f"the checkpoint holds no env state ({mine['envs']['unsupported']}): the envs continue "
                          "from where they are, so the run will not match an uninterrupted one exactly", stacklevel=2)

    def record(self, i: int, agent: str, policy_id: str, row: dict[str, Any], next_obs: Any) -> None:
        """``AgentSteps.record``: keep one agent step."""
        raise NotImplementedError

    def drop(self, i: int, agent: str, policy_id: str, last_obs: Any) -> None:
        """``AgentSteps.drop``: cut the trajectory of an agent removed without a done flag."""

    def open_agents(self, i: int) -> list[str]:
        """``AgentSteps.open_agents``: agents of env ``i`` whose trajectory is open."""
        return []


class _Trajectory:
    """One agent's rows in one env since its segment started (within a fragment)."""

    __slots__ = ("policy_id", "rows")

    def __init__(self, policy_id: str) -> None:
        self.policy_id = policy_id
        self.rows: list[dict[str, Any]] = []


class MultiAgentRolloutDataModule(MultiAgentEnvDataModule):
    """Steps ``num_envs`` copies of a PettingZoo parallel env for ``rollout_fragment_length``
    steps per iteration and yields one ``SampleBatch`` per policy, post-processed with GAE
    along each agent's trajectory (bootstrapped from the agent's last observation when its
    segment was cut by a truncation or by the end of the fragment; not after termination).

    ``batch.env_steps`` counts env steps (``num_envs * rollout_fragment_length``);
    ``batch.info["agent_steps_sampled"]`` the agents' steps (rows). With
    ``count_steps_by="agent_steps"`` the envs step (all together) until at least
    ``num_envs * rollout_fragment_length`` agent steps were sampled, and ``env_steps`` is
    what that took. Episode returns are the team's (summed over agents);
    ``info["policy_returns"]`` has each policy's summed return of the episodes that ended.
    """

    def __init__(
        self,
        env: EnvSettings | Callable[[], Any],
        policy_mapping_fn: Callable[[str], str],
        rollout_fragment_length: int,
        count_steps_by: str,
        sampling_device: str = "cpu",
    ) -> None:
        super().__init__(env, policy_mapping_fn, sampling_device)
        check_at_least_one(rollout_fragment_length=rollout_fragment_length)
        if count_steps_by not in ("env_steps", "agent_steps"):
            raise ValueError(f"count_steps_by must be 'env_steps' or 'agent_steps', got {count_steps_by!r}")
        self.count_steps_by = count_steps_by
        self.rollout_fragment_length = rollout_fragment_length

    @property
    def train_batch_size(self) -> int:
        return self.num_envs * self.rollout_fragment_length

    def on_envs_ready(self) -> None:
        self._trajectories: dict[tuple[int, str], _Trajectory] = {}
        self._segments: list[tuple[str, list[dict[str, Any]], Any, bool]] = []  # (policy, rows, bootstrap obs, cut)

    # ------------------------------------------------------------ sampling
    def sample(self) -> MultiAgentBatch:
        """One fragment of every env: each policy's trajectory segments (``_segments_by_policy``),
        post-processed by the algorithm in its training step."""
        assert self.module is not None and self.envs is not None, "call setup() first"
        start = time.perf_counter()
        self._segments = []
        env_steps = agent_steps = 0
        policies = self.acting_policies()
        with torch.inference_mode():
            while (agent_steps if self.count_steps_by == "agent_steps" else env_steps) < self.train_batch_size:
                stepped, acted = self.sampler.step(policies, self)
                env_steps += stepped
                agent_steps += acted
        # segments still open at the end of the fragment bootstrap from the agent's current observation
        for (i, agent), trajectory in self._trajectories.items():
            if trajectory.rows:
                self._segments.append((trajectory.policy_id, trajectory.rows, self.sampler.obs[i][agent], True))
        self._trajectories = {}
        batches = self._segments_by_policy(self._segments)
        self._segments = []
        info = {**self.episode_info(), "agent_steps_sampled": agent_steps,
                "sample_time_s": time.perf_counter() - start}
        return MultiAgentBatch(batches, env_steps=env_steps, info=info)

    def record(self, i: int, agent: str, policy_id: str, row: dict[str, Any], next_obs: Any) -> None:
        trajectory = self._trajectories.setdefault((i, agent), _Trajectory(policy_id))
        trajectory.rows.append(row)
        terminated, truncated = row[SampleBatch.TERMINATEDS], row[SampleBatch.TRUNCATEDS]
        if terminated or truncated:  # the agent left: its segment ends here
            final = row[SampleBatch.OBS] if next_obs is None else next_obs  # as ``drop`` says
            self._segments.append((policy_id, trajectory.rows, final, truncated and not terminated))
            del self._trajectories[(i, agent)]

    def open_agents(self, i: int) -> list[str]:
        return [agent for (j, agent) in self._trajectories if j == i]

    def drop(self, i: int, agent: str, policy_id: str, last_obs: Any) -> None:
        trajectory = self._trajectories.pop((i, agent))
        self._segments.append((policy_id, trajectory.rows, last_obs, True))

    @staticmethod
    def _segments_by_policy(segments: list) -> dict[str, SampleBatch]:
        """Each policy's segments, rows one after another (segment order), with the ``[S]``
        columns the learner's GAE reads (``OnPolicyModule.postprocess_segments``):
        ``segment_lengths``, ``bootstrap_obs`` (a valid observation where there is none to
        bootstrap from) and ``bootstrap_mask`` (the segment was cut and its observation is known)."""
        by_policy: dict[str, list[dict[str, torch.Tensor]]] = {}
        ends: dict[str, list[tuple[int, torch.Tensor, bool]]] = {}
        for pid, rows, bootstrap_obs, cut in segments:
            cols = {k: torch.stack([torch.as_tensor(r[k]) for r in rows]) for k in rows[0]}
            cols[SampleBatch.REWARDS] = cols[SampleBatch.REWARDS].float()
            last = cols[SampleBatch.OBS][-1] if bootstrap_obs is None else torch.as_tensor(np.asarray(bootstrap_obs))
            by_policy.setdefault(pid, []).append(cols)
            ends.setdefault(pid, []).append((len(rows), last, bool(cut and bootstrap_obs is not None)))
        batches = {}
        for pid, parts in sorted(by_policy.items()):
            batch = SampleBatch({k: torch.cat([c[k] for c in parts]) for k in parts[0]})
            batch[SEGMENT_LENGTHS] = torch.tensor([n for n, _, _ in ends[pid]], dtype=torch.int64)
            batch[SampleBatch.BOOTSTRAP_OBS] = torch.stack([obs.to(batch[SampleBatch.OBS].dtype)
                                                            for _, obs, _ in ends[pid]])
            batch[BOOTSTRAP_MASK] = torch.tensor([cut for _, _, cut in ends[pid]], dtype=torch.bool)
            batches[pid] = batch
        return batches
