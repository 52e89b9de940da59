"""``lightning-rl``: Lightning's CLI over every algorithm, plus ``plot``, ``record`` and ``tune``.

    lightning-rl fit -c examples/configs/ppo_cartpole.yaml
    lightning-rl fit --model PPO --model.env CartPole-v1 --trainer.max_epochs 5
    lightning-rl fit --model.help PPO                 # every setting of PPO, one line each
    lightning-rl fit --ckpt_path last.ckpt --model.total_env_steps 200000   # resume with a larger budget
    lightning-rl validate --ckpt_path lightning_logs/version_0/checkpoints/last.ckpt
    lightning-rl test --ckpt_path lightning_logs/version_0/checkpoints/last.ckpt
    lightning-rl fit -c examples/configs/dqn_cartpole.yaml --print_config
    lightning-rl plot lightning_logs/version_0 lightning_logs/version_1 --out curve.png
    lightning-rl record --ckpt_path model.ckpt --out agent.gif
    lightning-rl tune -c examples/configs/ppo_cartpole.yaml --search-space ppo --n-trials 20

Errors of the command line (a bad value, a misspelled setting, an unknown algorithm, an
unreadable checkpoint, a missing optional dependency) are one line, ``lightning-rl fit: error:
...``, with exit code 2.

Importing torch and Lightning takes seconds, so this module imports neither until a command
runs: the help texts (``lightning-rl --help``, ``fit --help``, ``fit --model.help PPO`` aside,
which imports the algorithm it describes), an unknown command or algorithm, and a misspelled
``--model.SETTING`` or ``--trainer.ARGUMENT`` answer from the source alone (the algorithms'
settings and ``pl.Trainer``'s arguments read with ``ast``). Lightning's CLI classes
(``RLCLI``, ``RLArgumentParser``) are defined on first use.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
import typing
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NoReturn

from lightning_rl.extras import missing_dependency

if TYPE_CHECKING:
    from pytorch_lightning.cli import LightningCLI

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


def fail(command: str | None, message: str) -> NoReturn:
    """``lightning-rl COMMAND: error: MESSAGE`` on one line of stderr, exit code 2."""
    message = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    print(f"{PROG}{' ' + command if command else ''}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


@functools.cache
def _lightning() -> SimpleNamespace:
    """Lightning's CLI classes as lightning_rl's (``RLArgumentParser``, ``RLCLI``), defined on first
    use: importing Lightning (and torch) takes seconds that help and argument errors do not wait
    for. Also imports every algorithm, so ``--model PPO`` and checkpoints resolve."""
    from jsonargparse import Namespace, set_parsing_settings
    from pytorch_lightning.cli import LightningArgumentParser, LightningCLI
    from pytorch_lightning.loggers import CSVLogger

    import lightning_rl.algorithms  # noqa: F401  # defines every algorithm
    from lightning_rl.algorithms.base import Algorithm
    from lightning_rl.checkpoint import (
        CheckpointError,
        algorithm_class,
        algorithm_path,
        class_path,
        read_checkpoint,
        resolve_algorithm,
    )
    from lightning_rl.checkpoint_data import is_callable_placeholder
    from lightning_rl.data.envs import check_env

    # each setting's help is the docstring under its field (jsonargparse reads the bases' too)
    set_parsing_settings(docstring_parse_attribute_docstrings=True)

    class RLArgumentParser(LightningArgumentParser):
        """Lightning's parser, with jsonargparse's multi-line reports turned into one line that
        names the setting (and, for a misspelled one, the setting meant)."""

        command: str | None = None

        def error(self, message: str, ex: Exception | None = None) -> NoReturn:
            if not self.exit_on_error:  # a parser jsonargparse uses inside, trying alternatives: its errors are caught
                super().error(message, ex)
            fail(self.command, summarize_parse_error(message))


    class RLCLI(LightningCLI):
        """Lightning's CLI with these differences, which keep runs reproducible, checkpoints safe and
        errors short:

        - the model's ``seed`` follows ``--seed_everything`` when it is not given itself;
        - ``--ckpt_path`` fills in the model's class and hyperparameters from any lightning_rl
          checkpoint (not only the CLI's own), read with ``weights_only=True``, with the class
          taken from the algorithms defined in this process, never imported because a file
          names it. A callable hyperparameter (an env factory) is not in the file: pass it
          again (``--model.env ...``). The command line may change the settings in
          ``RESUMABLE_SETTINGS`` (a larger budget, another evaluation cadence ...); a different
          value for any other is an error naming it;
        - there is no ``predict`` subcommand (``PREDICT_REFUSAL``);
        - a bad value, a misspelled setting, an algorithm's own validation error (its ``__init__``'s
          ``ValueError``) and ``--trainer.gradient_clip_val`` are one-line errors.
        """

        def __init__(self, *args: Any, argv: list[str] | None = None, **kwargs: Any) -> None:
            self._argv = list(sys.argv[1:] if argv is None else argv)
            self._command = self._argv[0] if self._argv and self._argv[0] in SUBCOMMANDS else None
            super().__init__(*args, args=argv, **kwargs)

        @staticmethod
        def subcommands() -> dict[str, set[str]]:
            return {name: skip for name, skip in LightningCLI.subcommands().items() if name in SUBCOMMANDS}

        def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
            parser = super().init_parser(**kwargs)
            if isinstance(parser, RLArgumentParser):
                parser.command = self._command
            return parser

        def _parse_ckpt_path(self) -> None:
            subcommand = self.config.get("subcommand")
            if not subcommand:
                return
            ckpt_path = self.config[subcommand].get("ckpt_path")
            if not ckpt_path or (str(ckpt_path) in LIGHTNING_CKPT_NAMES and not Path(ckpt_path).is_file()):
                return
            try:
                checkpoint = read_checkpoint(ckpt_path)
                # a resumed fit continues only the class that wrote the checkpoint
                written_by = algorithm_path(checkpoint)
                cls = (resolve_algorithm(written_by) if subcommand == "fit" and written_by
                       else algorithm_class(checkpoint))
            except CheckpointError as err:
                self.parser.error(str(err))
            given_class, given = self._given_model_settings(subcommand)
            if cls is not None and given_class is not None and given_class is not cls:
                self.parser.error(f"--model {given_class.__name__}: checkpoint {ckpt_path!r} was written by "
                                  f"{cls.__name__}; leave --model out to take the checkpoint's")
            hparams = {k: v for k, v in checkpoint.get("hyper_parameters", {}).items() if not k.startswith("_")}
            for name, value in list(hparams.items()):
                if not is_callable_placeholder(value):
                    continue
                if name not in given:
                    self.parser.error(
                        f"checkpoint {ckpt_path!r} was trained with {name}={value}, which a checkpoint cannot hold "
                        f"(loading one never runs code): pass it again with --model.{name}"
                    )
                del hparams[name]  # the command line's value stands
            for name, value in given.items():
                if name not in hparams or _plain(value) == _plain(hparams[name]):
                    continue
                if name not in RESUMABLE_SETTINGS:
                    self.parser.error(
                        f"--model.{name} {_plain(value)!r}: checkpoint {ckpt_path!r} was trained with "
                        f"{_plain(hparams[name])!r}, and a run continued from a checkpoint keeps its settings except "
                        f"{', '.join(RESUMABLE_SETTINGS)}"
                    )
                del hparams[name]  # the command line's value stands
            if cls is None:
                return
            model = {"class_path": class_path(cls), "init_args": hparams}
            self.config = self.parser.parse_object({subcommand: {"model": model}}, self.config)

        def _given_model_settings(self, subcommand: str) -> tuple[type | None, dict[str, Any]]:
            """The model class and the settings that the command line and its config files give
            themselves (no defaults)."""
            given = self.parser.parse_args(self._argv, defaults=False)
            model = given.get(subcommand, Namespace()).get("model")
            if not isinstance(model, Namespace):
                return None, {}
            init_args = model.get("init_args")
            settings = init_args.as_dict() if isinstance(init_args, Namespace) else {}
            return _import_class(model.get("class_path")), settings

        def before_instantiate_classes(self) -> None:
            subcommand = self.config.get("subcommand")
            config = self.config[subcommand] if subcommand else self.config
            seed = config.get("seed_everything")
            model = config.get("model")
            init_args = getattr(model, "init_args", None)
            class_path = getattr(model, "class_path", None)
            if class_path is not None and class_path.rsplit(".", 1)[-1] not in _algorithm_names():
                self.parser.error(NO_ALGORITHM.format(names=", ".join(_algorithm_names())))  # the base, with defaults
            seeded = isinstance(seed, int) and not isinstance(seed, bool)
            if seeded and init_args is not None and init_args.get("seed") is None:
                init_args.seed = seed
            trainer = config.get("trainer")
            if subcommand == "fit" and trainer is not None and trainer.get("gradient_clip_val") is not None:
                self.parser.error(
                    "--trainer.gradient_clip_val: the algorithms step their optimizers themselves (manual "
                    "optimization), so Lightning cannot clip their gradients; set the maximum gradient norm with "
                    "--model.grad_clip"
                )
            # An env-step budget is the run's limit: no epoch limit (Lightning would set 1000 and warn).
            if (
                subcommand == "fit" and trainer is not None and init_args is not None
                and init_args.get("total_env_steps") is not None and trainer.get("max_epochs") is None
                and trainer.get("max_steps") in (None, -1) and trainer.get("max_time") is None
            ):
                trainer.max_epochs = -1
            self._check_env(init_args)

        def instantiate_trainer(self, **kwargs: Any) -> Any:
            config = self._get(self.config_init, "trainer", default={})
            if config.get("logger") in (None, True) and not tensorboard_available():
                # Lightning's own fallback, without its notice to install another package
                kwargs.setdefault("logger", CSVLogger(config.get("default_root_dir") or os.getcwd()))
            return super().instantiate_trainer(**kwargs)

        def _check_env(self, init_args: Any) -> None:
            """A bad ``--model.env`` is reported as ours (naming the env and the import that
            failed), not as jsonargparse's "does not validate against any of the Union subtypes"."""
            env = init_args.get("env") if init_args is not None else None
            if not isinstance(env, str):
                return
            try:
                check_env(env, init_args.get("env_kwargs"), init_args.get("vectorization") or "auto")
            except (ValueError, ImportError, TypeError) as err:
                self.parser.error(missing_dependency(err) or str(err))

        def instantiate_classes(self) -> None:
            try:
                super().instantiate_classes()
            except (ValueError, TypeError) as err:
                cause = _raised_by_lightning_rl(err)
                if cause is None:
                    raise
                self.parser.error(missing_dependency(cause) or str(cause))
            if self.subcommand == "fit" and isinstance(self.model, Algorithm):
                # Ctrl-C / SIGTERM: the message gives the command that resumes the run. Through the module
                # (its InterruptCheckpoint): one in the Trainer's callbacks at the start of fit would make
                # Lightning resume from "last" and replace the default ModelCheckpoint.
                self.model.resume_command = list(self._argv)

    RLArgumentParser.__qualname__ = "RLArgumentParser"
    RLCLI.__qualname__ = "RLCLI"
    return SimpleNamespace(RLArgumentParser=RLArgumentParser, RLCLI=RLCLI, Namespace=Namespace)


