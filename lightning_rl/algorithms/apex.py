"""Ape-X DQN (Horgan et al. 2018, https://arxiv.org/abs/1803.00933): distributed prioritized
experience replay. Sampler workers explore with fixed per-worker epsilons and give their
n-step transitions initial priorities; the learner replays the prioritized buffer."""

from __future__ import annotations

from typing import Any, ClassVar

from lightning_rl.algorithms.common import LearnerQueue, SamplerWorkers
from lightning_rl.algorithms.dqn import DQN
from lightning_rl.data.async_replay import ApexDataModule


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

    Args:
        env: gymnasium id (``"module:Id"`` imports ``module`` first) or a callable returning a ``gymnasium.Env``.
        num_envs: envs per sampler worker (of the learner process with ``num_workers=0``).
        rollout_fragment_length: env steps per env in one worker fragment (inserted into the replay whole).
        buffer_size: replay capacity in transitions (per learner process).
        learning_starts: env steps inserted into the replay (per learner process) before learning starts.
        training_intensity: replayed rows per inserted env step (sets ``num_gradient_steps``); give it or that.
        num_gradient_steps: gradient steps per iteration; give it or ``training_intensity`` (neither: intensity 16).
        lr_schedule: ``constant``/``None`` (the default: unlike DQN's), ``linear`` (to 0 at ``total_env_steps``) or
            ``[[env_step, lr], ...]``.
        target_network_update_freq: trained rows (over all ranks) between target-network updates.
        epsilon: worker ``i`` of ``N`` explores with ``epsilon ** (1 + epsilon_alpha * i / (N - 1))``, fixed.
        epsilon_alpha: spread of the workers' epsilons (see ``epsilon``).
    """

    setting_defaults: ClassVar[dict[str, Any]] = dict(
        num_envs=4, total_env_steps=100_000, learner_queue_size=4, target_network_update_freq=32_000,
    )
    # the workers sample (with their own epsilons) and the replay is always prioritized
    fixed_settings: ClassVar[dict[str, Any]] = dict(
        sampling_device="cpu", train_freq=64, tau=1.0, prioritized_replay=True, epsilon_start=1.0, epsilon_end=0.02,
        epsilon_timesteps=10_000, policies=None, policy_mapping_fn=None, policies_to_train=None,
        iterations_per_step=1,
    )

    def __init__(
        self,
        *,
        rollout_fragment_length: int = 16,
        training_intensity: float | None = None,
        num_gradient_steps: int | None = None,
        epsilon: float = 0.4,
        epsilon_alpha: float = 7.0,
        **settings: Any,
    ) -> None:
        super().__init__(num_gradient_steps=num_gradient_steps or 1, **settings)
        self.save_hyperparameters()
        self.default_datamodule = ApexDataModule(
            self.env_spec, num_envs=self.num_envs, rollout_fragment_length=rollout_fragment_length,
            buffer_size=settings["buffer_size"], learning_starts=settings["learning_starts"],
            n_step=settings["n_step"], gamma=self.gamma, prioritized_replay_alpha=settings["prioritized_replay_alpha"],
            prioritized_replay_eps=settings["prioritized_replay_eps"], epsilon=epsilon, epsilon_alpha=epsilon_alpha,
            vectorization=self.vectorization, seed=self.seed, iterations_per_epoch=self.iterations_per_epoch,
            check_finite=self.check_finite, checkpoint_replay_buffer=settings["checkpoint_replay_buffer"],
            replay_frame_stack=settings["replay_frame_stack"], **self.worker_settings, **self.queue_settings,
        )
        if training_intensity is not None and num_gradient_steps is not None:
            raise ValueError("give training_intensity or num_gradient_steps, not both")
        if num_gradient_steps is None and training_intensity is None:
            training_intensity = 16.0
        if training_intensity is not None:
            if training_intensity <= 0:
                raise ValueError(f"training_intensity must be positive, got {training_intensity}")
            per_iteration = self.default_datamodule.train_batch_size
            self.num_gradient_steps = max(1, round(training_intensity * per_iteration / self.train_batch_size))
        self.training_intensity = training_intensity

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
