"""PettingZoo envs: building one from a factory, telling one apart from a gymnasium env, and
the spaces of its agents and of the policies they are mapped to.

``env`` is a zero-argument callable returning a ``pettingzoo.ParallelEnv`` (an AEC env is
converted with PettingZoo's own ``aec_to_parallel``). ``pettingzoo`` is an optional extra
(``pip install lightning-rl[multiagent]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from lightning_rl.data.envs.make import GymMake

__all__ = ["agent_spaces", "is_multi_agent_env", "make_parallel_env", "policy_spaces"]


def _pettingzoo() -> Any:
    try:
        import pettingzoo
    except ImportError as err:  # pragma: no cover - the tests install it
        raise ImportError("multi-agent envs need PettingZoo: pip install lightning-rl[multiagent]") from err
    return pettingzoo


def make_parallel_env(env: Callable[[], Any]) -> Any:
    """One env from a callable returning a PettingZoo ``ParallelEnv`` (or an AEC env, converted)."""
    pettingzoo = _pettingzoo()
    made = env()
    if isinstance(made, pettingzoo.AECEnv):
        from pettingzoo.utils.conversions import aec_to_parallel

        made = aec_to_parallel(made)
    if not isinstance(made, pettingzoo.ParallelEnv):
        raise TypeError(f"env factory {env!r} returned {type(made).__name__}, not a PettingZoo ParallelEnv")
    return made


def is_multi_agent_env(env: Any) -> bool:
    """Whether ``env`` (an env spec) makes a PettingZoo env (probed once: the factory is called)."""
    if isinstance(env, str | GymMake) or not callable(env):  # gymnasium ids: never PettingZoo
        return False
    try:
        import pettingzoo
    except ImportError:
        return False
    made = env()
    try:
        return isinstance(made, pettingzoo.ParallelEnv | pettingzoo.AECEnv)
    finally:
        close = getattr(made, "close", None)  # whatever the factory made (a wrong type is reported later)
        if callable(close):
            close()


def agent_spaces(env: Callable[[], Any]) -> dict[str, tuple[gym.Space, gym.Space]]:
    """``{agent: (observation_space, action_space)}`` for every possible agent of ``env``."""
    probe = make_parallel_env(env)
    try:
        return {a: (probe.observation_space(a), probe.action_space(a)) for a in probe.possible_agents}
    finally:
        probe.close()


def policy_spaces(
    spaces: dict[str, tuple[gym.Space, gym.Space]], policy_ids: list[str], mapping: Callable[[str], str]
) -> dict[str, tuple[gym.Space, gym.Space]]:
    """Each policy's spaces: those of the agents mapped to it, which must agree. Clear errors
    name the agent whose mapping is unknown or whose spaces differ from the policy's."""
    out: dict[str, tuple[gym.Space, gym.Space]] = {}
    owner: dict[str, str] = {}
    for agent, pair in spaces.items():
        pid = mapping(agent)
        if pid not in policy_ids:
            raise ValueError(f"policy_mapping_fn({agent!r}) returned {pid!r}, which is not one of the policies "
                             f"{policy_ids}")
        if pid in out and out[pid] != pair:
            raise ValueError(
                f"agents {owner[pid]!r} and {agent!r} are both mapped to policy {pid!r} but have different spaces: "
                f"{out[pid]} vs {pair}; map them to different policies"
            )
        out.setdefault(pid, pair)
        owner.setdefault(pid, agent)
    unused = [p for p in policy_ids if p not in out]
    if unused:
        raise ValueError(f"no agent is mapped to the policies {unused} (agents: {list(spaces)})")
    return out
