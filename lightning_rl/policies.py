"""Policies: the networks an algorithm trains, with their spaces, the agent → policy mapping,
their sampling copies and the one action path that samplers, evaluation and users share.

``Policies`` is the ``nn.ModuleDict`` an algorithm keeps as ``self.policies`` (so checkpoints
hold ``policies.<policy id>.*`` weights); it uses no Lightning API.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from lightning_rl.batch import DEFAULT_POLICY_ID, EPISODE_STARTS, PREV_ACTIONS, PREV_REWARDS, STATE_IN, STATE_OUT
from lightning_rl.data.envs.make import EnvSpec
from lightning_rl.data.envs.pettingzoo import agent_spaces, policy_spaces
from lightning_rl.data.envs.spaces import (
    flatten_observation,
    flatten_observation_space,
    is_raw_observation,
    is_structured,
)
from lightning_rl.data.envs.vector import env_spaces
from lightning_rl.data.samplers.engine import policy_state

# agent id -> policy id: any callable, or a table (plain data, so checkpoints and YAML hold it)
PolicyMapping = dict[str, str] | Callable[[str], str]


class MappingTable:
    """A ``policy_mapping_fn`` given as ``{agent_id: policy_id}``; an agent not in it is an error."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = dict(table)

    def __call__(self, agent_id: str) -> str:
        try:
            return self.table[agent_id]
        except KeyError:
            raise ValueError(f"agent {agent_id!r} is not in policy_mapping_fn {self.table}") from None


def default_policy_mapping(agent_id: str) -> str:
    """Every agent acts with the one default policy (parameter sharing)."""
    return DEFAULT_POLICY_ID


