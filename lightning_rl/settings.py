"""Checks and schedules shared by the algorithms' settings (validated where each is declared),
and what of them a checkpoint saves."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from lightning_rl.checkpoint import callable_placeholder
from lightning_rl.nn.encoders import activation_hparam, encoder_hparam

Schedule = str | Sequence[Sequence[float]] | None


def resolve_schedule(
    name: str, schedule: Schedule, initial: float, total_env_steps: int | None, unset: str = "constant"
) -> list[tuple[float, float]] | None:
    """``"constant"`` -> no schedule; ``"linear"`` -> ``initial`` down to 0 over
    ``total_env_steps``; a list of ``[env_step, value]`` points -> piecewise linear. ``None`` (not
    set) -> ``unset``, where ``"linear"`` means linear over a budget and constant without one."""
    if schedule is None:
        schedule = "linear" if unset == "linear" and total_env_steps is not None else "constant"
    if schedule == "constant":
        return None
    if schedule == "linear":
        if total_env_steps is None:
            raise ValueError(f"{name}='linear' decays to 0 over total_env_steps, which is None: set total_env_steps "
                             f"or pass {name}='constant'")
        return [(0.0, initial), (float(total_env_steps), 0.0)]
    if isinstance(schedule, str):
        raise ValueError(f"{name} must be 'constant', 'linear' or a list of [env_step, value], got {schedule!r}")
    points = [(float(t), float(v)) for t, v in schedule]
    if not points or any(b[0] <= a[0] for a, b in pairwise(points)):
        raise ValueError(f"{name} points must be non-empty with increasing env steps, got {schedule!r}")
    return points


def check_positive(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be positive, got {value}")


def check_gamma(gamma: float) -> None:
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")


def plain_hyperparameters(init_args: dict[str, Any], ignore: list[str]) -> dict[str, Any]:
    """The hyperparameters among ``init_args`` to save as something else than themselves: an
    importable encoder or activation class as its import path (plain data that reloads), any
    other callable (an env factory, a lambda) as its placeholder."""
    as_data = {k: f(init_args[k]) for k, f in (("encoder", encoder_hparam), ("activation", activation_hparam))
               if k in init_args and k not in ignore}
    as_data = {k: v for k, v in as_data.items() if not callable(v)}
    callables = {k: v for k, v in init_args.items() if callable(v) and k not in ignore and k not in as_data}
    return {**as_data, **{k: callable_placeholder(v) for k, v in callables.items()}}
