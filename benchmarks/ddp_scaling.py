"""Global env steps/s of PPO CartPole with 1 and 2 CPU DDP ranks (gloo), and the ratio.

Each rank runs 64 envs and 4 epochs of minibatch SGD per iteration, in two shapes: 32-step
rollouts in 4 minibatches of 512, and the PPO-Atari / DD-PPO shape of 128-step rollouts in 4
minibatches of 2048. Every minibatch step is one gradient all-reduce, so the 2-rank run pays
one gloo round trip (about 1-2 ms on a small VM) per step. Rows:

- ``1 rank``: one process;
- ``2 ranks``: DDP with each rank pinned to its own core (``cpu_affinity=True``, the default);
- ``2 ranks, no pinning``: the same with ``cpu_affinity=False``;
- ``2 independent``: two single-rank processes at once, summed: what the machine allows
  two ranks that never communicate (the ceiling of the ratio).

Each configuration runs in its own process (DDP launches its own workers).

    python benchmarks/ddp_scaling.py [--repeats 3] [--compile off,on] [--configs 32,128]

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
devices, iterations, fragment, minibatch, affinity, compile = map(int, sys.argv[1:7])

class Clock(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 1:  # skip the first iterations (process start-up, first rollouts)
            self.start, self.steps = time.perf_counter(), pl_module.global_counters["num_env_steps_sampled"]
    def on_train_end(self, trainer, pl_module):
        steps = pl_module.global_counters["num_env_steps_sampled"] - self.steps
        self.rate = steps / (time.perf_counter() - self.start)

model = PPO(env="CartPole-v1", num_envs=64, rollout_fragment_length=fragment, num_sgd_iter=4,
            sgd_minibatch_size=minibatch, seed=0, total_env_steps=None, iterations_per_epoch=iterations,
            cpu_affinity=bool(affinity), compile=bool(compile))
clock = Clock()
kwargs = dict(strategy="ddp", devices=devices) if devices > 1 else dict(devices=1)
trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[clock], **kwargs)
trainer.fit(model)
if trainer.is_global_zero:
    print("RESULT " + json.dumps({"devices": devices, "env_steps_per_s": clock.rate}))
"""

CONFIGS = {  # name: (rollout_fragment_length, sgd_minibatch_size, iterations)
    "32-step rollouts, minibatch 512": (32, 512, 40),
    "128-step rollouts, minibatch 2048": (128, 2048, 14),
}
ROWS = ("1 rank", "2 ranks", "2 ranks, no pinning", "2 independent")


def launch(script: str, devices: int, iterations: int, fragment: int, minibatch: int,
           affinity: bool, compile: bool) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [str(v) for v in (devices, iterations, fragment, minibatch, int(affinity), int(compile))]
    return subprocess.Popen([sys.executable, script, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen) -> float:
    try:
        out, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"run failed:\n{out[-2000:]}\n{err[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])["env_steps_per_s"]


def run(script: str, row: str, fragment: int, minibatch: int, iterations: int, compile: bool) -> float:
    if row == "2 independent":
        procs = [launch(script, 1, iterations, fragment, minibatch, True, compile) for _ in range(2)]
        return sum(result(p) for p in procs)
    devices = 1 if row == "1 rank" else 2
    return result(launch(script, devices, iterations, fragment, minibatch, row != "2 ranks, no pinning", compile))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", default="off", help="comma-separated: off and/or on (compile=True)")
    parser.add_argument("--configs", default="32,128", help="rollout lengths of the configurations to run")
    args = parser.parse_args()
    start = time.time()
    compiles = [c.strip() == "on" for c in args.compile.split(",") if c.strip()]
    configs = {name: c for name, c in CONFIGS.items() if str(c[0]) in args.configs.split(",")}
    variants = [(name, comp) for name in configs for comp in compiles]
    rates = {(v, r): [] for v in variants for r in ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        # A file, not `python -c`: Lightning's DDP launcher re-runs sys.argv for the other ranks.
        script = os.path.join(tmp, "ddp_scaling_worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        for _ in range(args.repeats):  # interleaved, so load changes hit every row alike
            for variant in variants:
                config, comp = variant
                fragment, minibatch, iterations = CONFIGS[config]
                for row in ROWS:
                    rates[variant, row].append(run(script, row, fragment, minibatch, iterations, comp))
                    print(f"{config:<36} compile={int(comp)} {row:<20} {rates[variant, row][-1]:>9,.0f} env steps/s",
                          flush=True)
    mean = {key: statistics.median(values) for key, values in rates.items()}  # robust to a noisy neighbour
    print(f"\nPPO CartPole, 64 envs per rank, 4 epochs of 4 minibatches, gloo on {os.cpu_count()} cores "
          f"(median global env steps/s, ratio to 1 rank, fraction of the 2-independent ceiling)")
    figures = {}
    for variant in variants:
        config, comp = variant
        one, ceiling = mean[variant, "1 rank"], mean[variant, "2 independent"]
        print(f"  {config}, compile={comp}")
        for row in ROWS:
            print(f"    {row:<20} {mean[variant, row]:>9,.0f}   {mean[variant, row] / one:.2f}x   "
                  f"{mean[variant, row] / ceiling:.2f} of the ceiling")
        figures[f"{config}, compile={comp}"] = {
            row: {"env_steps_per_s": round(mean[variant, row], 1), "ratio": round(mean[variant, row] / one, 3),
                  "of_ceiling": round(mean[variant, row] / ceiling, 3),
                  "runs": [round(r, 1) for r in rates[variant, row]]} for row in ROWS}
    print(f"  target: 2 ranks >= 0.9 of the ceiling   [{time.time() - start:.0f} s]")
    print(json.dumps({"benchmark": "ddp_scaling", "configs": figures}))


if __name__ == "__main__":
    main()
