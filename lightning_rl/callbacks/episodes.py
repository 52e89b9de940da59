"""Episode returns, counters and throughput, logged under ``rollout/``, ``counters/``, ``perf/``."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import pytorch_lightning as pl
import torch

from lightning_rl.callbacks.metrics import should_log, stage


def iteration_infos(batch: Any) -> list[dict[str, Any]]:
    """The ``info`` of each sampling iteration in a training batch (an ``IterationStream``, with
    ``iterations_per_step > 1``, holds several)."""
    infos = getattr(batch, "infos", None)
    return [getattr(batch, "info", {})] if infos is None else list(infos)


class RolloutMetricsCallback(pl.Callback):
    """Observes each policy batch's ``info`` and the module's counters.

    ``rollout/episode_return_mean`` is the mean over the last ``window`` episodes of every
    rank; counters are global (summed over ranks) and ``step`` (the loggers' x axis) is
    the global count of env steps sampled. Episodes are collected every iteration; metrics
    are logged at Lightning's ``log_every_n_steps`` cadence (timings averaged since the
    last log).
    """

    def __init__(self, window: int = 100) -> None:
        self.window = window
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[int] = deque(maxlen=window)
        self._last_time: float | None = None
        self._last_steps = 0
        # Sums since the last logged iteration (per-iteration averages are logged).
        self._episodes, self._sample_s, self._learn_s, self._iterations = 0, 0.0, 0.0, 0
        self._perf: dict[str, tuple[float, int]] = {}
        self.policy_returns: dict[str, deque[float]] = {}  # multi-agent: each policy's share of the team return

    def state_dict(self) -> dict[str, Any]:
        return {"returns": list(self.returns), "lengths": list(self.lengths)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.returns.extend(state_dict.get("returns", []))
        self.lengths.extend(state_dict.get("lengths", []))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_time = time.perf_counter()
        self._last_steps = pl_module.global_counters["num_env_steps_sampled"]

    def _episode_stats(self, pl_module: pl.LightningModule) -> tuple[float, float, float, float, float]:
        """(count, return sum, length sum, min return, max return) over all ranks' windows."""
        n = len(self.returns)
        local = torch.tensor(
            [n, sum(self.returns), sum(self.lengths), min(self.returns, default=float("inf")),
             max(self.returns, default=float("-inf"))],
            dtype=torch.float64,
        )
        gathered = pl_module.all_gather(local).reshape(-1, 5)
        return (
            gathered[:, 0].sum().item(), gathered[:, 1].sum().item(), gathered[:, 2].sum().item(),
            gathered[:, 3].min().item(), gathered[:, 4].max().item(),
        )

    def _policy_return_means(self, pl_module: pl.LightningModule) -> dict[str, float]:
        """``rollout/policy_return_mean/<policy_id>`` over all ranks' windows: one all_gather of
        ``[count, sum]`` per policy of the module (the same list on every rank)."""
        policy_ids = sorted(pl_module.policies)
        local = torch.tensor([x for pid in policy_ids for x in (len(self.policy_returns.get(pid, ())),
                                                                 sum(self.policy_returns.get(pid, ())))],
                             dtype=torch.float64)
        totals = pl_module.all_gather(local).reshape(-1, len(policy_ids), 2).sum(0)
        return {f"rollout/policy_return_mean/{pid}": float(total / count)
                for pid, (count, total) in zip(policy_ids, totals.tolist()) if count > 0}

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        for info in iteration_infos(batch):
            returns = info.get("episode_returns", [])
            self.returns.extend(returns)
            self.lengths.extend(info.get("episode_lengths", []))
            for per_policy in info.get("policy_returns", []):
                for policy_id, value in per_policy.items():
                    self.policy_returns.setdefault(policy_id, deque(maxlen=self.window)).append(value)
            self._episodes += len(returns)
            self._sample_s += info.get("sample_time_s", 0.0)
            self._iterations += 1
            for key, value in info.get("perf", {}).items():  # sampler figures (async sampling): mean, or max
                total, count = self._perf.get(key, (0.0, 0))
                self._perf[key] = (max(total, value), 1) if key.endswith("_max") else (total + value, count + 1)
        self._learn_s += outputs.get("learn_time_s", 0.0) if outputs else 0.0
        if not should_log(trainer, batch_idx):
            return
        metrics: dict[str, float] = {}
        count, ret_sum, len_sum, ret_min, ret_max = self._episode_stats(pl_module)
        if count > 0:  # no finished episode yet: log nothing rather than NaN
            metrics["rollout/episode_return_mean"] = ret_sum / count
            metrics["rollout/episode_len_mean"] = len_sum / count
            metrics["rollout/episode_return_min"] = ret_min
            metrics["rollout/episode_return_max"] = ret_max
        metrics["rollout/episodes_this_iter"] = self._episodes / self._iterations
        if getattr(pl_module, "multi_agent", False):
            metrics.update(self._policy_return_means(pl_module))
        counters = pl_module.global_counters
        for name, value in counters.items():
            metrics[f"counters/{name}"] = float(value)
        now = time.perf_counter()
        steps = counters["num_env_steps_sampled"]
        if self._last_time is not None and now > self._last_time:
            metrics["perf/env_steps_per_s"] = (steps - self._last_steps) / (now - self._last_time)
        metrics["perf/sample_time_ms"] = 1000.0 * self._sample_s / self._iterations
        metrics["perf/learn_time_ms"] = 1000.0 * self._learn_s / self._iterations
        metrics.update({f"perf/{key}": total / count for key, (total, count) in self._perf.items()})
        self._perf = {}
        self._last_time, self._last_steps = now, steps
        self._episodes, self._sample_s, self._learn_s, self._iterations = 0, 0.0, 0.0, 0
        bar = {"return": metrics["rollout/episode_return_mean"]} if "rollout/episode_return_mean" in metrics else {}
        bar["env_steps"] = float(steps)
        if "perf/env_steps_per_s" in metrics:
            bar["steps/s"] = metrics["perf/env_steps_per_s"]
        stage(trainer, metrics, bar)  # the loggers' x axis: global env steps (MetricsWriter)
