"""The multi-agent sampling engine: PettingZoo parallel envs stepped with one policy per group of agents.

``MultiAgentEnvSampler`` is ``EnvSampler``'s counterpart for PettingZoo's Parallel API and, like
it, knows no Lightning and no algorithm. It owns ``num_envs`` envs, their seeds, the
action-sampling generator and the episode statistics; each step, every policy acts for all its
live agents in one forward (``ActingPolicy.act``), and what becomes of each agent's step is up
to an ``AgentSteps`` consumer: GAE segments (the synchronous rollout), n-step windows (replay)
or time-major columns (``MultiAgentFragmentSampler``, what IMPALA's and APPO's sampler workers
run). Agents may appear and leave within an episode.

Time-major fragments: each policy's fragment is ``[T, K]``, one column per (env, agent mapped
to the policy), so its shapes are fixed by the env's possible agents (static compiled graphs,
equal shapes on every DDP rank, fixed shared-memory slots for sampler workers). A row where the
agent did not act is ``valid=False`` and counts nothing in the loss. After an agent leaves, the
next row holds its final observation, as a reset row of gymnasium's next-step autoreset does:
V-trace bootstraps a truncation from it (an env whose episode ended spends its next step on the
reset, ``reset_next_step``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch

from lightning_rl.batch import SampleBatch
from lightning_rl.data.envs.pettingzoo import make_parallel_env
from lightning_rl.data.envs.spaces import valid_point
from lightning_rl.data.envs.state import UnsupportedEnvState, capture_env_state, restore_env_state
from lightning_rl.data.samplers.engine import ActingPolicy, new_generator

__all__ = ["AgentSteps", "MultiAgentEnvSampler", "MultiAgentFragmentSampler", "split_policy_columns"]

VALID, BOOTSTRAP_OBS = SampleBatch.VALID, SampleBatch.BOOTSTRAP_OBS


def split_policy_columns(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """``{"<policy>/<column>": tensor}`` -> ``{policy: {column: tensor}}``."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        pid, column = key.rsplit("/", 1)
        out.setdefault(pid, {})[column] = value
    return out


class AgentSteps(Protocol):
    """What becomes of the agents' steps (``MultiAgentEnvSampler.step``)."""

    def record(self, i: int, agent: str, policy_id: str, row: dict[str, Any], next_obs: Any) -> None:
        """Keep one step of ``agent`` in env ``i``: ``row`` holds the observation it acted in, the
        policy's outputs, ``rewards``, ``terminateds`` and ``truncateds``; ``next_obs`` is what
        it observes next (``None`` if the env gave it none: a truncated agent then bootstraps from
        the observation it acted in, see ``drop``)."""

    def drop(self, i: int, agent: str, policy_id: str, last_obs: Any) -> None:
        """``agent`` acted in env ``i`` at this step and the env removed it from ``agents``
        without a done flag (mid-episode, or at the episode's end): cut its trajectory here, as
        a truncation bootstrapped from ``last_obs``, its latest observation.

        PettingZoo removes an agent only after a terminated or truncated flag (its
        ``parallel_api_test`` asserts it), so such an env is off the API; without a termination
        the agent's return did not end, so it is not valued as terminal. Its latest observation
        is the one the env gave with this step, or, with none, the one it acted in: RLlib's
        ``MultiAgentEpisode`` likewise repeats an agent's last observation when it ends without a
        new one, and a truncated agent without a next observation bootstraps the same way. Every
        consumer does this alike: PPO's and A2C's GAE, IMPALA's and APPO's V-trace, DQN's n-step."""

    def open_agents(self, i: int) -> list[str]:
        """Agents of env ``i`` whose trajectory is open (no done flag yet)."""


