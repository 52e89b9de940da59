"""The learner thread and the loader thread of an async DataModule share the worker pool and the
fault counters. Each test drives the bad interleaving on purpose: one thread is stopped exactly
between its read and its write, and the other thread is run meanwhile (no real processes, no
reliance on timing: the fixed code blocks the second thread until the first is done, the old
code let it through)."""

from __future__ import annotations

import multiprocessing
import threading
from types import SimpleNamespace

import pytest
import torch

from lightning_rl.batch import MultiAgentBatch, SampleBatch
from lightning_rl.data.async_gradients import A3CDataModule
from lightning_rl.data.async_sampling import AsyncSamplingDataModule
from lightning_rl.data.learner_queue import POLICY_VERSION
from lightning_rl.data.settings import EnvSettings, LearnerQueue, SamplerWorkers
from lightning_rl.data.workers import PoolSpec
from lightning_rl.data.workers.processes import ProcessPool

pytestmark = pytest.mark.timeout(60)

PAUSE_S = 0.5  # how long the stopped thread waits for the other one (which the fixed code holds back)


class FakeEnd:
    """One end of a worker's pipe: records what the learner sends to that worker."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.closed = False

    def send(self, value: int) -> None:
        if self.closed:
            raise OSError("handle is closed")
        self.sent.append(value)

    def poll(self, timeout: float = 0.0) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


class FakeProcess:
    def __init__(self, exitcode: int | None = None, **kwargs) -> None:
        self.exitcode, self.pid = exitcode, 4242

    def start(self) -> None:
        pass


class FakeContext:
    """Spawns nothing: the new worker's pipes are ``FakeEnd``s, kept in ``ends``."""

    def __init__(self) -> None:
        self.ends: list[FakeEnd] = []

    def Pipe(self, duplex: bool = True) -> tuple[FakeEnd, FakeEnd]:
        pair = (FakeEnd(), FakeEnd())
        self.ends += pair
        return pair

    def Process(self, **kwargs) -> FakeProcess:
        return FakeProcess()


def fake_pool(dm: AsyncSamplingDataModule, processes: list, conns: list, slots: list | None = None) -> ProcessPool:
    """``dm``'s process pool, started by hand: these processes and pipe ends, nothing spawned."""
    spec = PoolSpec(num_workers=len(processes), make_sampler=None, length=2, policy=None, tasks=[None] * len(processes),
                    seed=lambda index, restarts: None, columns={}, credits=1, hold=dm.hold_slots,
                    restart_failed_workers=dm.restart_failed_workers, timeout_s=dm.sampler_timeout_s,
                    on_restart=lambda: dm._count("num_worker_restarts", 1))
    pool = dm.pool = ProcessPool(spec)
    pool.ctx, pool.processes, pool.conns, pool.owner = FakeContext(), processes, conns, [0]
    pool.slots, pool.weights, pool.stop = slots, None, None
    return pool


class PausingList(list):
    """A list whose first read from ``thread`` runs ``meanwhile`` (in another thread) and waits
    for it, up to ``PAUSE_S``, before returning the value it read."""

    def __init__(self, items, thread: threading.Thread, meanwhile) -> None:
        super().__init__(items)
        self.thread, self.meanwhile, self.done, self.paused = thread, meanwhile, threading.Event(), False

    def __getitem__(self, index):
        value = super().__getitem__(index)
        if threading.current_thread() is self.thread and not self.paused:
            self.paused = True
            self.other = threading.Thread(target=lambda: (self.meanwhile(), self.done.set()), daemon=True)
            self.other.start()
            self.done.wait(PAUSE_S)
        return value


