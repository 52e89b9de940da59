"""``lightning-rl``: Lightning's CLI over every algorithm, plus ``plot`` and ``record``.

    lightning-rl fit -c examples/configs/ppo_cartpole.yaml
    lightning-rl fit --model PPO --model.env CartPole-v1 --trainer.max_epochs 5
    lightning-rl validate --ckpt_path lightning_logs/version_0/checkpoints/last.ckpt
    lightning-rl fit -c examples/configs/dqn_cartpole.yaml --print_config
    lightning-rl plot lightning_logs/version_0 lightning_logs/version_1 --out curve.png
    lightning-rl record --ckpt_path model.ckpt --out agent.gif
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.loggers import CSVLogger

import lightning_rl  # noqa: F401  (defines every algorithm, so --model PPO and checkpoints resolve)
from lightning_rl.algorithms.base import RLModule
from lightning_rl.checkpoint import (
    CheckpointError,
    algorithm_class,
    class_path,
    is_callable_placeholder,
    read_checkpoint,
)
from lightning_rl.data.envs import check_env
from lightning_rl.loggers import tensorboard_available

TOOLS = ("plot", "record")


class RLCLI(LightningCLI):
    """Lightning's CLI with two differences that keep runs reproducible and checkpoints safe:

    - the model's ``seed`` follows ``--seed_everything`` when it is not given itself;
    - ``--ckpt_path`` fills in the model's class and hyperparameters from any lightning_rl
      checkpoint (not only the CLI's own), read with ``weights_only=True``, with the class
      taken from the algorithms defined in this process, never imported because a file
      names it. A callable hyperparameter (an env factory) is not in the file: pass it
      again (``--model.env ...``).
    """

    def __init__(self, *args: Any, argv: list[str] | None = None, **kwargs: Any) -> None:
        self._argv = list(sys.argv[1:] if argv is None else argv)
        super().__init__(*args, args=argv, **kwargs)

    def _parse_ckpt_path(self) -> None:
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        try:
            checkpoint = read_checkpoint(ckpt_path)
            cls = algorithm_class(checkpoint)
        except CheckpointError as err:
            self.parser.error(str(err))
        hparams = {k: v for k, v in checkpoint.get("hyper_parameters", {}).items() if not k.startswith("_")}
        for name, value in list(hparams.items()):
            if not is_callable_placeholder(value):
                continue
            if not any(a == f"--model.{name}" or a.startswith(f"--model.{name}=") for a in self._argv):
                self.parser.error(
                    f"checkpoint {ckpt_path!r} was trained with {name}={value}, which a checkpoint cannot hold "
                    f"(loading one never runs code): pass it again with --model.{name}"
                )
            del hparams[name]  # the command line's value stands
        if cls is None:
            return
        model = {"class_path": class_path(cls), "init_args": hparams}
        self.config = self.parser.parse_object({subcommand: {"model": model}}, self.config)

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        seed = config.get("seed_everything")
        model = config.get("model")
        init_args = getattr(model, "init_args", None)
        seeded = isinstance(seed, int) and not isinstance(seed, bool)
        if seeded and init_args is not None and init_args.get("seed") is None:
            init_args.seed = seed
        # An env-step budget is the run's limit: no epoch limit (Lightning would set 1000 and warn).
        trainer = config.get("trainer")
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

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        if self.subcommand == "fit" and isinstance(self.model, RLModule):
            # Ctrl-C / SIGTERM: the message gives the command that resumes the run. Through the module
            # (its InterruptCheckpoint): one in the Trainer's callbacks at the start of fit would make
            # Lightning resume from "last" and replace the default ModelCheckpoint.
            self.model.resume_command = list(self._argv)

    def _check_env(self, init_args: Any) -> None:
        """A bad ``--model.env`` is reported as ours (naming the env and the import that
        failed), not as jsonargparse's "does not validate against any of the Union subtypes"."""
        env = init_args.get("env") if init_args is not None else None
        if not isinstance(env, str):
            return
        try:
            check_env(env, init_args.get("env_kwargs"))
        except (ValueError, ImportError, TypeError) as err:
            self.parser.error(str(err))


def cli(args: list[str] | None = None, run: bool = True, **kwargs: Any) -> LightningCLI:
    """Lightning's CLI with any ``RLModule`` subclass as the model (``--model PPO``)."""
    return RLCLI(
        RLModule,
        subclass_mode_model=True,
        auto_configure_optimizers=False,  # each algorithm configures its own optimizers
        # Lightning's default (True) seeds 0 too, with a "No seed found" warning.
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": "lightning-rl"},
        argv=args,
        run=run,
        **kwargs,
    )


def main(args: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if args is None else args)
    if argv[:1] == ["plot"]:
        from lightning_rl.plotting import main as plot_main

        return plot_main(argv[1:])
    if argv[:1] == ["record"]:
        from lightning_rl.recording import main as record_main

        return record_main(argv[1:])
    if argv[:1] in (["-h"], ["--help"]):
        print("lightning-rl {fit,validate,test,predict} [options]  (Lightning's CLI; `lightning-rl fit -h`)")
        print("lightning-rl plot LOG_DIR... --out curve.png   (`lightning-rl plot -h`)")
        print("lightning-rl record --ckpt_path CKPT --out agent.gif   (`lightning-rl record -h`)")
    argv = _with_model_from_checkpoint(argv)
    if args is None:  # the command line itself, so Lightning does not warn of args next to sys.argv
        sys.argv[1:] = argv
        cli(None)
    else:
        cli(argv)
    return 0


def _with_model_from_checkpoint(argv: list[str]) -> list[str]:
    """``validate/test/predict --ckpt_path X`` with no model given: the model class from the
    checkpoint (resolved among the algorithms defined here; its hyperparameters follow in
    ``RLCLI._parse_ckpt_path``)."""
    if not argv or argv[0] not in ("validate", "test", "predict") or "--ckpt_path" not in argv:
        return argv
    if any(a in ("-c", "--config", "--model") or a.startswith(("--model=", "--config=")) for a in argv[1:]):
        return argv
    path = argv[argv.index("--ckpt_path") + 1]
    try:
        cls = algorithm_class(read_checkpoint(path))
    except CheckpointError as err:
        print(f"lightning-rl {argv[0]}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    return argv if cls is None else [argv[0], "--model", class_path(cls), *argv[1:]]


if __name__ == "__main__":
    sys.exit(main())
