"""Groups of settings several algorithms take, each declared once: dataclass mixins of fields
(``settings.settings``). An algorithm takes a group by inheriting it; its signature, its
hyperparameters and ``--model.help`` show the group's settings with the algorithm's own."""

from __future__ import annotations

from typing import Any

from lightning_rl.settings import interval, setting, settings


@settings
class ActorCriticSettings:
    """A policy and a value function learned from fragments of ``rollout_fragment_length``
    steps per env (PPO, A2C, IMPALA, APPO, A3C)."""

    rollout_fragment_length: int = 32
    """env steps per env per iteration (the train batch: ``num_envs`` times this)."""
    lambda_: float = setting(default=0.95, check=interval("[0, 1]"))
    """GAE's lambda in [0, 1]."""
    vf_loss_coeff: float = 0.5
    """weight of the value loss."""
    entropy_coeff: float = 0.0
    """weight of the entropy bonus."""
    vf_share_layers: bool = False
    """one MLP trunk for the policy and the value function (else two separate networks)."""
    log_std_init: float = 0.0
    """initial log standard deviation of the Gaussian policy (``Box`` actions)."""

    def network_settings(self) -> dict[str, Any]:
        """What ``ActorCritic`` (``nn/models.py``) is built with, beside the spaces."""
        return dict(hiddens=self.hiddens, activation=self.activation,  # type: ignore[attr-defined]
                    vf_share_layers=self.vf_share_layers, log_std_init=self.log_std_init,
                    encoder=self.encoder)  # type: ignore[attr-defined]


@settings
class RecurrentSettings:
    """An LSTM policy (``nn/recurrent.py``) instead of the MLP one, with ``use_lstm``."""

    use_lstm: bool = False
    """a recurrent policy: an LSTM cell after each MLP encoder."""
    lstm_cell_size: int = 64
    """size of the LSTM cell (``use_lstm``)."""
    max_seq_len: int | None = 16
    """steps per training sequence; divides ``rollout_fragment_length``, at most ``sgd_minibatch_size``."""
    lstm_use_prev_action: bool = False
    """feed the previous action (one-hot for ``Discrete``) to the LSTM."""
    lstm_use_prev_reward: bool = False
    """feed the previous reward to the LSTM."""

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        if self.use_lstm and self.multi_agent:  # type: ignore[attr-defined]
            raise ValueError("use_lstm with a multi-agent (PettingZoo) env is not supported yet")
        if not self.use_lstm:
            self.max_seq_len = None  # no sequences: an MLP policy trains on rows

    def recurrent_settings(self) -> dict[str, Any]:
        """What ``RecurrentActorCritic`` takes beside ``ActorCritic``'s settings (none without ``use_lstm``)."""
        return dict(lstm_cell_size=self.lstm_cell_size, lstm_use_prev_action=self.lstm_use_prev_action,
                    lstm_use_prev_reward=self.lstm_use_prev_reward) if self.use_lstm else {}


@settings
class SamplerWorkers:
    """Sampler workers beside the learner (IMPALA, APPO, APEX, A3C): child processes, or Ray
    actors on any node of a Ray cluster (``data/workers/``)."""

    num_workers: int = 2
    """sampler workers (per rank under DDP); 0 samples in the learner process."""
    sampler_timeout_s: float = setting(default=60.0, resumable=True)
    """seconds the learner waits for data (or a Ray actor's placement) before it raises."""
    restart_failed_workers: bool = setting(default=False, resumable=True)
    """restart a worker that died (with a new seed) instead of raising."""
    sampler_backend: str = setting(default="processes", resumable=True)
    """``processes`` (children of the learner, shared memory) or ``ray`` (Ray actors, any node)."""
    ray_address: str | None = setting(default=None, resumable=True)
    """the Ray cluster the workers join (else ``RAY_ADDRESS``, else a local Ray for the run)."""
    num_cpus_per_worker: float | None = setting(default=None, resumable=True)
    """CPUs each Ray actor asks for (``sampler_backend='ray'``; ``None``: 1)."""
    custom_resources_per_worker: dict[str, float] | None = setting(default=None, resumable=True)
    """custom Ray resources each actor asks for, e.g. ``{'cpu_node': 1}`` (pins workers)."""

    def worker_settings(self) -> dict[str, Any]:
        """The sampler workers' settings, as the worker DataModules take them."""
        return dict(num_workers=self.num_workers, sampler_timeout_s=self.sampler_timeout_s,
                    restart_failed_workers=self.restart_failed_workers, sampler_backend=self.sampler_backend,
                    ray_address=self.ray_address, num_cpus_per_worker=self.num_cpus_per_worker,
                    custom_resources_per_worker=self.custom_resources_per_worker)


@settings
class LearnerQueue:
    """The queue of worker fragments before the learner and the weights sent back (IMPALA,
    APPO, APEX)."""

    learner_queue_size: int = 16
    """fragments that may wait for the learner."""
    broadcast_interval: int = 1
    """training iterations between weight broadcasts to the workers."""
    max_policy_lag: int | None = None
    """drop (and count) fragments sampled over this many iterations before training (``None``: keep)."""

    def queue_settings(self) -> dict[str, Any]:
        """The learner queue's settings, as the worker DataModules take them."""
        return dict(learner_queue_size=self.learner_queue_size, broadcast_interval=self.broadcast_interval,
                    max_policy_lag=self.max_policy_lag)
