"""Sampler workers as child processes of the learner process (the default backend): each owns
shared-memory slots it writes fragments into and two pipes (free slot ids in, filled ones out);
the weights go out through one shared flat state with a sequence lock (nothing pickled)."""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

from lightning_rl.data.envs.faults import describe_exit_code, stop_processes
from lightning_rl.data.samplers.engine import policy_state
from lightning_rl.data.workers.pool import Fragment, PoolSpec, Received, WorkerPool
from lightning_rl.data.workers.worker import SamplerWorker

_POLL_S = 0.05  # how often a blocked worker looks at the world (stop, orphaned)


class _SharedWeights:
    """The policy's whole state, parameters and buffers (BatchNorm statistics, observation
    normalizers...), as shared tensors with a sequence lock: odd while the learner writes.
    ``version`` is the learner iteration the state is from."""

    def __init__(self, policy: nn.Module) -> None:
        self.tensors = [t.detach().cpu().clone().share_memory_() for t in policy_state(policy)]
        self.seq = torch.zeros(2, dtype=torch.int64).share_memory_()  # [sequence, version]

    def write(self, policy: nn.Module, version: int) -> None:
        self.seq[0] += 1
        for shared, tensor in zip(self.tensors, policy_state(policy), strict=True):
            shared.copy_(tensor.detach())
        self.seq[1] = version
        self.seq[0] += 1

    def read_into(self, worker: SamplerWorker) -> None:
        """Load a newer state than the worker's into it."""
        while True:
            start = int(self.seq[0])
            version = int(self.seq[1])
            if start % 2:
                time.sleep(0.0005)
                continue
            if version == worker.version:
                return
            snapshot = [t.clone() for t in self.tensors]
            if int(self.seq[0]) == start:
                worker.load(snapshot, version)
                return


def _worker_main(index: int, seed: int | None, make_sampler: Callable[[int | None], Any], policy: nn.Module,
                 task: Any, length: int, weights: _SharedWeights, slots: list[dict[str, torch.Tensor]], free: Any,
                 out: Any, stop: Any, parent_pid: int) -> None:
    """A sampler process: take a free slot id from ``free``, load the newest weights, sample a
    fragment, fill the slot with it, send its id on ``out``; until stopped or orphaned. Each
    worker has its own two pipes: a worker killed mid-write can corrupt only its own (a shared
    queue's lock would hang the others)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the learner, which stops us
    # Daemonic for the learner (stopped at its exit), but free to start processes of its own: the
    # envs of ``vectorization="async"``. SIGTERM (how the pool stops a worker) stops them first,
    # then ends the worker as SIGTERM does; a worker killed outright leaves them to exit when their
    # pipes to it close.
    mp.current_process().daemon = False
    worker = None
    signal.signal(signal.SIGTERM, lambda signum, frame: _stop(worker))
    try:
        worker = SamplerWorker(make_sampler, seed, policy, task, length)
        while not stop.is_set() and os.getppid() == parent_pid:
            if not free.poll(_POLL_S * 4):
                continue
            slot = free.recv()
            weights.read_into(worker)
            tensors, extra, seconds, episodes = worker.sample()
            buf = slots[slot]
            for key, value in tensors.items():
                buf[key][: len(value)].copy_(value)
            out.send(("fragment", index, slot, worker.version, seconds, episodes, extra))
    except BaseException:  # everything, KeyboardInterrupt included, goes to the learner
        try:
            out.send(("error", index, traceback.format_exc()))
        except OSError:
            pass
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # a close under way ends before the worker
        if worker is not None:
            worker.close()


def _stop(worker: SamplerWorker | None) -> None:
    """SIGTERM in a worker: close its envs (terminating their processes; those of envs still
    being built too), then die of SIGTERM."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        if worker is not None:
            worker.close()
        stop_processes(mp.active_children(), timeout=1.0)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


