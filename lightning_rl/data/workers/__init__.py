"""Sampler workers and the pools that run them: child processes (``processes.py``, the
default) or Ray actors (``ray_actors.py``), behind one interface (``pool.py``); both run the
same worker (``worker.py``)."""

from lightning_rl.data.workers.pool import BACKENDS, Fragment, PoolSpec, Received, WorkerPool
from lightning_rl.data.workers.worker import SamplerWorker, sample_fragment

__all__ = ["BACKENDS", "Fragment", "PoolSpec", "Received", "SamplerWorker", "WorkerPool", "sample_fragment"]
