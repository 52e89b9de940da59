"""Microseconds per update step, eager against ``compile=True``, for each algorithm.

One "update" is what the learner does per minibatch: PPO/A2C one ``UpdateStep`` on a minibatch
(loss, backward, DDP sync (none here), norm clipping, optimizer step); DQN one ``update`` (TD
loss with the target network, Adam step); SAC one ``update`` (temperature, critic and actor
steps). Networks and minibatch sizes are those of the rl-zoo settings in ``compare_sb3.py``:

* ``ppo``: two 64-unit tanh MLPs (CartPole), 256 rows, Adam (fused in eager), clip 0.5;
* ``a2c``: the same networks, 40 rows (8 envs x 5 steps), RMSprop, clip 0.5;
* ``dqn``: 256x256 ReLU Q-network (CartPole), 64 rows, Adam, clip 10;
* ``sac``: 256x256 ReLU actor and twin critics (Pendulum), 256 rows, three Adam steps.

The update runs inside a real ``Trainer.fit`` (Lightning's optimizer wrappers and hooks as in
training) on one torch thread, with random minibatches of the right shapes; the compiled step is
compiled (and warmed up) before timing. Each cell is the median over ``--repeats`` timings of
``--calls`` consecutive updates. Compile time (the first call, with inductor's on-disk cache as
it is) is printed too. The last stdout line is one JSON object.

    python benchmarks/update_step.py [--algos ppo,a2c,dqn,sac,atari_ppo] [--calls 200] [--repeats 5]
        [--device cuda]

``atari_ppo`` is benchmarks/atari.py's PPO update (Nature CNN, 256 frame stacks; needs ale-py).
``--device cuda`` runs the learner on the GPU, where the compiled step runs in inductor's
``reduce-overhead`` mode; the ``cudagraph skips`` column counts the "skipping cudagraphs due to
..." lines inductor logged for it (0: replayed as CUDA graphs).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch

from lightning_rl import A2C, DQN, PPO, SAC
from lightning_rl.batch import DEFAULT_POLICY_ID as PID
from lightning_rl.batch import SampleBatch, shuffled_rows
from lightning_rl.update import policy_loss

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

SETTINGS = {
    "ppo": (PPO, dict(num_envs=8, rollout_fragment_length=32, num_sgd_iter=20, sgd_minibatch_size=256, lr=1e-3)),
    "a2c": (A2C, dict(num_envs=8, rollout_fragment_length=5)),
    "dqn": (DQN, dict(lr=2.3e-3, train_batch_size=64, double_q=False, dueling=False, n_step=1, hiddens=(256, 256),
                      learning_starts=0, train_freq=256, num_gradient_steps=128)),
    "sac": (SAC, dict(env="Pendulum-v1", train_batch_size=256, learning_starts=0)),
    # benchmarks/atari.py's PPO: the Nature CNN shared by both heads, minibatches of 256 frame stacks
    "atari_ppo": (PPO, dict(env="ALE/Breakout-v5", num_envs=8, rollout_fragment_length=128, num_sgd_iter=4,
                            sgd_minibatch_size=256, lr=2.5e-4, clip_param=0.1, entropy_coeff=0.01, grad_clip=0.5,
                            hiddens=(), vf_share_layers=True, encoder="nature_cnn")),
}


def observations(model: Any, rows: int, generator: torch.Generator) -> torch.Tensor:
    space = model.observation_space
    if space.dtype == "uint8":  # frames
        return torch.randint(0, 256, (rows, *space.shape), dtype=torch.uint8, generator=generator)
    return torch.randn(rows, *space.shape, generator=generator)


def minibatch(model: Any, algo: str, generator: torch.Generator) -> SampleBatch:
    obs_dim = model.observation_space.shape[0]
    if algo in ("ppo", "a2c", "atari_ppo"):
        rows = model.train_batch_size // model.num_minibatches
        obs = observations(model, rows, generator)
        with torch.no_grad():
            out = model.policy.compute_actions(obs, generator=generator)
        batch = SampleBatch({SampleBatch.OBS: obs, SampleBatch.ACTIONS: out[SampleBatch.ACTIONS],
                             SampleBatch.ACTION_LOGP: out[SampleBatch.ACTION_LOGP],
                             SampleBatch.VF_PREDS: out[SampleBatch.VF_PREDS],
                             SampleBatch.ADVANTAGES: torch.randn(rows, generator=generator),
                             SampleBatch.VALUE_TARGETS: torch.randn(rows, generator=generator)})
        # one minibatch as the learner cuts it (padded, with its mask, where compiled)
        return next(shuffled_rows(batch, 1, rows, generator, model.device, pad=model.compile))
    rows = model.train_batch_size
    if algo == "dqn":
        actions = torch.randint(model.action_space.n, (rows,), generator=generator)
    else:
        actions = torch.rand(rows, model.action_space.shape[0], generator=generator) * 4 - 2
    return SampleBatch({k: v.to(model.device) for k, v in {
        SampleBatch.OBS: torch.randn(rows, obs_dim, generator=generator),
        SampleBatch.NEXT_OBS: torch.randn(rows, obs_dim, generator=generator),
        SampleBatch.ACTIONS: actions, SampleBatch.REWARDS: torch.randn(rows, generator=generator),
        SampleBatch.TERMINATEDS: torch.zeros(rows, dtype=torch.bool),
        SampleBatch.DISCOUNTS: torch.full((rows,), 0.99), SampleBatch.WEIGHTS: torch.ones(rows),
    }.items()})


def one_update(model: Any, algo: str, batch: SampleBatch) -> Callable[[], Any]:
    if algo in ("ppo", "a2c", "atari_ppo"):
        step = model.update_step(f"loss/{PID}", dict(model.policy.named_parameters()), model.policy_optimizer(PID),
                                 policy_loss(model.loss, PID), model.grad_clip)
        scalars = model.loss_scalars(PID)
        return lambda: step(batch, scalars)
    return lambda: model.update(PID, batch)


class Bench(pl.Callback):
    """Times the updates at the start of training (the fit then runs one iteration)."""

    def __init__(self, algo: str, calls: int, repeats: int) -> None:
        self.algo, self.calls, self.repeats = algo, calls, repeats
        self.result: dict[str, float] = {}

    def on_train_start(self, trainer: pl.Trainer, model: Any) -> None:
        batch = minibatch(model, self.algo, torch.Generator().manual_seed(0))
        update = one_update(model, self.algo, batch)
        cuda = model.device.type == "cuda"
        skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
        start = time.perf_counter()
        update()  # compiles, when compiled
        if cuda:
            torch.cuda.synchronize()
        self.result["first_call_s"] = time.perf_counter() - start
        for _ in range(20):
            update()
        times = []
        for _ in range(self.repeats):
            start = time.perf_counter()
            for _ in range(self.calls):
                update()
            if cuda:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) / self.calls * 1e6)
        # inductor counts each "skipping cudagraphs due to ..." it logs (0 where CUDA graphs captured it)
        self.result["cudagraph_skips"] = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] - skips
        self.result["us"] = statistics.median(times)
        self.result["compiled"] = all(s.compiled for s in model._update_steps.values())
        trainer.should_stop = True


def measure(algo: str, compile: bool, calls: int, repeats: int, device: str = "cpu") -> dict[str, float]:
    cls, settings = SETTINGS[algo]
    model = cls(**settings, seed=0, compile=compile, num_cpu_threads=1)
    bench = Bench(algo, calls, repeats)
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[bench],
                         accelerator="gpu" if device == "cuda" else "cpu", devices=1,
                         max_epochs=1, limit_train_batches=1)
    trainer.fit(model)
    return bench.result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algos", default="ppo,a2c,dqn,sac")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="the learner's device")
    args = p.parse_args()
    rows = {}
    print(f"torch {torch.__version__}, 1 thread, {args.device}; µs per update (median of {args.repeats} x "
          f"{args.calls} calls)")
    print("| algorithm | eager µs | compiled µs | speed-up | compile s (first call) | cudagraph skips |")
    print("|---|---|---|---|---|---|")
    for algo in args.algos.split(","):
        eager = measure(algo, False, args.calls, args.repeats, args.device)
        compiled = measure(algo, True, args.calls, args.repeats, args.device)
        rows[algo] = {"eager_us": eager["us"], "compiled_us": compiled["us"], "speedup": eager["us"] / compiled["us"],
                      "compile_s": compiled["first_call_s"], "compiled": compiled["compiled"],
                      "cudagraph_skips": compiled["cudagraph_skips"], "device": args.device}
        note = "" if compiled["compiled"] else " (fell back to eager)"
        print(f"| {algo} | {eager['us']:.0f} | {compiled['us']:.0f}{note} | {rows[algo]['speedup']:.2f}x | "
              f"{compiled['first_call_s']:.1f} | {compiled['cudagraph_skips']} |", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
