"""On-policy sampling: a DataModule that owns vector envs and yields one policy batch per step."""

from __future__ import annotations

import time

import numpy as np
import torch

from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from lightning_rl.data.base import EnvDataModule, rank_seed
from lightning_rl.data.envs import EnvSpec

__all__ = ["RolloutDataModule", "rank_seed"]


class RolloutDataModule(EnvDataModule):
    """Steps ``num_envs`` gymnasium envs for ``rollout_fragment_length`` steps per iteration.

    Each Lightning training step receives one ``MultiAgentBatch``: the rollout, already
    post-processed by the algorithm (``module.postprocess_rollout``, e.g. GAE), with the
    reset steps of gymnasium's next-step autoreset dropped. ``batch.env_steps`` counts
    every env step taken (``num_envs * rollout_fragment_length``).
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
        check_finite: bool = True,
    ) -> None:
        super().__init__(env, num_envs, vectorization, seed, iterations_per_epoch, sampling_device, check_finite)
        if rollout_fragment_length < 1:
            raise ValueError(f"rollout_fragment_length must be >= 1, got {rollout_fragment_length}")
        self.rollout_fragment_length = rollout_fragment_length

    @property
    def train_batch_size(self) -> int:
        return self.num_envs * self.rollout_fragment_length

    def sample(self, policy_id: str = DEFAULT_POLICY_ID) -> MultiAgentBatch:
        """One rollout of ``rollout_fragment_length`` steps, post-processed by the module."""
        assert self.module is not None and self.envs is not None, "call setup() first"
        start = time.perf_counter()
        with torch.inference_mode():
            rollout, valid = self.rollout_fragment(policy_id)
        # Outside inference mode: the batch's tensors become ordinary ones autograd may save.
        rollout = SampleBatch({k: v.clone() for k, v in rollout.items()})
        with torch.no_grad():
            batch = self.module.postprocess_rollout(policy_id, rollout, torch.tensor(self._obs), valid)
        info = self.episode_info()
        info["sample_time_s"] = time.perf_counter() - start
        return MultiAgentBatch({policy_id: batch}, env_steps=self.train_batch_size, info=info)

    def rollout_fragment(self, policy_id: str) -> tuple[SampleBatch, torch.Tensor]:
        """Time-major ``[T, N]`` columns of one fragment (call under ``torch.inference_mode``) and
        the ``[T, N]`` mask of real transitions; ``self._obs`` is then the observation after it."""
        T, N = self.rollout_fragment_length, self.num_envs
        cols: dict[str, torch.Tensor] = {}
        rewards = np.empty((T, N), dtype=np.float32)
        terminateds = np.empty((T, N), dtype=bool)
        truncateds = np.empty((T, N), dtype=bool)
        valid = np.empty((T, N), dtype=bool)
        obs_buf = torch.empty((T, N, *self._obs.shape[1:]), dtype=torch.as_tensor(self._obs).dtype)
        for t in range(T):
            # The policy reads the copy in obs_buf, not numpy's memory: a matmul's rounding may
            # depend on its input's alignment, which numpy leaves to chance (exact resume).
            obs_buf[t] = torch.from_numpy(self._obs)
            obs = obs_buf[t]
            out = self.module.policy_outputs(obs, policy_id, explore=True, generator=self.generator,
                                             device=self.sampling_device)
            for key, value in out.items():
                if key not in cols:
                    cols[key] = torch.empty((T, *value.shape), dtype=value.dtype)
                cols[key][t] = value
            _, rewards[t], terminateds[t], truncateds[t], valid[t] = self.step_envs(
                out[SampleBatch.ACTIONS].cpu().numpy()
            )
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
