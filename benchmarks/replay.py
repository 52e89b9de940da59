"""Replay-buffer speed and memory at 1M transitions (CartPole-sized: obs dim 4, Discrete actions).

Measures the mean time of one prioritized sample of ``--batch-size`` plus the priority
update of those rows (the learner -> replay loop of one gradient step), the time of a
uniform sample, and the buffers' memory against the raw bytes of the transitions, with
``next_obs`` stored as a separate array (what a naive buffer holds) and without.

    python benchmarks/replay.py [--capacity 1000000] [--num-envs 1000] [--repeats 300]

``--frames``: stacked Atari frames instead, ``(4, 84, 84)`` uint8 with 4 Discrete actions. Bytes
per transition (every array a buffer allocates, over its capacity) of lightning_rl's replay
storing each frame once (uniform and prioritized), of its replay of whole observations, of APEX's
replay of whole transitions with each packet's frames stored once and without, and of
Stable-Baselines3's ``ReplayBuffer`` with ``optimize_memory_usage`` True and False, each built
at ``--capacity`` (default 100k: the figures do not depend on it; ``per_1m_gb`` scales them
to 1M transitions); then ``--fill`` steps of ``--game`` (random actions, the standard
preprocessing of data/envs/atari.py; SB3's buffers get the same observations) and the time
of one sample of ``--batch-size`` from each, as ratios to the frame replay's.

    python benchmarks/replay.py --frames [--capacity 100000] [--fill 2000] [--batch-size 32]

The last stdout line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import gymnasium as gym
import numpy as np
import torch

from lightning_rl.batch import SampleBatch
from lightning_rl.data.buffers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer, TransitionReplayBuffer


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


def array_nbytes(obj: object) -> int:
    """Bytes of the numpy arrays among ``obj``'s attributes (an SB3 buffer's storage)."""
    return sum(v.nbytes for v in vars(obj).values() if isinstance(v, np.ndarray))


def frames(args: argparse.Namespace) -> None:
    """The ``--frames`` figures (see the module docstring)."""
    from lightning_rl.data.async_replay import NStepPriorityTask
    from lightning_rl.data.buffers.packed_frames import PackedFrameReplayBuffer, frame_capacity_for
    from lightning_rl.data.envs import make_vector_env

    try:
        from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
    except ImportError:  # the bench extra is not installed: ours alone
        SB3ReplayBuffer = None
        print("stable_baselines3 is not installed (pip install -e '.[bench]'): SB3's buffers are left out")

    obs_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    act_space = gym.spaces.Discrete(4)
    cap = args.capacity
    ours = dict(observation_space=obs_space, action_space=act_space, n_step=args.n_step, seed=args.seed)

    buffers: dict[str, object] = {
        "ours_frames": ReplayBuffer(cap, **ours, frame_stack=True),
        "ours_frames_per": PrioritizedReplayBuffer(cap, **ours, frame_stack=True),
        "ours_whole_obs": ReplayBuffer(cap, **ours),
    }
    # APEX's replay of whole n-step transitions, frames once per packet at its defaults (4 envs, 16 steps, 3-step)
    task = NStepPriorityTask(obs_space, act_space, 4, 16, 3, 0.99, 0.4, frame_stack=True)
    apex_frames = frame_capacity_for(cap, 16, 3, 4, task.packet_frames())
    buffers["ours_apex_packed"] = PackedFrameReplayBuffer(cap, obs_space, act_space, seed=args.seed,
                                                          frame_capacity=apex_frames)
    buffers["ours_apex_whole"] = TransitionReplayBuffer(cap, obs_space, act_space, seed=args.seed)
    if SB3ReplayBuffer is not None:
        buffers["sb3_optimize_memory"] = SB3ReplayBuffer(cap, obs_space, act_space, device="cpu",
                                                         optimize_memory_usage=True,
                                                         handle_timeout_termination=False)
        buffers["sb3"] = SB3ReplayBuffer(cap, obs_space, act_space, device="cpu")
    ours_types = (ReplayBuffer, TransitionReplayBuffer)
    per_transition = {name: (b.nbytes if isinstance(b, ours_types) else array_nbytes(b)) / cap
                      for name, b in buffers.items()}
    print(f"stacked frames (4, 84, 84) uint8, Discrete(4), n_step={args.n_step}: bytes per transition "
          f"(capacity {cap:,})")
    for name, nbytes in per_transition.items():
        print(f"  {name:20s} {nbytes:9,.0f} B   1M transitions: {nbytes * 1e6 / 1e9:6.2f} GB   "
              f"{nbytes / per_transition['ours_frames']:.2f}x ours")

    # a real stream of the game into ours (frames, whole) and SB3's memory-optimized buffer
    envs = make_vector_env(args.game, 1, "sync")
    rng = np.random.default_rng(args.seed)
    obs, _ = envs.reset(seed=args.seed)
    prev_done = np.zeros(1, dtype=bool)
    filled = {k: buffers[k] for k in ("ours_frames", "ours_whole_obs", "sb3_optimize_memory") if k in buffers}
    start = time.perf_counter()
    for _ in range(args.fill):
        actions = rng.integers(0, 4, 1)
        next_obs, rewards, terminateds, truncateds, _ = envs.step(actions)
        for name in ("ours_frames", "ours_whole_obs"):
            filled[name].add(obs, actions, rewards, terminateds, truncateds, ~prev_done)
        # SB3 takes transitions, not the reset steps of next-step autoreset
        if "sb3_optimize_memory" in filled and not prev_done[0]:
            final = next_obs
            filled["sb3_optimize_memory"].add(obs, final, actions[:, None], rewards, terminateds | truncateds, [{}])
        obs, prev_done = next_obs, terminateds | truncateds
    envs.close()
    fill_s = time.perf_counter() - start
    flat = np.flatnonzero(filled["ours_frames"]._sampleable_flat)
    a, b = (filled[k]._transitions(flat) for k in ("ours_frames", "ours_whole_obs"))
    assert all(torch.equal(a[k], b[k]) for k in a), "the frame replay differs from the whole-observation replay"
    sample_ms = {name: time_ms(lambda buf=buf: buf.sample(args.batch_size), args.repeats)[0]
                 for name, buf in filled.items()}
    print(f"  {args.fill} steps of {args.game} in {fill_s:.1f} s; {len(flat)} sampleable rows equal in both of ours")
    for name, ms in sample_ms.items():
        print(f"  sample of {args.batch_size}: {name:20s} {ms:.3f} ms  {ms / sample_ms['ours_frames']:.2f}x ours")
    print(json.dumps({
        "capacity": cap, "n_step": args.n_step, "game": args.game, "fill_steps": args.fill,
        "batch_size": args.batch_size, "bytes_per_transition": {k: round(v, 1) for k, v in per_transition.items()},
        "per_1m_gb": {k: round(v * 1e6 / 1e9, 3) for k, v in per_transition.items()},
        "vs_ours_frames": {k: round(v / per_transition["ours_frames"], 3) for k, v in per_transition.items()},
        "sample_ms": {k: round(v, 4) for k, v in sample_ms.items()},
        "sample_vs_ours_frames": {k: round(v / sample_ms["ours_frames"], 3) for k, v in sample_ms.items()},
        "load_avg": os.getloadavg(),
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=None, help="default 1M, 100k with --frames")
    parser.add_argument("--num-envs", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=None, help="default 256, 32 with --frames")
    parser.add_argument("--n-step", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", action="store_true", help="stacked Atari frames against SB3 (module docstring)")
    parser.add_argument("--fill", type=int, default=2000, help="--frames: env steps of --game into the buffers")
    parser.add_argument("--game", default="ALE/Breakout-v5")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.frames:
        args.capacity = args.capacity or 100_000
        args.batch_size = args.batch_size or 32
        return frames(args)
    args.capacity = args.capacity or 1_000_000
    args.batch_size = args.batch_size or 256

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
