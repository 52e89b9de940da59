"""Async sampling: env steps/s on CartPole-v1 with 0, 1 and 2 sampler workers, and the policy lag
(IMPALA by default; APPO, APEX and A3C with ``--algo``).

Each run fits ``IMPALA`` (or ``APPO``) for ``--steps`` env steps with ``num_workers`` sampler
processes of ``--num-envs`` envs each (0: the synchronous baseline, sampling in the learner
process with the same envs per fragment), one torch thread per process, alternating the
worker counts within each repeat. Reported per worker count: median env steps/s over
``--repeats`` (fit time, process start-up included), its ratio to the 0-worker run, the policy
lag of the batches trained on (learner iterations since the weights that sampled each
fragment, or, for A3C, that computed each gradient: mean and max), the learner's wait for data
(ms per iteration), the rows trained on per second (APEX: replayed rows) and the greedy return
after the run (10 episodes). APEX's learner is the bottleneck (32 gradient steps of 64 rows per
128 inserted env steps): its env steps/s is what its learner consumes.

The issue's target on this 2-core machine: 2 workers >= 1.5x the 0-worker run. The anchor:
RLlib 2.60's APPO on CartPole with 2 env runners x 4 envs (its tuned example) ran 2,339 env
steps/s on this kind of machine and reached a mean return of 254 after 328k steps.

Usage::

    python benchmarks/async.py                          # IMPALA, 0/1/2 workers, 200k steps, 2 repeats
    python benchmarks/async.py --algo APPO --steps 500000 --repeats 1
    python benchmarks/async.py --algo APEX --steps 20000
    python benchmarks/async.py --algo A3C --num-envs 8
    python benchmarks/async.py --env ALE/Breakout-v5 --workers 0,2 --steps 8000 --repeats 1
    python benchmarks/async.py --backend ray --workers 0,2 --steps 100000 --repeats 2
    python benchmarks/async.py --backend ray --env ALE/Breakout-v5 --workers 0,2 --steps 8000 --repeats 1
    python benchmarks/async.py --ingest --env ALE/Breakout-v5
    python benchmarks/async.py --env ALE/Breakout-v5 --workers 0,2 --steps 8000 --precision bf16-mixed

``--precision bf16-mixed`` runs the learner under bfloat16 autocast (the workers act in float32);
``--vectorization envpool`` steps every worker's envs with envpool; ``--learner-threads N`` gives
the learner process N torch threads (``num_cpu_threads``) in every run, 0 workers included (each
sampler worker keeps one); ``--compile`` runs the learner's update as compiled graphs
(``compile=True``): its compilation falls in the first update, while workers fill the learner
queue ahead of it, so the rate over the second half of the run (``second_half_steps_per_s``: from
the first training step that ends with half the env steps sampled; in each run's line and the
JSON, with ``after_first_update_steps_per_s``) is the one to compare.

``--backend ray`` runs every worker count above 0 twice, with worker processes and with Ray actors
(``sampler_backend="ray"``) on a local Ray started once before the runs (``ray.init(num_cpus=<cores>)``,
not counted in the fit time; actor start-up is). Each row also reports the steady rate, env steps/s
from the first training batch to the end of fit, and the start-up (seconds from ``fit`` to the first
batch: a Ray actor imports torch and the package in a fresh process, a forked worker does not). The
issue's target: 2 Ray workers >= 0.8x 2 worker processes and >= 1.3x 0 workers.

``--ingest`` measures what the learner pays per fragment, without envs: each worker returns the
same fragment of the env's shape (IMPALA's fragment for that env) as fast as it can, through the
backend's own path (``RayPool.receive``: ``ray.wait``, ``ray.get``, the copy into the learner's
tensors; ``ProcessPool.receive``: the slot copied out), and the learner's CPU time per fragment
(``time.thread_time`` of the receiving thread) and its fragments/s are reported with the fragment's
bytes: the bytes/s one learner ingests and how many actors of a measured speed it can absorb.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
import warnings
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch._dynamo

from lightning_rl import A3C, APEX, APPO, IMPALA, evaluate
from lightning_rl.data.settings import EnvSettings


class Lag(pl.Callback):
    """Policy lag of every batch trained on, and the learner's wait for it."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.lag_max = 0.0
        self.waits: list[float] = []
        self.first: tuple[float, int] | None = None  # (time, env steps sampled) when the first batch arrived
        self.threads = 0  # the learner's torch threads during fit
        self.updated: tuple[float, int] | None = None  # (time, env steps sampled) after the first training step
        self.ends: list[tuple[float, int]] = []  # (time, env steps sampled) after every training step

    def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
        if self.first is None:
            self.first = (time.perf_counter(), int(module.counters["num_env_steps_sampled"]))
            self.threads = torch.get_num_threads()
        perf = batch.info.get("perf", {})
        self.lags.append(perf.get("policy_lag_mean", 0.0))
        self.lag_max = max(self.lag_max, perf.get("policy_lag_max", 0.0))
        self.waits.append(perf.get("learner_wait_ms", 0.0))

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, *args: Any) -> None:
        self.ends.append((time.perf_counter(), int(module.counters["num_env_steps_sampled"])))
        if self.updated is None:
            self.updated = self.ends[0]

    def second_half(self, sampled: int, end: float) -> float:
        """Env steps/s from the first training step that ends with half the run sampled: past a
        compilation and with a learner queue that filled meanwhile drained to its steady level."""
        start = next(((t, n) for t, n in self.ends if n >= sampled / 2), self.ends[-1])
        return (sampled - start[1]) / max(end - start[0], 1e-9)


