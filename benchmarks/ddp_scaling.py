"""Global env steps/s of PPO CartPole with 1 and 2 CPU DDP ranks (gloo), and the ratio.

Each rank runs 64 envs x 32 steps per iteration and 4 epochs of minibatch SGD; the
2-rank run does twice the env steps per iteration in about the same wall time when the
ranks scale. Each configuration runs in its own process (DDP launches its own workers).

    python benchmarks/ddp_scaling.py [--iterations 30] [--repeats 2]

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = r"""
import json, logging, sys, time, warnings
import torch, pytorch_lightning as pl
from lightning_rl import PPO
logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
devices, iterations = int(sys.argv[1]), int(sys.argv[2])

class Clock(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 1:  # skip the first iterations (process start-up, first rollouts)
            self.start, self.steps = time.perf_counter(), pl_module.global_counters["num_env_steps_sampled"]
    def on_train_end(self, trainer, pl_module):
        steps = pl_module.global_counters["num_env_steps_sampled"] - self.steps
        self.rate = steps / (time.perf_counter() - self.start)

model = PPO(env="CartPole-v1", num_envs=64, rollout_fragment_length=32, num_sgd_iter=4, sgd_minibatch_size=512,
            seed=0, total_env_steps=None, iterations_per_epoch=iterations)
clock = Clock()
kwargs = dict(strategy="ddp", devices=devices) if devices > 1 else dict(devices=1)
trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[clock], **kwargs)
trainer.fit(model)
if trainer.is_global_zero:
    print("RESULT " + json.dumps({"devices": devices, "env_steps_per_s": clock.rate}))
"""


def run(devices: int, iterations: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        # A file, not `python -c`: Lightning's DDP launcher re-runs sys.argv for the other ranks.
        script = os.path.join(tmp, "ddp_scaling_worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        proc = subprocess.run([sys.executable, script, str(devices), str(iterations)], env=env,
                              capture_output=True, text=True, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{devices}-rank run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])["env_steps_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rates: dict[int, list[float]] = {1: [], 2: []}
    start = time.time()
    for _ in range(args.repeats):  # alternate so load changes hit both alike
        for devices in (1, 2):
            rates[devices].append(run(devices, args.iterations))
            print(f"{devices} rank(s): {rates[devices][-1]:,.0f} global env steps/s", flush=True)
    one, two = statistics.mean(rates[1]), statistics.mean(rates[2])
    print(f"\nPPO CartPole, 64 envs x 32 steps per rank, 4 epochs, minibatch 512, gloo on {os.cpu_count()} cores")
    print(f"  1 rank : {one:>10,.0f} env steps/s")
    print(f"  2 ranks: {two:>10,.0f} env steps/s")
    print(f"  scaling: {two / one:.2f}x  (target >= 1.7x)   [{time.time() - start:.0f} s]")
    print(json.dumps({"benchmark": "ddp_scaling", "env_steps_per_s_1_rank": round(one, 1),
                      "env_steps_per_s_2_ranks": round(two, 1), "ratio": round(two / one, 3),
                      "runs_1_rank": [round(r, 1) for r in rates[1]], "runs_2_ranks": [round(r, 1) for r in rates[2]]}))


if __name__ == "__main__":
    main()
