"""Griffe extension: an algorithm's ``__init__`` as ``lightning_rl.settings.declare_settings``
made it (every setting, inherited ones included, with types and defaults), not the parameters
its source lists (its own settings and ``**settings``), so that the API reference's signature
and parameter table match ``help(PPO)``."""

from __future__ import annotations

import inspect
import re
from typing import Any

import griffe


def annotation(parameter: inspect.Parameter) -> str | None:
    if parameter.annotation is inspect.Parameter.empty:
        return None
    value = parameter.annotation
    text = value if isinstance(value, str) else inspect.formatannotation(value)
    return re.sub(r"\b(typing|collections\.abc)\.", "", text)


def default(parameter: inspect.Parameter) -> str | None:
    return None if parameter.default is inspect.Parameter.empty else repr(parameter.default)


class DeclaredSettings(griffe.Extension):
    def on_class_members(self, *, node: Any, cls: griffe.Class, **kwargs: Any) -> None:
        init = getattr(getattr(node, "obj", None), "__init__", None)
        if not hasattr(init, "_declared_by") or "__init__" not in cls.members:
            return
        cls.members["__init__"].parameters = griffe.Parameters(*[
            griffe.Parameter(p.name, annotation=annotation(p), kind=griffe.ParameterKind(p.kind.description),
                             default=default(p))
            for p in inspect.signature(init).parameters.values()
        ])
