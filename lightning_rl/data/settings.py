"""The settings the data layer reads, declared once (``settings.settings``): the envs and how
they are sampled, the replay, the sampler workers and the learner queue. A DataModule takes
these objects (an algorithm passes its own values, ``settings.group_of``); an algorithm takes
each group by inheriting it (``algorithms/common.py``)."""

from __future__ import annotations

from typing import Any

from lightning_rl.data.envs import EnvSpec
from lightning_rl.data.workers.pool import BACKENDS
from lightning_rl.settings import at_least, positive, setting, settings


@settings
class EnvSettings:
    """The envs, how many steps a run samples and how they are seeded and stepped (every
    algorithm)."""

    env: EnvSpec = setting(default="CartPole-v1", kw_only=False)
    """gymnasium id (``"module:Id"`` imports ``module`` first) or a callable returning an Env or a PettingZoo env."""
    env_kwargs: dict[str, Any] | None = None
    """keyword arguments for every env made (training, evaluation, ``record``), kept in checkpoints."""
    num_envs: int = setting(default=8, check=at_least(1))
    """envs stepped in parallel (per process under DDP)."""
    total_env_steps: int | None = setting(default=100_000, check=at_least(1, or_none=True), resumable=True)
    """stop ``fit`` once this many env steps were sampled (over DDP ranks); ``None``: Trainer limits."""
    iterations_per_epoch: int = setting(default=10, check=at_least(1), resumable=True)
    """training iterations per Lightning epoch: the cadence of checkpoints and validation."""
    seed: int | None = None
    """seeds network init, sampling, shuffling and envs (``seed + 1000 * rank``); ``None``: random."""
    vectorization: str = "auto"
    """``auto`` (the env's own vector env, if any), ``sync``, ``async``, ``vector_entry_point`` or ``envpool``
    (envpool's C++ envs for the ids it provides: ALE, classic control, MuJoCo)."""
    check_finite: bool = setting(default=True, resumable=True)
    """raise on a NaN or infinite reward or observation, naming the field, the env and its step."""


@settings
class ReplaySettings:
    """A replay buffer the envs' transitions are sampled into (DQN, SAC, TD3, APEX)."""

    buffer_size: int = 100_000
    """replay capacity in transitions (per process)."""
    learning_starts: int = 1000
    """env steps (per process) of uniform random actions before learning starts."""
    train_freq: int = 64
    """env steps per env sampled into the replay per iteration."""
    n_step: int = 3
    """steps summed into each target (truncation ends the window but still bootstraps)."""
    prioritized_replay: bool = False
    """proportional prioritized replay (a sum tree) with importance weights."""
    prioritized_replay_alpha: float = 0.6
    """priority exponent (0: uniform replay)."""
    prioritized_replay_eps: float = 1e-6
    """added to each ``|td_error|`` so that no priority is 0."""
    checkpoint_replay_buffer: bool | str = "auto"
    """keep the replay buffer in checkpoints (exact resume); ``auto``: if it takes <= 1 GiB."""
    replay_frame_stack: bool | str = "auto"
    """store stacked frames once (per step; APEX: per worker packet): ``auto`` for uint8 (K, H, W) frames of a
    K-frame-stack env."""


@settings
class SamplerWorkers:
    """Sampler workers beside the learner (IMPALA, APPO, APEX, A3C): child processes, or Ray
    actors on any node of a Ray cluster (``data/workers/``)."""

    num_workers: int = setting(default=2, check=at_least(0))
    """sampler workers (per rank under DDP); 0 samples in the learner process."""
    sampler_timeout_s: float = setting(default=60.0, check=positive, resumable=True)
    """seconds the learner waits for data (or a Ray actor's placement) before it raises."""
    restart_failed_workers: bool = setting(default=False, resumable=True)
    """restart a worker that died (with a new seed) instead of raising."""
    sampler_backend: str = setting(default="processes", resumable=True)
    """``processes`` (children of the learner, shared memory) or ``ray`` (Ray actors, any node)."""
    ray_address: str | None = setting(default=None, resumable=True)
    """the Ray cluster the workers join (else ``RAY_ADDRESS``, else a local Ray for the run)."""
    num_cpus_per_worker: float | None = setting(default=None, resumable=True)
    """CPUs each Ray actor asks for (``sampler_backend='ray'``; ``None``: 1)."""
    custom_resources_per_worker: dict[str, float] | None = setting(default=None, resumable=True)
    """custom Ray resources each actor asks for, e.g. ``{'cpu_node': 1}`` (pins workers)."""


def check_backend(workers: SamplerWorkers) -> None:
    """The sampler backend's settings: Ray's only with ``"ray"``, and Ray installed for it."""
    backend, num_cpus = workers.sampler_backend, workers.num_cpus_per_worker
    resources = workers.custom_resources_per_worker
    if backend not in BACKENDS:
        raise ValueError(f"sampler_backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "ray":
        given = [n for n, v in (("ray_address", workers.ray_address), ("num_cpus_per_worker", num_cpus),
                                ("custom_resources_per_worker", resources)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to Ray actors: pass sampler_backend='ray'")
        return
    if num_cpus is not None and num_cpus < 0:
        raise ValueError(f"num_cpus_per_worker must be >= 0, got {num_cpus}")
    if resources is not None and any(not isinstance(v, int | float) or v < 0 for v in resources.values()):
        raise ValueError(f"custom_resources_per_worker must map resource names to amounts >= 0, got {resources}")
    if workers.num_workers:
        from lightning_rl.data.workers.ray_actors import RAY_EXTRA, ray_installed

        if not ray_installed():
            raise ImportError(RAY_EXTRA)


@settings
class LearnerQueue:
    """The queue of worker fragments before the learner and the weights sent back (IMPALA,
    APPO, APEX)."""

    learner_queue_size: int = setting(default=16, check=at_least(1))
    """fragments that may wait for the learner."""
    broadcast_interval: int = setting(default=1, check=at_least(1))
    """training iterations between weight broadcasts to the workers."""
    max_policy_lag: int | None = setting(default=None, check=at_least(0, or_none=True))
    """drop (and count) fragments sampled over this many iterations before training (``None``: keep)."""