class ProcessPool(WorkerPool):
    """Worker processes (fork where no CUDA is initialized, else spawn), ``credits`` shared-memory
    slots each. A worker killed by a signal is found by its exit code."""

    def __init__(self, spec: PoolSpec) -> None:
        super().__init__(spec)
        self.processes: list[Any] = []
        self.conns: list[Any] = []  # per worker: (free-slot sender, fragment receiver)
        self.weights: _SharedWeights | None = None
        self.slots: list[dict[str, torch.Tensor]] = []
        self.owner: list[int] = []
        # The loader thread and the learner's both talk to the workers: a restart (new pipes,
        # every slot handed to the new worker) and a slot handed back are one step each.
        self.lock = threading.RLock()
        self.closing = False

    def start(self, policy: nn.Module, version: int) -> None:
        spec = self.spec
        self.weights = _SharedWeights(spec.policy)
        self.weights.write(policy, version)
        self.slots = [
            {k: torch.zeros(shape, dtype=dtype).share_memory_() for k, (shape, dtype) in spec.columns.items()}
            for _ in range(spec.credits * spec.num_workers)
        ]
        self.owner = [i // spec.credits for i in range(len(self.slots))]
        # fork where it is safe (no CUDA in this process yet): no pickling, quick start.
        method = "fork" if "fork" in mp.get_all_start_methods() and not torch.cuda.is_initialized() else "spawn"
        self.ctx = mp.get_context(method)
        self.stop = self.ctx.Event()
        self.processes = [None] * spec.num_workers
        self.conns = [None] * spec.num_workers
        for i in range(spec.num_workers):
            self._spawn(i)

    def _spawn(self, index: int) -> None:
        """Start worker ``index`` with new pipes, holding every slot it owns."""
        spec = self.spec
        free_recv, free_send = self.ctx.Pipe(duplex=False)
        out_recv, out_send = self.ctx.Pipe(duplex=False)
        process = self.ctx.Process(
            target=_worker_main, name=f"lightning_rl-sampler-{index}", daemon=True,
            args=(index, spec.seed(index, self.restarts[index]), spec.make_sampler, spec.policy, spec.tasks[index],
                  spec.length, self.weights, self.slots, free_recv, out_send, self.stop, os.getpid()),
        )
        process.start()
        free_recv.close()  # the worker's ends live in the worker now
        out_send.close()
        self._close_conns(index)
        self.processes[index] = process
        self.conns[index] = (free_send, out_recv)
        for slot, owner in enumerate(self.owner):
            if owner == index:
                free_send.send(slot)

    def _close_conns(self, index: int) -> None:
        if self.conns[index] is not None:
            for conn in self.conns[index]:
                conn.close()
            self.conns[index] = None

    def broadcast(self, policy: nn.Module, version: int) -> None:
        self.weights.write(policy, version)

    def receive(self, limit: int, timeout: float) -> list[Received]:
        self.check()
        receivers = [c[1] for c in self.conns if c is not None]
        received: list[Received] = []
        for conn in multiprocessing.connection.wait(receivers, timeout=timeout):
            try:
                while len(received) < limit and conn.poll():
                    received.append(self._receive(conn.recv()))
            except (EOFError, OSError):  # the worker died: check names it
                continue
        return received

    def _receive(self, message: tuple) -> Received:
        """A worker's message: its fragment (copied out, its slot handed back unless ``hold``:
        then ``release`` does), or its error raised."""
        if message[0] == "error":
            _, index, trace = message
            raise RuntimeError(
                f"sampler worker {index} (pid {self.processes[index].pid}) failed:\n\n"
                f"Traceback in the worker process:\n{trace}"
            )
        _, index, slot, version, seconds, episodes, extra = message
        counts = {k: extra.get("counts", {}).get(k, extra.get("count")) for k in self.slots[slot]}
        tensors = {k: (v if counts[k] is None else v[:counts[k]]).clone() for k, v in self.slots[slot].items()}
        if self.spec.hold:  # and which incarnation of the worker it is from (see release)
            extra["slot"] = (slot, self.restarts[index])
        else:
            self.release(index, slot)
        return Received(Fragment(tensors, version, index, extra), seconds, episodes)

    def release(self, index: int, token: Any, incarnation: int | None = None) -> None:
        with self.lock:  # no restart between the check and the send: its successor has the slot already
            if incarnation is not None and incarnation != self.restarts[index]:
                return
            try:
                self.conns[index][0].send(token)
            except (OSError, TypeError):  # that worker just died: the slot is its successor's
                pass

    def _raise_sent_error(self, index: int) -> None:
        """Raise the error a dead worker sent before it exited, if any (the rest of what it sent is dropped)."""
        if self.conns[index] is None:
            return
        receiver = self.conns[index][1]
        try:
            while receiver.poll():
                message = receiver.recv()
                if message[0] == "error":
                    self._receive(message)
        except (EOFError, OSError):
            pass

    def check(self) -> None:
        for i, process in enumerate(self.processes):
            code = process.exitcode
            if code is None or self.closing:
                continue
            self._raise_sent_error(i)  # an env error it sent before exiting names the env, not "died"
            if not self.spec.restart_failed_workers:
                raise RuntimeError(f"sampler worker {i} (pid {process.pid}) died: {describe_exit_code(code)}")
            with self.lock:
                self.restarts[i] += 1
                self._spawn(i)
            self.spec.on_restart()

    def describe(self) -> str:
        return f"workers alive: {[p.is_alive() for p in self.processes]}"

    def close(self, terminate: bool = False) -> None:
        self.closing = True
        if self.processes:
            self.stop.set()
            stop_processes([p for p in self.processes if p is not None], timeout=0.5 if terminate else 2.0)
            for i in range(len(self.conns)):
                self._close_conns(i)
            self.processes = []
