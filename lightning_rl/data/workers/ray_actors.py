"""Sampler workers as Ray actors (``sampler_backend="ray"``): on any node of a Ray cluster that
has the resources they ask for (``num_cpus_per_worker``, ``custom_resources_per_worker``).

Each actor runs a ``SamplerWorker``, as a worker process does. The learner keeps at most
``credits`` sample requests in flight per actor (``ray.wait`` with a timeout drains them); a
fragment comes back as an object reference, fetched from the object store (without a copy on
the learner's node: numpy arrays, uint8 frames staying uint8) and copied into the learner's
tensors once. Weights go out once per broadcast (one ``ray.put``): every request carries the
newest reference and a side method (its own concurrency group, so it runs while the actor
samples) offers it to the actor at once; an actor loads a version only when it changed.

Faults are Ray's: an exception in an actor's method (an env error) is a ``RayTaskError`` with
its traceback, re-raised naming the worker; a dead actor (killed, out of memory, its node lost)
fails its requests with ``RayActorError``, and a fragment that was ready and then lost with its
node fails its fetch with ``ObjectLostError`` (``OwnerDiedError`` among them): either way the
worker is restarted as a new actor with a new seed when ``restart_failed_workers``, else an error
names the worker and its node. Without a running Ray (``ray.is_initialized()``) and without
``ray_address`` or ``RAY_ADDRESS`` a local Ray is started for the run and shut down after it; a
Ray the pool joined is left running, its actors killed.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import secrets
import sys
import threading
import time
from typing import Any

import torch
from torch import nn

from lightning_rl.data.samplers.engine import policy_state
from lightning_rl.data.workers.pool import Fragment, PoolSpec, Received, WorkerPool
from lightning_rl.data.workers.worker import SamplerWorker

RAY_EXTRA = "sampler_backend='ray' needs Ray: pip install 'lightning-rl[ray]'"


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def import_ray() -> Any:
    """The ``ray`` module, or an ``ImportError`` naming the extra."""
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_EXTRA) from None
    return ray


AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def run_token_auth() -> dict[str, str | None]:
    """Token authentication for the local Ray a run starts, with a token of its own in this
    process's environment (the Ray processes inherit it), unless the user chose a mode or a
    token (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN[_PATH]``). Left to itself, Ray enables token
    authentication with a warning and writes a token to ``~/.ray/auth_token``. Returns the
    variables as they were, for ``restore_environ`` once the Ray is shut down."""
    if any(name in os.environ for name in AUTH_VARIABLES):
        return {}
    before = {name: os.environ.get(name) for name in AUTH_VARIABLES}
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    _reread_ray_auth()
    return before


def restore_environ(before: dict[str, str | None]) -> None:
    if not before:
        return
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _reread_ray_auth()


def _reread_ray_auth() -> None:
    """Ray reads ``RAY_AUTH_MODE`` into its config when imported and caches the token it finds:
    have it read both again (as Ray's own ``_enable_token_auth`` does), so that this process
    uses the token its Ray processes inherit."""
    if "ray" not in sys.modules:
        return  # read when imported
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # a Ray without token authentication: nothing to read
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@functools.cache
def actor_class() -> Any:
    """The sampler actor (made once Ray is imported: its methods' concurrency groups are Ray's)."""
    ray = import_ray()

    @ray.remote(concurrency_groups={"weights": 1})
    class RaySampler:
        """A ``SamplerWorker`` in a Ray actor. ``sample`` runs one at a time, in order;
        ``set_weights`` in its own group, while a fragment is being sampled."""

        def __init__(self, index: int, seed: int | None, make_sampler: Any, policy: nn.Module, task: Any,
                     length: int, timeout_s: float) -> None:
            self.index, self.timeout_s = index, timeout_s
            self.worker = SamplerWorker(make_sampler, seed, policy, task, length)
            self.latest: tuple[Any, int] | None = None  # (reference, version) of the newest weights offered
            self.lock = threading.Lock()

        def where(self) -> dict[str, Any]:
            context = ray.get_runtime_context()
            return {"actor_id": context.get_actor_id(), "node_id": context.get_node_id(),
                    "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

        def _offer(self, weights: tuple[Any, int]) -> None:
            with self.lock:
                if self.latest is None or weights[1] > self.latest[1]:
                    self.latest = weights

        @ray.method(concurrency_group="weights")
        def set_weights(self, box: list[tuple[Any, int]]) -> None:
            self._offer(box[0])  # in a list: Ray passes the reference, not the weights

        def sample(self, box: list[tuple[Any, int]]) -> tuple:
            self._offer(box[0])
            ref, version = self.latest
            if version != self.worker.version:
                self.worker.load(ray.get(ref, timeout=self.timeout_s), version)
            tensors, extra, seconds, episodes = self.worker.sample()
            arrays = {k: v.numpy() for k, v in tensors.items()}  # numpy: zero-copy reads from the object store
            return arrays, self.worker.version, seconds, episodes, extra

    return RaySampler


class RayPool(WorkerPool):
    """``num_workers`` Ray actors of ``num_cpus`` CPUs and ``resources`` custom resources each."""

    def __init__(self, spec: PoolSpec, address: str | None = None, num_cpus: float = 1.0,
                 resources: dict[str, float] | None = None) -> None:
        super().__init__(spec)
        self.address, self.num_cpus, self.resources = address, num_cpus, dict(resources or {})
        self.actors: list[Any] = []
        self.where: list[dict[str, Any] | None] = []
        self.where_refs: list[Any] = []
        self.pending: dict[Any, tuple[int, int]] = {}  # request -> (worker, incarnation)
        self.weights: tuple[Any, int] | None = None
        self.owns_ray = False
        self.auth_env: dict[str, str | None] = {}  # the environment's auth variables before this run's Ray
        self.closing = False
        self.lock = threading.RLock()  # the loader thread restarts, the learner releases

    # ------------------------------------------------------------ start
    def start(self, policy: nn.Module, version: int) -> None:
        ray = self.ray = import_ray()
        n = self.spec.num_workers
        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS")
            if address:
                ray.init(address=address)
            else:  # a Ray of this machine for this run: enough of what the workers ask for
                self.auth_env = run_token_auth()
                try:
                    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(n * self.num_cpus)),
                             resources={k: v * n for k, v in self.resources.items()}, include_dashboard=False)
                except BaseException:
                    restore_environ(self.auth_env)
                    raise
            self.owns_ray = True
        self.policy_ref = ray.put(self.spec.policy)
        self.broadcast(policy, version)
        self.actors, self.where, self.where_refs = [None] * n, [None] * n, [None] * n
        for i in range(n):
            self._spawn(i)
        deadline = time.monotonic() + self.spec.timeout_s
        for i in range(n):
            self._placed(i, max(0.0, deadline - time.monotonic()))

    def _spawn(self, index: int) -> None:
        spec = self.spec
        # "DEFAULT": never inside a placement group the caller runs in (a Ray Train worker's holds
        # only the learner's resources)
        actor = actor_class().options(num_cpus=self.num_cpus, resources=self.resources, max_restarts=0,
                                      scheduling_strategy="DEFAULT").remote(
            index, spec.seed(index, self.restarts[index]), spec.make_sampler, self.policy_ref, spec.tasks[index],
            spec.length, spec.timeout_s)
        self.actors[index], self.where[index] = actor, None
        self.where_refs[index] = actor.where.remote()
        for _ in range(spec.credits):
            self._submit(index)

    def _placed(self, index: int, timeout: float) -> None:
        """Wait for worker ``index``'s actor to be placed and its sampler built."""
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            self.where[index] = self.ray.get(self.where_refs[index], timeout=timeout)
        except GetTimeoutError:
            raise RuntimeError(
                f"sampler worker {index}: its Ray actor was not placed within sampler_timeout_s="
                f"{self.spec.timeout_s:g} s: no node has num_cpus={self.num_cpus:g} and resources {self.resources} "
                f"free (the cluster's free resources: {self.ray.available_resources()})"
            ) from None
        except RayActorError as err:
            raise RuntimeError(f"{self.name(index)} failed:\n\nTraceback in the worker:\n{err}") from None

    def _submit(self, index: int) -> None:
        ref = self.actors[index].sample.remote([self.weights])
        self.pending[ref] = (index, self.restarts[index])

    def locate(self, index: int, timeout: float = 0.0) -> dict[str, Any] | None:
        """Where worker ``index``'s actor runs (actor id, node id, ip, pid), once it is placed."""
        if self.where[index] is None:
            try:
                self.where[index] = self.ray.get(self.where_refs[index], timeout=timeout)
            except Exception:  # not placed yet, or its constructor failed (its requests say why)
                pass
        return self.where[index]

    def name(self, index: int) -> str:
        """``sampler worker i (Ray actor ..., pid ..., node ... at ip)`` as far as it is known."""
        where = self.locate(index) if index < len(self.where) else None
        if where is None:
            return f"sampler worker {index} (a Ray actor not yet placed)"
        return (f"sampler worker {index} (Ray actor {where['actor_id']}, pid {where['pid']}, on node "
                f"{where['node_id']} at {where['ip']})")

    # ------------------------------------------------------------ weights
    def broadcast(self, policy: nn.Module, version: int) -> None:
        state = [t.detach().cpu().clone() for t in policy_state(policy)]
        self.weights = (self.ray.put(state), version)
        for actor in self.actors:
            if actor is not None:
                actor.set_weights.remote([self.weights])

    # ------------------------------------------------------------ fragments
    def receive(self, limit: int, timeout: float) -> list[Received]:
        from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError, RayTaskError

        with self.lock:
            refs = list(self.pending)
        if not refs or limit <= 0:
            time.sleep(timeout if not refs else 0.0)
            return []
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=timeout)
        if not ready:
            return []
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        received: list[Received] = []
        for ref in ready[:limit]:
            with self.lock:
                owner = self.pending.pop(ref, None)
            if owner is None:  # a request of a worker restarted since
                continue
            index, incarnation = owner
            try:
                arrays, version, seconds, episodes, extra = self.ray.get(ref, timeout=self.spec.timeout_s)
            except RayActorError as err:
                self._died(index, incarnation, err)
                continue
            except ObjectLostError as err:  # ready, then lost with its node (OwnerDiedError is one too)
                self._died(index, incarnation, err, "lost its fragment")
                continue
            except RayTaskError as err:
                raise RuntimeError(f"{self.name(index)} failed:\n\nTraceback in the worker:\n{err}") from None
            except GetTimeoutError:
                raise RuntimeError(f"{self.name(index)}: its fragment did not arrive within sampler_timeout_s="
                                   f"{self.spec.timeout_s:g} s") from None
            tensors = {k: torch.from_numpy(a.copy()) for k, a in arrays.items()}  # the object store's are read-only
            if self.spec.hold:
                extra["slot"] = (0, incarnation)
            else:
                self._submit(index)
            received.append(Received(Fragment(tensors, version, index, extra), seconds, episodes))
        return received

    def _died(self, index: int, incarnation: int, err: Exception, what: str = "died") -> None:
        """Worker ``index``'s actor is dead, or what it sent was lost with its node (its actor is
        then as good as dead: killed): a new one (new seed), or an error naming it."""
        if self.closing or incarnation != self.restarts[index]:
            return  # an incarnation already replaced
        if getattr(err, "actor_init_failed", False):  # its sampler could not be built: the same again would fail
            raise RuntimeError(f"{self.name(index)} failed:\n\nTraceback in the worker:\n{err}")
        if not self.spec.restart_failed_workers:
            raise RuntimeError(f"{self.name(index)} {what}: {err}")
        with self.lock:
            self.restarts[index] += 1
            for ref in [r for r, (i, _) in self.pending.items() if i == index]:
                del self.pending[ref]
            self._kill(self.actors[index])
            self._spawn(index)
        self.spec.on_restart()

    def release(self, index: int, token: Any, incarnation: int | None = None) -> None:
        with self.lock:
            if self.closing or (incarnation is not None and incarnation != self.restarts[index]):
                return
            self._submit(index)

    def describe(self) -> str:
        with self.lock:
            in_flight = [sum(i == w for i, _ in self.pending.values()) for w in range(len(self.actors))]
        placed = [w is not None for w in self.where]
        return f"Ray actors placed: {placed}, requests in flight per worker: {in_flight}"

    # ------------------------------------------------------------ stop
    def _kill(self, actor: Any) -> None:
        if actor is not None:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass

    def close(self, terminate: bool = False) -> None:
        self.closing = True
        with self.lock:
            actors, self.actors = self.actors, []
            self.pending.clear()
        if not hasattr(self, "ray"):
            return
        for actor in actors:
            self._kill(actor)
        if self.owns_ray:
            self.owns_ray = False
            self.ray.shutdown()
            restore_environ(self.auth_env)
