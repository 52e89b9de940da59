"""How an algorithm's settings are declared (typed dataclass fields, each with its default,
check and description where it is declared), the checks and schedules they share, and what of
them a checkpoint saves."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

from lightning_rl.checkpoint_data import callable_placeholder
from lightning_rl.nn.encoders import activation_hparam, encoder_hparam

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # pragma: no cover
    from typing_extensions import dataclass_transform

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


def plain_hyperparameters(init_args: dict[str, Any], ignore: list[str]) -> dict[str, Any]:
    """The hyperparameters among ``init_args`` to save as something else than themselves: an
    importable encoder or activation class as its import path (plain data that reloads), any
    other callable (an env factory, a lambda) as its placeholder."""
    as_data = {k: f(init_args[k]) for k, f in (("encoder", encoder_hparam), ("activation", activation_hparam))
               if k in init_args and k not in ignore}
    as_data = {k: v for k, v in as_data.items() if not callable(v)}
    callables = {k: v for k, v in init_args.items() if callable(v) and k not in ignore and k not in as_data}
    return {**as_data, **{k: callable_placeholder(v) for k, v in callables.items()}}


# ---------------------------------------------------------------- declaring settings
# A setting is a field of a dataclass (``@settings``): ``name: Type = default`` with a one-line
# docstring under it, or ``name: Type = setting(default=..., check=..., resumable=...)`` where
# it is validated or may change when a run resumes. Python's dataclasses write ``__init__``
# from the fields, so ``help``, editors and type checkers read the settings, their types and
# defaults from the source as it stands.

Check = Callable[[str, Any], None]
"""A setting's validation: ``check(name, value)`` raises a one-line ``ValueError`` naming it."""


def positive(name: str, value: float | None) -> None:
    """A positive number (``None``, where the setting takes it, passes)."""
    check_positive(**{name: value})


def at_least(low: int, or_none: bool = False) -> Check:
    """An integer of at least ``low`` (``or_none``: or ``None``)."""
    def check(name: str, value: Any) -> None:
        if (value is not None or not or_none) and not (value is not None and value >= low):
            raise ValueError(f"{name} must be >= {low}{' or None' if or_none else ''}, got {value}")
    return check


def interval(text: str) -> Check:
    """A number in the interval ``text``: ``"(0, 1]"`` or ``"[0, 1]"``."""
    low_open, low, high, high_open = text[0] == "(", *map(float, text[1:-1].split(",")), text[-1] == ")"

    def check(name: str, value: Any) -> None:
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        if not (above and below):
            raise ValueError(f"{name} must be in {text}, got {value}")
    return check


def one_of(*values: Any) -> Check:
    """One of ``values``."""
    def check(name: str, value: Any) -> None:
        if value not in values:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, values))}, got {value!r}")
    return check


def setting(*, default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING,
            check: Check | None = None, resumable: bool = False, init: bool = True,
            kw_only: Any = dataclasses.MISSING) -> Any:
    """A setting's declaration where it needs more than its default (``dataclasses.field``):

    - ``check``: its validation (``positive``, ``at_least(1)``, ``interval("(0, 1]")``,
      ``one_of(...)`` or any ``check(name, value)`` that raises ``ValueError``), run when an
      algorithm is made;
    - ``resumable``: the command line may change it when a run continues a checkpoint (how
      long, how often, where and how fast it runs; ``cli.RESUMABLE_SETTINGS``);
    - ``init=False``: a setting an inherited class takes that this class fixes to ``default``
      (out of its signature and its checkpoints' hyperparameters).
    """
    metadata = {"check": check, "resumable": resumable}
    return dataclasses.field(default=default, default_factory=default_factory, init=init,  # type: ignore[call-overload]
                             kw_only=kw_only, metadata=metadata)


# Settings whose attribute an algorithm replaces with a submodule it builds from them (the
# ``policies`` setting with the ``Policies`` module): no class attribute may shadow it.
SUBMODULE_SETTINGS = frozenset({"policies"})

_T = typing.TypeVar("_T", bound=type)
_G = typing.TypeVar("_G")


