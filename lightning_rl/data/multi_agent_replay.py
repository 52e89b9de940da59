"""Off-policy sampling over PettingZoo: each agent's steps become n-step transitions along its
own trajectory, in the replay of the policy it is mapped to."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.batch import MultiAgentBatch, SampleBatch
from lightning_rl.data.base import rank_seed
from lightning_rl.data.buffers.replay_buffer import keeps_replay
from lightning_rl.data.buffers.transitions import NStepWindows, TransitionReplayBuffer
from lightning_rl.data.multi_agent import MultiAgentEnvDataModule
from lightning_rl.data.replay import checked_replay
from lightning_rl.data.samplers.engine import ExploringPolicy
from lightning_rl.data.settings import EnvSettings, ReplaySettings

__all__ = ["MultiAgentReplayDataModule"]


class MultiAgentReplayDataModule(MultiAgentEnvDataModule):
    """Each iteration, ``train_freq`` steps of every env; every agent step goes through that
    agent's own n-step window (``NStepWindows``: an agent that terminates or is truncated cuts
    its windows, one that joins later starts new ones, an agent the env drops at an episode
    end without a done flag is cut as a truncation) into the replay of its policy: one
    ``TransitionReplayBuffer`` of ``buffer_size`` per policy, new transitions at the largest
    priority so far (uniform replay: ``alpha = 0``, every priority 1).

    Like ``ReplayDataModule``, the batch a training step receives has no rows:
    ``batch.replay`` is this DataModule once ``learning_starts`` env steps (per process, the
    same on every rank) were taken, and the learner draws per policy (``sample_minibatch``,
    ``update_priorities``). Before that, agents act uniformly at random.
    """

    def __init__(
        self,
        env: EnvSettings | Callable[[], Any],
        policy_mapping_fn: Callable[[str], str],
        policy_spaces: dict[str, tuple[gym.Space, gym.Space]],
        replay: ReplaySettings | None = None,
        *,
        gamma: float,
        sampling_device: str = "cpu",
    ) -> None:
        super().__init__(env, policy_mapping_fn, sampling_device)
        replay = checked_replay(replay, 1, gamma)
        if replay.replay_frame_stack is True:
            raise ValueError("replay_frame_stack=True: a multi-agent replay stores whole transitions")
        self.policy_spaces = dict(policy_spaces)
        self.buffer_size, self.learning_starts = replay.buffer_size, replay.learning_starts
        self.train_freq, self.n_step, self.gamma = replay.train_freq, replay.n_step, gamma
        self.prioritized_replay = replay.prioritized_replay
        self.alpha = replay.prioritized_replay_alpha if replay.prioritized_replay else 0.0
        self.eps = replay.prioritized_replay_eps
        self.checkpoint_replay_buffer = replay.checkpoint_replay_buffer
        self.buffers: dict[str, TransitionReplayBuffer] = {}
        self.env_steps = 0  # this process's env steps, which learning_starts counts

    def on_envs_ready(self) -> None:
        seed = rank_seed(self.seed, self.rank)
        self.buffers = {
            pid: TransitionReplayBuffer(self.buffer_size, *spaces, self.alpha, self.eps,
                                        seed=None if seed is None else seed + k)
            for k, (pid, spaces) in enumerate(sorted(self.policy_spaces.items()))
        }
        self._windows: dict[tuple[int, str], NStepWindows] = {}
        self._open: set[tuple[int, str]] = set()
        self.env_steps = 0

    def _window(self, i: int, agent: str, policy_id: str) -> NStepWindows:
        window = self._windows.get((i, agent))
        if window is None:  # one add per agent step, plus one reset row per episode end, between drains
            window = self._windows[(i, agent)] = NStepWindows(
                *self.policy_spaces[policy_id], 1, 2 * self.train_freq, self.n_step, self.gamma)
        return window

    # ------------------------------------------------------------ stepping
    def acting_policies(self) -> dict[str, ExploringPolicy]:
        if self.env_steps >= self.starts:
            return super().acting_policies()
        # uniform random actions (epsilon 1) while the buffer fills
        device = self.sampling_device
        return {pid: ExploringPolicy(self.module.sampling_policy(pid, device), {"epsilon": 1.0}, device)
                for pid in self.module.policies}

    def record(self, i: int, agent: str, policy_id: str, row: dict[str, Any], next_obs: Any) -> None:
        window = self._window(i, agent, policy_id)
        terminated, truncated = row[SampleBatch.TERMINATEDS], row[SampleBatch.TRUNCATEDS]
        window.add(row[SampleBatch.OBS][None], row[SampleBatch.ACTIONS][None], [row[SampleBatch.REWARDS]],
                   [terminated], [truncated], [True])
        if terminated or truncated:
            # the agent left: a reset row carries its final observation and completes its windows
            final = row[SampleBatch.OBS] if next_obs is None else next_obs
            window.add(np.asarray(final)[None], np.zeros_like(window._actions[0]), [0.0], [False], [False], [False])
            self._open.discard((i, agent))
        else:
            self._open.add((i, agent))

    def open_agents(self, i: int) -> list[str]:
        return sorted(agent for (j, agent) in self._open if j == i)

    def drop(self, i: int, agent: str, policy_id: str, last_obs: Any) -> None:
        window = self._window(i, agent, policy_id)
        window.add(np.asarray(last_obs)[None], np.zeros_like(window._actions[0]), [0.0], [False], [False],
                   [True])
        window.end_episodes()  # that row becomes the reset row; the step before it, truncated
        self._open.discard((i, agent))

    def sample(self) -> MultiAgentBatch:
        """Step every env ``train_freq`` times; completed transitions go into their policy's replay."""
        assert self.module is not None and self.envs is not None, "call setup() first"
        start = time.perf_counter()
        env_steps = agent_steps = 0
        policies = self.acting_policies()
        with torch.inference_mode():
            for _ in range(self.train_freq):
                stepped, acted = self.sampler.step(policies, self)
                env_steps += stepped
                agent_steps += acted
        self.env_steps += env_steps
        completed: dict[str, list[SampleBatch]] = {}
        for (_, agent), window in sorted(self._windows.items()):
            transitions = window.drain()
            if transitions.count:
                completed.setdefault(self.policy_mapping_fn(agent), []).append(transitions)
        for policy_id, parts in completed.items():
            self.buffers[policy_id].add({k: torch.cat([p[k] for p in parts]) for k in TransitionReplayBuffer.COLUMNS})
        info = {**self.episode_info(), "agent_steps_sampled": agent_steps, "sample_time_s": time.perf_counter() - start,
                "buffer_size": sum(len(b) for b in self.buffers.values())}
        ready = self.env_steps >= self.starts
        return MultiAgentBatch({}, env_steps=env_steps, info=info, replay=self if ready else None)

    # ------------------------------------------------------------ the learner's side
    def count(self, policy_id: str) -> int:
        """Transitions of ``policy_id`` held on this process."""
        return len(self.buffers[policy_id])

    def sample_minibatch(self, policy_id: str, batch_size: int, beta: float | None = None) -> SampleBatch:
        """``batch_size`` transitions of ``policy_id`` (with replacement), with ``batch_indexes``
        and importance ``weights`` (ones for uniform replay)."""
        return self.buffers[policy_id].sample(batch_size, beta=beta if self.prioritized_replay else 0.0)

    def update_priorities(self, policy_id: str, batch_indexes: Any, td_error: Any) -> None:
        if self.prioritized_replay:
            self.buffers[policy_id].update_priorities(batch_indexes, td_error)

    # ------------------------------------------------------------ checkpoints
    def local_state(self) -> dict[str, Any]:
        state = super().local_state()
        state["env_steps"] = self.env_steps
        state["windows"] = {f"{i}/{agent}": w.state_dict(tensors=True) for (i, agent), w in self._windows.items()}
        state["open"] = [f"{i}/{agent}" for i, agent in sorted(self._open)]
        keep = keeps_replay(self.checkpoint_replay_buffer, sum(b.nbytes for b in self.buffers.values()))
        state["buffers"] = {pid: b.state_dict(tensors=True) for pid, b in self.buffers.items()} if keep else None
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        def key(text: str) -> tuple[int, str]:
            i, agent = text.split("/", 1)
            return int(i), agent

        self._windows = {}
        for name, window_state in state["windows"].items():
            i, agent = key(name)
            self._window(i, agent, self.policy_mapping_fn(agent)).load_state_dict(window_state)
        self._open = {key(name) for name in state["open"]}
        if state["buffers"] is not None:
            for pid, buffer_state in state["buffers"].items():
                self.buffers[pid].load_state_dict(buffer_state)
            self.env_steps = int(state["env_steps"])
