"""What capturing the envs' state costs at each checkpoint save: 64 sync CartPoles after 500 steps.

Times ``capture_env_state`` (the envs as plain data) and ``torch.save`` of the result, and gives
the size that state adds to a checkpoint (what ``tests/test_env_state.py`` used to print).

    python benchmarks/env_state.py [--num-envs 64] [--steps 500] [--repeats 20]

The last stdout line is one JSON object with the figures (medians over ``--repeats``).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time

import torch

from lightning_rl.data.envs import make_vector_env
from lightning_rl.data.envs.state import capture_env_state


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)

    envs = make_vector_env("CartPole-v1", args.num_envs, "sync")
    envs.reset(seed=0)
    envs.action_space.seed(0)
    for _ in range(args.steps):
        envs.step(envs.action_space.sample())
    capture, save, size = [], [], 0
    for _ in range(args.repeats):
        start = time.perf_counter()
        state = capture_env_state(envs)
        capture.append(time.perf_counter() - start)
        buffer = io.BytesIO()
        start = time.perf_counter()
        torch.save(state, buffer)
        save.append(time.perf_counter() - start)
        size = buffer.tell()
    envs.close()
    result = {"num_envs": args.num_envs, "steps": args.steps, "capture_ms": 1e3 * statistics.median(capture),
              "torch_save_ms": 1e3 * statistics.median(save), "kB": size / 1e3}
    print(f"{args.num_envs} sync CartPoles after {args.steps} steps: capture {result['capture_ms']:.1f} ms, "
          f"torch.save {result['torch_save_ms']:.1f} ms, {result['kB']:.0f} kB")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
