"""PPO with the learner on a GPU against the CPU: env steps/s of both.

Sampling stays on ``sampling_device="cpu"`` (a CPU copy of the policy, refreshed after each
iteration); the policy batch moves to the GPU once per iteration. Prints both rates, the
ratio, and, as the last line, one JSON object. Without a GPU it says so and measures the
CPU only. Nothing in the test suite depends on a GPU.

    python benchmarks/gpu_check.py [--iterations 40]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings

import pytorch_lightning as pl
import torch

from lightning_rl import PPO

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

CONFIGS = {
    # rl-zoo CartPole settings, and a large-batch setting where a GPU learner can pay off.
    "cartpole_rlzoo": dict(num_envs=8, rollout_fragment_length=32, num_sgd_iter=20, sgd_minibatch_size=256),
    "cartpole_large": dict(num_envs=64, rollout_fragment_length=128, num_sgd_iter=4, sgd_minibatch_size=4096,
                           hiddens=(256, 256)),
}


class Clock(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 2:
            self.start, self.steps = time.perf_counter(), pl_module.counters["num_env_steps_sampled"]

    def on_train_end(self, trainer, pl_module):
        steps = pl_module.counters["num_env_steps_sampled"] - self.steps
        self.rate = steps / (time.perf_counter() - self.start)


def measure(accelerator: str, config: dict, iterations: int) -> tuple[float, float]:
    model = PPO(env="CartPole-v1", seed=0, total_env_steps=None, iterations_per_epoch=iterations, **config)
    clock = Clock()
    trainer = pl.Trainer(accelerator=accelerator, devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[clock])
    trainer.fit(model)
    return clock.rate, float(trainer.callback_metrics.get("rollout/episode_return_mean", float("nan")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=40)
    args = parser.parse_args()
    has_gpu = torch.cuda.is_available()
    print(f"GPU: {torch.cuda.get_device_name(0) if has_gpu else 'none (CPU figures only)'}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    results: dict = {"benchmark": "gpu_check", "gpu": torch.cuda.get_device_name(0) if has_gpu else None}
    for name, config in CONFIGS.items():
        cpu_rate, cpu_ret = measure("cpu", config, args.iterations)
        row = {"cpu_env_steps_per_s": round(cpu_rate, 1), "cpu_return": round(cpu_ret, 1)}
        line = f"{name:16s} cpu {cpu_rate:>10,.0f} env steps/s"
        if has_gpu:
            gpu_rate, gpu_ret = measure("gpu", config, args.iterations)
            row.update(gpu_env_steps_per_s=round(gpu_rate, 1), gpu_return=round(gpu_ret, 1),
                       gpu_over_cpu=round(gpu_rate / cpu_rate, 3))
            line += f"   gpu {gpu_rate:>10,.0f} env steps/s   gpu/cpu {gpu_rate / cpu_rate:.2f}x"
        print(line, flush=True)
        results[name] = row
    print(json.dumps(results))


if __name__ == "__main__":
    main()
