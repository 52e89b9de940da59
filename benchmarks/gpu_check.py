"""GPU learner against the CPU: env steps/s of PPO, DQN and SAC, eager and compiled.

Rows per configuration (each a fresh fit of ``--iterations`` iterations; the rate skips the
first three, so compile time and start-up are not in it):

* ``cpu`` / ``cpu+c``: learner and sampling on the CPU, ``compile`` off / on;
* ``gpu`` / ``gpu+c``: the learner on the GPU, sampling on the CPU (``sampling_device="cpu"``:
  a CPU copy of the policy refreshed once per iteration; the batch moves to the GPU once per
  iteration); ``+c`` compiles the update (mode ``reduce-overhead``: CUDA graphs where possible);
* ``gpu, sampling on gpu``: ``sampling_device="cuda"`` (the policy acts on the GPU and its
  action-sampling generator lives there), eager.

Also checks, on the GPU, that a compiled run and an eager run of the same seed end with
parameters equal up to float tolerance, and that a ``sampling_device="cuda"`` run is
reproducible under its seed. Without a GPU it says so and measures the CPU rows only. Nothing
in the test suite depends on a GPU. The last line printed is one JSON object.

    python benchmarks/gpu_check.py [--iterations 40] [--algos ppo,dqn,sac]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings

import pytorch_lightning as pl
import torch

from lightning_rl import DQN, PPO, SAC

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

CONFIGS = {
    # rl-zoo CartPole settings, a large-batch PPO where a GPU learner can pay off, and the
    # rl-zoo DQN/SAC networks (256x256) with several gradient steps per iteration.
    "ppo_cartpole_rlzoo": (PPO, dict(env="CartPole-v1", num_envs=8, rollout_fragment_length=32, num_sgd_iter=20,
                                     sgd_minibatch_size=256)),
    "ppo_cartpole_large": (PPO, dict(env="CartPole-v1", num_envs=64, rollout_fragment_length=128, num_sgd_iter=4,
                                     sgd_minibatch_size=4096, hiddens=(256, 256))),
    "dqn_cartpole": (DQN, dict(env="CartPole-v1", learning_starts=256, train_freq=256, num_gradient_steps=128,
                               train_batch_size=64, double_q=False, dueling=False, n_step=1)),
    "sac_pendulum": (SAC, dict(env="Pendulum-v1", learning_starts=256, train_freq=64, num_gradient_steps=64,
                               train_batch_size=256)),
}


class Clock(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 2:
            self.start, self.steps = time.perf_counter(), pl_module.counters["num_env_steps_sampled"]

    def on_train_end(self, trainer, pl_module):
        steps = pl_module.counters["num_env_steps_sampled"] - self.steps
        self.rate = steps / (time.perf_counter() - self.start)


def fit(config: str, accelerator: str, iterations: int, **kwargs) -> tuple[float, torch.nn.Module]:
    cls, settings = CONFIGS[config]
    model = cls(**settings, seed=0, total_env_steps=None, iterations_per_epoch=iterations, **kwargs)
    clock = Clock()
    trainer = pl.Trainer(accelerator=accelerator, devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[clock])
    trainer.fit(model)
    return clock.rate, model


def params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().cpu().flatten() for p in model.parameters()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--algos", default="ppo,dqn,sac")
    args = parser.parse_args()
    has_gpu = torch.cuda.is_available()
    print(f"GPU: {torch.cuda.get_device_name(0) if has_gpu else 'none (CPU rows only)'}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    results: dict = {"benchmark": "gpu_check", "gpu": torch.cuda.get_device_name(0) if has_gpu else None}
    algos = args.algos.split(",")
    for name in CONFIGS:
        if not any(name.startswith(a) for a in algos):
            continue
        rows: dict = {}
        rows["cpu"], _ = fit(name, "cpu", args.iterations)
        rows["cpu+c"], _ = fit(name, "cpu", args.iterations, compile=True)
        if has_gpu:
            rows["gpu"], eager = fit(name, "gpu", args.iterations)
            rows["gpu+c"], compiled = fit(name, "gpu", args.iterations, compile=True)
            rows["gpu, sampling on gpu"], on_gpu = fit(name, "gpu", args.iterations, sampling_device="cuda")
            _, on_gpu_again = fit(name, "gpu", args.iterations, sampling_device="cuda")
            diff = (params(eager) - params(compiled)).abs().max().item()
            results[f"{name}_checks"] = {
                "compiled_vs_eager_max_abs_diff": diff,
                "sampling_on_gpu_reproducible": bool(torch.equal(params(on_gpu), params(on_gpu_again))),
                "compiled_steps": {k: s.compiled for k, s in compiled._update_steps.items()},
            }
        base = rows["cpu"]
        print(f"{name}: " + "   ".join(f"{k} {v:,.0f} env steps/s ({v / base:.2f}x)" for k, v in rows.items()),
              flush=True)
        if has_gpu:
            print(f"  checks: {results[f'{name}_checks']}", flush=True)
        results[name] = {k: round(v, 1) for k, v in rows.items()}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