class Policies(nn.ModuleDict):
    """The policies by id, and what is known of them before they are built.

    Args:
        env: the env spec the policies act in (``env_spec``'s result).
        multi_agent: whether ``env`` is a PettingZoo env (several agents, several policies).
        policies: policy ids, or ``{policy id: per-policy settings}``; one default policy when
            ``None``.
        policy_mapping_fn: agent id → policy id, a callable or a ``{agent: policy}`` table.
        policies_to_train: the ids updated by ``fit``; all when ``None``.
        vectorization: how the envs are built (``"envpool"``: the spaces are envpool's).
    """

    def __init__(
        self,
        env: EnvSpec,
        multi_agent: bool,
        policies: Sequence[str] | dict[str, dict[str, Any]] | None = None,
        policy_mapping_fn: PolicyMapping | None = None,
        policies_to_train: Sequence[str] | None = None,
        vectorization: str = "auto",
    ) -> None:
        super().__init__()
        if isinstance(policy_mapping_fn, dict):  # plain data: a checkpoint keeps it and reloads it
            policy_mapping_fn = MappingTable(policy_mapping_fn)
        if isinstance(policies, dict):
            self.policy_config = {pid: dict(cfg or {}) for pid, cfg in policies.items()}
        else:
            self.policy_config = {pid: {} for pid in (policies or [DEFAULT_POLICY_ID])}
        if not multi_agent and (list(self.policy_config) != [DEFAULT_POLICY_ID] or policy_mapping_fn):
            raise ValueError("policies and policy_mapping_fn need a multi-agent env (a PettingZoo env factory), "
                             f"which env={env!r} is not")
        if multi_agent:
            self.policy_mapping_fn: Callable[[str], str] | None = policy_mapping_fn or default_policy_mapping
            self.raw_observation_space: gym.Space | None = None  # agents' spaces are used as they are
            spaces = agent_spaces(env)
            self.policy_spaces = policy_spaces(spaces, list(self.policy_config), self.policy_mapping_fn)
        else:
            self.policy_mapping_fn = None
            raw_obs_space, action_space = env_spaces(env, vectorization)
            # Dict/Tuple observations arrive flattened (make_vector_env); compute_actions flattens raw ones
            self.raw_observation_space = raw_obs_space
            spaces = {"agent_0": (flatten_observation_space(raw_obs_space), action_space)}
            self.policy_spaces = {DEFAULT_POLICY_ID: spaces["agent_0"]}
        self.policy_agents: dict[str, list[str]] = {pid: [] for pid in self.policy_spaces}  # possible agents
        for agent in spaces:
            self.policy_agents[self.policy_mapping_fn(agent) if multi_agent else DEFAULT_POLICY_ID].append(agent)
        self.to_train: list[str] = list(policies_to_train or self.policy_config)
        unknown = [p for p in self.to_train if p not in self.policy_config]
        if unknown:
            raise ValueError(f"policies_to_train names {unknown}, which are not among the policies "
                             f"{list(self.policy_config)}")
        self.version = 0  # bumped after every update: sampling copies refresh when it moves
        self._copies: dict[tuple[str, torch.device], tuple[int, nn.Module]] = {}

    def build(self, make: Callable[..., nn.Module], seed: int | None, owner: str, **defaults: Any) -> None:
        """One network per policy, ``make(observation_space, action_space, **settings)``: the
        algorithm's ``defaults`` overridden by the policy's own settings, initialised from ``seed``
        without touching torch's global RNG. A policy's settings may only override ``defaults``:
        any other is a ``ValueError`` naming it and ``owner`` (the algorithm)."""
        for policy_id, settings in self.policy_config.items():
            unknown = sorted(set(settings) - set(defaults))
            if unknown:
                raise ValueError(
                    f"policies[{policy_id!r}] sets {', '.join(unknown)}, which {owner} does not take per "
                    f"policy; its per-policy settings are {', '.join(sorted(defaults))}"
                )
        with torch.random.fork_rng():
            if seed is not None:
                torch.manual_seed(seed)
            for policy_id, (obs_space, action_space) in self.policy_spaces.items():
                self[policy_id] = make(obs_space, action_space, **{**defaults, **self.policy_config[policy_id]})

    def check_spaces(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        """Raise if a DataModule's envs do not match the spaces the first policy was built for."""
        expected = next(iter(self.policy_spaces.values()))
        if (observation_space, action_space) != expected:
            raise ValueError(
                f"the DataModule's envs have spaces {observation_space}, {action_space}, but the "
                f"module was built for {expected[0]}, {expected[1]}"
            )

    def sampling_copy(self, policy_id: str, device: torch.device, home: torch.device) -> nn.Module:
        """The policy on ``device``: itself where it lives (``home``), else a copy in eval mode whose
        parameters and buffers are refreshed whenever ``version`` moved."""
        policy = self[policy_id]
        if device == home:
            return policy
        version, policy_copy = self._copies.get((policy_id, device), (-1, None))
        if policy_copy is None:
            policy_copy = copy.deepcopy(policy).to(device).eval()
        if version != self.version:
            with torch.no_grad():
                for target, source in zip(policy_state(policy_copy), policy_state(policy), strict=True):
                    target.copy_(source)
            self._copies[(policy_id, device)] = (self.version, policy_copy)
        return policy_copy

    def is_recurrent(self, policy_id: str = DEFAULT_POLICY_ID) -> bool:
        """Whether the policy carries a state between steps (``use_lstm``)."""
        return bool(getattr(self[policy_id], "recurrent", False))

    def action_inputs(
        self, obs: np.ndarray | Tensor, policy_id: str, state: Any, episode_start: Any, prev_action: Any,
        prev_reward: Any,
    ) -> tuple[Tensor, bool, dict[str, Tensor] | None]:
        """A user's observation(s) and recurrent inputs as ``[N, ...]`` tensors: a raw Dict/Tuple
        observation is flattened as the envs' are; one observation becomes a batch of one
        (``single``). Returns ``(obs, single, inputs)``, ``inputs`` None for a feed-forward policy."""
        raw_space = self.raw_observation_space
        if is_raw_observation(obs) and raw_space is not None and is_structured(raw_space):
            obs = flatten_observation(obs, raw_space)
        obs_t = torch.as_tensor(obs if isinstance(obs, Tensor) else np.asarray(obs))
        single = tuple(obs_t.shape) == tuple(self.policy_spaces[policy_id][0].shape or ())
        if single:
            obs_t = obs_t.unsqueeze(0)
        if not self.is_recurrent(policy_id):
            return obs_t, single, None
        given = {STATE_IN: state, EPISODE_STARTS: episode_start, PREV_ACTIONS: prev_action, PREV_REWARDS: prev_reward}
        n = obs_t.shape[0]
        inputs = {k: torch.as_tensor(v if isinstance(v, Tensor) else np.asarray(v)) for k, v in given.items()
                  if v is not None}
        # per env: a row of state or of a Box action, a scalar otherwise
        inputs = {k: v.reshape(n, -1) if k in (STATE_IN, PREV_ACTIONS) else v.reshape(n) for k, v in inputs.items()}
        if STATE_IN in inputs:
            inputs[STATE_IN] = inputs[STATE_IN].float()
        return obs_t, single, inputs

    def as_given(self, out: dict[str, Tensor], policy_id: str, single: bool, numpy: bool,
                 recurrent: bool) -> Any:
        """``compute_actions``' answer from the policy's outputs: actions (numpy in the space's
        dtype when ``numpy``), and the next state for a recurrent policy."""
        actions = out["actions"][0] if single else out["actions"]
        if numpy:
            actions = actions.cpu().numpy()
            action_space = self.policy_spaces[policy_id][1]
            if isinstance(action_space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
                actions = actions.astype(action_space.dtype)  # what the space's contains() accepts
        if not recurrent:
            return actions
        next_state = out[STATE_OUT][0] if single else out[STATE_OUT]
        return actions, next_state.cpu().numpy() if numpy else next_state
