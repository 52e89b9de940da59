"""Shared helpers: short seeded fits with no loggers or progress output."""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from lightning_rl.batch import SampleBatch

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


# The files that take most of the default suite's time (the single-agent learning runs are ``slow``
# and not in it). With pytest-xdist's ``--dist loadfile --no-loadscope-reorder`` (setup.cfg) files
# are handed to the workers in collection order, so these start first and the many short files
# fill in around them, rather than one worker starting a long file while the other has nothing
# left to do.
LONGEST_FILES = ("test_ddp.py", "test_cli.py", "test_async_faults.py", "test_ray.py", "test_impala_appo.py",
                 "test_learning.py")


# The files ``pytest -m quick`` leaves out (CONTRIBUTING.md): learning runs, 2-rank DDP launches,
# CLI and example subprocesses, sampler-process faults, real Atari games, the package build and
# the docs site. Every other test not marked ``slow`` is marked ``quick``.
LONG_FILES = frozenset({
    *LONGEST_FILES, "test_examples.py", "test_packaging.py", "test_docs.py", "test_atari.py", "test_interrupt.py",
    "test_compile.py", "test_custom_env.py", "test_custom_network.py", "test_checkpoint_safety.py",
    "test_env_faults.py", "test_async.py", "test_async_resume.py", "test_apex_a3c.py", "test_normalization.py",
    "test_recurrent.py", "test_plot_record.py", "test_benchmark_scripts.py", "test_learning_seeds.py",
    "test_trainer_flags_processes.py", "test_tune.py", "test_tune_ray.py", "test_benchmark_continuous_control.py",
})


def pytest_collection_modifyitems(config, items):
    """Collect ``LONGEST_FILES`` first, in that order; each file's tests keep their own order. Mark
    ``quick`` every test outside ``LONG_FILES`` that is not ``slow``."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))
    for item in items:
        if item.path.name not in LONG_FILES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.quick)


def quiet_trainer(**kwargs) -> pl.Trainer:
    """A Trainer that writes nothing unless asked (``logger``/``default_root_dir`` in kwargs)."""
    defaults = dict(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", devices=1,
    )
    return pl.Trainer(**{**defaults, **kwargs})


def spy_frames_and_rewards(model: pl.LightningModule) -> list[tuple]:
    """Wrap ``model.postprocess`` to record, per iteration, the default policy's observation dtype
    and frame shape, the set of rewards the learner sees, and the episodes' raw returns."""
    seen: list[tuple] = []
    post = model.postprocess

    def spy(batch):
        rows = batch.policy_batches["default_policy"]
        seen.append((rows[SampleBatch.OBS].dtype, tuple(rows[SampleBatch.OBS].shape[2:]),
                     set(torch.unique(rows[SampleBatch.REWARDS]).tolist()), list(batch.info["episode_returns"])))
        return post(batch)

    model.postprocess = spy
    return seen


def fit_in_halves(make: Callable[[], pl.LightningModule], tmp_path: Path, batches: int = 4) -> tuple:
    """``(full, first, resumed)``: a 2-epoch run of ``batches`` iterations per epoch, and the same
    run stopped after epoch 1, checkpointed and resumed (what every exact-resume test compares)."""
    full = make()
    quiet_trainer(max_epochs=2, limit_train_batches=batches, default_root_dir=tmp_path / "full").fit(full)
    first = make()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=batches, default_root_dir=tmp_path)
    trainer.fit(first)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    resumed = make()
    quiet_trainer(max_epochs=2, limit_train_batches=batches, default_root_dir=tmp_path).fit(
        resumed, ckpt_path=tmp_path / "mid.ckpt")
    return full, first, resumed


def sample_once(model: pl.LightningModule):
    """One iteration's batch from the model's own sampler, outside fit, post-processed as the
    training step learns on it (``postprocess``: GAE for the policy-gradient methods)."""
    dm = model.default_datamodule
    dm.connect(model)
    dm.setup("fit")
    try:
        return model.postprocess(dm.sample())
    finally:
        dm.close()


