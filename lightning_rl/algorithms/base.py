"""RLModule: the Lightning plumbing every algorithm shares.

One Lightning training step is one training iteration on one policy batch
(manual optimization); the algorithm's ``learn_on_policy_batch`` does the update.
"""

from __future__ import annotations

import copy
import logging
import os
import time
import warnings
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelSummary
from pytorch_lightning.trainer.states import TrainerFn
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from lightning_rl.checkpoint import CheckedCheckpointIO
from lightning_rl.data.envs import EnvSpec, env_spaces, resolve_vectorization
from lightning_rl.evaluation import evaluate
from lightning_rl.functional import piecewise_linear
from lightning_rl.learner_info import LearnerInfoBuilder

log = logging.getLogger(__name__)
# Without evaluation_interval the val loader is deliberately empty.
warnings.filterwarnings("ignore", message="Total length of `list` across ranks is zero")

COUNTER_NAMES = (
    "num_env_steps_sampled",
    "num_env_steps_trained",
    "num_agent_steps_sampled",
    "num_agent_steps_trained",
    "num_iterations",
    "num_grad_updates",
    "num_target_updates",
)


Schedule = str | Sequence[Sequence[float]] | None

def resolve_schedule(
    name: str, schedule: Schedule, initial: float, total_env_steps: int | None
) -> list[tuple[float, float]] | None:
    """``"constant"``/``None`` -> no schedule; ``"linear"`` -> ``initial`` down to 0 over
    ``total_env_steps``; a list of ``[env_step, value]`` points -> piecewise linear."""
    if schedule is None or schedule == "constant":
        return None
    if schedule == "linear":
        if total_env_steps is None:
            raise ValueError(f"{name}='linear' decays to 0 over total_env_steps, which is None")
        return [(0.0, initial), (float(total_env_steps), 0.0)]
    if isinstance(schedule, str):
        raise ValueError(f"{name} must be 'constant', 'linear' or a list of [env_step, value], got {schedule!r}")
    points = [(float(t), float(v)) for t, v in schedule]
    if not points or any(b[0] <= a[0] for a, b in pairwise(points)):
        raise ValueError(f"{name} points must be non-empty with increasing env steps, got {schedule!r}")
    return points

