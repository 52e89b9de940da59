"""Callbacks that observe training and log what they see; none changes the model."""

from lightning_rl.callbacks.episodes import RolloutMetricsCallback
from lightning_rl.callbacks.final_checkpoint import FinalCheckpoint
from lightning_rl.callbacks.interrupt import InterruptCheckpoint
from lightning_rl.callbacks.known_warnings import KnownWarnings
from lightning_rl.callbacks.learner_info import LearnerInfoCallback, LogCadence
from lightning_rl.callbacks.metrics import MetricsWriter
from lightning_rl.callbacks.progress import EnvStepProgressBar

__all__ = [
    "EnvStepProgressBar",
    "FinalCheckpoint",
    "InterruptCheckpoint",
    "KnownWarnings",
    "LearnerInfoCallback",
    "LogCadence",
    "MetricsWriter",
    "RolloutMetricsCallback",
]
