"""The replay settings every replay DataModule checks (``checkpoint_replay_buffer``, the sizes
of the ring), and the replay buffers by the names they had here: the ring (``ring.py``), its
n-step windows (``n_step.py``), prioritized replay (``prioritized.py``), whole transitions
(``transitions.py``) and frame storage (``frames.py``, ``packed_frames.py``)."""

from __future__ import annotations

from typing import Any

from lightning_rl.data.buffers.prioritized import PrioritizedReplayBuffer
from lightning_rl.data.buffers.ring import ReplayBuffer
from lightning_rl.data.buffers.transitions import NStepWindows, TransitionReplayBuffer

__all__ = ["REPLAY_CHECKPOINT_AUTO_BYTES", "NStepWindows", "PrioritizedReplayBuffer", "ReplayBuffer",
           "TransitionReplayBuffer", "check_checkpoint_replay_setting", "check_replay_settings", "keeps_replay"]

REPLAY_CHECKPOINT_AUTO_BYTES = 2**30  # checkpoint_replay_buffer="auto" keeps buffers of at most this many bytes


def check_checkpoint_replay_setting(value: Any) -> None:
    """``checkpoint_replay_buffer`` is ``True``, ``False`` or ``"auto"``."""
    if not (isinstance(value, bool) or value == "auto"):
        raise ValueError(f"checkpoint_replay_buffer must be True, False or 'auto', got {value!r}")


def keeps_replay(setting: bool | str, nbytes: int) -> bool:
    """Whether a checkpoint holds a replay of ``nbytes`` (all its arrays, per process):
    ``checkpoint_replay_buffer`` itself, or with ``"auto"`` at most ``REPLAY_CHECKPOINT_AUTO_BYTES``
    (1 GiB)."""
    return nbytes <= REPLAY_CHECKPOINT_AUTO_BYTES if setting == "auto" else bool(setting)


def check_replay_settings(buffer_size: int, num_envs: int, train_freq: int, learning_starts: int, n_step: int,
                          gamma: float, prioritized_replay: bool, alpha: float, eps: float) -> None:
    """Validate a replay DataModule's settings before any buffer is built."""
    if train_freq < 1:
        raise ValueError(f"train_freq must be >= 1, got {train_freq}")
    if learning_starts < 0:
        raise ValueError(f"learning_starts must be >= 0, got {learning_starts}")
    ReplayBuffer.check_config(buffer_size, num_envs, n_step, gamma)
    if prioritized_replay:
        PrioritizedReplayBuffer.check_priority_config(alpha, eps)
