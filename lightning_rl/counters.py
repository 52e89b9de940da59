"""The counters of a run: per rank (``Algorithm.counters``) and summed over ranks
(``Algorithm.global_counters``); schedules, the budget and target updates read the sums."""

from __future__ import annotations

import torch

from lightning_rl.batch import MultiAgentBatch
from lightning_rl.distributed import sum_over_ranks, world_size

COUNTER_NAMES = (
    "num_env_steps_sampled",
    "num_env_steps_trained",
    "num_agent_steps_sampled",
    "num_agent_steps_trained",
    "num_iterations",
    "num_grad_updates",
    "num_target_updates",
)


def new_counters() -> dict[str, int]:
    return dict.fromkeys(COUNTER_NAMES, 0)


def count_iteration(counters: dict[str, int], batch: MultiAgentBatch, trained: int, multi_agent: bool) -> None:
    """One training iteration on ``batch`` that trained on ``trained`` rows."""
    counters["num_env_steps_sampled"] += batch.env_steps
    counters["num_agent_steps_sampled"] += batch.info.get("agent_steps_sampled", batch.agent_steps())
    # multi-agent: the rows trained are agents' steps; the env steps are the batch's
    counters["num_env_steps_trained"] += (batch.env_steps if trained else 0) if multi_agent else trained
    counters["num_agent_steps_trained"] += trained
    counters["num_iterations"] += 1


def summed_over_ranks(counters: dict[str, int], device: torch.device) -> dict[str, int]:
    """The counters summed over DDP ranks (a copy in one process); one all-reduce."""
    if world_size() == 1:
        return dict(counters)
    local = torch.tensor([counters[k] for k in COUNTER_NAMES], dtype=torch.float64, device=device)
    return {k: int(v) for k, v in zip(COUNTER_NAMES, sum_over_ranks(local).tolist())}