def settings(algo: type, env: str, num_envs: int) -> dict[str, Any]:
    # an ALE id: impala_atari.yaml's network (IMPALA's CNN shared by both heads) and fragments
    pixels = dict(encoder="impala_cnn", hiddens=(), vf_share_layers=True) if env.startswith("ALE/") else {}
    if algo in (IMPALA, APPO):
        length = 20 if pixels else 50
        return dict(env=env, num_envs=num_envs, rollout_fragment_length=length, train_batch_size=10 * length,
                    iterations_per_epoch=50, **pixels)
    return dict(env=env, num_envs=num_envs, **pixels)  # their defaults (APEX: 16-step fragments; A3C: 5-step ones)


def run(algo: type, workers: int, steps: int, num_envs: int, seed: int, env: str = "CartPole-v1",
        backend: str = "processes", precision: str = "32-true", vectorization: str = "auto",
        learner_threads: int = 1, compile: bool = False) -> dict[str, Any]:
    pixels = env.startswith("ALE/")
    model = algo(**settings(algo, env, num_envs), num_workers=workers, total_env_steps=steps, seed=seed,
                 sampler_backend=backend if workers else "processes", vectorization=vectorization,
                 num_cpu_threads=learner_threads, compile=compile)
    lag = Lag()
    torch._dynamo.utils.counters.clear()
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[lag], precision=precision)
    start = time.perf_counter()
    trainer.fit(model)
    end = time.perf_counter()
    seconds = end - start
    sampled = model.counters["num_env_steps_sampled"]
    steady = (sampled - lag.first[1]) / (end - lag.first[0])  # from the first batch on: start-up left out
    updated = (sampled - lag.updated[1]) / (end - lag.updated[0])  # from the first update's end: its compilation too
    return {
        "workers": workers, "backend": backend if workers else "-", "seed": seed, "env_steps": sampled,
        "fit_s": seconds, "steps_per_s": sampled / seconds, "steady_steps_per_s": steady,
        "after_first_update_steps_per_s": updated, "second_half_steps_per_s": lag.second_half(sampled, end),
        "compiled_graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "start_s": lag.first[0] - start,
        "trained_per_s": model.counters["num_env_steps_trained"] / seconds,
        "lag_mean": float(np.mean(lag.lags)), "lag_max": int(lag.lag_max),
        "learner_wait_ms": float(np.mean(lag.waits)), "learner_threads": lag.threads,
        "greedy": float(np.mean(evaluate(model, num_episodes=2 if pixels else 10, seed=seed + 10_000))),
    }


class ReplayedFragment:
    """A sampler that returns one fixed fragment at once (``--ingest``: no env, only transport)."""

    def __init__(self, columns: dict[str, torch.Tensor], seed: int | None = None) -> None:
        self.columns = columns

    def fragment(self, acting: Any, length: int) -> Any:
        from lightning_rl.batch import SampleBatch

        return SampleBatch(dict(self.columns))

    def episode_info(self) -> dict[str, list]:
        return {"episode_returns": [], "episode_lengths": []}

    def close(self, terminate: bool = False) -> None:
        pass


