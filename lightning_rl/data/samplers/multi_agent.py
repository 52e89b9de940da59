"""Time-major multi-agent fragments for the V-trace learners (IMPALA, APPO).

Each policy's fragment is ``[T, K]``: one column per (env, agent mapped to the policy), so its
shapes are fixed by the env's possible agents (static compiled graphs, equal shapes on every
DDP rank, fixed shared-memory slots for sampler workers). A row where the agent did not act
is ``valid=False`` and counts nothing in the loss. After an agent leaves, the next row holds
its final observation, as a reset row of gymnasium's next-step autoreset does: V-trace
bootstraps a truncation from it (an env whose episode ended spends its next step on the reset,
``reset_next_step``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lightning_rl.batch import SampleBatch
from lightning_rl.data.envs.spaces import valid_point
from lightning_rl.data.multi_agent import MultiAgentEnvDataModule

__all__ = ["MultiAgentFragmentSampler", "split_policy_columns"]

VALID, BOOTSTRAP_OBS = SampleBatch.VALID, SampleBatch.BOOTSTRAP_OBS


def split_policy_columns(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """``{"<policy>/<column>": tensor}`` -> ``{policy: {column: tensor}}``."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        pid, column = key.rsplit("/", 1)
        out.setdefault(pid, {})[column] = value
    return out


class MultiAgentFragmentSampler(MultiAgentEnvDataModule):
    """Steps ``num_envs`` copies of a PettingZoo env for ``rollout_fragment_length`` steps and
    lays every policy's rows out time-major (see the module docstring). A sampler worker's, or
    the learner process's own with ``num_workers=0``."""

    reset_next_step = True

    def __init__(
        self,
        env: Callable[[], Any],
        policy_mapping_fn: Callable[[str], str],
        policy_agents: dict[str, list[str]],
        policy_spaces: dict[str, tuple[Any, Any]],
        num_envs: int,
        rollout_fragment_length: int,
        seed: int | None,
    ) -> None:
        super().__init__(env, policy_mapping_fn, num_envs, seed, 1, "cpu")
        self.rollout_fragment_length = rollout_fragment_length
        self.policy_agents = {pid: list(agents) for pid, agents in policy_agents.items()}
        self.policy_spaces = dict(policy_spaces)
        self._layout: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None

    def column(self, i: int, agent: str, policy_id: str) -> int:
        agents = self.policy_agents[policy_id]
        return i * len(agents) + agents.index(agent)

    def fragment_columns(self, policy: Any = None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """``{"<policy>/<column>": (shape, dtype)}`` of one fragment, from one probe of each policy."""
        if self._layout is not None:
            return self._layout
        T = self.rollout_fragment_length
        layout: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        for pid, agents in self.policy_agents.items():
            K = self.num_envs * len(agents)
            obs = torch.as_tensor(np.asarray(self.policy_spaces[pid][0].sample()))[None]
            with torch.inference_mode():
                out = self.module.policy_outputs(obs, pid, explore=True, generator=torch.Generator().manual_seed(0),
                                                 device="cpu")
            cols = {SampleBatch.OBS: ((T, K, *obs.shape[1:]), obs.dtype)}
            cols.update({k: ((T, K, *v.shape[1:]), v.dtype) for k, v in out.items()})
            cols.update({SampleBatch.REWARDS: ((T, K), torch.float32), SampleBatch.TERMINATEDS: ((T, K), torch.bool),
                         SampleBatch.TRUNCATEDS: ((T, K), torch.bool), VALID: ((T, K), torch.bool),
                         BOOTSTRAP_OBS: ((K, *obs.shape[1:]), obs.dtype)})
            layout.update({f"{pid}/{k}": v for k, v in cols.items()})
        self._layout = layout
        return layout

    def fragment(self) -> tuple[dict[str, torch.Tensor], int]:
        """One fragment of every policy (``{"<policy>/<column>": tensor}``) and the agent steps in it."""
        self._cols = {k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in self.fragment_columns().items()}
        for pid, (obs_space, action_space) in self.policy_spaces.items():
            # Rows where an agent did not act are masked, but the learner's forward still reads them
            # (and its one-hot of ``obs - start``, a MultiDiscrete action's log-prob): they hold a
            # valid observation and action of the policy's spaces, not zeros that may lie below a start.
            for key, space in ((SampleBatch.OBS, obs_space), (BOOTSTRAP_OBS, obs_space),
                               (SampleBatch.ACTIONS, action_space)):
                column = self._cols[f"{pid}/{key}"]
                column[:] = valid_point(space, column.dtype)
        self._final: dict[tuple[int, str], Any] = {}  # agents that left at the last step: their final observation
        agent_steps = 0
        with torch.inference_mode():
            for t in range(self.rollout_fragment_length):
                self._t = t
                agent_steps += self.step_all()[1]
        for i, env in enumerate(self.par_envs):  # the observation after the fragment, per column
            if self._reset_pending[i]:
                continue
            for agent in env.agents:
                pid = self.policy_mapping_fn(agent)
                self._cols[f"{pid}/{BOOTSTRAP_OBS}"][self.column(i, agent, pid)] = torch.as_tensor(
                    np.asarray(self._obs[i][agent]))
        for (i, agent), final in self._final.items():
            pid = self.policy_mapping_fn(agent)
            self._cols[f"{pid}/{BOOTSTRAP_OBS}"][self.column(i, agent, pid)] = torch.as_tensor(np.asarray(final))
        cols, self._cols = self._cols, {}
        return cols, agent_steps

    def record(self, i: int, agent: str, policy_id: str, row: dict[str, Any], next_obs: Any) -> None:
        t, c = self._t, self.column(i, agent, policy_id)
        for key, value in row.items():
            self._cols[f"{policy_id}/{key}"][t, c] = torch.as_tensor(value)
        self._cols[f"{policy_id}/{VALID}"][t, c] = True
        if row[SampleBatch.TERMINATEDS] or row[SampleBatch.TRUNCATEDS]:
            self._leave(i, agent, policy_id, row[SampleBatch.OBS] if next_obs is None else next_obs)
            self._open.discard((i, agent))
        else:
            self._open.add((i, agent))

    def _leave(self, i: int, agent: str, policy_id: str, final: Any) -> None:
        """Put the final observation where V-trace reads the next value: the next row, or after the fragment."""
        t, c = self._t, self.column(i, agent, policy_id)
        if t + 1 < self.rollout_fragment_length:
            self._cols[f"{policy_id}/{SampleBatch.OBS}"][t + 1, c] = torch.as_tensor(np.asarray(final))
        else:
            self._final[(i, agent)] = final

    def on_envs_ready(self) -> None:
        self._open: set[tuple[int, str]] = set()

    def open_agents(self, i: int) -> list[str]:
        return sorted(agent for (j, agent) in self._open if j == i)

    def drop(self, i: int, agent: str, policy_id: str) -> None:
        self._cols[f"{policy_id}/{SampleBatch.TRUNCATEDS}"][self._t, self.column(i, agent, policy_id)] = True
        self._leave(i, agent, policy_id, self._obs[i][agent])
        self._open.discard((i, agent))

    def local_state(self) -> dict[str, Any]:
        return {**super().local_state(), "open": [f"{i}/{agent}" for i, agent in sorted(self._open)]}

    def load_local_state(self, state: dict[str, Any]) -> None:
        self._open = {(int(k.split("/", 1)[0]), k.split("/", 1)[1]) for k in state["open"]}
