"""Compiled graphs shared between the update steps of a process.

Dynamo caches compiled graphs per code object. ``shared_code(method, name)`` gives ``method``
a code object named after the step (``UpdateStep.name``): steps of one name share one, so a
second model of the same algorithm in a process (a sweep's trials, a notebook's reruns) reuses
the first one's graphs where their guards hold instead of tracing again, and steps of other
names (SAC's three, one per policy) do not count as recompiles of each other. A shared code
object takes at most ``_GRAPHS_PER_CODE`` graphs (other settings or shapes recompile), then
steps get a fresh one: no step meets dynamo's recompile limit and falls back to eager.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

# The compiled steps' code objects by (function, step name).
_SHARED_CODE: dict[tuple[Callable[..., Any], str], list[types.CodeType]] = {}
_GRAPHS_PER_CODE = 4  # compiled graphs a shared code object may hold (dynamo's recompile limit is 8)


def _graphs_of(code: types.CodeType) -> int:
    """Compiled graphs dynamo holds for ``code``; ``_GRAPHS_PER_CODE`` where it cannot tell."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        return len(_debug_get_cache_entry_list(code))
    except Exception:  # a torch without this (private) reader
        return _GRAPHS_PER_CODE


def shared_code(method: types.MethodType, name: str) -> types.MethodType:
    """The bound ``method`` with the code object its function shares with the steps named ``name``."""
    fn = method.__func__
    variants = _SHARED_CODE.setdefault((fn, name), [])
    code = next((c for c in variants if _graphs_of(c) < _GRAPHS_PER_CODE), None)
    if code is None:
        code = fn.__code__.replace(co_name=f"{fn.__name__}_{name.replace('/', '_')}")
        if _graphs_of(code) == 0:  # (unknown where dynamo's cache cannot be read: not shared)
            variants.append(code)
    own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return types.MethodType(own, method.__self__)
