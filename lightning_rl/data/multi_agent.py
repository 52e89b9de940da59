"""Multi-agent sampling over PettingZoo's Parallel API.

``env`` is a zero-argument callable returning a ``pettingzoo.ParallelEnv`` (an AEC env is
converted with PettingZoo's own ``aec_to_parallel``). Agents may appear and leave within an
episode; each agent's spaces come from the env. ``policy_mapping_fn(agent_id)`` names the
policy that acts for an agent; the sampler emits one ``SampleBatch`` per policy with the rows
of every agent mapped to it, GAE computed along each agent's own trajectory.

``pettingzoo`` is an optional extra (``pip install lightning-rl[multiagent]``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.batch import MultiAgentBatch, SampleBatch
from lightning_rl.checkpoint import pack_rank_states, unpack_rank_state
from lightning_rl.data.base import EnvDataModule, rank_seed
from lightning_rl.data.envs.state import UnsupportedEnvState, capture_env_state, restore_env_state

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
    from lightning_rl.data.envs import GymMake

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


class MultiAgentEnvDataModule(EnvDataModule):
    """Steps ``num_envs`` copies of a PettingZoo parallel env together, each policy acting for
    all its live agents in one forward. What the agents' steps become is the subclass's:
    ``act`` chooses a policy's actions, ``record`` keeps one agent step, ``drop`` hears of an
    agent the env removed without a done flag. Episode returns are the
    team's (summed over agents); ``policy_returns`` has each policy's share."""

    def __init__(
        self,
        env: Callable[[], Any],
        policy_mapping_fn: Callable[[str], str],
        num_envs: int,
        seed: int | None,
        iterations_per_epoch: int,
        sampling_device: str,
    ) -> None:
        super().__init__(env, num_envs, "sync", seed, iterations_per_epoch, sampling_device, check_finite=False)
        self.policy_mapping_fn = policy_mapping_fn
        self.par_envs: list[Any] = []

    # ------------------------------------------------------------ envs
    @property
    def envs(self) -> list[Any] | None:  # type: ignore[override]
        """The PettingZoo envs (``None`` before ``setup`` and after ``teardown``)."""
        return self.par_envs or None

    def setup(self, stage: str) -> None:
        if self.module is None and self.trainer is not None:
            self.connect(self.trainer.lightning_module)
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__} needs a module: call connect(module) or use it with a Trainer")
        if self.par_envs:
            return
        self.rank = self.trainer.global_rank if self.trainer is not None else 0
        self.par_envs = [make_parallel_env(self.env) for _ in range(self.num_envs)]
        seed = rank_seed(self.seed, self.rank)
        if seed is not None:
            self.generator.manual_seed(seed)
        self._obs: list[dict[str, Any]] = []
        for i, env in enumerate(self.par_envs):
            obs, _ = env.reset(seed=None if seed is None else seed + i)
            self._obs.append(obs)
        self._returns = [dict.fromkeys(env.agents, 0.0) for env in self.par_envs]
        self._lengths = [0] * self.num_envs
        self._reset_pending = [False] * self.num_envs
        self._ended: list[tuple[float, int, dict[str, float]]] = []
        self.on_envs_ready()

    def close(self, terminate: bool = False) -> None:
        if not self.par_envs:
            return
        try:  # what a checkpoint taken after fit must hold (as the base class keeps it)
            self._state_at_teardown = pack_rank_states(self.local_state(), interrupted=terminate)
        except Exception:
            if not terminate:
                raise
            self._state_at_teardown = {}
        for env in self.par_envs:
            env.close()
        self.par_envs = []

    # ------------------------------------------------------------ checkpoints
    def local_state(self) -> dict[str, Any]:
        """This process's sampler state as plain data (``env_state.capture_env_state`` per env:
        PettingZoo envs whose state lives in Python objects resume exactly). Taken between
        iterations."""
        try:
            envs: Any = [capture_env_state(env) for env in self.par_envs]
        except UnsupportedEnvState as err:
            envs = {"unsupported": str(err)}
        return {
            "generator": self.generator.get_state(),
            "envs": envs,
            "obs": [{a: torch.as_tensor(np.asarray(o)) for a, o in obs.items()} for obs in self._obs],
            "returns": [dict(r) for r in self._returns],
            "lengths": list(self._lengths),
            "reset_pending": list(self._reset_pending),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's envs, observations and RNG (call after ``setup``); envs whose state
        was not captured restart from fresh episodes, with a warning."""
        if not state or not self.par_envs:
            return
        world_size = self.trainer.world_size if self.trainer is not None else 1
        mine = unpack_rank_state(state, self.rank, world_size, "envs")
        if mine is None:
            return
        self.load_local_state(mine)
        if isinstance(mine["envs"], dict):
            warnings.warn(f"the checkpoint holds no env state ({mine['envs']['unsupported']}): the envs continue "
                          "from where they are, so the run will not match an uninterrupted one exactly", stacklevel=2)
            return
        self.generator.set_state(mine["generator"])
        for env, env_state in zip(self.par_envs, mine["envs"]):
            restore_env_state(env, env_state)
        self._obs = [{a: o.numpy().copy() for a, o in obs.items()} for obs in mine["obs"]]
        self._returns = [dict(r) for r in mine["returns"]]
        self._lengths = list(mine["lengths"])
        self._reset_pending = list(mine["reset_pending"])

    # ------------------------------------------------------------ stepping
    # Reset an env whose episode ended at its next step rather than at once (gymnasium's
    # next-step autoreset): that step's rows hold each agent's final observation (time-major
    # fragments, where V-trace bootstraps a truncation from the next row).
    reset_next_step = False

    def act(self, policy_id: str, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """A policy's outputs (``actions`` and whatever ``record`` keeps) for ``obs [K, ...]``."""
        return self.module.policy_outputs(obs, policy_id, explore=True, generator=self.generator,
                                          device=self.sampling_device)

    def record(self, i: int, agent: str, policy_id: str, row: dict[str, Any], next_obs: Any) -> None:
        """Keep one step of ``agent`` in env ``i``: ``row`` holds the observation it acted in, the
        outputs of ``act``, ``rewards``, ``terminateds`` and ``truncateds``; ``next_obs`` is what
        it observes next (``None`` if the env gave it none: a truncated agent then bootstraps from
        the observation it acted in, see ``drop``)."""
        raise NotImplementedError

    def drop(self, i: int, agent: str, policy_id: str) -> None:
        """``agent`` acted in env ``i`` at this step and the env removed it from ``agents``
        without a done flag (mid-episode, or at the episode's end): cut its trajectory here, as
        a truncation bootstrapped from its latest observation (``self._obs[i][agent]``).

        PettingZoo removes an agent only after a terminated or truncated flag (its
        ``parallel_api_test`` asserts it), so such an env is off the API; without a termination
        the agent's return did not end, so it is not valued as terminal. Its latest observation
        is the one the env gave with this step, or, with none, the one it acted in: RLlib's
        ``MultiAgentEpisode`` likewise repeats an agent's last observation when it ends without a
        new one, and a truncated agent without a next observation bootstraps the same way. Every
        sampler does this alike: PPO's and A2C's GAE, IMPALA's and APPO's V-trace, DQN's n-step."""

    def step_all(self) -> tuple[int, int]:
        """One step of every env; returns ``(env steps, agent steps)`` taken."""
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
            obs = torch.as_tensor(np.stack([np.asarray(self._obs[i][a]) for i, a in keys]))
            out = {k: v.cpu() for k, v in self.act(pid, obs).items()}
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
            for agent in actions[i]:
                reward = float(rewards.get(agent, 0.0))
                self._returns[i][agent] = self._returns[i].get(agent, 0.0) + reward
                row = {**outputs[(i, agent)], SampleBatch.REWARDS: reward,
                       SampleBatch.TERMINATEDS: bool(terminations.get(agent, False)),
                       SampleBatch.TRUNCATEDS: bool(truncations.get(agent, False))}
                self.record(i, agent, self.policy_mapping_fn(agent), row, obs.get(agent))
            for agent in obs:  # new agents may join mid-episode
                self._returns[i].setdefault(agent, 0.0)
            self._obs[i] = {**self._obs[i], **obs}
            live = set(env.agents)
            for agent in actions[i]:  # removed without a done flag: cut here (see ``drop``)
                if agent not in live and not (terminations.get(agent, False) or truncations.get(agent, False)):
                    self.drop(i, agent, self.policy_mapping_fn(agent))
            if not env.agents:  # the episode is over for everyone
                self._end_episode(i)
        return resets + sum(1 for a in actions if a), sum(len(a) for a in actions)

    def _end_episode(self, i: int) -> None:
        returns = self._returns[i]
        per_policy: dict[str, float] = {}
        for agent, r in returns.items():
            pid = self.policy_mapping_fn(agent)
            per_policy[pid] = per_policy.get(pid, 0.0) + r
        self._ended.append((float(sum(returns.values())), self._lengths[i], per_policy))
        for agent in self.open_agents(i):  # agents the env dropped without a done flag
            self.drop(i, agent, self.policy_mapping_fn(agent))
        if self.reset_next_step:
            self._reset_pending[i] = True
        else:
            self._reset_env(i)

    def _reset_env(self, i: int) -> None:
        self._reset_pending[i] = False
        obs, _ = self.par_envs[i].reset()
        self._obs[i] = obs
        self._returns[i] = dict.fromkeys(self.par_envs[i].agents, 0.0)
        self._lengths[i] = 0

    def open_agents(self, i: int) -> list[str]:
        """Agents of env ``i`` whose trajectory is open (no done flag yet)."""
        return []

    def episode_info(self) -> dict[str, Any]:
        ended, self._ended = self._ended, []
        return {"episode_returns": [r for r, _, _ in ended], "episode_lengths": [n for _, n, _ in ended],
                "policy_returns": [p for _, _, p in ended]}


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
        env: Callable[[], Any],
        policy_mapping_fn: Callable[[str], str],
        num_envs: int = 1,
        rollout_fragment_length: int = 32,
        seed: int | None = None,
        iterations_per_epoch: int = 10,
        sampling_device: str = "cpu",
        count_steps_by: str = "env_steps",
    ) -> None:
        super().__init__(env, policy_mapping_fn, num_envs, seed, iterations_per_epoch, sampling_device)
        if rollout_fragment_length < 1:
            raise ValueError(f"rollout_fragment_length must be >= 1, got {rollout_fragment_length}")
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
        assert self.module is not None and self.par_envs, "call setup() first"
        start = time.perf_counter()
        self._segments = []
        env_steps = agent_steps = 0
        with torch.inference_mode():
            while (agent_steps if self.count_steps_by == "agent_steps" else env_steps) < self.train_batch_size:
                stepped, acted = self.step_all()
                env_steps += stepped
                agent_steps += acted
        # segments still open at the end of the fragment bootstrap from the agent's current observation
        for (i, agent), trajectory in self._trajectories.items():
            if trajectory.rows:
                self._segments.append((trajectory.policy_id, trajectory.rows, self._obs[i][agent], True))
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

    def drop(self, i: int, agent: str, policy_id: str) -> None:
        trajectory = self._trajectories.pop((i, agent))
        self._segments.append((policy_id, trajectory.rows, self._obs[i].get(agent), True))

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
