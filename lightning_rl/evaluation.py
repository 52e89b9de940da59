"""Deterministic evaluation episodes on separate envs (the sampling engine's, ``data/samplers/engine.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pytorch_lightning.trainer.states import TrainerFn
from torch.utils.data import DataLoader

from lightning_rl.batch import DEFAULT_POLICY_ID
from lightning_rl.data.envs import EnvSpec
from lightning_rl.data.samplers.engine import EnvSampler
from lightning_rl.inference import Acting


@torch.no_grad()
def evaluate(
    module: torch.nn.Module,
    env: EnvSpec | None = None,
    num_episodes: int = 10,
    seed: int | None = None,
    explore: bool = False,
    policy_id: str = DEFAULT_POLICY_ID,
    vectorization: str = "auto",
) -> list[float]:
    """Returns of ``num_episodes`` episodes, one per env of a fresh vector env, greedy by default.

    Each env plays exactly one episode (a whole game for Atari), so short episodes are not
    over-represented.
    ``env`` defaults to the module's own (``module.env_spec``).
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    if getattr(module, "multi_agent", False):  # team returns of a PettingZoo env
        return evaluate_multi_agent(module, env if env is not None else module.env_spec, num_episodes, seed, explore)
    sampler = EnvSampler(env if env is not None else module.env_spec, num_episodes, vectorization,
                         check_finite=False)
    try:
        sampler.open()
        sampler.reset(seed)
        returns = np.zeros(num_episodes)
        finished = np.zeros(num_episodes, dtype=bool)
        acting = Acting(module, policy_id, explore)  # carries a recurrent policy's state
        while not finished.all():
            _, rewards, terminateds, truncateds, _ = sampler.step(acting.act(sampler.obs))  # Box actions clipped
            acting.observe(rewards, terminateds | truncateds)
            # the episode statistics' returns: raw, and whole games' scores for Atari (data/envs/atari.py)
            for env, episode_return in sampler.envs.last_ended.items():
                if not finished[env]:
                    returns[env], finished[env] = episode_return, True
    finally:
        sampler.close()
    return returns.tolist()


@torch.no_grad()
def evaluate_multi_agent(
    module: torch.nn.Module, env: Any, num_episodes: int = 10, seed: int | None = None, explore: bool = False
) -> list[float]:
    """Team returns (summed over agents) of ``num_episodes`` episodes of a PettingZoo parallel
    env, each agent acting with the policy ``module.policy_mapping_fn`` names for it."""
    from lightning_rl.data.multi_agent import make_parallel_env

    returns = []
    made = make_parallel_env(env)
    try:
        for episode in range(num_episodes):
            obs, _ = made.reset(seed=None if seed is None else seed + episode)
            total = 0.0
            while made.agents:
                actions = {}
                for agent in made.agents:
                    action = module.compute_actions(np.asarray(obs[agent]), policy_id=module.policy_mapping_fn(agent),
                                                    explore=explore)
                    actions[agent] = action.item() if np.ndim(action) == 0 else action
                obs, rewards, _, _, _ = made.step(actions)
                total += float(sum(rewards.values()))
            returns.append(total)
    finally:
        made.close()
    return returns


def log_evaluation(module: Any, prefix: str, seed_offset: int) -> None:
    """An algorithm's validation or test step: ``evaluation_num_episodes`` greedy episodes
    seeded ``seed + seed_offset + 1000 * rank``, logged as ``<prefix>/episode_return_mean``
    (``_min``, ``_max``) at the global env-step count."""
    seed = None if module.seed is None else module.seed + seed_offset + 1000 * module.global_rank
    returns = evaluate(module, module.env_spec, module.evaluation_num_episodes, seed=seed,
                       vectorization=getattr(module.default_datamodule, "vectorization", "auto"))
    sync = module.trainer.world_size > 1
    for stat, fn, reduce in (("mean", np.mean, "mean"), ("min", np.min, "min"), ("max", np.max, "max")):
        module.log(f"{prefix}/episode_return_{stat}", float(fn(returns)), sync_dist=sync, reduce_fx=reduce,
                   batch_size=1, prog_bar=stat == "mean")
    module.log("step", float(module.global_counters["num_env_steps_sampled"]), batch_size=1)


class EvaluationHooks:
    """An algorithm's Lightning validation and test (``Algorithm`` inherits them): greedy
    episodes on envs of their own, logged at the global env-step count."""

    def val_dataloader(self) -> Any:
        """One evaluation request per validation run: always for ``trainer.validate``, during
        ``fit`` only when ``evaluation_interval`` is set."""
        validating = self._trainer is not None and self.trainer.state.fn == TrainerFn.VALIDATING
        return DataLoader(range(1), batch_size=None) if validating or self.evaluation_interval else []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """``evaluation_num_episodes`` greedy episodes on separate envs (per rank under DDP),
        logged at the global env-step count like the training metrics."""
        log_evaluation(self, "val", seed_offset=100_000)

    def test_dataloader(self) -> Any:
        """One evaluation request per ``trainer.test`` (``lightning-rl test``)."""
        return DataLoader(range(1), batch_size=None)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        """``evaluation_num_episodes`` greedy episodes on test envs of their own (seeded apart
        from validation's), logged as ``test/episode_return_mean`` (and ``_min``, ``_max``)."""
        log_evaluation(self, "test", seed_offset=200_000)

