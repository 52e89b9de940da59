"""What ``lightning-rl`` knows before torch or Lightning is imported: its commands and algorithms,
its one-line errors, and the algorithms' settings and ``pl.Trainer``'s arguments read from the
source with ``ast`` (``cli.py``)."""

from __future__ import annotations

import ast
import difflib
import functools
import importlib
import importlib.util
import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any, NoReturn

PROG = "lightning-rl"
TOOLS = ("plot", "record", "tune")
SUBCOMMANDS = ("fit", "validate", "test")
# The built-in algorithms, by name: what --model NAME takes before any algorithm is imported (a
# subclass defined in this process is known once lightning_rl.checkpoint is: _algorithm_names).
ALGORITHMS = ("A2C", "A3C", "APEX", "APPO", "DDPG", "DQN", "IMPALA", "PPO", "SAC", "TD3")
# Lightning's own --ckpt_path values that name no file ("last" checkpoint of this run, ...).
LIGHTNING_CKPT_NAMES = ("last", "best", "hpc", "registry")
PREDICT_REFUSAL = (
    "not offered: a policy acts on observations from an env, which Lightning's predict loop does not have; "
    "play greedy episodes with `lightning-rl test --ckpt_path CKPT` (logs test/*) or `lightning-rl record "
    "--ckpt_path CKPT`, or act in Python with model.predict(obs)"
)


NO_ALGORITHM = "no algorithm chosen: add --model NAME (one of {names})"


def fail(command: str | None, message: str) -> NoReturn:
    """``lightning-rl COMMAND: error: MESSAGE`` on one line of stderr, exit code 2."""
    message = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    print(f"{PROG}{' ' + command if command else ''}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _import_class(path: str | None) -> type | None:
    """The class a command line's ``--model`` names (the user's own input: importing it is
    what jsonargparse does too)."""
    if not path:
        return None
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        found = None
    if found is None:
        from lightning_rl.checkpoint import CheckpointError, resolve_algorithm

        try:
            found = resolve_algorithm(path)
        except CheckpointError:
            return None
    return found if inspect.isclass(found) else None


def summarize_parse_error(message: str) -> str:
    """One line from jsonargparse's report of a bad command line: a misspelled algorithm setting
    with the setting meant, a bad value with the setting and the type it needs, else the report's
    informative lines joined."""
    class_match = re.search(r"Problem with given class_path '([^']+)'", message)
    cls = _import_class(class_match.group(1)) if class_match else None
    no_model = re.search(r"arguments are required: (\w+\.)?model\b", message)
    if no_model or (cls is not None and cls.__name__ not in _algorithm_names()):  # Algorithm, OnPolicyModule ...
        return NO_ALGORITHM.format(names=", ".join(_algorithm_names()))
    unknown = re.search(r"(?:Option|Key) '([^']+)' is not (?:accepted|expected)", message)
    if cls is not None and unknown:
        name = unknown.group(1).removeprefix("init_args.")
        settings = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        return _no_such_setting(cls.__name__, name, settings)
    keys = re.findall(r'Parser key "([^"]+)"', message)
    if keys:  # a bad value: the innermost setting, the types it takes, the value given
        inner = message[message.rindex(f'Parser key "{keys[-1]}"'):]
        expected = [_type_name(m) for m in re.findall(r"Expected an? (.+?)(?:\. Got value: .*)?$", inner, re.M)
                    if "NoneType" not in m]
        value = re.search(r"(?:Got|Given) value: (.*)", inner)
        if expected:
            got = f", got {value.group(1).strip()!r}" if value else ""
            return f"--{'.'.join(keys)}: expected {' or '.join(dict.fromkeys(expected))}{got}"
    noise = ("Subtypes:", "Errors:", "Given value type:", "Given value:", "Does not validate against any")
    lines = [re.sub(r"^- ", "", line.strip()) for line in message.splitlines()]
    return "; ".join(line for line in lines if line and not line.startswith(noise) and "NoneType" not in line)


def _type_name(text: str) -> str:
    """``<class 'float'>`` -> ``float``, ``typing.Literal['a', 'b']`` -> ``one of 'a', 'b'``."""
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text)
    return re.sub(r"^typing\.Literal\[(.*)\]$", r"one of \1", text)


