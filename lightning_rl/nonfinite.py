"""Non-finite losses named: the error an update step raises (eager) or the learner raises once
per iteration from the compiled steps' on-device flags (``update.py``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["NonFiniteLossError", "check_updates", "flat_terms", "nonfinite_error", "nonfinite_terms"]


class FlaggedStep(Protocol):
    """An update step as ``check_updates`` reads it (``update.UpdateStep``)."""

    name: str
    ok: Tensor | None  # compiled steps: False from the first non-finite loss on; eager: None


def flat_terms(aux: Mapping[str, Any], loss: Tensor) -> dict[str, Tensor]:
    """The 0-dim tensors of ``aux`` (nested one level, as ``learner_stats``) by name, for errors."""
    terms: dict[str, Tensor] = {}
    for key, value in aux.items():
        if isinstance(value, Mapping):
            terms.update({k: v for k, v in value.items() if isinstance(v, Tensor) and v.dim() == 0})
        elif isinstance(value, Tensor) and value.dim() == 0:
            terms[key] = value
    return terms or {"loss": loss}


def nonfinite_terms(results: Mapping[str, Any]) -> list[str]:
    """Names of the non-finite numbers in a (nested) learner-info dict."""
    bad = []
    for key, value in results.items():
        if isinstance(value, Mapping):
            bad += nonfinite_terms(value)
        elif isinstance(value, float) and not math.isfinite(value):
            bad.append(key)
    return bad


class NonFiniteLossError(FloatingPointError):
    """A loss term became NaN or infinite; raised before the optimizer steps on it."""


def nonfinite_error(owner: Any, detail: str, after: str = "") -> NonFiniteLossError:
    """The error naming the iteration and env step of ``owner`` (an ``Algorithm``)."""
    return NonFiniteLossError(
        f"non-finite loss at iteration {owner.counters['num_iterations']} "
        f"(env step {owner.global_counters['num_env_steps_sampled']}){detail}; the weights were not stepped{after}"
    )


def check_updates(steps: Iterable[FlaggedStep], learner_info: Mapping[str, Any], owner: Any) -> None:
    """Stop fit if a compiled step met a non-finite loss this iteration (one host read of the
    steps' flags per iteration; the eager step raises at once)."""
    steps = [s for s in steps if s.ok is not None]
    if not steps or bool(torch.stack([s.ok for s in steps]).all()):
        return
    bad = nonfinite_terms(learner_info)
    bad = [n for n in bad if n != "total_loss"] or bad
    raise nonfinite_error(owner, " in the " + ", ".join(repr(s.name) for s in steps if not s.ok) + " update"
                          + (f": {', '.join(bad)}" if bad else ""), " from that minibatch on")
