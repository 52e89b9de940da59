"""An algorithm's own part of a checkpoint (``checkpoint["lightning_rl"]``): its counters and
random state per rank, its budget and the schedules derived from it, restored on resume."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch
from pytorch_lightning.utilities import rank_zero_info

from lightning_rl.checkpoint import builtin_algorithm, class_path
from lightning_rl.checkpoint_data import pack_rank_states, unpack_rank_state
from lightning_rl.functional import piecewise_linear

if TYPE_CHECKING:
    import pytorch_lightning as pl


class Stateful(Protocol):
    """What an algorithm's checkpoint state is read from and restored into (every ``Algorithm``;
    named here so that ``base.py`` imports this module and not the other way round)."""

    counters: dict[str, int]
    global_counters: dict[str, int]
    shuffle_generator: torch.Generator
    learner_generator: torch.Generator
    total_env_steps: int | None
    budget_counter: str

    @property
    def default_datamodule(self) -> pl.LightningDataModule | None: ...

    def extra_state(self) -> dict[str, Any]: ...

    def load_extra_state(self, state: dict[str, Any]) -> None: ...


# ----------------------------------------------------------------------------- an algorithm's state
def algorithm_state(module: Stateful, interrupted: bool) -> dict[str, Any]:
    """``checkpoint["lightning_rl"]``: plain values and tensors only, so the file loads with
    ``weights_only=True``. What differs between DDP ranks (counters, RNG, the default
    DataModule's envs and replay) is gathered per rank (a DataModule given to the Trainer
    gathers its own)."""
    local = {
        "counters": dict(module.counters),
        "shuffle_generator": module.shuffle_generator.get_state(),
        "learner_generator": module.learner_generator.get_state(),
        "learner_generator_device": module.learner_generator.device.type,
        "torch_rng": torch.get_rng_state(),
    }
    dm = module.default_datamodule
    return {
        "algorithm": class_path(type(module)),
        "base_algorithm": class_path(builtin_algorithm(type(module))),
        "global_counters": dict(module.global_counters),
        "total_env_steps": module.total_env_steps,
        "schedules": {setting: [[float(t), float(v)] for t, v in points]
                      for setting, points, _ in _schedules(module) if points is not None},
        "ranks": pack_rank_states(local, interrupted),
        "datamodule": dm.state_dict() if dm is not None else None,
        **module.extra_state(),
    }


def restore_algorithm_state(module: Stateful, state: dict[str, Any], rank: int, world_size: int,
                            fitting: bool) -> dict[str, Any] | None:
    """Undo ``algorithm_state``: this rank's counters and RNG (an even share of the global
    counters under another world size); torch's global RNG only when ``fitting`` (a resume).
    Returns the default DataModule's state, which waits for the DataModule's setup."""
    module.global_counters.update(state.get("global_counters", {}))
    if fitting and rank == 0:
        say_retimed_schedules(module, state)
    mine = unpack_rank_state(state.get("ranks"), rank, world_size, "counters and RNG", warn=fitting)
    if mine is not None:
        module.counters.update(mine["counters"])
        module.shuffle_generator.set_state(mine["shuffle_generator"])
        if mine.get("learner_generator_device") == module.learner_generator.device.type:  # same kind of device
            module.learner_generator.set_state(mine["learner_generator"])
        if fitting:  # a resumed fit continues the run; loading weights leaves the caller's random state alone
            torch.set_rng_state(mine["torch_rng"])
    else:
        module.counters.update({k: v // world_size for k, v in module.global_counters.items()})
    module.load_extra_state(state)
    return state.get("datamodule")


# ----------------------------------------------------------------------------- schedules at resume
# The schedules an algorithm may have: (setting, attribute holding its points, the value it sets).
SCHEDULES = (
    ("lr_schedule", "lr_points", "lr"),
    ("clip_param_schedule", "clip_points", "clip_param"),
    ("prioritized_replay_beta", "beta_points", "prioritized_replay_beta"),
)


def _schedules(module: Stateful) -> list[tuple[str, list[tuple[float, float]] | None, str]]:
    return [(setting, getattr(module, attr), value) for setting, attr, value in SCHEDULES if hasattr(module, attr)]


def say_retimed_schedules(module: Stateful, state: dict[str, Any]) -> None:
    """A run resumed with another ``total_env_steps`` re-times the schedules derived from it
    (``linear`` ones, ``prioritized_replay_beta``'s annealing): they end at the new budget, as
    SB3's do when ``learn`` continues with a larger ``total_timesteps``. Said in one line, with
    each schedule's old and new end and its value now under both."""
    saved = state.get("schedules")
    if not saved:
        return  # a checkpoint from before schedules were saved, or without any
    step = module.global_counters.get(module.budget_counter, 0)
    changes = []
    for setting, points, value in _schedules(module):
        old = saved.get(setting)
        if old is None or points is None or [[float(t), float(v)] for t, v in points] == old:
            continue
        changes.append(f"{setting} ends at {points[-1][0]:,.0f} (was {old[-1][0]:,.0f}), so {value} is "
                       f"{piecewise_linear(points, step):.3g} (was {piecewise_linear(old, step):.3g})")
    if changes:
        unit = "env steps" if module.budget_counter == "num_env_steps_sampled" else "agent steps"
        was = state.get("total_env_steps")
        rank_zero_info(
            f"{type(module).__name__} resumes at {step:,} {unit} with total_env_steps={_count(module.total_env_steps)} "
            f"(was {_count(was)}); the schedules derived from the budget end at the new one: {'; '.join(changes)}"
        )


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)
