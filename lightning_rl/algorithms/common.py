"""Groups of settings several algorithms take, each declared once (``settings.SettingsGroup``):
an algorithm takes a group by inheriting it, and its signature shows the group's settings."""

from __future__ import annotations

from typing import Any

from lightning_rl.settings import SettingsGroup


class ActorCriticSettings(SettingsGroup):
    """A policy and a value function learned from fragments of ``rollout_fragment_length``
    steps per env (PPO, A2C, IMPALA, APPO, A3C)."""

    def __init__(
        self,
        *,
        rollout_fragment_length: int = 32,
        lambda_: float = 0.95,
        vf_loss_coeff: float = 0.5,
        entropy_coeff: float = 0.0,
        vf_share_layers: bool = False,
        log_std_init: float = 0.0,
        **settings: Any,
    ) -> None:
        super().__init__(**settings)
        if not 0.0 <= lambda_ <= 1.0:
            raise ValueError(f"lambda_ must be in [0, 1], got {lambda_}")
        self.rollout_fragment_length, self.lambda_ = rollout_fragment_length, lambda_
        self.vf_loss_coeff, self.entropy_coeff = vf_loss_coeff, entropy_coeff
        # what ActorCritic (nn/models.py) is built with, beside the spaces
        self.network_settings: dict[str, Any] = dict(
            hiddens=self.hiddens, activation=self.activation, vf_share_layers=vf_share_layers,
            log_std_init=log_std_init, encoder=self.encoder,
        )


class RecurrentSettings(SettingsGroup):
    """An LSTM policy (``nn/recurrent.py``) instead of the MLP one, with ``use_lstm``."""

    def __init__(
        self,
        *,
        use_lstm: bool = False,
        lstm_cell_size: int = 64,
        max_seq_len: int | None = 16,
        lstm_use_prev_action: bool = False,
        lstm_use_prev_reward: bool = False,
        **settings: Any,
    ) -> None:
        super().__init__(**settings)
        if use_lstm and self.multi_agent:
            raise ValueError("use_lstm with a multi-agent (PettingZoo) env is not supported yet")
        self.use_lstm = use_lstm
        self.max_seq_len = max_seq_len if use_lstm else None
        # what RecurrentActorCritic takes beside ActorCritic's settings
        self.recurrent_settings: dict[str, Any] = dict(
            lstm_cell_size=lstm_cell_size, lstm_use_prev_action=lstm_use_prev_action,
            lstm_use_prev_reward=lstm_use_prev_reward,
        ) if use_lstm else {}


class SamplerWorkers(SettingsGroup):
    """Sampler workers beside the learner (IMPALA, APPO, APEX, A3C): child processes, or Ray
    actors on any node of a Ray cluster (``data/workers/``)."""

    def __init__(
        self,
        *,
        num_workers: int = 2,
        sampler_timeout_s: float = 60.0,
        restart_failed_workers: bool = False,
        sampler_backend: str = "processes",
        ray_address: str | None = None,
        num_cpus_per_worker: float | None = None,
        custom_resources_per_worker: dict[str, float] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(**settings)
        self.worker_settings: dict[str, Any] = dict(
            num_workers=num_workers, sampler_timeout_s=sampler_timeout_s,
            restart_failed_workers=restart_failed_workers, sampler_backend=sampler_backend, ray_address=ray_address,
            num_cpus_per_worker=num_cpus_per_worker, custom_resources_per_worker=custom_resources_per_worker,
        )


class LearnerQueue(SettingsGroup):
    """The queue of worker fragments before the learner and the weights sent back (IMPALA,
    APPO, APEX)."""

    def __init__(
        self,
        *,
        learner_queue_size: int = 16,
        broadcast_interval: int = 1,
        max_policy_lag: int | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(**settings)
        self.queue_settings: dict[str, Any] = dict(
            learner_queue_size=learner_queue_size, broadcast_interval=broadcast_interval,
            max_policy_lag=max_policy_lag,
        )
