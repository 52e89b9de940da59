"""Lightning's CLI classes as ``lightning-rl``'s (``RLArgumentParser``, ``RLCLI``), defined on
first use (``_lightning``): importing Lightning and torch takes seconds that help and argument
errors do not wait for (``cli.py``)."""

from __future__ import annotations

import functools
import os
import sys
import traceback
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

from lightning_rl.cli_source import (
    LIGHTNING_CKPT_NAMES,
    NO_ALGORITHM,
    RESUMABLE_SETTINGS,
    SUBCOMMANDS,
    _algorithm_names,
    _import_class,
    fail,
    summarize_parse_error,
)
from lightning_rl.extras import missing_dependency


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
