"""Groups of settings, each declared once: dataclass mixins of fields (``settings.settings``).
``Algorithm`` takes ``EnvSettings`` and the first four here (every algorithm's settings, with
PPO's defaults); an algorithm takes the others by inheriting them. The groups the data layer
reads (``EnvSettings``, ``ReplaySettings``, ``SamplerWorkers``, ``LearnerQueue``) are declared
in ``data/settings.py`` and offered here too. An algorithm's signature, its hyperparameters
and ``--model.help`` show the groups' settings with the algorithm's own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_rl.data.settings import EnvSettings, LearnerQueue, ReplaySettings, SamplerWorkers
from lightning_rl.evaluation import DEFAULT_MAX_EPISODE_STEPS
from lightning_rl.nn.encoders import Activation, EncoderSpec
from lightning_rl.policies import PolicyMapping
from lightning_rl.settings import Schedule, interval, positive, setting, settings

__all__ = ["ActorCriticSettings", "EnvSettings", "LearnerQueue", "MultiAgentSettings", "NetworkSettings",
           "OptimizationSettings", "RecurrentSettings", "ReplaySettings", "RunSettings", "SamplerWorkers"]


@settings
class RunSettings:
    """How a run goes: its process settings, evaluation, checks and compilation (every
    algorithm)."""

    num_cpu_threads: int | None = setting(default=1, resumable=True)
    """torch intra-op threads during ``fit`` (restored after; one is fastest for small MLPs, as rl-zoo sets);
    ``None`` leaves torch's setting alone."""
    cpu_affinity: bool = setting(default=True, resumable=True)
    """under DDP on CPU, pin each local rank to its own share of the CPUs during ``fit`` (Linux)."""
    evaluation_interval: int | None = setting(default=None, check=positive, resumable=True)
    """epochs between greedy evaluations (Lightning validation, ``val/*``); ``None``: none."""
    evaluation_num_episodes: int = setting(default=10, check=positive, resumable=True)
    """greedy episodes per evaluation (validation and test), one per env."""
    evaluation_max_episode_steps: int = setting(default=DEFAULT_MAX_EPISODE_STEPS, check=positive, resumable=True)
    """steps after which an evaluation, test or ``record`` episode is cut (its return so far counted, with a
    warning naming the env) when the env sets no time limit of its own."""
    compile: bool = setting(default=False, resumable=True)  # type: ignore[assignment]  # nn.Module.compile
    """run each update step as compiled graphs (same results up to rounding; else eager, with a warning)."""


@settings
class OptimizationSettings:
    """The learning rate and its schedule, the discount and the gradient clip (every
    algorithm)."""

    lr: float = setting(default=3e-4, check=positive)
    """Adam's learning rate."""
    lr_schedule: Schedule = None
    """``constant``/``None``, ``linear`` (to 0 at ``total_env_steps``) or ``[[env_step, lr], ...]``."""
    gamma: float = setting(default=0.99, check=interval("(0, 1]"))
    """discount factor in (0, 1]."""
    grad_clip: float | None = setting(default=0.5, check=positive)
    """maximum global norm of the gradients (``None``: no clipping)."""


@settings
class NetworkSettings:
    """The shape of the networks (every algorithm)."""

    hiddens: Sequence[int] = (64, 64)
    """MLP layer sizes of the policy and of the value network (after ``encoder``)."""
    activation: Activation = "tanh"
    """the MLP's activation: a name such as ``tanh``, an import path or an ``nn.Module`` class."""
    encoder: EncoderSpec = None
    """network before the MLP: an ``nn.Module`` class or factory of the observation space, or an import path."""


@settings
class MultiAgentSettings:
    """The policies of a multi-agent (PettingZoo) env and the agents they act for (every
    algorithm; those without multi-agent support fix them with ``init=False``)."""

    policies: Sequence[str] | dict[str, dict[str, Any]] | None = None  # type: ignore[assignment]  # then the module
    """multi-agent: policy ids, or ``{id: per-policy settings such as hiddens}``."""
    policy_mapping_fn: PolicyMapping | None = None
    """multi-agent: agent id -> policy id, a callable or an ``{agent: policy}`` table."""
    policies_to_train: Sequence[str] | None = None
    """multi-agent: the policies that learn (``None``: all)."""


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
