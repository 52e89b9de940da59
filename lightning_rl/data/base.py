"""EnvDataModule: the Lightning adapter of a sampler (the module door, per-rank checkpoint state,
the dataset of iterations); the envs themselves are the sampling engine's (``samplers/engine.py``)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import TrainerStatus
from torch.utils.data import DataLoader, IterableDataset

from lightning_rl.batch import MultiAgentBatch
from lightning_rl.checkpoint_data import pack_rank_states, unpack_rank_state
from lightning_rl.data.envs import EnvSpec, env_spec, resolve_vectorization
from lightning_rl.data.learner import Learner
from lightning_rl.data.samplers.engine import EnvSampler, eval_mode, new_generator, policy_state, rank_seed
from lightning_rl.data.settings import EnvSettings
from lightning_rl.settings import check_group

__all__ = ["EnvDataModule", "IterationStream", "check_at_least_one", "env_settings", "eval_mode", "lightning_seed",
           "new_generator", "policy_state", "rank_seed"]


def env_settings(env: EnvSettings | EnvSpec) -> EnvSettings:
    """``env`` as checked env settings: an ``EnvSettings`` as it is, an env id or factory with the
    other settings' defaults."""
    settings = env if isinstance(env, EnvSettings) else EnvSettings(env)
    check_group(settings)
    return settings


def check_at_least_one(**values: int) -> None:
    """A DataModule's own counts (``rollout_fragment_length``, ``train_batch_size``, ...), which a
    DataModule made by hand takes unchecked: each ``>= 1``, else one line naming it."""
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def lightning_seed() -> int | None:
    """The seed ``pl.seed_everything`` set in this process (``PL_GLOBAL_SEED``, inherited by DDP
    ranks), or ``None``: what ``seed=None`` of a module or DataModule takes when a fit sets it up."""
    value = os.environ.get("PL_GLOBAL_SEED")
    return int(value) if value else None


class IterationStream:
    """The batches of ``count`` training iterations, each sampled only when the training step
    asks for the next, after it learned on the previous one (so each is acted by the policies as
    the last update left them, as with one iteration per step). What one Lightning training step
    learns on when ``iterations_per_step > 1``: Lightning's per-step loop and hooks are paid once
    for all of them. What a callback's ``batch`` is then: ``batches`` holds each iteration's
    ``MultiAgentBatch`` as it was sampled (and post-processed), ``infos`` their ``info``s and
    ``info`` those merged."""

    def __init__(self, datamodule: EnvDataModule, count: int) -> None:
        self.datamodule, self.count = datamodule, count
        self.batches: list[MultiAgentBatch] = []
        self.infos: list[dict[str, Any]] = []

    def __iter__(self) -> Iterator[MultiAgentBatch]:
        for _ in range(self.count):
            batch = self.datamodule.sample_iteration()
            self.batches.append(batch)
            self.infos.append(batch.info)
            yield batch

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"a training step's batch is an IterationStream of up to {self.count} iterations "
            f"(iterations_per_step={self.datamodule.iterations_per_step}), which has no {name!r}: read .batches "
            "(each iteration's MultiAgentBatch), .infos or .info, or set iterations_per_step=1")

    @property
    def info(self) -> dict[str, Any]:
        """The infos of the iterations sampled so far as one (what a callback reads of a batch's
        ``info`` after the step): lists joined (the episodes that ended), numbers summed (sampling
        time), anything else the last iteration's."""
        merged: dict[str, Any] = {}
        for info in self.infos:
            for key, value in info.items():
                if key in merged and isinstance(value, list):
                    merged[key] = merged[key] + value
                elif key in merged and isinstance(value, (int, float)) and not isinstance(value, bool):
                    merged[key] = merged[key] + value
                else:
                    merged[key] = value
        return merged