def ingest(env: str, num_envs: int, workers: int, seconds: float) -> dict[str, Any]:
    """The learner's cost per fragment of ``env``'s IMPALA shape, per backend (see the module docstring)."""
    import functools

    from lightning_rl.data.async_sampling import _cpu_copy
    from lightning_rl.data.rollout import RolloutDataModule
    from lightning_rl.data.workers import PoolSpec
    from lightning_rl.data.workers.processes import ProcessPool
    from lightning_rl.data.workers.ray_actors import RayPool
    from lightning_rl.data.workers.task import FragmentTask, _fragment_columns

    s = settings(IMPALA, env, num_envs)
    model = IMPALA(**s, num_workers=0, seed=0)
    policy = _cpu_copy(model.policies["default_policy"])
    dm = RolloutDataModule(EnvSettings(env, num_envs=num_envs, vectorization="sync", seed=0, iterations_per_epoch=1),
                           s["rollout_fragment_length"])
    dm.connect(model)
    columns = _fragment_columns(policy, dm)
    fragment = {k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in columns.items()}
    nbytes = sum(t.numel() * t.element_size() for t in fragment.values())
    results = {}
    for backend, pool_class in (("processes", ProcessPool), ("ray", RayPool)):
        spec = PoolSpec(num_workers=workers, make_sampler=functools.partial(ReplayedFragment, fragment),
                        length=s["rollout_fragment_length"], policy=policy, tasks=[FragmentTask()] * workers,
                        seed=lambda i, r: i, columns=columns, credits=1 + 16 // workers, hold=False,
                        restart_failed_workers=False, timeout_s=60.0, on_restart=lambda: None)
        pool = pool_class(spec)
        pool.start(policy, 0)
        try:
            pool.receive(64, 30.0)  # warm
            count, cpu = 0, 0.0
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                t0 = time.thread_time()
                count += len(pool.receive(64, 1.0))
                cpu += time.thread_time() - t0
            wall = time.perf_counter() - start
        finally:
            pool.close()
        results[backend] = {"fragments_per_s": count / wall, "learner_cpu_ms_per_fragment": 1000 * cpu / count,
                            "mb_per_s": count * nbytes / wall / 1e6}
    return {"env": env, "fragment_bytes": nbytes, "columns": {k: [list(v[0]), str(v[1])] for k, v in columns.items()},
            "workers": workers, **results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=["IMPALA", "APPO", "APEX", "A3C"], default="IMPALA")
    p.add_argument("--workers", default="0,1,2", help="comma-separated worker counts (default 0,1,2)")
    p.add_argument("--steps", type=int, default=200_000, help="env steps per run (default 200k)")
    p.add_argument("--num-envs", type=int, default=4, help="envs per worker (default 4)")
    p.add_argument("--repeats", type=int, default=2, help="runs per worker count, seeds 0.. (default 2)")
    p.add_argument("--env", default="CartPole-v1", help="an env id; an ALE id gets IMPALA's CNN (default CartPole-v1)")
    p.add_argument("--backend", choices=["processes", "ray"], default="processes",
                   help="ray: every worker count above 0 with worker processes and with Ray actors")
    p.add_argument("--precision", choices=["32-true", "bf16-mixed"], default="32-true",
                   help="the learner's Trainer precision (default 32-true)")
    p.add_argument("--vectorization", default="auto", help="the envs' vector backend (auto, sync, envpool...)")
    p.add_argument("--compile", action="store_true", help="the learner's update as compiled graphs (compile=True)")
    p.add_argument("--learner-threads", type=int, default=1,
                   help="the learner's torch threads (num_cpu_threads) in every run; the workers keep one (default 1)")
    p.add_argument("--ingest", action="store_true", help="the learner's cost per fragment, per backend (no envs)")
    p.add_argument("--ingest-seconds", type=float, default=10.0, help="seconds of each --ingest measurement")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if args.backend == "ray" or args.ingest:
        import ray

        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        if args.ingest:
            return report_ingest(ingest(args.env, args.num_envs, 2, args.ingest_seconds), load)
        return compare(args, load)
    finally:
        if args.backend == "ray" or args.ingest:
            ray.shutdown()


def report_ingest(r: dict[str, Any], load: float) -> int:
    print(f"\nIngest, IMPALA's {r['env']} fragment ({r['fragment_bytes']:,} bytes), {r['workers']} workers returning "
          f"it at once; load average {load:.2f} at the start")
    print("| backend | fragments/s | learner CPU ms per fragment | MB/s ingested |")
    print("|---|---|---|---|")
    for backend in ("processes", "ray"):
        b = r[backend]
        print(f"| {backend} | {b['fragments_per_s']:,.0f} | {b['learner_cpu_ms_per_fragment']:.2f} | "
              f"{b['mb_per_s']:,.1f} |")
    print(json.dumps({"benchmark": "async_ingest", **r, "load": load}))
    return 0


