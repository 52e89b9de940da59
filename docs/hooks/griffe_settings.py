"""Griffe extension: an algorithm's settings as the API reference shows them. The reference is
built by inspection (``force_inspection``), which sees each settings dataclass's ``__init__``
(every setting, inherited ones included, with types and defaults) but not the docstring under
each field: this gives every setting the class declares its description
(``lightning_rl.settings.setting_docs``, the text IDEs and jsonargparse read from the source),
so that the reference, ``help(PPO)`` and ``--model.help PPO`` say the same."""

from __future__ import annotations

import dataclasses
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
        obj = getattr(node, "obj", None)
        if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
            return
        from lightning_rl.settings import setting_docs

        if "__init__" in cls.members:
            cls.members["__init__"].parameters = griffe.Parameters(*[
                griffe.Parameter(p.name, annotation=annotation(p), kind=griffe.ParameterKind(p.kind.description),
                                 default=default(p))
                for p in inspect.signature(obj).parameters.values()
            ])
        docs = setting_docs(obj)
        for name, member in cls.members.items():
            if name in docs and name in inspect.get_annotations(obj):
                member.docstring = griffe.Docstring(docs[name], parent=member)
