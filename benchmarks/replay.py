"""Replay-buffer speed and memory at 1M transitions (CartPole-sized: obs dim 4, Discrete actions).

Measures the mean time of one prioritized sample of ``--batch-size`` plus the priority
update of those rows (the learner -> replay loop of one gradient step), the time of a
uniform sample, and the buffers' memory against the raw bytes of the transitions, with
``next_obs`` stored as a separate array (what a naive buffer holds) and without.

    python benchmarks/replay.py [--capacity 1000000] [--num-envs 1000] [--repeats 300]

The last stdout line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.batch import SampleBatch
from lightning_rl.data.buffers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer


def fill(buf: ReplayBuffer, steps: int, rng: np.random.Generator, episode_len: float = 100.0) -> float:
    """``steps`` vectorized adds of a random CartPole-like stream with next-step autoreset; seconds taken."""
    n = buf.num_envs
    prev_done = np.zeros(n, dtype=bool)
    start = time.perf_counter()
    for _ in range(steps):
        obs = rng.standard_normal((n, 4), dtype=np.float32)
        actions = rng.integers(0, 2, n)
        terminateds = rng.random(n) < 1.0 / episode_len
        truncateds = np.zeros(n, dtype=bool)
        rewards = np.where(prev_done, 0.0, 1.0).astype(np.float32)
        buf.add(obs, actions, rewards, terminateds & ~prev_done, truncateds, ~prev_done)
        prev_done = terminateds & ~prev_done
    return time.perf_counter() - start


def time_ms(fn, repeats: int, warmup: int = 20) -> tuple[float, float]:
    """Mean and median milliseconds of ``fn()`` over ``repeats`` calls."""
    for _ in range(warmup):
        fn()
    times = np.empty(repeats)
    for i in range(repeats):
        start = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - start
    return float(times.mean() * 1e3), float(np.median(times) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--num-envs", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--n-step", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    act_space = gym.spaces.Discrete(2)
    kwargs = dict(num_envs=args.num_envs, n_step=args.n_step, gamma=0.99, seed=args.seed)
    per = PrioritizedReplayBuffer(args.capacity, obs_space, act_space, **kwargs)
    uniform = ReplayBuffer(args.capacity, obs_space, act_space, **kwargs)
    steps = per.rows + 1  # fill every slot and wrap once
    rng = np.random.default_rng(args.seed)
    fill_per_s = fill(per, steps, rng)
    fill_uniform_s = fill(uniform, steps, rng)
    td_rng = np.random.default_rng(args.seed + 1)

    def per_step() -> None:
        batch = per.sample(args.batch_size, beta=0.4)
        per.update_priorities(batch[SampleBatch.BATCH_INDEXES], td_rng.standard_normal(args.batch_size))

    per_mean, per_median = time_ms(per_step, args.repeats)
    per_sample_mean, _ = time_ms(lambda: per.sample(args.batch_size), args.repeats)
    uniform_mean, uniform_median = time_ms(lambda: uniform.sample(args.batch_size), args.repeats)

    # Raw bytes of `capacity` transitions: obs float32[4], action int64, reward float32,
    # terminated + truncated bools; a naive buffer also stores next_obs float32[4].
    cap = per.capacity
    obs_bytes = 4 * 4
    raw_without_next = cap * (obs_bytes + 8 + 4 + 2)
    raw_with_next = raw_without_next + cap * obs_bytes
    mib = 2.0**20
    figures = {
        "capacity": cap,
        "num_envs": args.num_envs,
        "n_step": args.n_step,
        "batch_size": args.batch_size,
        "sampleable": len(per),
        "fill_per_s": round(fill_per_s, 3),
        "fill_uniform_s": round(fill_uniform_s, 3),
        "per_sample_update_ms_mean": round(per_mean, 4),
        "per_sample_update_ms_median": round(per_median, 4),
        "per_sample_ms_mean": round(per_sample_mean, 4),
        "uniform_sample_ms_mean": round(uniform_mean, 4),
        "uniform_sample_ms_median": round(uniform_median, 4),
        "uniform_nbytes": uniform.nbytes,
        "per_storage_nbytes": per.storage_nbytes,
        "per_priority_nbytes": per.priority_nbytes,
        "per_nbytes": per.nbytes,
        "raw_nbytes_with_next_obs": raw_with_next,
        "raw_nbytes_without_next_obs": raw_without_next,
        "uniform_vs_raw_with_next_obs": round(uniform.nbytes / raw_with_next, 3),
        "uniform_vs_raw_without_next_obs": round(uniform.nbytes / raw_without_next, 3),
        "per_vs_raw_with_next_obs": round(per.nbytes / raw_with_next, 3),
    }
    print(f"replay buffers: {cap:,} transitions ({args.num_envs} envs x {per.rows} rows), n_step={args.n_step}")
    print(f"  fill: PER {fill_per_s:.2f} s, uniform {fill_uniform_s:.2f} s for {steps} vector adds")
    print(
        f"  PER sample+update of {args.batch_size}: mean {per_mean:.3f} ms, median {per_median:.3f} ms "
        f"(sample alone {per_sample_mean:.3f} ms)"
    )
    print(f"  uniform sample of {args.batch_size}: mean {uniform_mean:.3f} ms, median {uniform_median:.3f} ms")
    print(
        f"  memory: uniform {uniform.nbytes / mib:.1f} MiB; PER {per.nbytes / mib:.1f} MiB "
        f"(storage {per.storage_nbytes / mib:.1f} + trees {per.priority_nbytes / mib:.1f})"
    )
    print(
        f"  raw transitions: {raw_with_next / mib:.1f} MiB with next_obs, {raw_without_next / mib:.1f} MiB without; "
        f"uniform buffer = {figures['uniform_vs_raw_with_next_obs']:.2f}x / "
        f"{figures['uniform_vs_raw_without_next_obs']:.2f}x of those"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