@dataclass_transform(kw_only_default=True, eq_default=False, field_specifiers=(dataclasses.field, setting))
def settings(cls: _T) -> _T:
    """Make ``cls``'s annotated class attributes its settings: a dataclass whose ``__init__``
    takes them by keyword (``field(kw_only=False)`` for a positional one), keeping the class's
    own equality, hash and repr (an ``nn.Module``'s). Other class attributes of a settings class
    are unannotated or ``ClassVar``. Each setting's type is resolved where it is declared, so
    ``inspect.signature``, jsonargparse and Lightning's CLI read real types. An inherited
    setting re-declared with a plain default (``lr: float = 7e-4``) keeps its check and
    resumability."""
    inherited = {f.name: f for base in reversed(cls.__mro__[1:]) if dataclasses.is_dataclass(base)
                 for f in dataclasses.fields(base)}
    for name in inspect.get_annotations(cls):
        value = cls.__dict__.get(name, dataclasses.MISSING)
        if name in inherited and value is not dataclasses.MISSING and not isinstance(value, dataclasses.Field):
            # a new default for an inherited setting: its check, resumability and place stay
            setattr(cls, name, dataclasses.field(default=value, kw_only=inherited[name].kw_only,
                                                 metadata=inherited[name].metadata))
        elif name in SUBMODULE_SETTINGS and isinstance(value, dataclasses.Field) and not value.init:
            # fixed, and with no class attribute to read it from: ``__init__`` sets it
            value.default_factory, value.default = functools.partial(_same, value.default), dataclasses.MISSING
    cls = dataclasses.dataclass(kw_only=True, eq=False, repr=False, match_args=False)(cls)  # type: ignore[assignment]
    hints = cls.__init__.__annotations__
    for field in dataclasses.fields(cls):
        if isinstance(field.type, str):
            field.type = _resolved(cls, field.name, field.type)
        if field.name in hints:
            hints[field.name] = field.type
        if field.name in SUBMODULE_SETTINGS and field.name in cls.__dict__:
            delattr(cls, field.name)
    return cls


def _same(value: Any) -> Any:
    return value


def _resolved(cls: type, name: str, annotation: str) -> Any:
    """``annotation`` evaluated in the module of the class that declares ``name`` (the text
    itself where it names a type imported only for type checkers)."""
    owner = next((k for k in cls.__mro__ if name in inspect.get_annotations(k)), cls)
    namespace = vars(sys.modules[owner.__module__]) if owner.__module__ in sys.modules else {}
    try:
        return eval(annotation, dict(namespace))  # the package's own annotations
    except Exception:
        return annotation


def setting_fields(cls: type) -> list[dataclasses.Field]:
    """The settings ``cls`` takes, in the order of its signature (``init=False`` ones left out)."""
    return [f for f in dataclasses.fields(cls) if f.init] if dataclasses.is_dataclass(cls) else []


def resumable_settings(cls: type) -> tuple[str, ...]:
    """The settings of ``cls`` declared ``resumable``."""
    return tuple(f.name for f in setting_fields(cls) if f.metadata.get("resumable"))


def received_settings(module: Any) -> dict[str, Any]:
    """The settings ``module`` was made with, as its dataclass ``__init__`` set them."""
    return {f.name: module.__dict__[f.name] for f in setting_fields(type(module)) if f.name in module.__dict__}


def group_of(group: type[_G], source: Any, **changes: Any) -> _G:
    """The settings ``group`` declares as a ``group`` object, with ``source``'s values (an
    algorithm's, for the DataModule it builds) and ``changes``."""
    values = {f.name: getattr(source, f.name) for f in setting_fields(group)}
    return group(**{**values, **changes})


def check_group(values: Any) -> None:
    """Run the checks of a settings object's declarations on its own values (a DataModule given
    one made by hand)."""
    check_settings(values, {f.name: getattr(values, f.name) for f in setting_fields(type(values))})


def check_settings(module: Any, values: dict[str, Any]) -> None:
    """Run each setting's ``check`` on its value."""
    for field in setting_fields(type(module)):
        check = field.metadata.get("check")
        if check is not None and field.name in values:
            check(field.name, values[field.name])


@functools.cache
def setting_docs(cls: type) -> dict[str, str]:
    """Each setting's description: the docstring under its declaration (each line joined into
    one), the nearest declaring class's in ``cls``'s MRO; a re-declaration without one keeps
    the inherited text."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if inspect.get_annotations(klass):
            docs.update(_attribute_docstrings(klass))
    return docs


def _attribute_docstrings(klass: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(klass))
        node = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return {}
    if not isinstance(node, ast.ClassDef):
        return {}
    found: dict[str, str] = {}
    for item, after in zip(node.body, node.body[1:]):
        if (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            found[item.target.id] = " ".join(after.value.value.split())
    return found


def hyperparameters(module: Any, names: Sequence[str] = (), ignore: Sequence[str] | str | None = None
                    ) -> dict[str, Any]:
    """What a checkpoint keeps of the settings ``module`` was made with (its fields as its
    dataclass ``__init__`` set them, defaults filled in; ``names``: only these; less ``ignore``): callable
    ones (an env factory, a lambda) as a ``"<callable name>"`` placeholder, since Lightning would
    drop the ones it cannot pickle and a checkpoint that holds code cannot load safely; an
    importable encoder or activation class as its import path."""
    ignore = [ignore] if isinstance(ignore, str) else list(ignore or [])
    settings = dict(module.__dict__.get("_received_settings", {}))
    if names:
        settings = {name: settings[name] for name in names}
    settings = {k: v for k, v in settings.items() if k not in ignore}
    return {**settings, **plain_hyperparameters(settings, ignore)}


def no_caller() -> types.FrameType:
    """A frame without a caller: given it, Lightning's ``save_hyperparameters`` looks for no
    ``__init__`` arguments on the stack and keeps exactly the dict it is given."""
    def frame() -> Any:
        yield
    return frame().gi_frame
