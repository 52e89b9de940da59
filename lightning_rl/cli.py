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
settings and ``pl.Trainer``'s arguments read with ``ast``: ``cli_source.py``, ``cli_help.py``).
Lightning's CLI classes (``RLCLI``, ``RLArgumentParser``) are defined on first use
(``cli_lightning.py``).
"""

from __future__ import annotations

import difflib
import os
import sys
import typing
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_rl.cli_help import _check_names, _command_help, _model_help, _option_value, _top_help
from lightning_rl.cli_lightning import _integer_settings, _lightning
from lightning_rl.cli_source import (
    ALGORITHMS,
    DESCRIPTIONS,
    LIGHTNING_CKPT_NAMES,
    PREDICT_REFUSAL,
    PROG,
    RESUMABLE_SETTINGS,
    SUBCOMMANDS,
    TOOLS,
    _algorithm_names,
    fail,
)
from lightning_rl.extras import missing_dependency

if TYPE_CHECKING:
    from pytorch_lightning.cli import LightningCLI

__all__ = ["ALGORITHMS", "RESUMABLE_SETTINGS", "cli", "main"]


def __getattr__(name: str) -> Any:
    if name in ("RLArgumentParser", "RLCLI"):
        return getattr(_lightning(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    from lightning_rl import checkpoint as ckpt

    try:
        checkpoint = ckpt.read_checkpoint(path)
        written_by = ckpt.algorithm_path(checkpoint)
        fitting = argv[0] == "fit" and written_by
        cls = ckpt.resolve_algorithm(written_by) if fitting else ckpt.algorithm_class(checkpoint)
    except ckpt.CheckpointError as err:
        fail(argv[0], str(err))
    return argv if cls is None else [argv[0], "--model", ckpt.class_path(cls), *argv[1:]]


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


if __name__ == "__main__":
    sys.exit(main())
