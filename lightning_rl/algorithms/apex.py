"""Ape-X DQN (Horgan et al. 2018, https://arxiv.org/abs/1803.00933): distributed prioritized
experience replay. Sampler workers explore with fixed per-worker epsilons and give their
n-step transitions initial priorities; the learner replays the prioritized buffer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_rl.algorithms.common import LearnerQueue, ReplaySettings, SamplerWorkers
from lightning_rl.algorithms.dqn import DQN
from lightning_rl.data.async_replay import ApexDataModule
from lightning_rl.policies import PolicyMapping
from lightning_rl.settings import Schedule, group_of, positive, setting, settings


@settings
class APEX(SamplerWorkers, LearnerQueue, DQN):
    """DQN (double Q, dueling, n-step, prioritized replay) fed by asynchronous sampler workers.

    Per training iteration: insert ``max(num_workers, 1)`` worker fragments (``num_envs *
    rollout_fragment_length`` env steps each, with the workers' priorities) into the replay,
    then ``num_gradient_steps`` times: sample ``train_batch_size`` rows, one DQN step, update
    the priorities of exactly those rows. The loss is ``DQN``'s.

    ``training_intensity`` sets ``num_gradient_steps`` per iteration to ``round(training_intensity *
    env steps per iteration / train_batch_size)`` (at least 1); with neither given,
    ``training_intensity=16``: the same replay ratio whatever ``num_workers``. The learner queue is
    shorter than IMPALA's: the learner is APEX's bottleneck, and a long queue only makes the
    inserted fragments older (measured: a policy lag of about 25 iterations with 16 and one worker).

    Resume restores the counters, networks, optimizer and (``checkpoint_replay_buffer``) the
    replay; the workers start fresh episodes, so a resumed run is not bit-identical.
    """

    num_envs: int = 4
    """envs per sampler worker (of the learner process with ``num_workers=0``)."""
    total_env_steps: int | None = 100_000
    lr_schedule: Schedule = None
    """``constant``/``None`` (the default: unlike DQN's), ``linear`` (to 0 at ``total_env_steps``) or
    ``[[env_step, lr], ...]``."""
    # the workers sample (with their own epsilons) and the replay is always prioritized; single-agent
    policies: Sequence[str] | dict[str, dict[str, Any]] | None = setting(default=None, init=False)  # type: ignore[assignment]
    policy_mapping_fn: PolicyMapping | None = setting(default=None, init=False)
    policies_to_train: Sequence[str] | None = setting(default=None, init=False)
    sampling_device: str = setting(default="cpu", init=False)
    buffer_size: int = 100_000
    """replay capacity in transitions (per learner process)."""
    learning_starts: int = 1000
    """env steps inserted into the replay (per learner process) before learning starts."""
    train_freq: int = setting(default=64, init=False)
    num_gradient_steps: int | None = None  # type: ignore[assignment]  # None: from training_intensity
    """gradient steps per iteration; give it or ``training_intensity`` (neither: intensity 16)."""
    target_network_update_freq: int = 32_000
    """trained rows (over all ranks) between target-network updates."""
    tau: float = setting(default=1.0, init=False)
    prioritized_replay: bool = setting(default=True, init=False)
    epsilon_start: float = setting(default=1.0, init=False)
    epsilon_end: float = setting(default=0.02, init=False)
    epsilon_timesteps: int = setting(default=10_000, init=False)
    learner_queue_size: int = 4
    rollout_fragment_length: int = 16
    """env steps per env in one worker fragment (inserted into the replay whole)."""
    training_intensity: float | None = setting(default=None, check=positive)
    """replayed rows per inserted env step (sets ``num_gradient_steps``); give it or that."""
    epsilon: float = 0.4
    """worker ``i`` of ``N`` explores with ``epsilon ** (1 + epsilon_alpha * i / (N - 1))``, fixed."""
    epsilon_alpha: float = 7.0
    """spread of the workers' epsilons (see ``epsilon``)."""
    iterations_per_step: int = setting(default=1, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        num_gradient_steps = self.num_gradient_steps
        self.default_datamodule = ApexDataModule(
            self.env_settings(), group_of(ReplaySettings, self), gamma=self.gamma,
            rollout_fragment_length=self.rollout_fragment_length, epsilon=self.epsilon,
            epsilon_alpha=self.epsilon_alpha, workers=group_of(SamplerWorkers, self),
            learner_queue=group_of(LearnerQueue, self),
        )
        training_intensity = self.training_intensity
        if training_intensity is not None and num_gradient_steps is not None:
            raise ValueError("give training_intensity or num_gradient_steps, not both")
        if num_gradient_steps is None and training_intensity is None:
            training_intensity = 16.0
        if training_intensity is not None:
            per_iteration = self.default_datamodule.train_batch_size
            num_gradient_steps = max(1, round(training_intensity * per_iteration / self.train_batch_size))
        self.num_gradient_steps, self.training_intensity = num_gradient_steps, training_intensity

    supports_multi_agent = False  # its workers sample single-agent envs
    lr_schedule_unset = "constant"  # DQN decays its rate; APEX's measured defaults keep it constant

    def exploration_kwargs(self, policy_id: str) -> dict[str, Any]:
        """Worker 0's epsilon: what the learner process samples with when ``num_workers=0``."""
        return {"epsilon": self.default_datamodule.epsilons[0]}

    def target_update_due(self) -> bool:
        """``target_network_update_freq`` trained rows (over all ranks) since the last update."""
        world = self.trainer.world_size if self._trainer is not None else 1
        trained = self.counters["num_grad_updates"] * self.train_batch_size * world
        if trained - self._last_target_update < self.target_network_update_freq:
            return False
        self._last_target_update = trained
        self.counters["num_target_updates"] += 1
        return True
