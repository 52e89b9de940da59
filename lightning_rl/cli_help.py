"""``lightning-rl``'s help texts and the check of misspelled ``--model.SETTING`` and
``--trainer.ARGUMENT`` names, answered from the source alone (``cli_source.py``)."""

from __future__ import annotations

import difflib
import inspect
import re

from lightning_rl.cli_source import (
    ALGORITHMS,
    DESCRIPTIONS,
    PROG,
    _cli_value,
    _declared_settings,
    _first_sentence,
    _import_class,
    _no_such_setting,
    _trainer_arguments,
    fail,
)


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
