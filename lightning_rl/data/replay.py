"""Off-policy sampling: a DataModule that owns vector envs and a replay buffer."""

from __future__ import annotations

import time
from typing import Any

import torch

from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from lightning_rl.data.base import EnvDataModule, rank_seed
from lightning_rl.data.buffers.frames import check_frame_stack_setting, use_frame_storage
from lightning_rl.data.buffers.prioritized import PrioritizedReplayBuffer
from lightning_rl.data.buffers.replay_buffer import check_checkpoint_replay_setting, check_replay_settings, keeps_replay
from lightning_rl.data.buffers.ring import ReplayBuffer
from lightning_rl.data.envs.make import EnvSpec
from lightning_rl.data.samplers.engine import ExploringPolicy
from lightning_rl.data.settings import EnvSettings, ReplaySettings
from lightning_rl.settings import check_group


def checked_replay(replay: ReplaySettings | None, num_envs: int, gamma: float) -> ReplaySettings:
    """``replay`` (``None``: the defaults), its values checked with ``num_envs`` and ``gamma``."""
    replay = ReplaySettings() if replay is None else replay
    check_group(replay)
    check_replay_settings(replay.buffer_size, num_envs, replay.train_freq, replay.learning_starts, replay.n_step,
                          gamma, replay.prioritized_replay, replay.prioritized_replay_alpha,
                          replay.prioritized_replay_eps)
    check_checkpoint_replay_setting(replay.checkpoint_replay_buffer)
    check_frame_stack_setting(replay.replay_frame_stack)
    return replay