def __getattr__(name: str) -> Any:
    if name in ("RLArgumentParser", "RLCLI"):
        return getattr(_lightning(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tensorboard_available() -> bool:
    """Whether TensorBoard can log (``lightning_rl.loggers.tensorboard_available``)."""
    from lightning_rl.loggers import tensorboard_available as available

    return available()


def _raised_by_lightning_rl(err: BaseException) -> BaseException | None:
    """The ``ValueError``/``TypeError`` that lightning_rl's own code raised (an algorithm's
    validation in ``__init__``) among the exceptions jsonargparse wrapped it in, if any."""
    package = str(Path(__file__).parent)
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = traceback.extract_tb(current.__traceback__)
        if isinstance(current, ValueError | TypeError) and frames and frames[-1].filename.startswith(package):
            return current
        current = current.__cause__ or current.__context__
    return None


def _plain(value: Any) -> Any:
    """A setting as plain data, so a checkpoint's tuple equals the command line's list."""
    if isinstance(value, _lightning().Namespace):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


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


NO_ALGORITHM = "no algorithm chosen: add --model NAME (one of {names})"


def _type_name(text: str) -> str:
    """``<class 'float'>`` -> ``float``, ``typing.Literal['a', 'b']`` -> ``one of 'a', 'b'``."""
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text)
    return re.sub(r"^typing\.Literal\[(.*)\]$", r"one of \1", text)


def cli(args: list[str] | None = None, run: bool = True, **kwargs: Any) -> LightningCLI:
    """Lightning's CLI with any ``Algorithm`` subclass as the model (``--model PPO``)."""
    classes = _lightning()
    from lightning_rl.algorithms.base import Algorithm

    names = ", ".join(_algorithm_names())
    return classes.RLCLI(
        Algorithm,
        subclass_mode_model=True,
        auto_configure_optimizers=False,  # each algorithm configures its own optimizers
        # Lightning's default (True) seeds 0 too, with a "No seed found" warning.
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        parser_class=classes.RLArgumentParser,
        parser_kwargs={"prog": PROG, **{name: {"description": text.format(algos=names)}
                                        for name, text in DESCRIPTIONS.items()}},
        argv=args,
        run=run,
        **kwargs,
    )


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


# ----------------------------------------------------------------------------- help, without Lightning
def _top_help() -> str:
    names = ", ".join(ALGORITHMS)
    return "\n".join([
        f"usage: {PROG} {{fit,validate,test,plot,record,tune}} ...",
        "",
        "Reinforcement learning as PyTorch Lightning modules.",
        "",
        "commands:",
        f"  {PROG} {{fit,validate,test}} [options]  (Lightning's CLI; `{PROG} fit -h`; "
        f"an algorithm's settings: `{PROG} fit --model.help PPO`)",
        f"  {PROG} plot LOG_DIR... --out curve.png   (`{PROG} plot -h`)",
        f"  {PROG} record --ckpt_path CKPT --out agent.gif   (`{PROG} record -h`)",
        f"  {PROG} tune -c CONFIG.yaml --search-space ppo   (`{PROG} tune -h`)",
        "",
        f"  fit        train an algorithm ({names}): --model NAME or -c CONFIG.yaml",
        "  validate   play greedy episodes of a checkpoint and log val/*",
        "  test       play greedy episodes of a checkpoint on test envs and log test/*",
        "  plot       draw the learning curves of runs",
        "  record     play a checkpoint's policy and write a GIF",
        "  tune       search hyperparameters: trials of fit with Optuna",
    ])


def _command_help(command: str) -> str:
    """``lightning-rl fit --help``: the options, one line each, and ``pl.Trainer``'s arguments with
    their defaults, read from Lightning's source (nothing imported)."""
    ckpt = "resume this checkpoint, its algorithm and settings included (what may change: above)" \
        if command == "fit" else "the checkpoint to evaluate, its algorithm and settings included"
    options = [
        ("-h, --help", "this help"),
        ("-c, --config CONFIG.yaml", "the command line as YAML (model, trainer, seed_everything); later options "
                                     "override it"),
        ("--print_config", "print the whole config of the command, every default included, and exit"),
        ("--seed_everything N", "seeds the run, and the model unless --model.seed is given (default: 0)"),
        ("--model NAME", f"the algorithm: {', '.join(ALGORITHMS)} (any case), or the import path of a subclass"),
        ("--model.SETTING VALUE", f"a setting of the algorithm; every one, described: {PROG} {command} "
                                  "--model.help PPO"),
        ("--ckpt_path CKPT", ckpt),
        ("--data CLASS_PATH", "a LightningDataModule of your own instead of the algorithm's"),
        ("--trainer.ARGUMENT VALUE", "an argument of pl.Trainer (below)"),
    ]
    width = max(len(flag) for flag, _ in options)
    lines = [f"usage: {PROG} {command} [-c CONFIG.yaml] [--model NAME] [--model.SETTING VALUE ...] "
             "[--trainer.ARGUMENT VALUE ...] [--ckpt_path CKPT] [--print_config]",
             "", DESCRIPTIONS[command].format(algos=", ".join(ALGORITHMS)), "", "options:"]
    lines += [f"  {flag:<{width}}  {text}" for flag, text in options]
    trainer = _trainer_arguments()
    lines += ["", "pl.Trainer's arguments (--trainer.ARGUMENT VALUE), each with its default:"]
    if trainer is None:
        lines.append("  every argument of pl.Trainer: https://lightning.ai/docs/pytorch/stable/common/trainer.html")
    else:
        flags = [f"--trainer.{name} {default}" for name, default, _ in trainer]
        width = max(map(len, flags))
        lines += [f"  {flag:<{width}}  {text}" for flag, (_, _, text) in zip(flags, trainer, strict=True)]
    return "\n".join(lines)


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

def _option_value(argv: list[str], option: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def _options(argv: list[str]) -> list[str]:
    """The ``--name`` of every option given (``--a=b`` -> ``--a``)."""
    return [arg.split("=", 1)[0] for arg in argv if arg.startswith("--")]


def _check_names(command: str, argv: list[str]) -> None:
    """Misspelled names, before anything is imported: a ``--model.SETTING`` that the algorithm
    named by ``--model NAME`` does not have, a ``--trainer.ARGUMENT`` that is no argument of
    ``pl.Trainer`` (not even the start of one: argparse takes a unique prefix). What cannot be
    told from the source (a config file's model, a class of the user's) is left to Lightning's
    parser."""
    options = _options(argv)
    trainer = _trainer_arguments()
    if trainer is not None:
        names = [name for name, _, _ in trainer]
        for option in options:
            if not option.startswith("--trainer."):
                continue
            name = option.removeprefix("--trainer.").split(".")[0].rstrip("+")
            if not any(known.startswith(name) for known in names):
                close = difflib.get_close_matches(name, names, n=1)
                meant = f"; did you mean --trainer.{close[0]}?" if close else ""
                fail(command, f"--trainer.{name}: pl.Trainer has no argument {name!r}{meant} (all of them: "
                              f"{PROG} {command} --help)")
    algorithm = _option_value(argv, "--model")
    settings = _declared_settings()
    if algorithm not in ALGORITHMS or settings is None or "--model.class_path" in options:
        return
    for option in options:
        if not option.startswith("--model.") or option == "--model.help":
            continue
        name = option.removeprefix("--model.").removeprefix("init_args.").split(".")[0].rstrip("+")
        if name not in settings[algorithm] and name not in ("init_args", "dict_kwargs"):
            fail(command, _no_such_setting(algorithm, name, sorted(settings[algorithm])))


def _model_help(command: str, name: str) -> str | None:
    """``--model.help PPO``: every setting of the algorithm, one line each (name, default,
    description); ``None`` for a name that is no algorithm (Lightning's parser then says so)."""
    if name in ALGORITHMS:
        import lightning_rl.algorithms as algorithms

        cls = getattr(algorithms, name)
    else:
        cls = _import_class(name)
        from lightning_rl.algorithms.base import Algorithm

        if cls is None or not issubclass(cls, Algorithm):
            return None
    from lightning_rl.settings import setting_docs

    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    docs = setting_docs(cls)
    flags = [f"--model.{p.name} {_cli_value(p.default) if p.default is not p.empty else '(required)'}"
             for p in params]
    width = max(map(len, flags), default=0)
    summary = _first_sentence((cls.__doc__ or "").strip().split("\n\n")[0])
    lines = [f"{cls.__name__}: {summary}" if summary else cls.__name__,
             f"Its settings (--model {cls.__name__} --model.SETTING VALUE; in a config, model.init_args), "
             "each with its default:"]
    for flag, param in zip(flags, params, strict=True):
        text = re.sub(r"``(.+?)``", r"`\1`", " ".join(docs.get(param.name, "").split()))
        lines.append(f"  {flag:<{width}}  {text}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the command line
def main(args: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if args is None else args)
    if args is None:
        # As `python -m` does: an env module in the current directory (--model.env my_envs:Grid-v0)
        # imports. A console script's sys.path starts with the script's own directory instead.
        cwd = os.getcwd()
        if cwd not in sys.path and "" not in sys.path:
            sys.path.insert(0, cwd)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    try:
        if argv[:1] == ["plot"]:
            from lightning_rl.plotting import main as plot_main

            return plot_main(argv[1:])
        if argv[:1] == ["record"]:
            import lightning_rl.algorithms  # noqa: F401  # every algorithm a checkpoint may name
            from lightning_rl.recording import main as record_main

            return record_main(argv[1:])
        if argv[:1] == ["tune"]:
            from lightning_rl.tune import main as tune_main

            return tune_main(argv[1:], fit=cli)
        if argv[:1] == ["predict"]:
            fail("predict", PREDICT_REFUSAL)
        if not argv:
            fail(None, f"a command is required: {', '.join((*SUBCOMMANDS, *TOOLS))} ({PROG} --help)")
        if argv[0] in ("-h", "--help"):
            print(_top_help())
            return 0
        if command is None and not argv[0].startswith("-"):
            close = difflib.get_close_matches(argv[0], [*SUBCOMMANDS, *TOOLS], n=1)
            meant = f"; did you mean {close[0]}?" if close else ""
            fail(None, f"unknown command {argv[0]!r}{meant} (the commands: {', '.join((*SUBCOMMANDS, *TOOLS))})")
        if command is not None and any(arg in ("-h", "--help") for arg in argv[1:]):
            print(_command_help(command))
            return 0
        argv = _normalize_model_names(argv)
        if command is not None:
            _check_names(command, argv)
            wanted = _option_value(argv, "--model.help")
            shown = _model_help(command, wanted) if wanted else None
            if shown is not None:
                print(shown)
                return 0
        argv = _normalize_integers(_with_model_from_checkpoint(argv))
        if args is None:  # the command line itself, so Lightning does not warn of args next to sys.argv
            sys.argv[1:] = argv
            cli(None)
        else:
            cli(argv)
    except Exception as err:  # an optional dependency a run needs (Box2D, Ray, ...): one line naming its extra
        line = missing_dependency(err)
        if line is None:
            raise
        fail(command or (argv[0] if argv and argv[0] in TOOLS else None), line)
    return 0


def _with_model_from_checkpoint(argv: list[str]) -> list[str]:
    """``fit/validate/test --ckpt_path X`` with no model given: the model class from the
    checkpoint (resolved among the algorithms defined here; its hyperparameters follow in
    ``RLCLI._parse_ckpt_path``). A resumed fit continues only the class that wrote the file."""
    path = _option_value(argv, "--ckpt_path")
    if not argv or argv[0] not in SUBCOMMANDS or path is None:
        return argv
    if path in LIGHTNING_CKPT_NAMES and not Path(path).is_file():
        return argv
    if any(a in ("-c", "--config", "--model") or a.startswith(("--model=", "--config=")) for a in argv[1:]):
        return argv
    _lightning()  # every algorithm defined
    from lightning_rl.checkpoint import (
        CheckpointError,
        algorithm_class,
        algorithm_path,
        class_path,
        read_checkpoint,
        resolve_algorithm,
    )

    try:
        checkpoint = read_checkpoint(path)
        written_by = algorithm_path(checkpoint)
        cls = resolve_algorithm(written_by) if argv[0] == "fit" and written_by else algorithm_class(checkpoint)
    except CheckpointError as err:
        fail(argv[0], str(err))
    return argv if cls is None else [argv[0], "--model", class_path(cls), *argv[1:]]


def _each_option(argv: list[str]) -> typing.Iterator[tuple[int, str, str, bool]]:
    """(index of the value, option, value, written as ``--option=value``) of each option with a value."""
    for i, arg in enumerate(argv):
        option, eq, value = arg.partition("=")
        if eq:
            yield i, option, value, True
        elif i + 1 < len(argv):
            yield i + 1, arg, argv[i + 1], False


def _normalize_model_names(argv: list[str]) -> list[str]:
    """``--model ppo`` (any case) is PPO, and an unknown algorithm name is an error listing the
    algorithms."""
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    out = list(argv)
    for i, option, value, eq in _each_option(argv):
        if option in ("--model", "--model.help") and "." not in value and not value.startswith(("{", "-")):
            names = _algorithm_names()
            by_name = {name.lower(): name for name in names}
            if value.lower() not in by_name:
                fail(command, f"{option} {value}: no such algorithm (the algorithms: {', '.join(names)})")
            out[i] = f"{option}={by_name[value.lower()]}" if eq else by_name[value.lower()]
    return out


def _normalize_integers(argv: list[str]) -> list[str]:
    """An integer setting takes an integral number written as a float (``--model.total_env_steps
    1e5`` or ``100000.0``)."""
    out = list(argv)
    integers = None
    for i, option, value, eq in _each_option(argv):
        if not option.startswith("--model."):
            continue
        integers = _integer_settings() if integers is None else integers
        if option.removeprefix("--model.").removeprefix("init_args.") in integers:
            out[i] = f"{option}={_integral(value)}" if eq else _integral(value)
    return out


def _integral(text: str) -> str:
    """``"1e5"`` or ``"100000.0"`` -> ``"100000"``; anything else unchanged (and checked by the parser)."""
    try:
        number = Decimal(text)
    except InvalidOperation:
        return text
    return str(int(number)) if number.is_finite() and number == number.to_integral_value() else text


def _integer_settings() -> set[str]:
    """The names of the algorithms' integer settings (``int`` or ``int | None``)."""
    _lightning()  # every algorithm defined
    from lightning_rl.checkpoint import algorithm_registry

    names: set[str] = set()
    for cls in algorithm_registry().values():
        try:
            hints = typing.get_type_hints(cls.__init__)
        except Exception:  # an annotation this process cannot resolve: no conversion for that class
            continue
        for name, hint in hints.items():
            if hint is int or (typing.get_origin(hint) in (typing.Union, _UnionType)
                               and int in typing.get_args(hint)
                               and set(typing.get_args(hint)) <= {int, type(None)}):
                names.add(name)
    return names


_UnionType = type(int | None)


if __name__ == "__main__":
    sys.exit(main())