class MultiAgentEnvSampler:
    """``num_envs`` copies of a PettingZoo parallel env, stepped together.

    Args:
        env: a zero-argument callable returning a PettingZoo ``ParallelEnv`` (or an AEC env).
        policy_mapping_fn: agent id -> the id of the policy that acts for it.
        num_envs: envs stepped together.
        seed: the action-sampling generator's seed until ``reset`` re-seeds it.
        device: where the action-sampling generator lives (the policies act there).
        reset_next_step: reset an env whose episode ended at its next step rather than at once
            (gymnasium's next-step autoreset): that step's rows hold each agent's final
            observation (time-major fragments, where V-trace bootstraps a truncation from the
            next row).
        check_finite: raise, naming the env, the agent, the field and the step, when an env gives
            an agent a NaN or infinite reward or (floating-point) observation.

    Episode returns are the team's (summed over agents); ``policy_returns`` has each policy's share.
    """

    def __init__(self, env: Callable[[], Any], policy_mapping_fn: Callable[[str], str], num_envs: int,
                 seed: int | None = None, device: torch.device | str = "cpu", reset_next_step: bool = False,
                 check_finite: bool = True) -> None:
        self.env, self.policy_mapping_fn, self.num_envs = env, policy_mapping_fn, num_envs
        self.reset_next_step = reset_next_step
        self.check_finite = check_finite
        self.steps = 0  # steps of every env together (each env's own step count, resets included)
        self.generator = new_generator(seed, device)
        self.par_envs: list[Any] = []
        self.obs: list[dict[str, Any]] = []  # each env's latest observation of every agent
        self.where = ""

    @property
    def envs(self) -> list[Any] | None:
        """The PettingZoo envs (``None`` before ``open`` and after ``close``)."""
        return self.par_envs or None

    # ------------------------------------------------------------ envs
    def open(self) -> None:
        """Build the envs (``reset`` starts their episodes)."""
        self.par_envs = [make_parallel_env(self.env) for _ in range(self.num_envs)]

    def reset(self, seed: int | None) -> None:
        """Every env to a fresh episode (env ``i`` seeded ``seed + i``); the generator re-seeded
        with ``seed`` (when given)."""
        if seed is not None:
            self.generator.manual_seed(seed)
        self.obs = [env.reset(seed=None if seed is None else seed + i)[0] for i, env in enumerate(self.par_envs)]
        if self.check_finite:
            for i, obs in enumerate(self.obs):
                self._check_finite(i, "observation", obs, "at reset")
        self._returns = [dict.fromkeys(env.agents, 0.0) for env in self.par_envs]
        self._lengths = [0] * self.num_envs
        self._reset_pending = [False] * self.num_envs
        self._ended: list[tuple[float, int, dict[str, float]]] = []

    def close(self, terminate: bool = False) -> None:
        envs, self.par_envs = self.par_envs, []
        for env in envs:
            env.close()

    # ------------------------------------------------------------ stepping
    def step(self, policies: Mapping[str, ActingPolicy], steps: AgentSteps) -> tuple[int, int]:
        """One step of every env, each policy of ``policies`` acting for its live agents in one
        forward; every agent step goes to ``steps``. Returns ``(env steps, agent steps)``."""
        by_policy: dict[str, list[tuple[int, str]]] = {}
        resets = 0
        for i, env in enumerate(self.par_envs):
            if self._reset_pending[i]:  # this env's step is its reset
                self._reset_env(i)
                resets += 1
                continue
            for agent in env.agents:
                by_policy.setdefault(self.policy_mapping_fn(agent), []).append((i, agent))
        actions: list[dict[str, Any]] = [{} for _ in self.par_envs]
        outputs: dict[tuple[int, str], dict[str, Any]] = {}
        for pid, keys in by_policy.items():
            obs = torch.as_tensor(np.stack([np.asarray(self.obs[i][a]) for i, a in keys]))
            out = {k: v.cpu() for k, v in policies[pid].act(obs, self.generator, {}).items()}
            for n, (i, agent) in enumerate(keys):
                outputs[(i, agent)] = {SampleBatch.OBS: obs[n], **{k: v[n] for k, v in out.items()}}
                actions[i][agent] = out[SampleBatch.ACTIONS][n].numpy()
                if actions[i][agent].ndim == 0:
                    actions[i][agent] = actions[i][agent].item()
        for i, env in enumerate(self.par_envs):
            if not actions[i]:
                continue
            obs, rewards, terminations, truncations, _ = env.step(actions[i])
            self._lengths[i] += 1
            if self.check_finite:
                when = f"at its env step {self.steps + 1}"
                self._check_finite(i, "reward", rewards, when)
                self._check_finite(i, "observation", obs, when)
            for agent in actions[i]:
                reward = float(rewards.get(agent, 0.0))
                self._returns[i][agent] = self._returns[i].get(agent, 0.0) + reward
                row = {**outputs[(i, agent)], SampleBatch.REWARDS: reward,
                       SampleBatch.TERMINATEDS: bool(terminations.get(agent, False)),
                       SampleBatch.TRUNCATEDS: bool(truncations.get(agent, False))}
                steps.record(i, agent, self.policy_mapping_fn(agent), row, obs.get(agent))
            for agent in obs:  # new agents may join mid-episode
                self._returns[i].setdefault(agent, 0.0)
            self.obs[i] = {**self.obs[i], **obs}
            live = set(env.agents)
            for agent in actions[i]:  # removed without a done flag: cut here (see ``AgentSteps.drop``)
                if agent not in live and not (terminations.get(agent, False) or truncations.get(agent, False)):
                    steps.drop(i, agent, self.policy_mapping_fn(agent), self.obs[i].get(agent))
            if not env.agents:  # the episode is over for everyone
                self._end_episode(i, steps)
        self.steps += 1
        return resets + sum(1 for a in actions if a), sum(len(a) for a in actions)

    def _check_finite(self, i: int, field: str, values: Mapping[str, Any], when: str) -> None:
        """Raise if an agent's ``field`` in env ``i`` (a dict by agent) holds a NaN or infinity."""
        for agent, value in values.items():
            array = np.asarray(value)
            if array.dtype.kind in "fc" and not np.isfinite(array).all():
                raise ValueError(
                    f"env {i} of {self.num_envs} ({self.env!r}){self.where} gave agent {agent!r} a non-finite "
                    f"{field} {when}: {value!r}. Fix the env, or pass check_finite=False to train on it anyway"
                )

    def _end_episode(self, i: int, steps: AgentSteps) -> None:
        returns = self._returns[i]
        per_policy: dict[str, float] = {}
        for agent, r in returns.items():
            pid = self.policy_mapping_fn(agent)
            per_policy[pid] = per_policy.get(pid, 0.0) + r
        self._ended.append((float(sum(returns.values())), self._lengths[i], per_policy))
        for agent in steps.open_agents(i):  # agents the env dropped without a done flag
            steps.drop(i, agent, self.policy_mapping_fn(agent), self.obs[i].get(agent))
        if self.reset_next_step:
            self._reset_pending[i] = True
        else:
            self._reset_env(i)

    def _reset_env(self, i: int) -> None:
        self._reset_pending[i] = False
        obs, _ = self.par_envs[i].reset()
        if self.check_finite:
            self._check_finite(i, "observation", obs, f"at the reset of its env step {self.steps + 1}")
        self.obs[i] = obs
        self._returns[i] = dict.fromkeys(self.par_envs[i].agents, 0.0)
        self._lengths[i] = 0

    def live_agents(self) -> list[tuple[int, str]]:
        """``(env, agent)`` of every agent that acts at the next step (envs awaiting their reset left out)."""
        return [(i, agent) for i, env in enumerate(self.par_envs) if not self._reset_pending[i] for agent in env.agents]

    def episode_info(self) -> dict[str, Any]:
        """Team returns, lengths and each policy's returns of the episodes that ended since the last call."""
        ended, self._ended = self._ended, []
        return {"episode_returns": [r for r, _, _ in ended], "episode_lengths": [n for _, n, _ in ended],
                "policy_returns": [p for _, _, p in ended]}

    # ------------------------------------------------------------ state
    def local_state(self) -> dict[str, Any]:
        """Everything needed to continue exactly, as plain data (``capture_env_state`` per env:
        PettingZoo envs whose state lives in Python objects resume exactly). Taken between
        iterations."""
        try:
            envs: Any = [capture_env_state(env) for env in self.par_envs]
        except UnsupportedEnvState as err:
            envs = {"unsupported": str(err)}
        return {
            "generator": self.generator.get_state(),
            "envs": envs,
            "obs": [{a: torch.as_tensor(np.asarray(o)) for a, o in obs.items()} for obs in self.obs],
            "returns": [dict(r) for r in self._returns],
            "lengths": list(self._lengths),
            "reset_pending": list(self._reset_pending),
            "steps": self.steps,
        }

    def load_local_state(self, state: dict[str, Any]) -> bool:
        """Restore ``local_state``; False (nothing restored) when it holds no env state: the envs
        then continue from where they are."""
        if isinstance(state["envs"], dict):
            return False
        self.generator.set_state(state["generator"])
        for env, env_state in zip(self.par_envs, state["envs"]):
            restore_env_state(env, env_state)
        self.obs = [{a: o.numpy().copy() for a, o in obs.items()} for obs in state["obs"]]
        self._returns = [dict(r) for r in state["returns"]]
        self._lengths = list(state["lengths"])
        self._reset_pending = list(state["reset_pending"])
        self.steps = int(state.get("steps", 0))
        return True