class ReplayDataModule(EnvDataModule):
    """Each iteration: ``train_freq`` vector-env steps into the replay buffer; the learner then
    draws its minibatches from here: one draw per gradient step with prioritized replay, every
    minibatch of the iteration in one draw with uniform replay (it does not depend on the updates).

    The batch a training step receives carries no rows: ``batch.replay`` is this DataModule
    once learning may start, else ``None``. With prioritized replay the learner calls
    ``sample_minibatch`` for each gradient step and gives the ``td_error`` of exactly those rows back through
    ``update_priorities`` before it samples the next — sample, update, priorities, as the
    reference's replay loop does. Learning may start after ``learning_starts`` env steps
    (per process) and ``n_step + 1`` vector steps: counts that are the same on every DDP rank,
    so all ranks start together; from then on every rank's buffer has sampleable rows, and a
    minibatch larger than what is stored is drawn with replacement (as Stable-Baselines3 does).

    Args:
        env: the env settings, as ``EnvDataModule`` takes them.
        replay: the replay settings (``data/settings.ReplaySettings``: ``buffer_size``,
            ``learning_starts``, ``train_freq`` vector-env steps per iteration, ``n_step``,
            proportional prioritized replay (Schaul et al. 2016) and its ``alpha`` and ``eps``,
            ``checkpoint_replay_buffer``, ``replay_frame_stack``); ``None``: their defaults.
            Prioritized replay's importance exponent beta is the learner's
            (``sample_minibatch(beta=...)``); ``frame_stack`` is what ``replay_frame_stack``
            decided (``frames.use_frame_storage``), once the envs are open; a buffer kept in
            checkpoints (``keeps_replay``) resumes exactly, else a resumed run starts with an
            empty buffer and waits ``learning_starts`` again.
        gamma: discount of the n-step returns (``discounts`` carries ``gamma ** k``).
        sampling_device: as ``EnvDataModule``'s.
    """

    def __init__(
        self,
        env: EnvSettings | EnvSpec,
        replay: ReplaySettings | None = None,
        *,
        gamma: float,
        sampling_device: str = "cpu",
    ) -> None:
        super().__init__(env, sampling_device)
        replay = checked_replay(replay, self.num_envs, gamma)
        self.buffer_size = replay.buffer_size
        self.learning_starts = replay.learning_starts
        self.train_freq = replay.train_freq
        self.n_step = replay.n_step
        self.gamma = gamma
        self.prioritized_replay = replay.prioritized_replay
        self.alpha = replay.prioritized_replay_alpha
        self.eps = replay.prioritized_replay_eps
        self.buffer: ReplayBuffer | None = None
        self.env_steps = 0  # this process's env steps, which learning_starts counts
        self.checkpoint_replay_buffer = replay.checkpoint_replay_buffer
        self.replay_frame_stack = replay.replay_frame_stack
        self.frame_stack: bool | None = None  # decided when the envs open

    def on_envs_ready(self) -> None:
        space = self.envs.single_observation_space
        self.frame_stack = use_frame_storage(self.replay_frame_stack, space, self.envs.metadata)
        kwargs = dict(
            capacity=self.buffer_size, observation_space=space,
            action_space=self.envs.single_action_space, num_envs=self.num_envs, n_step=self.n_step,
            gamma=self.gamma, seed=rank_seed(self.seed, self.rank), frame_stack=self.frame_stack,
        )
        if self.prioritized_replay:
            self.buffer = PrioritizedReplayBuffer(**kwargs, alpha=self.alpha, eps=self.eps)
        else:
            self.buffer = ReplayBuffer(**kwargs)
        self.env_steps = 0

    @property
    def ready(self) -> bool:
        """Learning may start: identical on every rank (see the class docstring)."""
        return self.env_steps >= self.starts and self.buffer.num_added > self.n_step

    def sample(self, policy_id: str = DEFAULT_POLICY_ID) -> MultiAgentBatch:
        """Step the envs ``train_freq`` times into the buffer (random actions before
        ``learning_starts``, else the module's exploring policy). A dev run (``fast_dev_run``) acts
        with the policy from the start and steps on until the buffer can be sampled."""
        assert self.module is not None and self.envs is not None, "call setup() first"
        start = time.perf_counter()
        agent_steps = rows = 0
        policy = ExploringPolicy(self.module.sampling_policy(policy_id, self.sampling_device),
                                 self.module.exploration_kwargs(policy_id), self.sampling_device)
        with torch.inference_mode():
            while rows < self.train_freq or (self.dev_run and not self.ready):
                rows += 1
                if self.env_steps < self.starts:
                    actions = self.envs.action_space.sample()
                else:
                    out = policy.act(torch.tensor(self.sampler.obs), self.generator, {})
                    actions = out[SampleBatch.ACTIONS].cpu().numpy()
                obs, rewards, terminateds, truncateds, valid = self.sampler.step(actions)
                if (ended := terminateds | truncateds).any():
                    policy.episodes_ended(ended)
                self.buffer.add(obs, actions, rewards, terminateds, truncateds, valid)
                agent_steps += int(valid.sum())
                self.env_steps += self.num_envs
        info = self.episode_info()
        info["sample_time_s"] = time.perf_counter() - start
        info["buffer_size"] = len(self.buffer)
        info["agent_steps_sampled"] = agent_steps
        return MultiAgentBatch({}, env_steps=rows * self.num_envs, info=info,
                               replay=self if self.ready else None)

    def sample_minibatch(self, policy_id: str, batch_size: int, beta: float | None = None) -> SampleBatch:
        """``batch_size`` n-step transitions with ``batch_indexes`` and importance ``weights``
        (``beta`` is the importance exponent of prioritized replay; ignored for uniform)."""
        if self.prioritized_replay:
            return self.buffer.sample(batch_size, beta=beta)
        return self.buffer.sample(batch_size)

    def update_priorities(self, policy_id: str, batch_indexes: Any, td_error: Any) -> None:
        """Set the priorities of exactly the rows ``sample_minibatch`` returned (no-op for uniform replay)."""
        if self.prioritized_replay:
            self.buffer.update_priorities(batch_indexes, td_error)

    def local_state(self) -> dict[str, Any]:
        state = super().local_state()
        state["env_steps"] = self.env_steps
        keep = keeps_replay(self.checkpoint_replay_buffer, self.buffer.nbytes)
        state["buffer"] = self.buffer.state_dict(tensors=True) if keep else None
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        if state.get("buffer") is not None:
            self.buffer.load_state_dict(state["buffer"])
            self.env_steps = int(state["env_steps"])
        else:  # an empty buffer; env_steps restarts so learning_starts fills it again
            self.on_envs_reset()

    def describe_restored(self, state: dict[str, Any]) -> str:
        done = super().describe_restored(state)
        if state.get("buffer") is None:
            return (f"{done}, not the replay buffer (the checkpoint holds none: checkpoint_replay_buffer), so "
                    f"learning waits for learning_starts={self.learning_starts} env steps again")
        stored = min(self.buffer.num_added, self.buffer.rows) * self.num_envs
        return f"{done}, the replay buffer ({stored} env steps) and its env step count ({self.env_steps})"

    def on_envs_reset(self) -> None:
        if self.buffer is not None:
            self.buffer.end_episodes()  # no n-step window may join the old stream to the new