def test_a3c_release_and_a_worker_restart_never_hand_the_new_worker_a_slot_twice():
    """The learner hands slot 0 back to worker 0 (incarnation 0) while the loader thread finds
    worker 0 dead and restarts it, handing the new worker every slot it owns: the learner is
    stopped right after its incarnation check, and the restart runs then."""
    dm = A3CDataModule(EnvSettings("CartPole-v1", num_envs=1), 5, gamma=0.99, lambda_=1.0, vf_loss_coeff=0.5,
                       entropy_coeff=0.0, workers=SamplerWorkers(num_workers=1, restart_failed_workers=True))
    old_send, old_recv = FakeEnd(), FakeEnd()
    pool = fake_pool(dm, [FakeProcess(exitcode=-9)], [(old_send, old_recv)])  # killed
    pool.restarts = PausingList([0], threading.current_thread(), pool.check)

    dm.release(0, 0, incarnation=0)  # the packet of incarnation 0 was applied
    pool.restarts.other.join(timeout=10)

    assert pool.restarts.done.is_set() and list(pool.restarts) == [1] and dm.counters["num_worker_restarts"] == 1
    new_send = pool.conns[0][0]
    assert new_send is not old_send and new_send in pool.ctx.ends
    assert new_send.sent == [0]  # its slot, once: at its start
    assert old_send.sent == [0]  # the release went to the incarnation it was meant for, before the restart
    assert old_send.closed


class PausingCounters(dict):
    """Fault counters whose first read of ``key`` from ``thread`` runs ``meanwhile`` and waits
    for another thread's write of ``key`` (up to ``PAUSE_S``)."""

    def __init__(self, items, key: str, thread: threading.Thread, meanwhile) -> None:
        super().__init__(items)
        self.key, self.thread, self.meanwhile = key, thread, meanwhile
        self.written, self.paused = threading.Event(), False

    def __getitem__(self, key):
        value = super().__getitem__(key)
        if key == self.key and threading.current_thread() is self.thread and not self.paused:
            self.paused = True
            self.meanwhile()
            self.written.wait(PAUSE_S)
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key == self.key and threading.current_thread() is not self.thread:
            self.written.set()


def batch_of_version(version: int) -> MultiAgentBatch:
    return MultiAgentBatch({"default_policy": SampleBatch({POLICY_VERSION: torch.tensor([version])})}, env_steps=2,
                           info={"perf": {}})


def test_fragments_dropped_by_both_threads_are_all_counted():
    """The loader thread drops a fragment too old on arrival while the learner drops a batch that
    aged in the ready queue: the learner is stopped between reading and writing the counter, and
    the loader drops its fragment then."""
    dm = AsyncSamplingDataModule(EnvSettings("CartPole-v1", num_envs=1), rollout_fragment_length=2, train_batch_size=4,
                                 workers=SamplerWorkers(num_workers=1), learner_queue=LearnerQueue(max_policy_lag=0))
    assert dm.fragments_per_batch == 2
    dm.module = SimpleNamespace(counters={"num_iterations": 10}, device=torch.device("cpu"))
    receiver, sender = multiprocessing.Pipe(duplex=False)  # worker 0's fragments
    free = FakeEnd()
    fake_pool(dm, [FakeProcess()], [(free, receiver)], slots=[{"obs": torch.zeros(2, 1)}])
    episodes = {"episode_returns": [], "episode_lengths": []}
    # the loader drops fragment (slot 0, version 3) as soon as it arrives: 10 - 3 > max_policy_lag
    drop_in_loader = lambda: sender.send(("fragment", 0, 0, 3, 0.01, episodes, {}))  # noqa: E731
    dm.counters = PausingCounters(dm.counters, "num_fragments_dropped", threading.current_thread(), drop_in_loader)
    dm._ready.put(batch_of_version(5))  # aged while waiting: the learner drops it (its 2 fragments)
    # then the fresh batch, as soon as the learner took the old one
    threading.Thread(target=lambda: dm._ready.put(batch_of_version(10)), daemon=True).start()
    loader = threading.Thread(target=dm._load_loop, daemon=True)
    loader.start()
    try:
        batch = dm._next_batch()
        assert int(batch.policy_batches["default_policy"][POLICY_VERSION][0]) == 10
        assert dm.counters.written.wait(10)  # the loader counted its drop (after the learner, when fixed)
        assert free.sent == [0]  # and handed the slot back to its worker
    finally:
        dm._closing.set()
        loader.join(timeout=10)
        receiver.close()
        sender.close()
    assert not loader.is_alive() and dm._error is None
    assert dm.counters["num_fragments_dropped"] == 2 + 1