def _algorithm_names() -> list[str]:
    """What ``--model NAME`` takes: the built-in algorithms, then any subclass defined in this
    process (which needs ``lightning_rl.checkpoint``'s registry: none before it is imported)."""
    names = list(ALGORITHMS)
    if "lightning_rl.checkpoint" in sys.modules:
        from lightning_rl.checkpoint import algorithm_names

        names += [name for name in algorithm_names() if name not in names]
    return names


def _no_such_setting(algorithm: str, name: str, settings: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(settings), n=1)
    meant = f"; did you mean --model.{close[0]}?" if close else ""
    return (f"--model.{name}: {algorithm} has no setting {name!r}{meant} "
            f"(all of them: {PROG} fit --model.help {algorithm})")


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.(\s|$)", text)
    return text[: end.start() + 1] if end else text


def _args_section(doc: str) -> dict[str, str]:
    """A Google-style docstring's ``Args:`` entries, each joined onto one line."""
    lines = doc.expandtabs().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
    if start is None:
        return {}
    entries: dict[str, str] = {}
    indent, name = None, None
    for line in lines[start + 1:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        match = re.match(r"(\w+)(?: \([^)]*\))?: ?(.*)$", line.strip())
        if depth == indent and match:
            name = match.group(1)
            entries[name] = match.group(2)
        elif depth > indent and name is not None:
            entries[name] += " " + line.strip()
        else:
            break
    return entries


def _source_tree(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


@functools.cache
def _trainer_arguments() -> list[tuple[str, str, str]] | None:
    """``pl.Trainer``'s arguments as (name, default, first sentence of its description), read from
    the installed Lightning's source; ``None`` when it cannot be read (then nothing is checked
    against it)."""
    spec = importlib.util.find_spec("pytorch_lightning")  # finds the package; imports nothing
    if spec is None or not spec.submodule_search_locations:
        return None
    tree = _source_tree(Path(next(iter(spec.submodule_search_locations))) / "trainer" / "trainer.py")
    body = tree.body if tree else []
    trainer = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == "Trainer"), None)
    body = trainer.body if trainer else []
    init = next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None or init.args.kwarg is not None or init.args.vararg is not None:
        return None
    args = init.args
    positional = [*args.posonlyargs, *args.args][1:]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    named = [*zip(positional, defaults, strict=True), *zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    docs = _args_section(ast.get_docstring(init) or "")
    return [(arg.arg, _yaml_default(default), _first_sentence(docs.get(arg.arg, ""))) for arg, default in named]


def _yaml_default(node: ast.expr | None) -> str:
    """A default as it is written on the command line (``null``, ``true``, ``'auto'`` -> ``auto``)."""
    if node is None:
        return "(required)"
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)
    return _cli_value(value)