class MultiAgentFragmentSampler(MultiAgentEnvSampler):
    """Steps the envs for ``rollout_fragment_length`` steps and lays every policy's rows out
    time-major (see the module docstring): a sampler worker's, or the learner process's own with
    ``num_workers=0``.

    Args (besides ``MultiAgentEnvSampler``'s):
        policy_agents: ``{policy id: [the possible agents mapped to it]}`` (its columns' order).
        policy_spaces: ``{policy id: (observation space, action space)}``.
        rollout_fragment_length: steps of every env in one fragment.
    """

    def __init__(self, env: Callable[[], Any], policy_mapping_fn: Callable[[str], str],
                 policy_agents: dict[str, list[str]], policy_spaces: dict[str, tuple[Any, Any]], num_envs: int,
                 rollout_fragment_length: int, seed: int | None = None, check_finite: bool = True) -> None:
        super().__init__(env, policy_mapping_fn, num_envs, seed, "cpu", reset_next_step=True,
                         check_finite=check_finite)
        self.rollout_fragment_length = rollout_fragment_length
        self.policy_agents = {pid: list(agents) for pid, agents in policy_agents.items()}
        self.policy_spaces = dict(policy_spaces)
        self._layout: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None
        self._open: set[tuple[int, str]] = set()

    def column(self, i: int, agent: str, policy_id: str) -> int:
        agents = self.policy_agents[policy_id]
        return i * len(agents) + agents.index(agent)

    def fragment_columns(self, policies: Mapping[str, ActingPolicy]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """``{"<policy>/<column>": (shape, dtype)}`` of one fragment, from one probe of each policy."""
        if self._layout is not None:
            return self._layout
        T = self.rollout_fragment_length
        layout: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        for pid, agents in self.policy_agents.items():
            K = self.num_envs * len(agents)
            obs = torch.as_tensor(np.asarray(self.policy_spaces[pid][0].sample()))[None]
            with torch.inference_mode():
                out = policies[pid].act(obs, torch.Generator().manual_seed(0), {})
            cols = {SampleBatch.OBS: ((T, K, *obs.shape[1:]), obs.dtype)}
            cols.update({k: ((T, K, *v.shape[1:]), v.dtype) for k, v in out.items()})
            cols.update({SampleBatch.REWARDS: ((T, K), torch.float32), SampleBatch.TERMINATEDS: ((T, K), torch.bool),
                         SampleBatch.TRUNCATEDS: ((T, K), torch.bool), VALID: ((T, K), torch.bool),
                         BOOTSTRAP_OBS: ((K, *obs.shape[1:]), obs.dtype)})
            layout.update({f"{pid}/{k}": v for k, v in cols.items()})
        self._layout = layout
        return layout

    def fragment(self, policies: Mapping[str, ActingPolicy]) -> tuple[dict[str, torch.Tensor], int]:
        """One fragment of every policy (``{"<policy>/<column>": tensor}``) and the agent steps in it."""
        layout = self.fragment_columns(policies)
        self._cols = {k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in layout.items()}
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
                agent_steps += self.step(policies, self)[1]
        # the observation after the fragment, per column: the live agents', then the final one of those that left
        after = {key: self.obs[key[0]][key[1]] for key in self.live_agents()}
        for (i, agent), obs in {**after, **self._final}.items():
            pid = self.policy_mapping_fn(agent)
            self._cols[f"{pid}/{BOOTSTRAP_OBS}"][self.column(i, agent, pid)] = torch.as_tensor(np.asarray(obs))
        cols, self._cols = self._cols, {}
        return cols, agent_steps

    # ------------------------------------------------------------ AgentSteps
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

    def drop(self, i: int, agent: str, policy_id: str, last_obs: Any) -> None:
        self._cols[f"{policy_id}/{SampleBatch.TRUNCATEDS}"][self._t, self.column(i, agent, policy_id)] = True
        self._leave(i, agent, policy_id, last_obs)
        self._open.discard((i, agent))

    def open_agents(self, i: int) -> list[str]:
        return sorted(agent for (j, agent) in self._open if j == i)

    def _leave(self, i: int, agent: str, policy_id: str, final: Any) -> None:
        """Put the final observation where V-trace reads the next value: the next row, or after the fragment."""
        t, c = self._t, self.column(i, agent, policy_id)
        if t + 1 < self.rollout_fragment_length:
            self._cols[f"{policy_id}/{SampleBatch.OBS}"][t + 1, c] = torch.as_tensor(np.asarray(final))
        else:
            self._final[(i, agent)] = final

    # ------------------------------------------------------------ state
    def reset(self, seed: int | None) -> None:
        super().reset(seed)
        self._open = set()

    def local_state(self) -> dict[str, Any]:
        return {**super().local_state(), "open": [f"{i}/{agent}" for i, agent in sorted(self._open)]}

    def load_local_state(self, state: dict[str, Any]) -> bool:
        self._open = {(int(k.split("/", 1)[0]), k.split("/", 1)[1]) for k in state["open"]}
        return super().load_local_state(state)
