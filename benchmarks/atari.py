"""Atari throughput of lightning_rl against Stable-Baselines3 at identical settings, in one run.

Both sides play the same ALE game with the same preprocessing (no-op starts, frame skip 4 with
max-pooling, 84x84 grayscale, FIRE at reset, a lost life as episode end, clipped rewards, 4
stacked frames; v5's sticky actions on both), with the Nature CNN. SB3 steps gymnasium's envs
in one process (``make_atari_env`` + ``VecFrameStack``, a ``DummyVecEnv``); lightning_rl runs
once per ``--vectorizations`` entry: ``sync`` (gymnasium's ``SyncVectorEnv``, SB3's counterpart)
and ``envpool`` (envpool's C++ envs and threads, ``pip install "lightning-rl[envpool]"``; its
preprocessing switches mean the same, see lightning_rl/data/envs/envpool_env.py):

* PPO: 8 envs x 128 steps, 4 epochs of 4 minibatches (256), lr 2.5e-4, clip 0.1, entropy
  0.01, value coefficient 0.5, grad clip 0.5, one CNN shared by the policy and the value
  function, the heads right on its 512 features (SB3's ``CnnPolicy``).
* DQN: 1 env, Nature CNN with a 512-unit layer (SB3's ``CnnPolicy``), Adam 1e-4, batch 32, one
  gradient step per 4 env steps, target copied every 1,000 steps, learning starts at 1,000;
  plain DQN on both sides (no double Q, dueling or n-step), a 10k replay.

Runs alternate (each of ours, SB3, each of ours, ...) so drifts in machine load hit all alike;
steps/s is env steps over the wall time of ``fit`` / ``learn``, and for ours the share of it
spent sampling (env steps and the policy's forward passes; the rest is learning). Before the
fits, the envs alone: 8 envs stepped with random actions on each backend (``--env-only-steps``),
so the env's part of a step is seen apart from the networks'. ``--precisions 32-true,bf16-mixed``
also runs ours with ``Trainer(precision="bf16-mixed")`` (the update's convolutions and matrix
products in bfloat16, which CPUs with AMX or AVX512-BF16 run faster; SB3 has no such setting),
named ``ours-<backend>-bf16``; ``--compile false,true`` also runs ours with ``compile=True`` (the
update as compiled graphs, ``-compiled``). Besides the fit's rate, each row reports the steady
rate, env steps/s from the end of the first training iteration (ours: the first training step,
a compiled update's compilation included; SB3: its first update) to the end: what a long run
sees. The last line is one JSON object.

    python benchmarks/atari.py --algos ppo,dqn --seeds 2 --ppo-steps 8192 --dqn-steps 6000

``--device cuda`` puts both learners on the GPU (``benchmarks/gpu_run.sh`` runs it so);
``--sb3-vec subproc`` gives SB3 its ``SubprocVecEnv``, the counterpart of ours' ``async``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
import warnings
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

GAME = "ALE/Breakout-v5"


def quiet_trainer(precision: str = "32-true", callbacks: list[pl.Callback] | None = None,
                  device: str = "cpu") -> pl.Trainer:
    return pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, precision=precision, callbacks=callbacks,
                      accelerator="gpu" if device == "cuda" else "cpu", devices=1)


class Steady(pl.Callback):
    """The time and env steps at the end of the first training iteration (a compiled update's
    compilation included), from which the steady rate is counted."""

    def __init__(self) -> None:
        self.first: tuple[float, int] | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, *args: Any) -> None:
        if self.first is None:
            self.first = (time.perf_counter(), int(module.counters["num_env_steps_sampled"]))


def ours(algo: str, seed: int, steps: int, game: str, vectorization: str,
         precision: str = "32-true", compile: bool = False, device: str = "cpu") -> tuple[float, float, float, int]:
    """Env steps per second of ``fit``, the share of its time spent sampling, the steady env steps
    per second (after the first iteration) and the graphs torch.compile made."""
    import torch._dynamo

    import lightning_rl as L

    if algo == "ppo":
        model = L.PPO(env=game, seed=seed, num_envs=8, rollout_fragment_length=128, num_sgd_iter=4,
                      sgd_minibatch_size=256, lr=2.5e-4, clip_param=0.1, entropy_coeff=0.01, vf_loss_coeff=0.5,
                      grad_clip=0.5, hiddens=(), vf_share_layers=True, encoder="nature_cnn", total_env_steps=steps,
                      vectorization=vectorization, iterations_per_epoch=1000, compile=compile)
    else:
        model = L.DQN(env=game, seed=seed, num_envs=1, encoder="nature_cnn", hiddens=(512,), lr=1e-4,
                      lr_schedule="constant", train_batch_size=32, train_freq=4, num_gradient_steps=1,
                      target_network_update_freq=1000, learning_starts=1000, buffer_size=10_000, n_step=1,
                      double_q=False, dueling=False, epsilon_timesteps=steps // 10, epsilon_end=0.01,
                      total_env_steps=steps, vectorization=vectorization, iterations_per_epoch=100_000,
                      compile=compile)
    sampling = [0.0]
    postprocess = model.postprocess

    def timed(batch: Any) -> Any:  # every batch says how long sampling it took
        sampling[0] += batch.info.get("sample_time_s", 0.0)
        return postprocess(batch)

    model.postprocess = timed
    steady = Steady()
    trainer = quiet_trainer(precision, [steady], device)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    start = time.perf_counter()
    trainer.fit(model)
    end = time.perf_counter()
    sampled = model.counters["num_env_steps_sampled"]
    graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    rest = (sampled - steady.first[1]) / (end - steady.first[0])
    return sampled / (end - start), sampling[0] / (end - start), rest, graphs


def env_only(backend: str, game: str, steps: int, seed: int = 0) -> float:
    """Env steps per second of 8 envs under random actions, no network."""
    if backend == "sb3":
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack

        envs = VecFrameStack(make_atari_env(game, n_envs=8, seed=seed, env_kwargs={"frameskip": 1}), 4)
        envs.reset()
        actions = np.random.default_rng(seed).integers(0, envs.action_space.n, (steps, 8))
        start = time.perf_counter()
        for a in actions:
            envs.step(a)
    else:
        from lightning_rl.data.envs import make_vector_env

        envs = make_vector_env(game, 8, backend)
        envs.reset(seed=seed)
        actions = np.random.default_rng(seed).integers(0, envs.single_action_space.n, (steps, 8))
        start = time.perf_counter()
        for a in actions:
            envs.step(a)
    rate = 8 * steps / (time.perf_counter() - start)
    envs.close()
    return rate


def ale_env(game: str, **kwargs: Any) -> Any:
    """``gym.make(game)`` with the ALE ids registered (also in a SubprocVecEnv's fresh process)."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    return gym.make(game, **kwargs)


def sb3(algo: str, seed: int, steps: int, game: str, device: str = "cpu", vec: str = "dummy") -> tuple[float, float]:
    """Env steps per second of ``learn``, and the steady rate (from the second rollout on, after the first update)."""
    from stable_baselines3 import DQN, PPO
    from stable_baselines3.common.callbacks import BaseCallback

    class SteadySB3(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.rollouts, self.first = 0, None

        def _on_rollout_start(self) -> None:
            self.rollouts += 1
            if self.rollouts == 2:
                self.first = (time.perf_counter(), self.model.num_timesteps)

        def _on_step(self) -> bool:
            return True
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import SubprocVecEnv, VecFrameStack

    gym.register_envs(ale_py)  # the ALE ids (ours registers them too, but perhaps not yet in this process)
    n_envs = 8 if algo == "ppo" else 1
    env = VecFrameStack(make_atari_env(functools.partial(ale_env, game), n_envs=n_envs, seed=seed,
                                       env_kwargs={"frameskip": 1},
                                       vec_env_cls=SubprocVecEnv if vec == "subproc" else None), 4)
    if algo == "ppo":
        model = PPO("CnnPolicy", env, n_steps=128, n_epochs=4, batch_size=256, learning_rate=2.5e-4, clip_range=0.1,
                    ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, seed=seed, device=device)
    else:
        model = DQN("CnnPolicy", env, learning_rate=1e-4, batch_size=32, train_freq=4, gradient_steps=1,
                    target_update_interval=1000, learning_starts=1000, buffer_size=10_000,
                    exploration_fraction=0.1, exploration_final_eps=0.01, seed=seed, device=device,
                    optimize_memory_usage=False)
    steady = SteadySB3()
    start = time.perf_counter()
    model.learn(total_timesteps=steps, callback=steady)
    end = time.perf_counter()
    if steady.first is None:  # one rollout only: no steady part
        return model.num_timesteps / (end - start), float("nan")
    return model.num_timesteps / (end - start), (model.num_timesteps - steady.first[1]) / (end - steady.first[0])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algos", default="ppo,dqn")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--ppo-steps", type=int, default=8192)
    parser.add_argument("--dqn-steps", type=int, default=6000)
    parser.add_argument("--game", default=GAME)
    parser.add_argument("--vectorizations", default="sync,envpool",
                        help="comma-separated vector backends of ours: sync, async and/or envpool")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="the learner's device, ours (Trainer accelerator) and SB3's alike")
    parser.add_argument("--sb3-vec", default="dummy", choices=["dummy", "subproc"],
                        help="SB3's vector env: DummyVecEnv (one process) or SubprocVecEnv")
    parser.add_argument("--precisions", default="32-true",
                        help="comma-separated Trainer precisions of ours: 32-true and/or bf16-mixed")
    parser.add_argument("--compile", default="false",
                        help="comma-separated compile settings of ours: false and/or true (rows named -compiled)")
    parser.add_argument("--env-only-steps", type=int, default=500,
                        help="steps of the 8 envs alone per backend before the fits (0: skip)")
    args = parser.parse_args(argv)
    backends = [v.strip() for v in args.vectorizations.split(",") if v.strip()]
    if not backends or set(backends) - {"sync", "async", "envpool"}:
        parser.error(f"--vectorizations takes sync, async and/or envpool, got {args.vectorizations!r}")
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not precisions or set(precisions) - {"32-true", "bf16-mixed"}:
        parser.error(f"--precisions takes 32-true and/or bf16-mixed, got {args.precisions!r}")
    compiles = [c.strip() for c in args.compile.split(",") if c.strip()]
    if not compiles or set(compiles) - {"false", "true"}:
        parser.error(f"--compile takes false and/or true, got {args.compile!r}")
    runs = [(b, p, c == "true", f"ours-{b}" + "-bf16" * (p == "bf16-mixed") + "-compiled" * (c == "true"))
            for b in backends for p in precisions for c in compiles]
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    load_start = os.getloadavg()
    print(f"torch {torch.__version__}, threads 1, cpus {os.cpu_count()}, load average at start {load_start}")
    out: dict[str, Any] = {"game": args.game, "device": args.device, "sb3_vec": args.sb3_vec,
                           "load_avg_start": load_start, "env_only_steps_per_s": {},
                           "algos": {}}
    if args.env_only_steps:
        for backend in (*backends, "sb3"):
            rate = env_only(backend, args.game, args.env_only_steps)
            out["env_only_steps_per_s"][backend] = rate
            print(f"[envs alone, 8 x {args.env_only_steps} random steps] {backend}: {rate:,.0f} steps/s", flush=True)
    for algo in args.algos.split(","):
        steps = args.ppo_steps if algo == "ppo" else args.dqn_steps
        names = [name for *_, name in runs]
        rates: dict[str, list[float]] = {name: [] for name in (*names, "sb3")}
        steady: dict[str, list[float]] = {name: [] for name in (*names, "sb3")}
        sampling: dict[str, list[float]] = {name: [] for name in names}
        graphs: dict[str, int] = {}
        for seed in range(args.seeds):
            for backend, precision, compiled, name in runs:
                rate, share, rest, graphs[name] = ours(algo, seed, steps, args.game, backend, precision, compiled,
                                                       args.device)
                rates[name].append(rate)
                steady[name].append(rest)
                sampling[name].append(share)
                print(f"[{algo} {name} seed {seed}] {steps} env steps: {rate:,.0f} steps/s ({rest:,.0f} after the "
                      f"first iteration), {100 * share:.0f}% of the time sampling", flush=True)
            rate, rest = sb3(algo, seed, steps, args.game, args.device, args.sb3_vec)
            rates["sb3"].append(rate)
            steady["sb3"].append(rest)
            print(f"[{algo} sb3 seed {seed}] {steps} env steps: {rate:,.0f} steps/s ({rest:,.0f} after the first "
                  "update)", flush=True)
        mean = {k: float(np.mean(v)) for k, v in rates.items()}
        steady_mean = {k: float(np.mean(v)) for k, v in steady.items()}
        out["algos"][algo] = {"env_steps": steps, "steps_per_s": mean,
                              "steps_per_s_std": {k: float(np.std(v)) for k, v in rates.items()},
                              "sampling_share": {k: float(np.mean(v)) for k, v in sampling.items()},
                              "ratio_over_sb3": {k: mean[k] / mean["sb3"] for k in names},
                              "steady_steps_per_s": steady_mean,
                              "steady_ratio_over_sb3": {k: steady_mean[k] / steady_mean["sb3"] for k in names},
                              "compiled_graphs": graphs}
        print(f"{algo}: " + ", ".join(f"{k} {mean[k]:,.0f}" for k in names) + f" / SB3 {mean['sb3']:,.0f} steps/s = "
              + ", ".join(f"{mean[k] / mean['sb3']:.2f}x" for k in names), flush=True)
        print(f"{algo}, after the first iteration: " + ", ".join(f"{k} {steady_mean[k]:,.0f}" for k in names)
              + f" / SB3 {steady_mean['sb3']:,.0f} steps/s = "
              + ", ".join(f"{steady_mean[k] / steady_mean['sb3']:.2f}x" for k in names), flush=True)
    out["load_avg_end"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