def check_positive(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be positive, got {value}")


def check_gamma(gamma: float) -> None:
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")


def rank_cpus(available: set[int], local_rank: int, local_world_size: int) -> set[int]:
    """The CPUs of ``local_rank``: an equal, disjoint share of ``available`` (empty when there
    are more ranks than CPUs, where pinning would only stack ranks on shared cores)."""
    share = len(available) // local_world_size
    return set(sorted(available)[local_rank * share : (local_rank + 1) * share])


def set_process_affinity(cpus: set[int]) -> None:
    """Pin every thread of this process (gloo's too) to ``cpus``; threads started later inherit it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass


class _RestoreProcessSettings(pl.Callback):
    """A failed or interrupted ``fit`` skips ``on_fit_end``: give the process its threads and CPUs back."""

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if isinstance(pl_module, RLModule):
            pl_module.restore_process_settings()


class _GreedyPolicy(nn.Module):
    """``obs -> greedy actions`` of a policy, as one traceable forward."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: Tensor) -> Tensor:
        return self.policy.compute_actions(obs, explore=False)["actions"].detach()


class RLModule(pl.LightningModule):
    """Base of all algorithms: policies, counters, sampling access, the iteration loop.

    Subclasses build ``self.policies`` (a ``ModuleDict`` by policy id), implement
    ``learn_on_policy_batch`` and ``build_datamodule``, and may override
    ``postprocess_rollout``.

    Args:
        env: a registered gymnasium id or a zero-argument callable returning a ``gymnasium.Env``.
        num_envs: envs stepped in parallel (per process under DDP).
        total_env_steps: stop ``fit`` once this many env steps were sampled (summed over
            DDP ranks); ``None`` leaves stopping to the Trainer's limits.
        iterations_per_epoch: training iterations in one Lightning epoch, the cadence of
            epoch-based callbacks (checkpointing, validation).
        seed: seeds network init, action sampling, minibatch shuffling and the envs
            (``seed + 1000 * rank`` under DDP); ``None`` for random.
        vectorization: ``"auto"`` (the env's own batched version where it registers one,
            else ``"sync"``), ``"sync"``, ``"async"`` (one process per env) or
            ``"vector_entry_point"``.
        sampling_device: device the policy runs on while sampling; small MLPs are faster on
            the CPU than with a GPU round trip per env step.
        num_cpu_threads: torch intra-op threads during ``fit`` (restored afterwards). Small
            MLPs run fastest on one thread, and several threads spin badly on a busy machine
            (rl-zoo sets 1 too); ``None`` leaves torch's setting alone.
        cpu_affinity: under DDP on CPU, pin each local rank to its own share of the CPUs
            this process may use (Linux; restored after ``fit``). Ranks that synchronize
            every minibatch then stop migrating between cores and waiting on each other.

    Algorithms also take ``evaluation_interval`` (epochs between evaluations; ``None`` =
    no evaluation) and ``evaluation_num_episodes``: Lightning validation then plays that
    many greedy episodes on separate envs and logs ``val/episode_return_mean``, which
    ``ModelCheckpoint(monitor=...)`` and ``EarlyStopping`` can use.
    """

    def __init__(
        self,
        *,
        env: EnvSpec,
        num_envs: int,
        total_env_steps: int | None,
        iterations_per_epoch: int,
        seed: int | None,
        vectorization: str,
        sampling_device: str,
        num_cpu_threads: int | None,
        cpu_affinity: bool,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if total_env_steps is not None and total_env_steps < 1:
            raise ValueError(f"total_env_steps must be >= 1 or None, got {total_env_steps}")
        self.observation_space, self.action_space = env_spaces(env)
        resolve_vectorization(env, vectorization)
        self.sampling_device = torch.device(sampling_device)
        self.counters: dict[str, int] = dict.fromkeys(COUNTER_NAMES, 0)
        self.global_counters: dict[str, int] = dict(self.counters)
        self.policies = nn.ModuleDict()
        self.policies_to_train: list[str] = [DEFAULT_POLICY_ID]
        self.shuffle_generator = torch.Generator()
        if seed is not None:
            self.shuffle_generator.manual_seed(seed)
        self._default_datamodule: pl.LightningDataModule | None = None
        self._sampling_copies: dict[tuple[str, torch.device], tuple[int, nn.Module]] = {}
        self._weights_version = 0
        self._pending_datamodule_state: dict[str, Any] | None = None
        check_positive(num_cpu_threads=num_cpu_threads)
        self.num_cpu_threads = num_cpu_threads
        self._saved_num_threads: int | None = None
        self.cpu_affinity = cpu_affinity
        self._saved_affinity: set[int] | None = None

    # ----------------------------------------------------------------- policies
    def check_spaces(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        """Raise if a DataModule's envs do not match the spaces the policies were built for."""
        if observation_space != self.observation_space or action_space != self.action_space:
            raise ValueError(
                f"the DataModule's envs have spaces {observation_space}, {action_space}, but the "
                f"module was built for {self.observation_space}, {self.action_space}"
            )

    def sampling_policy(self, policy_id: str, device: torch.device) -> nn.Module:
        """The policy on ``device`` for sampling: itself, or a copy refreshed after each iteration."""
        policy = self.policies[policy_id]
        if next(policy.parameters()).device == device:
            return policy
        version, policy_copy = self._sampling_copies.get((policy_id, device), (-1, None))
        if policy_copy is None:
            policy_copy = copy.deepcopy(policy).to(device)
        if version != self._weights_version:
            policy_copy.load_state_dict(policy.state_dict())
            self._sampling_copies[(policy_id, device)] = (self._weights_version, policy_copy)
        return policy_copy

    @torch.no_grad()
    def compute_actions(
        self, obs: np.ndarray | Tensor, policy_id: str = DEFAULT_POLICY_ID, explore: bool = True
    ) -> np.ndarray | Tensor:
        """Actions for a batch ``[N, *obs_shape]`` (or one observation); numpy in, numpy out."""
        is_numpy = not isinstance(obs, Tensor)
        obs_t = torch.as_tensor(np.asarray(obs) if is_numpy else obs, device=self.device)
        single = tuple(obs_t.shape) == tuple(self.observation_space.shape or ())
        if single:
            obs_t = obs_t.unsqueeze(0)
        actions = self.policies[policy_id].compute_actions(obs_t, explore=explore)["actions"]
        if single:
            actions = actions[0]
        return actions.cpu().numpy() if is_numpy else actions

    def predict(
        self, obs: np.ndarray | Tensor, deterministic: bool = True, policy_id: str = DEFAULT_POLICY_ID
    ) -> np.ndarray | Tensor:
        """Actions for one observation or a batch, for use outside Lightning (greedy by default)."""
        was_training = self.training
        self.eval()
        try:
            return self.compute_actions(obs, policy_id=policy_id, explore=not deterministic)
        finally:
            self.train(was_training)

    def export_policy(self, path: str | os.PathLike[str], policy_id: str = DEFAULT_POLICY_ID) -> torch.jit.ScriptModule:
        """Save the greedy policy as TorchScript: ``torch.jit.load(path)(obs_batch) -> actions``,
        runnable without Python, Lightning or this library."""
        greedy = _GreedyPolicy(copy.deepcopy(self.policies[policy_id]).cpu().eval())
        example = torch.as_tensor(np.stack([self.observation_space.sample() for _ in range(2)]))
        with torch.no_grad():
            scripted = torch.jit.trace(greedy, example, check_trace=False)
        scripted.save(str(path))
        return scripted

    # ---------------------------------------------------------------- data
    def build_datamodule(self) -> pl.LightningDataModule:
        """The DataModule ``Trainer.fit(module)`` uses when none is given."""
        raise NotImplementedError

    def train_dataloader(self) -> Any:
        # Only called when fit() got no DataModule: build the default one from our hparams.
        dm = self.build_datamodule()
        dm.trainer = self.trainer
        dm.connect(self)  # type: ignore[attr-defined]
        dm.setup("fit")
        if self._pending_datamodule_state:  # resuming: continue the envs where they were
            dm.load_state_dict(self._pending_datamodule_state)
            self._pending_datamodule_state = None
        self._default_datamodule = dm
        return dm.train_dataloader()

    @property
    def active_datamodule(self) -> pl.LightningDataModule | None:
        """The DataModule feeding this fit: the Trainer's, or the default one we built."""
        if self._trainer is not None and self.trainer.datamodule is not None:
            return self.trainer.datamodule
        return self._default_datamodule

    def exploration_kwargs(self, policy_id: str) -> dict[str, Any]:
        """Extra keyword arguments for the sampler's ``compute_actions`` (e.g. epsilon)."""
        return {}

    def teardown(self, stage: str) -> None:
        if self._default_datamodule is not None:
            self._default_datamodule.teardown(stage)  # closes the envs; keeps their last state

    def postprocess_rollout(
        self, policy_id: str, rollout: SampleBatch, last_obs: Tensor, valid: Tensor
    ) -> SampleBatch:
        """Turn a time-major ``[T, N]`` rollout into a flat training batch of valid rows."""
        flat = SampleBatch({k: v.reshape(-1, *v.shape[2:]) for k, v in rollout.items()})
        return flat.select(valid.reshape(-1))

    # ---------------------------------------------------------------- learning
    def learn_on_policy_batch(self, policy_id: str, batch: SampleBatch, builder: LearnerInfoBuilder) -> None:
        """Update policy ``policy_id`` on its batch; add results to ``builder``."""
        raise NotImplementedError

    def on_iteration_end(self, learner_info: dict[str, Any]) -> None:
        """Per-iteration updates after learning (KL coefficient, target networks)."""

    def current(self, points: list[tuple[float, float]] | None, constant: float) -> float:
        """Value of a schedule at the env steps sampled so far (global over ranks)."""
        if points is None:
            return constant
        return piecewise_linear(points, self.global_counters["num_env_steps_sampled"])

    def apply_lr_schedule(self, *optimizers: Any) -> float:
        """Set the scheduled learning rate (``lr_points``, else ``hparams.lr``) on ``optimizers``."""
        lr = self.current(getattr(self, "lr_points", None), self.hparams.lr)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        return lr

    def policy_optimizer(self, policy_id: str) -> Any:
        optimizers = self.optimizers()
        if not isinstance(optimizers, list):
            return optimizers
        return optimizers[self.policies_to_train.index(policy_id)]

    def training_step(self, batch: MultiAgentBatch, batch_idx: int) -> dict[str, Any]:
        start = time.perf_counter()
        batch = batch.as_multi_agent()
        builder = LearnerInfoBuilder()
        trained = 0
        for policy_id in self.policies_to_train:
            if policy_id in batch.policy_batches:
                policy_batch = batch.policy_batches[policy_id]
                self.learn_on_policy_batch(policy_id, policy_batch, builder)
                trained += policy_batch.count
        learner_info = builder.finalize()
        self._weights_version += 1
        c = self.counters
        c["num_env_steps_sampled"] += batch.env_steps
        c["num_agent_steps_sampled"] += batch.info.get("agent_steps_sampled", batch.agent_steps())
        c["num_env_steps_trained"] += trained
        c["num_agent_steps_trained"] += trained
        c["num_iterations"] += 1
        self.on_iteration_end(learner_info)
        self.global_counters = self._counters_over_ranks(c)
        budget = self.hparams.get("total_env_steps")
        if budget is not None and self.global_counters["num_env_steps_sampled"] >= budget:
            self.trainer.should_stop = True
        return {"learner_info": learner_info, "learn_time_s": time.perf_counter() - start}

    def _counters_over_ranks(self, counters: dict[str, int]) -> dict[str, int]:
        if self.trainer.world_size == 1:
            return dict(counters)
        local = torch.tensor([counters[k] for k in COUNTER_NAMES], dtype=torch.float64, device=self.device)
        return {k: int(v) for k, v in zip(COUNTER_NAMES, self.sum_over_ranks(local).tolist())}

    def sum_over_ranks(self, tensor: Tensor) -> Tensor:
        """``tensor`` summed over DDP ranks (itself in one process). One all-reduce and no
        barrier: Lightning's ``strategy.reduce`` adds a barrier, a second round trip that
        costs about 1 ms with gloo on a small machine, twice per iteration."""
        if self.trainer.world_size == 1:
            return tensor
        total = tensor.clone()
        torch.distributed.all_reduce(total)
        return total

    # ---------------------------------------------------------------- Lightning hooks
    # ---------------------------------------------------------------- evaluation
    def val_dataloader(self) -> Any:
        """One evaluation request per validation run: always for ``trainer.validate``, during
        ``fit`` only when ``evaluation_interval`` is set."""
        validating = self._trainer is not None and self.trainer.state.fn == TrainerFn.VALIDATING
        if not validating and not self.hparams.get("evaluation_interval"):
            return []
        return DataLoader(range(1), batch_size=None)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """``evaluation_num_episodes`` greedy episodes on separate envs (per rank under DDP)."""
        seed = self.hparams.get("seed")
        returns = evaluate(
            self,
            self.hparams.env,
            self.hparams.get("evaluation_num_episodes", 10),
            seed=None if seed is None else seed + 100_000 + 1000 * self.global_rank,
            vectorization=self.hparams.get("vectorization", "auto"),
        )
        sync = self.trainer.world_size > 1
        self.log("val/episode_return_mean", float(np.mean(returns)), sync_dist=sync, batch_size=1, prog_bar=True)
        self.log("val/episode_return_min", float(np.min(returns)), sync_dist=sync, reduce_fx="min", batch_size=1)
        self.log("val/episode_return_max", float(np.max(returns)), sync_dist=sync, reduce_fx="max", batch_size=1)

    def on_fit_start(self) -> None:
        # Lightning turns "no limit given" into max_epochs=1000; with an env-step budget the
        # budget is the limit, so lift the epoch cap (a user's explicit max_epochs of 1000
        # is indistinguishable and is lifted too, as documented in the README).
        if self.num_cpu_threads is not None:
            self._saved_num_threads = torch.get_num_threads()
            torch.set_num_threads(self.num_cpu_threads)
        self._pin_rank_cpus()
        fit_loop = self.trainer.fit_loop
        if self.hparams.get("total_env_steps") and fit_loop.max_epochs == 1000 and self.trainer.max_steps == -1:
            fit_loop.max_epochs = -1

    def on_fit_end(self) -> None:
        self.restore_process_settings()

    def restore_process_settings(self) -> None:
        """Undo what ``fit`` changed in the process (torch threads, CPU pinning); also run
        when ``fit`` fails, which never reaches ``on_fit_end``."""
        if self._saved_num_threads is not None:
            torch.set_num_threads(self._saved_num_threads)
            self._saved_num_threads = None
        if self._saved_affinity is not None:
            set_process_affinity(self._saved_affinity)
            self._saved_affinity = None

    def _pin_rank_cpus(self) -> None:
        trainer = self.trainer
        if not self.cpu_affinity or trainer.world_size == 1 or self.device.type != "cpu":
            return
        if not hasattr(os, "sched_setaffinity"):  # not Linux
            return
        available = os.sched_getaffinity(0)
        cpus = rank_cpus(available, trainer.local_rank, trainer.num_devices)
        if cpus:
            self._saved_affinity = available
            set_process_affinity(cpus)

    def configure_callbacks(self) -> list[pl.Callback]:
        from lightning_rl.callbacks import InterruptCheckpoint, LearnerInfoCallback, RolloutMetricsCallback

        strategy = self.trainer.strategy if self._trainer is not None else None
        if strategy is not None and not isinstance(strategy.checkpoint_io, CheckedCheckpointIO):
            # The first hook of fit/validate, before Lightning restores a checkpoint: resuming
            # then reads it with weights_only=True and a bad file is an error naming it.
            strategy.checkpoint_io = CheckedCheckpointIO(strategy.checkpoint_io, self)

        interval = self.hparams.get("evaluation_interval")
        if interval is not None and self._trainer is not None:
            check_positive(evaluation_interval=interval, evaluation_num_episodes=self.hparams.evaluation_num_episodes)
            # Evaluate every `interval` epochs. Set here, the first hook Lightning calls on the
            # module, so that callbacks reading the cadence in their setup (EarlyStopping's
            # check_on_train_epoch_end) see it.
            self.trainer.check_val_every_n_epoch = interval

        present = {type(cb) for cb in self.trainer.callbacks} if self._trainer is not None else set()
        callbacks: list[pl.Callback] = [
            cb() for cb in (LearnerInfoCallback, RolloutMetricsCallback, _RestoreProcessSettings) if cb not in present
        ]
        if self._trainer is not None:
            if InterruptCheckpoint not in present:
                callbacks.append(InterruptCheckpoint(os.path.join(self.trainer.default_root_dir, "checkpoints")))
            if ModelSummary in present:  # show each policy's parameter count, not just the ModuleDict's
                callbacks.append(ModelSummary(max_depth=2))
        return callbacks

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Everything a resumed run needs to continue exactly (plain values and tensors, so the
        # file loads with weights_only=True). A DataModule given to the Trainer is saved by
        # Lightning itself; the default one is ours to save.
        checkpoint["lightning_rl"] = {
            "algorithm": f"{type(self).__module__}.{type(self).__qualname__}",
            "counters": dict(self.counters),
            "shuffle_generator": self.shuffle_generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "datamodule": self._default_datamodule.state_dict() if self._default_datamodule is not None else None,
            **self.extra_state(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("lightning_rl", {})
        self.counters.update(state.get("counters", {}))
        self.global_counters = dict(self.counters)
        if "shuffle_generator" in state:
            self.shuffle_generator.set_state(state["shuffle_generator"])
            torch.set_rng_state(state["torch_rng"])
        self._pending_datamodule_state = state.get("datamodule")
        self.load_extra_state(state)

    def extra_state(self) -> dict[str, Any]:
        """Algorithm state (plain Python values) saved in checkpoints beside the weights."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what ``extra_state`` saved."""