def _cli_value(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_cli_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_cli_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return value or "''"
    if isinstance(value, type | typing.Callable):  # type: ignore[arg-type]
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', value)}".lstrip(".")
    return repr(value)


@functools.cache
def _algorithm_sources() -> dict[str, ast.ClassDef] | None:
    """The classes of ``lightning_rl/algorithms`` and the setting groups of ``data/settings.py``
    by name, read with ``ast`` (nothing imported); ``None`` when the source cannot be read."""
    classes: dict[str, ast.ClassDef] = {}
    package = Path(__file__).parent
    for path in [*sorted((package / "algorithms").glob("*.py")), package / "data" / "settings.py"]:
        tree = _source_tree(path)
        if tree is None:
            return None
        classes.update({n.name: n for n in tree.body if isinstance(n, ast.ClassDef)})
    return classes


def _source_fields(node: ast.ClassDef) -> list[tuple[str, dict[str, Any]]]:
    """A settings class's own fields as its source declares them: each annotated class
    attribute (``ClassVar`` ones aside) with the keywords of its ``setting(...)`` that are
    literals (``init``, ``resumable``)."""
    fields: list[tuple[str, dict[str, Any]]] = []
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        if "ClassVar" in ast.unparse(item.annotation):
            continue
        keywords: dict[str, Any] = {}
        value = item.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "setting":
            for keyword in value.keywords:
                if keyword.arg in ("init", "resumable") and isinstance(keyword.value, ast.Constant):
                    keywords[keyword.arg] = keyword.value.value
        fields.append((item.target.id, keywords))
    return fields


def _source_settings(name: str) -> dict[str, dict[str, Any]] | None:
    """The settings of algorithm ``name`` read from the source, in the order of its signature
    (as ``dataclasses`` gathers the fields: the bases' first, in reverse MRO order, a
    re-declared one in its first place, its ``init``/``resumable`` the latest declaration's or,
    for a plain new default, the inherited ones)."""
    classes = _algorithm_sources()
    if classes is None or name not in classes:
        return None

    def ancestors(klass: str) -> list[str]:
        found = [klass]
        for base in classes[klass].bases:
            if isinstance(base, ast.Name) and base.id in classes:
                found += [a for a in ancestors(base.id) if a not in found]
        return found

    settings: dict[str, dict[str, Any]] = {}
    for klass in reversed(ancestors(name)):
        for field, keywords in _source_fields(classes[klass]):
            if field not in settings or keywords:  # new, or re-declared with setting(...)
                settings[field] = {"init": True, "resumable": False, **keywords}
    return settings


@functools.cache
def _declared_settings() -> dict[str, frozenset[str]] | None:
    """The names of each built-in algorithm's settings, read from the source of
    ``lightning_rl/algorithms`` and ``data/settings.py`` (``ast``, nothing imported): the dataclass fields of the class
    and of every class it inherits there, less those a class fixes (``setting(..., init=False)``).
    ``None`` when the source cannot be read. (``tests/test_cli_round_three.py`` checks them
    against the classes' signatures.)"""
    settings: dict[str, frozenset[str]] = {}
    for name in ALGORITHMS:
        fields = _source_settings(name)
        if fields is None:
            return None
        settings[name] = frozenset(field for field, declared in fields.items() if declared["init"])
    return settings


def _resumable_settings() -> tuple[str, ...]:
    """The settings declared ``setting(..., resumable=True)`` by any built-in algorithm, in the
    order of their first declaration, read from the source (``RESUMABLE_SETTINGS``)."""
    names: dict[str, None] = {}
    for name in ALGORITHMS:
        fields = _source_settings(name) or {}
        names.update({field: None for field, declared in fields.items() if declared["resumable"] and declared["init"]})
    return tuple(names)


# The settings a command line may change when it continues a checkpoint (resume, validate,
# test): how long, how often, where and how fast a run goes, each declared
# ``setting(..., resumable=True)`` (read from the source: nothing imported). All others (the
# env, the network, the spaces, the update's hyperparameters, the samplers' layout) are the
# checkpoint's; giving a different value is an error that names the setting.
RESUMABLE_SETTINGS = _resumable_settings()


DESCRIPTIONS = {
    "fit": "Train an algorithm: --model NAME ({algos}) or -c CONFIG.yaml. Every setting of an algorithm, "
           "described: lightning-rl fit --model.help PPO. --ckpt_path CKPT resumes a run with the "
           "checkpoint's settings; the command line may change only " + ", ".join(RESUMABLE_SETTINGS) + ".",
    "validate": "Play evaluation_num_episodes greedy episodes and log val/*: lightning-rl validate --ckpt_path "
                "CKPT (the algorithm and its settings come from the checkpoint). Every setting of an algorithm, "
                "described: lightning-rl validate --model.help PPO.",
    "test": "Play evaluation_num_episodes greedy episodes on test envs (seeded apart from validation's) and log "
            "test/*: lightning-rl test --ckpt_path CKPT (the algorithm and its settings come from the checkpoint). "
            "Every setting of an algorithm, described: lightning-rl test --model.help PPO.",
}