def compare(args: argparse.Namespace, load: float) -> int:
    algo = {"IMPALA": IMPALA, "APPO": APPO, "APEX": APEX, "A3C": A3C}[args.algo]
    counts = [int(w) for w in args.workers.split(",")]
    backends = ["processes", "ray"] if args.backend == "ray" else ["processes"]
    configs = [(w, b) for w in counts for b in (backends if w else ["-"])]
    runs = []
    for seed in range(args.repeats):
        for workers, backend in configs:
            r = run(algo, workers, args.steps, args.num_envs, seed, args.env, backend, args.precision,
                    args.vectorization, args.learner_threads, args.compile)
            runs.append(r)
            print(f"[{args.algo} workers={workers} {backend} seed={seed}] {r['env_steps']:,} steps in "
                  f"{r['fit_s']:.1f}s = {r['steps_per_s']:,.0f} steps/s ({r['steady_steps_per_s']:,.0f} from the first "
                  f"batch, {r['start_s']:.1f}s to it; {r['after_first_update_steps_per_s']:,.0f} after the first "
                  f"update; {r['second_half_steps_per_s']:,.0f} over the second half), "
                  f"{r['trained_per_s']:,.0f} trained rows/s; "
                  f"policy lag mean {r['lag_mean']:.2f} max {r['lag_max']}; "
                  f"learner wait {r['learner_wait_ms']:.1f} ms/iter; greedy {r['greedy']:.0f}", flush=True)

    def median_speed(workers: int, backend: str, key: str = "steps_per_s") -> float:
        return statistics.median(r[key] for r in runs if (r["workers"], r["backend"]) == (workers, backend))

    base = median_speed(*configs[0])
    steady_base = median_speed(*configs[0], key="steady_steps_per_s")
    updated_base = median_speed(*configs[0], key="after_first_update_steps_per_s")
    half_base = median_speed(*configs[0], key="second_half_steps_per_s")
    print(f"\n{args.algo} {args.env}, {args.steps:,} env steps, {args.num_envs} envs per worker; medians of "
          f"{args.repeats}; load average {load:.2f} at the start")
    print("| workers | backend | env steps/s (fit) | vs first row | vs processes | steady env steps/s | vs first row "
          "| vs processes | start-up s | policy lag mean / max | learner wait ms/iter | greedy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for workers, backend in configs:
        mine = [r for r in runs if (r["workers"], r["backend"]) == (workers, backend)]
        speed = median_speed(workers, backend)
        steady = median_speed(workers, backend, "steady_steps_per_s")
        updated = median_speed(workers, backend, "after_first_update_steps_per_s")
        half = median_speed(workers, backend, "second_half_steps_per_s")
        ray_row = backend == "ray"
        vs_processes = speed / median_speed(workers, "processes") if ray_row else None
        steady_vs = steady / median_speed(workers, "processes", "steady_steps_per_s") if ray_row else None
        summary[f"{workers} {backend}"] = {"steps_per_s": speed, "ratio": speed / base, "vs_processes": vs_processes,
                                           "steady_steps_per_s": steady, "steady_ratio": steady / steady_base,
                                           "steady_vs_processes": steady_vs,
                                           "after_first_update_steps_per_s": updated,
                                           "after_first_update_ratio": updated / updated_base,
                                           "second_half_steps_per_s": half, "second_half_ratio": half / half_base}
        print(f"| {workers} | {backend} | {speed:,.0f} | {speed / base:.2f}x | "
              f"{'' if vs_processes is None else f'{vs_processes:.2f}x'} | {steady:,.0f} | "
              f"{steady / steady_base:.2f}x | "
              f"{'' if steady_vs is None else f'{steady_vs:.2f}x'} | "
              f"{statistics.median(r['start_s'] for r in mine):.1f} | "
              f"{statistics.fmean(r['lag_mean'] for r in mine):.2f} / {max(r['lag_max'] for r in mine)} | "
              f"{statistics.fmean(r['learner_wait_ms'] for r in mine):.1f} | "
              f"{statistics.fmean(r['greedy'] for r in mine):.0f} |")
    print(json.dumps({"benchmark": "async", "algo": args.algo, "env": args.env, "steps": args.steps,
                      "num_envs": args.num_envs, "backend": args.backend, "precision": args.precision,
                      "vectorization": args.vectorization, "learner_threads": args.learner_threads,
                      "compile": args.compile, "load": load,
                      "summary": summary, "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
