"""``lightning-rl``: Lightning's CLI over every algorithm, plus ``plot`` and ``record``.

    lightning-rl fit -c examples/configs/ppo_cartpole.yaml
    lightning-rl fit --model PPO --model.env CartPole-v1 --trainer.max_epochs 5
    lightning-rl validate --ckpt_path lightning_logs/version_0/checkpoints/last.ckpt
    lightning-rl fit -c examples/configs/dqn_cartpole.yaml --print_config
    lightning-rl plot lightning_logs/version_0 lightning_logs/version_1 --out curve.png
    lightning-rl record --ckpt_path model.ckpt --out agent.gif
"""

from __future__ import annotations

import sys
from typing import Any

from pytorch_lightning.cli import LightningCLI

import lightning_rl  # noqa: F401  (imports every algorithm so --model PPO resolves)
from lightning_rl.algorithms.base import RLModule

TOOLS = ("plot", "record")


def cli(args: list[str] | None = None, run: bool = True, **kwargs: Any) -> LightningCLI:
    """Lightning's CLI with any ``RLModule`` subclass as the model (``--model PPO``)."""
    return LightningCLI(
        RLModule,
        subclass_mode_model=True,
        auto_configure_optimizers=False,  # each algorithm configures its own optimizers
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": "lightning-rl"},
        args=args,
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
    cli(_with_model_from_checkpoint(argv) if args is not None or argv else None)
    return 0


def _with_model_from_checkpoint(argv: list[str]) -> list[str]:
    """``validate/test/predict --ckpt_path X`` with no model given: take the model class from
    the checkpoint (Lightning then fills in its saved hyperparameters)."""
    if not argv or argv[0] not in ("validate", "test", "predict") or "--ckpt_path" not in argv:
        return argv
    if any(a in ("-c", "--config", "--model") or a.startswith(("--model=", "--config=")) for a in argv[1:]):
        return argv
    from lightning_rl.checkpoint import algorithm_path, read_checkpoint

    path = argv[argv.index("--ckpt_path") + 1]
    name = algorithm_path(read_checkpoint(path))
    return argv if name is None else [argv[0], "--model", name, *argv[1:]]


if __name__ == "__main__":
    sys.exit(main())
