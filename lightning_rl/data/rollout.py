"""On-policy sampling: a DataModule that owns vector envs and yields one policy batch per step."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from lightning_rl.data.envs import EnvSpec, make_vector_env

if TYPE_CHECKING:
    from lightning_rl.algorithms.base import RLModule

# Sampling steps envs with the live policy, so it must run in the training process.
warnings.filterwarnings("ignore", message=".*does not have many workers.*")


class _Iterations(IterableDataset):
    """``iterations_per_epoch`` policy batches per epoch; env state carries across epochs."""

    def __init__(self, datamodule: RolloutDataModule) -> None:
        self.datamodule = datamodule

    def __len__(self) -> int:
        return self.datamodule.iterations_per_epoch

    def __iter__(self) -> Iterator[MultiAgentBatch]:
        for _ in range(len(self)):
            yield self.datamodule.sample()


def rank_seed(seed: int | None, rank: int) -> int | None:
    """Distinct env seeds per DDP rank (``seed + 1000 * rank``)."""
    return None if seed is None else seed + 1000 * rank


class RolloutDataModule(pl.LightningDataModule):
    """Steps ``num_envs`` gymnasium envs for ``rollout_fragment_length`` steps per iteration.

    Each Lightning training step receives one ``MultiAgentBatch``: the rollout, already
    post-processed by the algorithm (``module.postprocess_rollout``, e.g. GAE), with the
    reset steps of gymnasium's next-step autoreset dropped. ``batch.env_steps`` counts
    every env step taken (``num_envs * rollout_fragment_length``); ``batch.info`` holds the
    episodes that finished and the sampling time, for callbacks.

    The module reaches the DataModule through ``connect`` (Lightning calls ``setup`` with
    the trainer's module); the DataModule samples with ``module.sampling_policy``.
    """

    def __init__(
        self,
        env: EnvSpec,
        num_envs: int = 8,
        rollout_fragment_length: int = 32,
        vectorization: str = "auto",
        seed: int | None = None,
        iterations_per_epoch: int = 10,
        sampling_device: str = "cpu",
    ) -> None:
        super().__init__()
        if rollout_fragment_length < 1:
            raise ValueError(f"rollout_fragment_length must be >= 1, got {rollout_fragment_length}")
        if iterations_per_epoch < 1:
            raise ValueError(f"iterations_per_epoch must be >= 1, got {iterations_per_epoch}")
        self.env = env
        self.num_envs = num_envs
        self.rollout_fragment_length = rollout_fragment_length
        self.vectorization = vectorization
        self.seed = seed
        self.iterations_per_epoch = iterations_per_epoch
        self.sampling_device = torch.device(sampling_device)
        self.module: RLModule | None = None
        self.envs: gym.vector.VectorEnv | None = None
        self.generator = torch.Generator()

    @property
    def train_batch_size(self) -> int:
        return self.num_envs * self.rollout_fragment_length

    def connect(self, module: RLModule) -> None:
        """The one door through which the DataModule learns the policy it samples with."""
        self.module = module

    def setup(self, stage: str) -> None:
        if self.module is None and self.trainer is not None:
            self.connect(self.trainer.lightning_module)
        if self.module is None:
            raise RuntimeError("RolloutDataModule needs a module: call connect(module) or use it with a Trainer")
        if self.envs is not None:
            return
        rank = self.trainer.global_rank if self.trainer is not None else 0
        seed = rank_seed(self.seed, rank)
        self.envs = make_vector_env(self.env, self.num_envs, self.vectorization)
        self.module.check_spaces(self.envs.single_observation_space, self.envs.single_action_space)
        if seed is not None:
            self.generator.manual_seed(seed)
        self._obs, _ = self.envs.reset(seed=seed)
        self._prev_done = np.zeros(self.num_envs, dtype=bool)
        self._episodes_seen = 0
        action_space = self.envs.single_action_space
        self._clip = (action_space.low, action_space.high) if isinstance(action_space, gym.spaces.Box) else None

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Iterations(self), batch_size=None, num_workers=0)

    def teardown(self, stage: str) -> None:
        if self.envs is not None:
            self.envs.close()
            self.envs = None

    def sample(self, policy_id: str = DEFAULT_POLICY_ID) -> MultiAgentBatch:
        """One rollout of ``rollout_fragment_length`` steps, post-processed by the module."""
        assert self.module is not None and self.envs is not None, "call setup() first"
        start = time.perf_counter()
        with torch.inference_mode():
            rollout, valid = self._rollout(policy_id)
        # Outside inference mode: the batch's tensors become ordinary ones autograd may save.
        rollout = SampleBatch({k: v.clone() for k, v in rollout.items()})
        with torch.no_grad():
            batch = self.module.postprocess_rollout(policy_id, rollout, torch.from_numpy(self._obs), valid)
        info = self._episode_info()
        info["sample_time_s"] = time.perf_counter() - start
        return MultiAgentBatch({policy_id: batch}, env_steps=self.train_batch_size, info=info)

    def _rollout(self, policy_id: str) -> tuple[SampleBatch, torch.Tensor]:
        """Time-major ``[T, N]`` columns of one fragment and the ``[T, N]`` mask of real transitions."""
        policy = self.module.sampling_policy(policy_id, self.sampling_device)
        T, N = self.rollout_fragment_length, self.num_envs
        cols: dict[str, torch.Tensor] = {}
        rewards = np.empty((T, N), dtype=np.float32)
        terminateds = np.empty((T, N), dtype=bool)
        truncateds = np.empty((T, N), dtype=bool)
        valid = np.empty((T, N), dtype=bool)
        obs_buf = torch.empty((T, N, *self._obs.shape[1:]), dtype=torch.as_tensor(self._obs).dtype)
        for t in range(T):
            obs = torch.from_numpy(self._obs)
            obs_buf[t] = obs
            out = policy.compute_actions(obs.to(self.sampling_device), explore=True, generator=self.generator)
            for key, value in out.items():
                if key not in cols:
                    cols[key] = torch.empty((T, *value.shape), dtype=value.dtype)
                cols[key][t] = value
            actions = out[SampleBatch.ACTIONS].cpu().numpy()
            if self._clip is not None:
                actions = np.clip(actions, *self._clip)
            self._obs, rewards[t], terminateds[t], truncateds[t], _ = self.envs.step(actions)
            # Next-step autoreset: the step after an episode end only resets the env.
            valid[t] = ~self._prev_done
            self._prev_done = terminateds[t] | truncateds[t]
        rollout = SampleBatch(
            {
                SampleBatch.OBS: obs_buf,
                **cols,
                SampleBatch.REWARDS: torch.from_numpy(rewards),
                SampleBatch.TERMINATEDS: torch.from_numpy(terminateds),
                SampleBatch.TRUNCATEDS: torch.from_numpy(truncateds),
            }
        )
        return rollout, torch.from_numpy(valid)

    def _episode_info(self) -> dict[str, Any]:
        """Returns and lengths of the episodes that ended since the last call."""
        stats = self.envs  # the RecordEpisodeStatistics wrapper
        new = min(stats.episode_count - self._episodes_seen, len(stats.return_queue))
        self._episodes_seen = stats.episode_count
        returns = [float(r) for r in islice(reversed(stats.return_queue), new)][::-1]
        lengths = [int(n) for n in islice(reversed(stats.length_queue), new)][::-1]
        return {"episode_returns": returns, "episode_lengths": lengths}
