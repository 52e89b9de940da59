"""Ape-X DQN (Horgan et al. 2018, https://arxiv.org/abs/1803.00933): distributed prioritized
experience replay. Sampler workers explore with fixed per-worker epsilons and give their
n-step transitions initial priorities; the learner replays the prioritized buffer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_rl.algorithms.dqn import DQN
from lightning_rl.data.async_replay import ApexDataModule
from lightning_rl.data.envs import EnvSpec
from lightning_rl.settings import Schedule


class APEX(DQN):
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
        hiddens: MLP layer sizes of the Q-network.
        activation: the MLP's activation: a name such as ``relu`` or an import path.
        target_network_update_freq: trained rows (over all ranks) between target-network updates.
        epsilon: worker ``i`` of ``N`` explores with ``epsilon ** (1 + epsilon_alpha * i / (N - 1))``, fixed.
        epsilon_alpha: spread of the workers' epsilons (see ``epsilon``).
    """

    def __init__(
        self,
        env: EnvSpec = "CartPole-v1",
        env_kwargs: dict[str, Any] | None = None,
        num_workers: int = 2,
        num_envs: int = 4,
        rollout_fragment_length: int = 16,
        learner_queue_size: int = 4,
        broadcast_interval: int = 1,
        max_policy_lag: int | None = None,
        sampler_timeout_s: float = 60.0,
        restart_failed_workers: bool = False,
        total_env_steps: int | None = 100_000,
        iterations_per_epoch: int = 50,
        seed: int | None = None,
        vectorization: str = "auto",
        num_cpu_threads: int | None = 1,
        cpu_affinity: bool = True,
        evaluation_interval: int | None = None,
        evaluation_num_episodes: int = 10,
        check_finite: bool = True,
        compile: bool = False,
        lr: float = 1e-3,
        lr_schedule: Schedule = None,
        gamma: float = 0.99,
        buffer_size: int = 100_000,
        learning_starts: int = 1000,
        training_intensity: float | None = None,
        num_gradient_steps: int | None = None,
        train_batch_size: int = 64,
        n_step: int = 3,
        grad_clip: float | None = 10.0,
        hiddens: Sequence[int] = (256, 256),
        activation: str = "relu",
        double_q: bool = True,
        dueling: bool = True,
        target_network_update_freq: int = 32_000,
        epsilon: float = 0.4,
        epsilon_alpha: float = 7.0,
        prioritized_replay_alpha: float = 0.6,
        prioritized_replay_beta: float = 0.4,
        prioritized_replay_eps: float = 1e-6,
        checkpoint_replay_buffer: bool = True,
    ) -> None:
        super().__init__(
            env=env, env_kwargs=env_kwargs,
            num_envs=num_envs, total_env_steps=total_env_steps, iterations_per_epoch=iterations_per_epoch,
            seed=seed, vectorization=vectorization, num_cpu_threads=num_cpu_threads, cpu_affinity=cpu_affinity,
            evaluation_interval=evaluation_interval, evaluation_num_episodes=evaluation_num_episodes,
            check_finite=check_finite, compile=compile, lr=lr, lr_schedule=lr_schedule, gamma=gamma,
            buffer_size=buffer_size, learning_starts=learning_starts, num_gradient_steps=num_gradient_steps or 1,
            train_batch_size=train_batch_size, n_step=n_step, grad_clip=grad_clip, hiddens=hiddens,
            activation=activation, double_q=double_q, dueling=dueling,
            target_network_update_freq=target_network_update_freq, prioritized_replay=True,
            prioritized_replay_alpha=prioritized_replay_alpha, prioritized_replay_beta=prioritized_replay_beta,
            prioritized_replay_eps=prioritized_replay_eps, checkpoint_replay_buffer=checkpoint_replay_buffer,
        )
        self.save_hyperparameters()
        self.default_datamodule = ApexDataModule(
            self.env_spec, num_workers=num_workers, num_envs=num_envs, rollout_fragment_length=rollout_fragment_length,
            buffer_size=buffer_size, learning_starts=learning_starts, n_step=n_step, gamma=gamma,
            prioritized_replay_alpha=prioritized_replay_alpha, prioritized_replay_eps=prioritized_replay_eps,
            epsilon=epsilon, epsilon_alpha=epsilon_alpha, learner_queue_size=learner_queue_size,
            broadcast_interval=broadcast_interval, max_policy_lag=max_policy_lag,
            sampler_timeout_s=sampler_timeout_s, restart_failed_workers=restart_failed_workers,
            vectorization=vectorization, seed=seed, iterations_per_epoch=iterations_per_epoch,
            check_finite=check_finite, checkpoint_replay_buffer=checkpoint_replay_buffer,
        )
        if training_intensity is not None and num_gradient_steps is not None:
            raise ValueError("give training_intensity or num_gradient_steps, not both")
        if num_gradient_steps is None and training_intensity is None:
            training_intensity = 16.0
        if training_intensity is not None:
            if training_intensity <= 0:
                raise ValueError(f"training_intensity must be positive, got {training_intensity}")
            per_iteration = self.default_datamodule.train_batch_size
            self.num_gradient_steps = max(1, round(training_intensity * per_iteration / train_batch_size))
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
