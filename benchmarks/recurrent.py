"""Recurrent PPO: env steps/s of PPO with and without an LSTM on CartPole without velocities
(``examples/ppo_lstm_cartpole.py``), and of sb3-contrib's ``RecurrentPPO`` at the same settings
when it is installed (``pip install sb3-contrib``), side by side in one run.

Settings are the example's (rl-zoo's for RecurrentPPO on CartPoleNoVel): 8 envs x 32 steps,
sequences of the whole 32-step fragment, 20 epochs of one 256-row minibatch, LSTM of 64, one
torch thread. Reported per run: median env steps/s over ``--repeats`` (fit time), the ratio to
our LSTM run, and the mean return of the last 20 training episodes.

Usage::

    python benchmarks/recurrent.py                    # 20k env steps each, 2 repeats
    python benchmarks/recurrent.py --steps 300000 --repeats 1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from ppo_lstm_cartpole import LastEpisodes, cartpole_without_velocities

from lightning_rl import PPO


def ours(steps: int, seed: int, use_lstm: bool, compile: bool) -> dict[str, Any]:
    model = PPO(env=cartpole_without_velocities, use_lstm=use_lstm, lstm_cell_size=64, max_seq_len=32, num_envs=8,
                rollout_fragment_length=32, num_sgd_iter=20, sgd_minibatch_size=256, lr=1e-3, gamma=0.98,
                lambda_=0.8, total_env_steps=steps, seed=seed, compile=compile)
    last = LastEpisodes(20)
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[last])
    start = time.perf_counter()
    trainer.fit(model)
    seconds = time.perf_counter() - start
    return {"steps_per_s": model.counters["num_env_steps_sampled"] / seconds, "last20": last.mean}


def sb3_recurrent(steps: int, seed: int) -> dict[str, Any] | None:
    if importlib.util.find_spec("sb3_contrib") is None:
        return None
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    env = make_vec_env(cartpole_without_velocities, n_envs=8, seed=seed)
    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=32, batch_size=256, n_epochs=20, learning_rate=1e-3,
                         gamma=0.98, gae_lambda=0.8, seed=seed, device="cpu",
                         policy_kwargs=dict(lstm_hidden_size=64, enable_critic_lstm=True))
    start = time.perf_counter()
    model.learn(steps)
    seconds = time.perf_counter() - start
    returns = [info["r"] for info in model.ep_info_buffer][-20:]
    return {"steps_per_s": steps / seconds, "last20": float(np.mean(returns)) if returns else float("nan")}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="our runs with compile=True")
    args = parser.parse_args(argv)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    runs: dict[str, list[dict[str, Any]]] = {"lstm": [], "feed_forward": [], "sb3_contrib_recurrent_ppo": []}
    for _ in range(args.repeats):
        runs["lstm"].append(ours(args.steps, args.seed, True, args.compile))
        runs["feed_forward"].append(ours(args.steps, args.seed, False, args.compile))
        sb3 = sb3_recurrent(args.steps, args.seed)
        if sb3 is not None:
            runs["sb3_contrib_recurrent_ppo"].append(sb3)
    lstm_speed = statistics.median(r["steps_per_s"] for r in runs["lstm"])
    report = {}
    for name, results in runs.items():
        if not results:
            report[name] = "not installed (pip install sb3-contrib)"
            continue
        speed = statistics.median(r["steps_per_s"] for r in results)
        report[name] = {"env_steps_per_s": round(speed, 1), "vs_our_lstm": round(speed / lstm_speed, 2),
                        "last20_return": [round(r["last20"], 1) for r in results]}
    print(json.dumps({"steps": args.steps, "compile": args.compile, **report}, indent=2))
    return report


if __name__ == "__main__":
    main()
