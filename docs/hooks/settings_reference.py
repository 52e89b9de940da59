"""MkDocs hook: the hyperparameter reference, written at build time from the algorithms'
settings (``lightning_rl.settings``: each a dataclass field, its type and default in the
signature ``dataclasses`` writes, its description the docstring under its declaration), so no
setting is described twice.

In a page, a line ``<!-- settings-table: PPO -->`` becomes PPO's table (setting, default, type,
description, in signature order) and ``<!-- settings-matrix -->`` the default of every setting for
every algorithm. An unknown algorithm or a setting without a description fails the build.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

ALGORITHMS = ("PPO", "A2C", "DQN", "SAC", "TD3", "DDPG", "IMPALA", "APPO", "APEX", "A3C")
MARKER = re.compile(r"^<!-- settings-(table|matrix)(?::\s*(\w+))? -->$", flags=re.MULTILINE)


def algorithm(name: str) -> type:
    import lightning_rl

    if name not in ALGORITHMS:
        raise ValueError(f"settings-table: unknown algorithm {name!r}; one of {', '.join(ALGORITHMS)}")
    return getattr(lightning_rl, name)


def settings(cls: type) -> list[inspect.Parameter]:
    """The settings of ``cls``, in the order of its signature (its dataclass fields)."""
    return [p for p in inspect.signature(cls.__init__).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def description(cls: type, name: str) -> str:
    from lightning_rl.settings import setting_docs

    text = setting_docs(cls).get(name)
    if not text:
        raise ValueError(f"{cls.__name__}.{name} has no description (a docstring under its field)")
    return text


def cell(text: str) -> str:
    """``text`` in a Markdown table cell: ``|`` escaped, reStructuredText's ``x`` as Markdown's `x`."""
    return re.sub(r"``(.+?)``", r"`\1`", text).replace("|", "\\|")


def type_name(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return re.sub(r"\b(typing|collections\.abc|torch\.nn\.modules\.module|gymnasium\.core)\.", "", text)


def default(value: Any) -> str:
    return "required" if value is inspect.Parameter.empty else f"`{value!r}`"


def table(name: str) -> str:
    cls = algorithm(name)
    rows = ["| setting | default | type | description |", "|---|---|---|---|"]
    rows += [f"| `{p.name}` | {cell(default(p.default))} | {cell(f'`{type_name(p.annotation)}`')} | "
             f"{cell(description(cls, p.name))} |" for p in settings(cls)]
    return "\n".join(rows)


def matrix() -> str:
    """Every setting (rows, in order of first appearance) against every algorithm (its default;
    blank where the algorithm does not take it)."""
    defaults = {name: {p.name: p.default for p in settings(algorithm(name))} for name in ALGORITHMS}
    names = list(dict.fromkeys(s for name in ALGORITHMS for s in defaults[name]))
    rows = ["| setting | " + " | ".join(ALGORITHMS) + " |", "|---" * (len(ALGORITHMS) + 1) + "|"]
    for s in names:
        cells = [cell(default(defaults[a][s])) if s in defaults[a] else "" for a in ALGORITHMS]
        rows.append(f"| `{s}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render(markdown: str) -> str:
    return MARKER.sub(lambda m: matrix() if m.group(1) == "matrix" else table(m.group(2) or ""), markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return render(markdown)
