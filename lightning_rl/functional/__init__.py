"""Pure math shared by the algorithms. Every function states the shapes it takes.

Time-major arrays are ``[T, B]``: ``T`` steps of ``B`` parallel envs. ``returns.py``: returns
and advantages; ``losses.py``: loss terms, their targets, statistics and schedules.
"""

from lightning_rl.functional.losses import (
    a2c_loss,
    clipped_double_q_target,
    double_q_target,
    explained_variance,
    huber_loss,
    masked_mean,
    moments,
    ornstein_uhlenbeck_step,
    piecewise_linear,
    ppo_surrogate_loss,
    smoothed_target_actions,
    soft_update_,
    standardized,
    value_loss,
)
from lightning_rl.functional.returns import (
    discounted_returns,
    gae,
    gae_batch,
    gae_segments,
    gae_sequences,
    n_step_returns,
    vtrace,
)

__all__ = [
    "a2c_loss",
    "clipped_double_q_target",
    "discounted_returns",
    "double_q_target",
    "explained_variance",
    "gae",
    "gae_batch",
    "gae_segments",
    "gae_sequences",
    "huber_loss",
    "masked_mean",
    "moments",
    "n_step_returns",
    "ornstein_uhlenbeck_step",
    "piecewise_linear",
    "ppo_surrogate_loss",
    "smoothed_target_actions",
    "soft_update_",
    "standardized",
    "value_loss",
    "vtrace",
]
