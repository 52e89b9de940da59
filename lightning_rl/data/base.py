"""EnvDataModule: what every env-owning DataModule shares (envs, seeds, the module door, episodes)."""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_rl.batch import MultiAgentBatch
from lightning_rl.data.envs import EnvSpec, make_vector_env

if TYPE_CHECKING:
    from lightning_rl.algorithms.base import RLModule

# Sampling steps envs with the live policy, so it must run in the training process: the
# "many workers" advice and the multi-worker __len__ caveat do not apply.
warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message=".*IterableDataset.*has `__len__` defined.*")


def rank_seed(seed: int | None, rank: int) -> int | None:
    """Distinct env seeds per DDP rank (``seed + 1000 * rank``)."""
    return None if seed is None else seed + 1000 * rank


class _Iterations(IterableDataset):
    """``iterations_per_epoch`` batches per epoch; env state carries across epochs."""

    def __init__(self, datamodule: EnvDataModule) -> None:
        self.datamodule = datamodule

    def __len__(self) -> int:
        return self.datamodule.iterations_per_epoch

    def __iter__(self) -> Iterator[MultiAgentBatch]:
        for _ in range(len(self)):
            yield self.datamodule.sample()


class EnvDataModule(pl.LightningDataModule):
    """Owns ``num_envs`` vector envs and yields one ``MultiAgentBatch`` per training step.

    The module reaches the DataModule through ``connect`` (Lightning's ``setup`` connects
    the trainer's module); subclasses implement ``sample``. ``batch.info`` carries the
    episodes that finished and the sampling time, for callbacks.
    """

    def __init__(
        self,
        env: EnvSpec,
        num_envs: int,
        vectorization: str,
        seed: int | None,
        iterations_per_epoch: int,
        sampling_device: str,
    ) -> None:
        super().__init__()
        if iterations_per_epoch < 1:
            raise ValueError(f"iterations_per_epoch must be >= 1, got {iterations_per_epoch}")
        self.env = env
        self.num_envs = num_envs
        self.vectorization = vectorization
        self.seed = seed
        self.iterations_per_epoch = iterations_per_epoch
        self.sampling_device = torch.device(sampling_device)
        self.module: RLModule | None = None
        self.envs: gym.vector.VectorEnv | None = None
        self.generator = torch.Generator()
        self._state_at_teardown: dict[str, Any] = {}

    def connect(self, module: RLModule) -> None:
        """The one door through which the DataModule learns the policy it samples with."""
        self.module = module

    def setup(self, stage: str) -> None:
        if self.module is None and self.trainer is not None:
            self.connect(self.trainer.lightning_module)
        if self.module is None:
            raise RuntimeError(f"{type(self).__name__} needs a module: call connect(module) or use it with a Trainer")
        if self.envs is not None:
            return
        rank = self.trainer.global_rank if self.trainer is not None else 0
        seed = rank_seed(self.seed, rank)
        self.envs = make_vector_env(self.env, self.num_envs, self.vectorization)
        self.module.check_spaces(self.envs.single_observation_space, self.envs.single_action_space)
        if seed is not None:
            self.generator.manual_seed(seed)
            self.envs.action_space.seed(seed)
        self._obs, _ = self.envs.reset(seed=seed)
        self._prev_done = np.zeros(self.num_envs, dtype=bool)
        self._episodes_seen = 0
        action_space = self.envs.single_action_space
        self._clip = (action_space.low, action_space.high) if isinstance(action_space, gym.spaces.Box) else None
        self.on_envs_ready()

    def on_envs_ready(self) -> None:
        """Subclass hook: envs are built and reset (allocate buffers here)."""

    # ------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Sampler state for exact resume: RNG, the envs themselves (pickled, when they can
        be) and where each env is in its episode. Plain tensors and bytes, so checkpoints load
        with ``weights_only=True``."""
        if self.envs is None:
            return self._state_at_teardown
        try:
            envs = pickle.dumps(self.envs)
        except Exception:  # async envs (processes), envs holding sockets or lambdas ...
            envs = None
        return {
            "generator": self.generator.get_state(),
            "envs": envs,
            "obs": torch.from_numpy(np.array(self._obs)),
            "prev_done": torch.from_numpy(self._prev_done.copy()),
            "episodes_seen": int(self._episodes_seen),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``; call after ``setup``. Envs that could not be pickled are
        reset instead, with a warning (the run continues, but not bit for bit)."""
        if not state or self.envs is None:
            return
        self.generator.set_state(state["generator"])
        if state["envs"] is None:
            warnings.warn(
                f"the checkpoint holds no env state ({type(self.envs.unwrapped).__name__} could not be pickled): "
                "the envs were reset and the run continues from fresh episodes, so it will not match an "
                "uninterrupted run exactly",
                stacklevel=2,
            )
            self.on_envs_reset()
            return
        self.envs.close()
        # The bytes were written by this library's own state_dict into the user's checkpoint.
        self.envs = pickle.loads(state["envs"])
        self._obs = state["obs"].numpy()
        self._prev_done = state["prev_done"].numpy().copy()
        self._episodes_seen = int(state["episodes_seen"])

    def on_envs_reset(self) -> None:
        """Subclass hook: the envs restarted from fresh episodes after a restore."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Iterations(self), batch_size=None, num_workers=0)

    def teardown(self, stage: str) -> None:
        if self.envs is not None:
            # Keep what a checkpoint saved after fit (trainer.save_checkpoint) must contain.
            self._state_at_teardown = self.state_dict()
            self.envs.close()
            self.envs = None

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
        self._obs, rewards, terminateds, truncateds, _ = self.envs.step(actions)
        valid = ~self._prev_done
        self._prev_done = terminateds | truncateds
        return obs, rewards, terminateds, truncateds, valid

    def episode_info(self) -> dict[str, Any]:
        """Returns and lengths of the episodes that ended since the last call."""
        stats = self.envs  # the RecordEpisodeStatistics wrapper
        new = min(stats.episode_count - self._episodes_seen, len(stats.return_queue))
        self._episodes_seen = stats.episode_count
        returns = [float(r) for r in islice(reversed(stats.return_queue), new)][::-1]
        lengths = [int(n) for n in islice(reversed(stats.length_queue), new)][::-1]
        return {"episode_returns": returns, "episode_lengths": lengths}