def fit_iterations(model: pl.LightningModule, iterations: int, **trainer_kwargs) -> pl.Trainer:
    """Run exactly ``iterations`` training iterations (Lightning training steps)."""
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=iterations, **trainer_kwargs)
    trainer.fit(model)
    return trainer


def _ephemeral_low() -> int:
    """The first port the kernel hands out for outgoing connections and ``bind(port 0)``."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; macOS and Windows start higher still


def free_port() -> int:
    """A port for one DDP launch's ``MASTER_PORT`` that no concurrent test can be given.

    Lightning's own default binds port 0 and closes it again: the port is an ephemeral one that any
    outgoing connection (gloo opens many) may take before rank 0 listens on it, and a ``MASTER_PORT``
    in the caller's environment would be shared by every launch. Here each pytest-xdist worker draws
    from its own block of 500 ports below the ephemeral range (so no outgoing connection, and no other
    worker, uses it) and checks that nothing listens there; a worker runs one launch at a time.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    low = min(_ephemeral_low(), 32768) - 10_000
    block = 500
    start = max(1024, low + (index * block) % 10_000)
    for port in random.sample(range(start, start + block), block):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}..{start + block - 1}")


def default_sigint() -> None:
    """``preexec_fn`` for a child a test Ctrl-Cs: SIGINT at its default, as from a terminal. A suite run as a
    background job of a shell inherits SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_one_children(script: str) -> list[int]:
    """Processes of ``benchmarks/<script> --run-one`` (a benchmark's fit in a process of its own)
    still alive: none once the benchmark returned."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--run-one" in cmdline and any(part.endswith(f"benchmarks/{script}".encode()) for part in cmdline):
            left.append(int(pid))
    return left


def ddp_subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a subprocess that starts a 2-process CPU DDP run: its own free
    ``MASTER_PORT`` on the loopback interface, one thread per process, no rank of ours inherited."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           **extra}
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GLOBAL_RANK", "RANK"):
        env.pop(name, None)
    return env


# AF_UNIX socket paths end at 107 bytes and Ray puts its sockets ~70 characters under its temp
# directory (session_<date>_<pid>/sockets/plasma_store): a base temp directory longer than this
# is passed over for /tmp.
_SHORT_TEMP = 40


@contextmanager
def ray_temp_dir(prefix: str = "lrl-ray-") -> Iterator[Path]:
    """A new, short directory that Ray treats as the machine's temp directory for as long as the
    block runs (``RAY_TMPDIR``, inherited by every subprocess started meanwhile), with the ``ray/``
    folder Ray's ``Cluster`` writes its address file into but does not create; yields that ``ray/``
    folder. Removed afterwards, and ``RAY_TMPDIR`` restored, also when the block raises."""
    base = tempfile.gettempdir()
    temp = Path(tempfile.mkdtemp(prefix=prefix, dir=base if len(base) + len(prefix) + 8 <= _SHORT_TEMP else "/tmp"))
    previous = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(temp)
    try:
        (temp / "ray").mkdir()
        yield temp / "ray"
    finally:
        if previous is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _ray_writes_under_the_suite():
    """Every Ray the suite starts (a test's cluster, a fit's local Ray, a benchmark's) keeps its
    session folders and address file in a directory of the suite's own, gone after it: nothing is
    read from, or left in, a ``/tmp/ray`` an earlier run may have left."""
    with ray_temp_dir("lrl-suite-"):
        yield


@pytest.fixture(autouse=True)
def _deterministic_torch():
    torch.set_num_threads(1)
    yield


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``lightning_rl.cli.main(args)`` as the command line runs it: (exit code, stdout, stderr)."""
    from lightning_rl.cli import main

    argv = sys.argv
    sys.argv = ["lightning-rl"]  # as on the command line (Lightning warns of args next to other argv)
    try:
        code = main(args)
    except SystemExit as exit_info:
        code = exit_info.code
    finally:
        sys.argv = argv
    out = capsys.readouterr()
    return code, out.out, out.err
