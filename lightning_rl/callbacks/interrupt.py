"""Save a checkpoint when ``fit`` is interrupted: Ctrl-C (SIGINT) or SIGTERM (cluster preemption,
``docker stop``, ``timeout``); the process then exits 130 or 143, as a shell reports a process
ended by that signal."""

from __future__ import annotations

import os
import shlex
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import OnExceptionCheckpoint
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities import rank_zero_info
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lightning_rl.callbacks.final_checkpoint import INTERRUPTED_FILENAME, model_checkpoint

SIGINT_EXIT_CODE = 128 + signal.SIGINT  # 130
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM  # 143


class Interrupted(SystemExit):
    """Ctrl-C during ``fit``: a ``SystemExit`` with code 130, raised where ``KeyboardInterrupt``
    would be. Lightning turns a ``KeyboardInterrupt`` into ``sys.exit(1)``; any other exception
    goes through its ordinary cleanup (callbacks' ``on_exception``, teardown) and on out of ``fit``."""

    def __init__(self) -> None:
        super().__init__(SIGINT_EXIT_CODE)


class InterruptCheckpoint(OnExceptionCheckpoint):
    """Lightning's ``OnExceptionCheckpoint`` for interruptions only: Ctrl-C (SIGINT) and SIGTERM
    during ``fit`` leave ``interrupted.ckpt`` in the run's checkpoint folder (the Trainer's
    ``ModelCheckpoint``'s, by default ``<version folder>/checkpoints``; without one,
    ``<trainer.log_dir>/checkpoints``), which the message says how to resume. Other exceptions
    are bugs to see, not states to resume from.

    - SIGINT: while ``fit`` runs (from its sanity check on), Python's default SIGINT handler is
      replaced by one that raises :class:`Interrupted` (exit code 130) at once, as
      ``KeyboardInterrupt`` would; further SIGINTs are ignored while fit cleans up (as Lightning
      does). A handler of the user's own is left in place (Lightning's ``KeyboardInterrupt``
      handling then applies: exit code 1). Lightning restores the handler when fit ends.
    - SIGTERM: Lightning's own handler stops fit after the iteration in progress (its
      ``SIGTERMException``, a ``SystemExit``); the checkpoint is saved and the exit code set to 143.
      Evaluation (the sanity check, validation, ``trainer.validate`` and ``trainer.test``) is one
      Lightning batch, between which alone Lightning looks: it looks itself after every env step
      (``evaluation.log_evaluation``), so SIGTERM ends it within a step, with exit code 143 too
      (and the checkpoint during ``fit``; ``validate`` and ``test`` have no training state to save).

    Args:
        dirpath: where to save; ``None`` (the default) = the run's checkpoint folder, as above.
        filename: the file's name without ``.ckpt``.
        resume_command: the ``lightning-rl`` arguments that started the run (the CLI passes
            them): the message then gives the command that resumes it; else
            ``trainer.fit(model, ckpt_path=...)``.
    """

    def __init__(self, dirpath: str | None = None, filename: str = INTERRUPTED_FILENAME,
                 resume_command: Sequence[str] | None = None) -> None:
        super().__init__(dirpath if dirpath is not None else "checkpoints", filename)
        self._dirpath_given = dirpath is not None
        self.resume_command = list(resume_command) if resume_command is not None else None
        self._sigint_installed = False

    # ---------------------------------------------------------------- where
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and not self._dirpath_given:
            self.dirpath = os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        checkpoint = model_checkpoint(trainer)  # its dirpath is resolved in its own setup
        if not self._dirpath_given and checkpoint is not None and checkpoint.dirpath:
            self.dirpath = checkpoint.dirpath
        self._install_sigint_handler()

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install_sigint_handler()

    # ---------------------------------------------------------------- SIGINT
    def _install_sigint_handler(self) -> None:
        """After Lightning registered its handlers (it restores those it found when fit ends)."""
        if self._sigint_installed or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return  # ignored (a background job), or the user's own handler: theirs
        signal.signal(signal.SIGINT, self._on_sigint)
        self._sigint_installed = True

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the cleanup that follows is not interrupted again
        raise Interrupted()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Not OnExceptionCheckpoint's: that deletes the file at every normal end, another run's included.
        if self._sigint_installed and signal.getsignal(signal.SIGINT) == self._on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        self._sigint_installed = False

    # ---------------------------------------------------------------- saving
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):
            what = "Terminated (SIGTERM)"
            exception.code = SIGTERM_EXIT_CODE  # Lightning's SIGTERMException exits 0 otherwise
        elif isinstance(exception, Interrupted | KeyboardInterrupt):
            what = "Interrupted (Ctrl-C)"
        else:
            return
        if trainer.state.fn != TrainerFn.FITTING:
            rank_zero_info(f"{what} during {trainer.state.fn.value}: no training state to save")
            return
        trainer.save_checkpoint(self.ckpt_path, weights_only=False)
        rank_zero_info(f"{what}: saved {self.ckpt_path}; resume with {self.resume_hint()}")

    def resume_hint(self) -> str:
        if self.resume_command is None:
            return f"trainer.fit(model, ckpt_path={self.ckpt_path!r})"
        return shlex.join(["lightning-rl", *without_ckpt_path(self.resume_command), "--ckpt_path", self.ckpt_path])

    def state_dict(self) -> dict[str, Any]:
        return {}


def without_ckpt_path(args: Sequence[str]) -> list[str]:
    """``args`` less any ``--ckpt_path X`` / ``--ckpt_path=X`` (a resumed run interrupted again)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            out.append(arg)
    return out
