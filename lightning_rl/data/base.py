"""EnvDataModule: what every env-owning DataModule shares (envs, seeds, the module door, episodes)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import TrainerStatus
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from lightning_rl.batch import MultiAgentBatch
from lightning_rl.checkpoint import pack_rank_states, unpack_rank_state
from lightning_rl.data.env_state import UnsupportedEnvState, capture_env_state, restore_env_state
from lightning_rl.data.envs import (
    EnvSpec,
    close_vector_env,
    make_vector_env,
    reset_vector_env,
    resolve_vectorization,
    step_vector_env,
)

if TYPE_CHECKING:
    from lightning_rl.algorithms.base import Algorithm

def rank_seed(seed: int | None, rank: int) -> int | None:
    """Distinct env seeds per DDP rank (``seed + 1000 * rank``)."""
    return None if seed is None else seed + 1000 * rank


def new_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` (where the random numbers are drawn), seeded with
    ``seed``, or from OS entropy when ``seed`` is None (a fresh generator alone always starts
    from the same fixed seed)."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def policy_state(policy: nn.Module) -> list[torch.Tensor]:
    """Every tensor a policy computes with, in a fixed order: its parameters, then its buffers
    (BatchNorm statistics, observation normalizers; non-persistent ones too). What a copy of
    the policy that acts elsewhere (a sampler worker, another device) must receive."""
    return [*policy.parameters(), *policy.buffers()]


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """Run ``module`` in eval mode (Dropout off, BatchNorm reading its running statistics
    without updating them), then give every submodule back the mode it had: acting is eval
    mode everywhere, the learner trains in the modes it set."""
    training = [m for m in module.modules() if m.training]
    if training:
        module.eval()
    try:
        yield
    finally:
        for m in training:
            m.training = True


class _Iterations(IterableDataset):
    """``iterations_per_epoch`` batches per epoch; env state carries across epochs."""

    def __init__(self, datamodule: EnvDataModule) -> None:
        self.datamodule = datamodule

    def __len__(self) -> int:
        return self.datamodule.iterations_per_epoch

    def __iter__(self) -> Iterator[MultiAgentBatch]:
        for _ in range(len(self)):
            # Sampling acts with the learner's own policies (when on its device): in eval mode,
            # value estimates for bootstrapping included; training then runs in its own modes.
            with eval_mode(self.datamodule.module.policies):
                batch = self.datamodule.sample()
            yield batch


class EnvDataModule(pl.LightningDataModule):
    """Owns ``num_envs`` vector envs and yields one ``MultiAgentBatch`` per training step.

    The module reaches the DataModule through ``connect`` (Lightning's ``setup`` connects
    the trainer's module); subclasses implement ``sample``. ``batch.info`` carries the
    episodes that finished and the sampling time, for callbacks.

    Args:
        env: a registered gymnasium id or any callable returning a ``gymnasium.Env``
            (``GymMake(id, kwargs)`` for an id with keyword arguments).
        num_envs: envs stepped in parallel (per process under DDP).
        vectorization: ``"auto"`` (the env's own batched version where it registers one,
            else ``"sync"``), ``"sync"``, ``"async"`` (one process per env) or
            ``"vector_entry_point"``.
        seed: env, action-sampling and replay seed (``seed + 1000 * rank`` under DDP);
            ``None`` for random.
        iterations_per_epoch: training iterations in one Lightning epoch, the cadence of
            epoch-based callbacks (checkpointing, validation).
        sampling_device: device the policy runs on while sampling (and where the action
            sampling generator lives); small MLPs are faster on the CPU than with a GPU
            round trip per env step.
        check_finite: raise, naming the env, the field and the step, when an env returns a
            NaN or infinite reward or observation (one vectorized check per step).
    """

    def __init__(
        self,
        env: EnvSpec,
        num_envs: int,
        vectorization: str,
        seed: int | None,
        iterations_per_epoch: int,
        sampling_device: str,
        check_finite: bool = True,
    ) -> None:
        super().__init__()
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if iterations_per_epoch < 1:
            raise ValueError(f"iterations_per_epoch must be >= 1, got {iterations_per_epoch}")
        resolve_vectorization(env, vectorization)
        self.env = env
        self.num_envs = num_envs
        self.vectorization = vectorization
        self.seed = seed
        self.iterations_per_epoch = iterations_per_epoch
        self.sampling_device = torch.device(sampling_device)
        self.check_finite = check_finite
        self.module: Algorithm | None = None
        self.envs: gym.vector.VectorEnv | None = None
        self.generator = new_generator(seed, self.sampling_device)
        self.rank = 0
        self._steps = 0  # vector-env steps taken by this process (each env's own step count)
        self._state_at_teardown: dict[str, Any] = {}

    def connect(self, module: Algorithm) -> None:
        """The one door through which the DataModule learns the policy it samples with."""
        self.module = module

    def setup(self, stage: str) -> None:
        if self.module is None and self.trainer is not None:
            self.connect(self.trainer.lightning_module)
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__} needs a module: call connect(module) or use it with a Trainer")
        if self.envs is not None:
            return
        self.rank = self.trainer.global_rank if self.trainer is not None else 0
        self.envs = make_vector_env(self.env, self.num_envs, self.vectorization)
        self.module.check_spaces(self.envs.single_observation_space, self.envs.single_action_space)
        action_space = self.envs.single_action_space
        self._clip = (action_space.low, action_space.high) if isinstance(action_space, gym.spaces.Box) else None
        self._float_obs = np.issubdtype(self.envs.single_observation_space.dtype or np.int64, np.floating)
        self._steps = 0
        self._reset(rank_seed(self.seed, self.rank))
        self.on_envs_ready()

    def _reset(self, seed: int | None) -> None:
        if seed is not None:
            self.generator.manual_seed(seed)
            self.envs.action_space.seed(seed)
        self._obs, _ = reset_vector_env(self.envs, seed=seed)
        self._prev_done = np.zeros(self.num_envs, dtype=bool)
        self._episodes_seen = self.envs.episode_count
        if self.check_finite and self._float_obs:
            self._check_finite("observation", self._obs)

    def on_envs_ready(self) -> None:
        """Subclass hook: envs are built and reset (allocate buffers here)."""

    # ------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Every rank's sampler state for exact resume (``{"world_size", "ranks"}``): RNG,
        the envs' own state as plain data (``data/env_state.py``; never pickled, so loading
        runs no code) and where each env is in its episode. Gathers over DDP ranks: call it
        on every rank together, as Lightning's checkpointing does."""
        if self.envs is None:
            return self._state_at_teardown
        interrupted = self.trainer is not None and self.trainer.state.status == TrainerStatus.INTERRUPTED
        return pack_rank_states(self.local_state(), interrupted)

    def local_state(self) -> dict[str, Any]:
        """This process's sampler state (plain tensors and values)."""
        try:
            envs = capture_env_state(self.envs)
        except UnsupportedEnvState as err:  # async envs (other processes), C-extension state ...
            envs = {"unsupported": str(err)}
        return {
            "generator": self.generator.get_state(),
            "envs": envs,
            "obs": torch.from_numpy(np.array(self._obs)),
            "prev_done": torch.from_numpy(self._prev_done.copy()),
            "episodes_seen": int(self._episodes_seen),
            "steps": self._steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's part of ``state_dict``; call after ``setup``. Envs whose state
        could not be captured, or a checkpoint of another world size, restart from fresh
        episodes with a warning (the run continues, but not bit for bit)."""
        if not state or self.envs is None:
            return
        world_size = self.trainer.world_size if self.trainer is not None else 1
        mine = unpack_rank_state(state, self.rank, world_size, "envs and replay")
        if mine is None:
            steps = int(state["ranks"][0]["steps"]) if state.get("ranks") else 0
            self.restart_episodes(rank_seed(self.seed, self.rank), steps)
            return
        self.generator.set_state(mine["generator"])
        self._steps = int(mine["steps"])
        if "unsupported" in mine["envs"]:
            warnings.warn(
                f"the checkpoint holds no env state of {self.env!r} ({mine['envs']['unsupported']}): the envs were "
                "reset and the run continues from fresh, re-seeded episodes, so it will not match an uninterrupted "
                "run exactly",
                stacklevel=2,
            )
            self.restart_episodes(rank_seed(self.seed, self.rank), self._steps)
            return
        restore_env_state(self.envs, mine["envs"])
        self._obs = mine["obs"].numpy().copy()
        self._prev_done = mine["prev_done"].numpy().copy()
        self._episodes_seen = int(mine["episodes_seen"])
        self.load_local_state(mine)

    def load_local_state(self, state: dict[str, Any]) -> None:
        """Subclass hook: restore what a subclass added to ``local_state``."""

    def restart_episodes(self, seed: int | None, offset: int) -> None:
        """Reset every env to a fresh episode (seeded by ``seed + offset``), when their state
        could not be restored."""
        self._reset(None if seed is None else seed + offset)
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
        envs, self.envs = self.envs, None
        close_vector_env(envs, terminate=terminate)

    def sample(self) -> MultiAgentBatch:
        """The next iteration's batch."""
        raise NotImplementedError

    def step_envs(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One vector-env step. Returns ``(obs, rewards, terminateds, truncateds, valid)`` where
        ``obs`` is what the actions were taken in and ``valid`` is False for the reset steps
        of gymnasium's next-step autoreset (the step after an episode end only resets)."""
        obs = self._obs
        if self._clip is not None:
            actions = np.clip(actions, *self._clip)
        self._obs, rewards, terminateds, truncateds, _ = step_vector_env(self.envs, actions)
        self._steps += 1
        if self.check_finite:
            self._check_finite("reward", rewards)
            if self._float_obs:
                self._check_finite("observation", self._obs)
        valid = ~self._prev_done
        self._prev_done = terminateds | truncateds
        return obs, rewards, terminateds, truncateds, valid

    def _check_finite(self, field: str, values: np.ndarray) -> None:
        finite = np.isfinite(values).reshape(self.num_envs, -1).all(axis=1)
        if finite.all():
            return
        env = int(np.flatnonzero(~finite)[0])
        where = f" on rank {self.rank}" if self.trainer is not None and self.trainer.world_size > 1 else ""
        raise ValueError(
            f"env {env} of {self.num_envs} ({self.env!r}){where} returned a non-finite {field} at its env step "
            f"{self._steps}: {values[env]!r}. Fix the env, or pass check_finite=False to train on it anyway"
        )

    def episode_info(self) -> dict[str, Any]:
        """Returns and lengths of the episodes that ended since the last call."""
        stats = self.envs  # the EpisodeStatistics wrapper (data/envs.py)
        new = min(stats.episode_count - self._episodes_seen, len(stats.return_queue))
        self._episodes_seen = stats.episode_count
        returns = [float(r) for r in islice(reversed(stats.return_queue), new)][::-1]
        lengths = [int(n) for n in islice(reversed(stats.length_queue), new)][::-1]
        return {"episode_returns": returns, "episode_lengths": lengths}