class _Iterations(IterableDataset):
    """``iterations_per_epoch`` iterations per epoch, one batch per Lightning step (or an
    ``IterationStream`` of up to ``iterations_per_step``); env state carries across epochs."""

    def __init__(self, datamodule: EnvDataModule) -> None:
        self.datamodule = datamodule

    def __len__(self) -> int:
        return -(-self.datamodule.iterations_per_epoch // self.datamodule.iterations_per_step)

    def __iter__(self) -> Iterator[MultiAgentBatch | IterationStream]:
        dm = self.datamodule
        for step in range(len(self)):
            if dm.iterations_per_step == 1:
                yield dm.sample_iteration()
            else:
                yield IterationStream(dm, min(dm.iterations_per_step,
                                              dm.iterations_per_epoch - step * dm.iterations_per_step))


class EnvDataModule(pl.LightningDataModule):
    """Owns ``num_envs`` vector envs and yields one ``MultiAgentBatch`` per training step.

    The module reaches the DataModule through ``connect`` (Lightning's ``setup`` connects
    the trainer's module); subclasses implement ``sample``. ``batch.info`` carries the
    episodes that finished and the sampling time, for callbacks.

    Args:
        env: the env settings (``data/settings.EnvSettings``: the env and its keyword arguments,
            ``num_envs``, ``vectorization``, ``seed``, ``iterations_per_epoch``, ``check_finite``;
            an algorithm passes its own), or an env id or factory alone, with the other settings'
            defaults. ``seed=None`` takes the seed of ``pl.seed_everything`` where one was set at
            ``setup``, else a random one; under DDP rank ``r`` seeds ``seed + 1000 * r``.
        sampling_device: device the policy runs on while sampling (and where the action
            sampling generator lives); small MLPs are faster on the CPU than with a GPU
            round trip per env step.
    """

    def __init__(self, env: EnvSettings | EnvSpec, sampling_device: str = "cpu") -> None:
        super().__init__()
        settings = env_settings(env)
        self.env = env_spec(settings.env, settings.env_kwargs, settings.vectorization)
        resolve_vectorization(self.env, settings.vectorization)
        self.num_envs = settings.num_envs
        self.vectorization = settings.vectorization
        self.seed = settings.seed
        self.iterations_per_epoch = settings.iterations_per_epoch
        self.sampling_device = torch.device(sampling_device)
        self.check_finite = settings.check_finite
        self.module: Learner | None = None
        self.sampler = EnvSampler(self.env, self.num_envs, self.vectorization, self.seed, self.sampling_device,
                                  self.check_finite)
        self.rank = 0
        self._state_at_teardown: dict[str, Any] = {}

    @property
    def envs(self) -> gym.vector.VectorEnv | None:
        """The sampler's vector env (``None`` before ``setup`` and after ``teardown``)."""
        return self.sampler.envs

    @property
    def generator(self) -> torch.Generator:
        """The action-sampling generator (seeded ``seed + 1000 * rank`` at ``setup``)."""
        return self.sampler.generator

    # env steps sampled before a replay learns (the replay DataModules' setting; none elsewhere)
    learning_starts: int = 0

    @property
    def dev_run(self) -> bool:
        """``Trainer(fast_dev_run=...)``: the replays learn from the first iteration (``learning_starts`` waived)."""
        return self.trainer is not None and bool(self.trainer.fast_dev_run)

    @property
    def starts(self) -> int:
        """``learning_starts``, waived in a dev run (``fast_dev_run``)."""
        return 0 if self.dev_run else self.learning_starts

    # training iterations per Lightning training step (an ``IterationStream`` when above 1): set
    # by the algorithm that builds this DataModule (its ``iterations_per_step`` setting)
    requested_iterations_per_step: int = 1

    @property
    def iterations_per_step(self) -> int:
        """``requested_iterations_per_step``, or 1 where the Trainer counts batches as iterations
        (``fast_dev_run``, ``limit_train_batches`` of less than the whole epoch,
        ``val_check_interval`` as a count): those flags keep meaning iterations."""
        trainer = self.trainer
        if self.requested_iterations_per_step > 1 and trainer is not None and (
                trainer.fast_dev_run or trainer.limit_train_batches != 1.0
                or isinstance(trainer.val_check_interval, int)):
            return 1
        return self.requested_iterations_per_step

    def sample_iteration(self) -> MultiAgentBatch:
        """One iteration's batch, acted by the learner's own policies (when on its device) in eval
        mode, value estimates for bootstrapping included; training then runs in its own modes."""
        with eval_mode(self.module.policies):
            return self.sample()

    def connect(self, module: Learner) -> None:
        """The one door through which the DataModule learns the policy it samples with (any
        ``Learner``: every algorithm is one)."""
        self.module = module

    def take_lightning_seed(self) -> None:
        """``seed=None`` becomes the seed of ``pl.seed_everything`` (if one was set): called first by ``setup``."""
        if self.seed is None:
            self.seed = lightning_seed()

    def setup(self, stage: str) -> None:
        if self.module is None and self.trainer is not None:
            self.connect(self.trainer.lightning_module)
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__} needs a module: call connect(module) or use it with a Trainer")
        if self.envs is not None:
            return
        self.take_lightning_seed()
        self.rank = self.trainer.global_rank if self.trainer is not None else 0
        if self.trainer is not None and self.trainer.world_size > 1:
            self.sampler.where = f" on rank {self.rank}"
        self.sampler.open()
        self.check_spaces()
        self.sampler.reset(rank_seed(self.seed, self.rank, self.num_envs))
        self.on_envs_ready()

    def check_spaces(self) -> None:
        """Raise if the envs do not match the spaces the module's policies were built for."""
        self.module.check_spaces(self.envs.single_observation_space, self.envs.single_action_space)

    def on_envs_ready(self) -> None:
        """Subclass hook: envs are built and reset (allocate buffers here)."""

    # ------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Every rank's sampler state for exact resume (``{"world_size", "ranks"}``): RNG,
        the envs' own state as plain data (``data/envs/state.py``; never pickled, so loading
        runs no code) and where each env is in its episode. Gathers over DDP ranks: call it
        on every rank together, as Lightning's checkpointing does."""
        if self.envs is None:
            return self._state_at_teardown
        interrupted = self.trainer is not None and self.trainer.state.status == TrainerStatus.INTERRUPTED
        return pack_rank_states(self.local_state(), interrupted)

    def local_state(self) -> dict[str, Any]:
        """This process's sampler state (plain tensors and values)."""
        return self.sampler.local_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's part of ``state_dict``; call after ``setup``. Envs whose state
        could not be captured (async envs, envpool, emulators) restart from fresh episodes with a
        warning, after everything else of the rank's state was restored (a replay buffer, its
        env step count): the run continues, but not bit for bit. A checkpoint of another world
        size restarts the episodes too."""
        if not state or self.envs is None:
            return
        world_size = self.trainer.world_size if self.trainer is not None else 1
        mine = unpack_rank_state(state, self.rank, world_size, "envs and replay")
        if mine is None:
            steps = int(state["ranks"][0]["steps"]) if state.get("ranks") else 0
            self.restart_episodes(rank_seed(self.seed, self.rank, self.num_envs), steps)
            return
        envs_restored = self.sampler.load_local_state(mine)
        self.load_local_state(mine)
        if envs_restored:
            return
        # Restored first, then cut: the episodes in progress end where the checkpoint left them.
        self.restart_episodes(rank_seed(self.seed, self.rank, self.num_envs), self.sampler.steps)
        warnings.warn(
            f"the checkpoint holds no env state of {self.env!r} ({mine['envs']['unsupported']}): the envs were "
            "reset and the run continues from fresh, re-seeded episodes (the episodes in progress were cut), so it "
            f"will not match an uninterrupted run exactly; restored: {self.describe_restored(mine)}",
            stacklevel=2,
        )

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Subclass hook: restore what a subclass added to ``local_state`` (also when the envs'
        own state could not be restored: ``on_envs_reset`` follows then)."""

    def describe_restored(self, state: dict[str, Any]) -> str:
        """What a restore kept although the envs restarted (ends the warning that says so)."""
        return "the weights, optimizer and counters"

    def restart_episodes(self, seed: int | None, offset: int) -> None:
        """Reset every env to a fresh episode (seeded by ``seed + offset``), when their state
        could not be restored."""
        self.sampler.reset(None if seed is None else seed + offset)
        self.on_envs_reset()

    def on_envs_reset(self) -> None:
        """Subclass hook: the envs restarted from fresh episodes after a restore."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Iterations(self), batch_size=None, num_workers=0)

    def teardown(self, stage: str) -> None:
        self.close()

    def on_exception(self, exception: BaseException) -> None:
        """A failed or interrupted fit: close the envs, terminating env worker processes."""
        self.close(terminate=True)

    def close(self, terminate: bool = False) -> None:
        """Close the envs, keeping what a checkpoint saved afterwards must contain (gathered over
        DDP ranks at a normal end, when every rank closes together; this rank's alone when
        ``terminate``-ing after a failure)."""
        if self.envs is None:
            return
        try:
            self._state_at_teardown = pack_rank_states(self.local_state(), interrupted=terminate)
        except Exception:  # a broken env (the reason we are closing) may not even report its state
            if not terminate:
                raise
            self._state_at_teardown = {}
        self.sampler.close(terminate)

    def sample(self) -> MultiAgentBatch:
        """The next iteration's batch."""
        raise NotImplementedError

    def episode_info(self) -> dict[str, Any]:
        """Returns and lengths of the episodes that ended since the last call."""
        return self.sampler.episode_info()
