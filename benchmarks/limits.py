"""Know the limit: how fast each algorithm's standard setting could run, piece by piece, and how
close ``Trainer.fit`` gets (issue 36, item 1).

For each setting of ``compare_sb3.py`` (PPO, A2C and plain DQN on CartPole-v1, SAC on
Pendulum-v1; ``--atari`` adds PPO on Breakout with the Nature CNN, 8 envs x 128 steps, 4 epochs of
4 minibatches of 256, as ``atari.py`` runs it) this measures, in one process on one torch thread,
each piece of an iteration apart, with the real objects: the algorithm built by
``compare_sb3.build_ours`` and a short "probe" fit whose callback, once the fit is in its steady
state (two iterations, for DQN and SAC two past ``learning_starts``), times on the live module and
DataModule:

* (a) ``env``: ``EnvSampler.step`` (data/samplers/engine.py: the env step, action clipping and the
  finite checks) with random actions on a vector env built as the DataModule builds its own
  (``EnvSampler(env_spec, num_envs, vectorization, ...)``, ``make_vector_env``), for the row's
  ``vectorization``;
* (b) ``act``: acting alone, env stubbed out. On-policy, ``EnvSampler.fragment`` of the row's
  fragment length on an ``EnvSampler`` whose ``step`` returns a canned result: the policy's
  ``compute_actions`` under ``torch.inference_mode`` and eval mode, the numpy -> torch copy of
  each step's observation into the fragment, the column writes, ``actions.cpu().numpy()`` and
  the fragment's clones. Off-policy, what ``ReplayDataModule.sample`` does per env step to act:
  ``policy.act(torch.tensor(obs))`` then ``.cpu().numpy()``. The forward alone
  (``ExploringPolicy.act`` on a ready tensor) is reported beside it (``fwd``);
* (c) ``update``: one iteration's worth of the algorithm's update on minibatches of the real
  shape cut from the live batch: PPO and A2C the module's own ``UpdateStep`` (update.py),
  ``num_sgd_iter`` x minibatches calls (PPO 20 x 256 rows, A2C 1 x 40 rows, Atari 16 x 256);
  DQN and SAC ``module.update`` per gradient step (DQN 128 x 64 rows; SAC 1 x 256 per env step,
  its three ``UpdateStep``s and the noise draws), eager and ``compile=True`` (``--compile``).

Then (d) runs the whole fit as ``compare_sb3.py`` runs it (same constructor, same Trainer flags,
its solve-tracking callback) and times it, with two differences. Under ``--steps-scale`` the fits
log as often per iteration as the unscaled run would (``log_every_n_steps`` set to what
``LogCadence`` picks for compare_sb3's budget, every ``iterations // 100``: A2C every 125, PPO
every 3), since a ``self.log`` costs more than a small iteration and ``LogCadence`` would log 100
to 200 times in any fit, however short (``--log-cadence scaled`` lets it). And the fit times its
own pieces (``Stopwatch``: the instances' methods wrapped, a few perf_counter calls per
iteration), so that its time splits into the same pieces under the same machine load: ``env``
(the sampler's ``step``), ``act`` (on-policy ``fragment`` minus ``env``; off-policy ``sample``
minus ``env`` and the replay's ``add``), ``upd`` (the ``UpdateStep`` calls; off-policy
``module.update``), ``smp+`` (on-policy ``sample`` minus ``fragment``: the exploring policy,
episode statistics; off-policy the replay's ``add``), ``lrn+`` (``training_step``'s
``learn_time_s`` minus ``upd``: GAE and post-processing, minibatch selection, learner info,
counters) and ``loop`` (the rest: Lightning's loop, hooks and batch transfer, callbacks and
logging, the eval-mode switch around sampling).

From (a), (b), (c) the limit is ``1 / (1/a + 1/b + 1/c)`` env steps/s (the pieces run one after
another); ``fit`` is the whole fit's rate, ``steady`` the rate from the end of its first
iteration that updated to the end of its last (``once s``: set-up, DQN's and SAC's
``learning_starts`` of random actions without updates, the first update with a compiled step's
compilation, teardown), each over the limit ("ours as fraction of the limit"; for DQN and SAC
only ``steady`` compares: their first iterations skip the update). Shares and the remainder
(``smp+``, ``lrn+``, ``loop`` per iteration) are of the steady part.

Each piece apart is the median over 5 blocks of calls of about ``--piece-seconds`` in all. On a
shared machine the numbers are indicative: the pieces apart and the fit run at different moments
(the shares, measured within the fit, are not affected).

``--profile ALG`` instead runs one eager fit of ALG under cProfile and prints the 25 functions of
lightning_rl and pytorch_lightning with the most cumulative time (per iteration, in µs), then
the 20 functions of any package with the most own time, to attribute the remainder
(``--profile-out PATH`` keeps the raw stats for pstats or snakeviz). cProfile's own cost inflates
Python-heavy code about 1.5x: read its µs as proportions.

Usage::

    python benchmarks/limits.py                                    # ppo,a2c,dqn,sac at 0.2 x compare_sb3's budgets
    python benchmarks/limits.py --algos a2c --compile off --steps-scale 0.1
    python benchmarks/limits.py --algos ppo --atari --json /tmp/limits.json
    python benchmarks/limits.py --profile a2c --steps-scale 0.05
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import math
import os
import platform
import pstats
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from compare_sb3 import (
    DEFAULT_STEPS,
    ENV_IDS,
    OFF_POLICY,
    SOLVE_CRITERIA,
    OursSolveCallback,
    SolveTracker,
    build_ours,
    json_safe,
    silence,
)

from lightning_rl import PPO
from lightning_rl.batch import DEFAULT_POLICY_ID as PID
from lightning_rl.batch import MultiAgentBatch, SampleBatch, shuffled_rows, standardize
from lightning_rl.callbacks.learner_info import default_log_every_n_steps
from lightning_rl.data.envs import resolve_vectorization
from lightning_rl.data.samplers.engine import EnvSampler, ExploringPolicy, eval_mode

ATARI = "atari"  # PPO on Breakout, atari.py's setting
ATARI_GAME = "ALE/Breakout-v5"
ATARI_PPO = dict(num_envs=8, rollout_fragment_length=128, num_sgd_iter=4, sgd_minibatch_size=256, lr=2.5e-4,
                 clip_param=0.1, entropy_coeff=0.01, vf_loss_coeff=0.5, grad_clip=0.5, hiddens=(),
                 vf_share_layers=True, encoder="nature_cnn", iterations_per_epoch=1000)
STEPS = {**DEFAULT_STEPS, ATARI: 16_384}
ALGOS = ("ppo", "a2c", "dqn", "sac")
PROBE_ITERATIONS = 2  # steady iterations (past learning_starts) before the probe measures


# --------------------------------------------------------------------------- timing
def per_call(fn: Callable[[], Any], seconds: float, blocks: int = 5) -> float:
    """Median seconds per call of ``fn`` over ``blocks`` blocks of about ``seconds / blocks`` each,
    after one untimed call."""
    fn()
    start = time.perf_counter()
    fn()
    calls = max(1, int(seconds / blocks / max(time.perf_counter() - start, 1e-7)))
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def copy_batch(batch: MultiAgentBatch) -> MultiAgentBatch:
    """A batch whose policy batches ``training_step`` may replace and pop (the tensors shared)."""
    return MultiAgentBatch({pid: SampleBatch(dict(b)) for pid, b in batch.policy_batches.items()},
                           batch.env_steps, dict(batch.info), batch.replay)


# --------------------------------------------------------------------------- the probe
class Probe(pl.Callback):
    """Times the pieces of an iteration on the live module and DataModule, then stops the fit."""

    def __init__(self, vectorization: str, seed: int, seconds: float) -> None:
        self.vectorization, self.seed, self.seconds = vectorization, seed, seconds
        self.seen = 0
        self.result: dict[str, float] | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: MultiAgentBatch, batch_idx: int) -> None:
        off_policy = hasattr(module, "num_gradient_steps")
        if self.result is not None or (off_policy and batch.replay is None):
            return
        self.seen += 1
        if self.seen <= PROBE_ITERATIONS:
            return
        dm = module.active_datamodule
        r: dict[str, float] = {"iteration_env_steps": batch.env_steps}
        r["env_s_per_step"] = self.env(module, dm) / dm.num_envs
        policy = ExploringPolicy(module.sampling_policy(PID, dm.sampling_device), module.exploration_kwargs(PID),
                                 dm.sampling_device)
        with eval_mode(module.policies):
            obs = torch.from_numpy(dm.sampler.obs.copy())
            with torch.inference_mode():
                forward = per_call(lambda: policy.act(obs, dm.generator, {}), self.seconds)
            r["forward_s_per_step"] = forward / dm.num_envs
            r["act_s_per_step"] = (self.act_off_policy(dm, policy) if off_policy
                                   else self.act_on_policy(module, dm, policy) / batch.env_steps)
        if off_policy:
            r["updates"] = module.num_gradient_steps
            r["update_s"] = self.update_off_policy(module, batch)
        else:
            r["updates"] = module.num_sgd_iter * module.num_minibatches
            r["update_s"] = self.update_on_policy(module, batch)
        r["compiled"] = all(step.compiled for step in module._update_steps.values())
        self.result = r
        trainer.should_stop = True

    def env(self, module: Any, dm: Any) -> float:
        """(a) Seconds per vector step of a vector env built as the DataModule builds its own."""
        sampler = EnvSampler(module.env_spec, dm.num_envs, self.vectorization, self.seed, check_finite=dm.check_finite)
        sampler.open()
        try:
            sampler.reset(self.seed)
            actions = [sampler.envs.action_space.sample() for _ in range(64)]
            i = iter(range(10**12))
            return per_call(lambda: sampler.step(actions[next(i) % 64]), self.seconds)
        finally:
            sampler.close()

    def act_on_policy(self, module: Any, dm: Any, policy: ExploringPolicy) -> float:
        """(b) Seconds per fragment of ``EnvSampler.fragment`` with the env step stubbed out."""
        stub = EnvSampler(module.env_spec, dm.num_envs, self.vectorization, self.seed)
        stub.obs = dm.sampler.obs.copy()
        n = dm.num_envs
        canned = (stub.obs, np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool), np.ones(n, bool))
        stub.step = lambda actions: canned
        return per_call(lambda: stub.fragment(policy, dm.rollout_fragment_length), self.seconds)

    def act_off_policy(self, dm: Any, policy: ExploringPolicy) -> float:
        """(b) Seconds per env step of ``ReplayDataModule.sample``'s acting: numpy -> torch, act, -> numpy."""
        obs = dm.sampler.obs

        def act() -> None:
            out = policy.act(torch.tensor(obs), dm.generator, {})
            out[SampleBatch.ACTIONS].cpu().numpy()

        with torch.inference_mode():
            return per_call(act, self.seconds) / dm.num_envs

    def update_on_policy(self, module: Any, batch: MultiAgentBatch) -> float:
        """(c) Seconds of one iteration's ``UpdateStep`` calls on minibatches of the live batch."""
        rows = module.postprocess(copy_batch(batch)).policy_batches[PID]
        standardize(rows, module.standardize_fields, None, None)
        step = module._update_steps[f"loss/{PID}"]  # the module's own, built in its first iteration
        num_minibatches, size = module.minibatch_plan(rows.count, PID)
        minibatches = list(shuffled_rows(rows, num_minibatches, size, module.shuffle_generator, module.device,
                                         step.compiled))
        scalars = module.loss_scalars(PID)

        def iteration() -> None:
            for _ in range(module.num_sgd_iter):
                for minibatch in minibatches:
                    step(minibatch, scalars)

        return per_call(iteration, self.seconds)

    def update_off_policy(self, module: Any, batch: MultiAgentBatch) -> float:
        """(c) Seconds of one iteration's ``module.update`` calls on replay minibatches."""
        size = module.train_batch_size
        drawn = batch.replay.sample_minibatch(PID, module.num_gradient_steps * size).to(module.device)
        minibatches = list(drawn.minibatches(size, shuffle=False))

        def iteration() -> None:
            for minibatch in minibatches:
                module.update(PID, minibatch)

        return per_call(iteration, self.seconds)


class TimedStep:
    """An ``UpdateStep`` whose calls add their time to ``total["update"]``."""

    def __init__(self, step: Any, total: dict[str, float]) -> None:
        self._step, self._total = step, total

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._step(*args, **kwargs)
        finally:
            self._total["update"] += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._step, name)


class Stopwatch(pl.Callback):
    """Times the pieces inside the measured fit itself, by wrapping the instances' methods:
    ``env`` (the sampler's ``step``), ``fragment`` (on-policy: the sampler's ``fragment``),
    ``add`` (off-policy: the replay's ``add``), ``sample`` (the DataModule's ``sample``),
    ``update`` (on-policy: each ``UpdateStep`` call; off-policy: ``module.update``) and ``learn``
    (the ``learn_time_s`` of ``training_step``); and marks the time, counters and totals at the end
    of the first iteration that updated and of the last (the steady part)."""

    def __init__(self, model: Any) -> None:
        self.total = dict.fromkeys(("env", "fragment", "add", "sample", "update", "learn"), 0.0)
        self.first: tuple[float, dict[str, int], dict[str, float]] | None = None
        self.last: tuple[float, dict[str, int], dict[str, float]] | None = None
        dm = model.default_datamodule
        self.wrap(dm.sampler, "step", "env")
        self.wrap(dm, "sample", "sample")
        if hasattr(model, "num_gradient_steps"):
            self.wrap(model, "update", "update")
        else:
            self.wrap(dm.sampler, "fragment", "fragment")
            update_step = model.update_step
            model.update_step = lambda *args, **kwargs: TimedStep(update_step(*args, **kwargs), self.total)

    def wrap(self, owner: Any, name: str, key: str) -> None:
        method, total = getattr(owner, name), self.total

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                total[key] += time.perf_counter() - start

        setattr(owner, name, timed)

    def on_train_start(self, trainer: pl.Trainer, module: Any) -> None:
        buffer = getattr(module.active_datamodule, "buffer", None)
        if buffer is not None:
            self.wrap(buffer, "add", "add")

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, *_: Any) -> None:
        self.total["learn"] += (outputs or {}).get("learn_time_s", 0.0)
        mark = (time.perf_counter(), dict(module.counters), dict(self.total))
        if self.first is None and module.counters["num_grad_updates"] > 0:
            self.first = mark
        self.last = mark


# --------------------------------------------------------------------------- runs
def build(algo: str, seed: int, steps: int, vectorization: str, threads: int, compile: bool) -> Any:
    if algo == ATARI:
        return PPO(env=ATARI_GAME, **ATARI_PPO, seed=seed, total_env_steps=steps, vectorization=vectorization,
                   compile=compile, num_cpu_threads=threads)
    return build_ours(algo, seed, steps, vectorization, threads, compile)


def step_env_steps(model: Any) -> int:
    """Env steps per Lightning training step (``iterations_per_step`` iterations)."""
    if hasattr(model, "num_gradient_steps"):
        return model.default_datamodule.train_freq * model.num_envs
    return model.train_batch_size * model.default_datamodule.requested_iterations_per_step


def fit(algo: str, seed: int, steps: int, vectorization: str, threads: int, compile: bool,
        callbacks: Callable[[Any], Sequence[pl.Callback]] = lambda model: (),
        profiler: cProfile.Profile | None = None, log_cadence: str = "full") -> tuple[Any, float]:
    """``Trainer.fit`` as compare_sb3.py's ``run_ours`` runs it, with ``callbacks(model)`` besides;
    returns the module and the wall time.
    ``log_cadence="full"``: ``log_every_n_steps`` is what ``LogCadence`` picks for the unscaled
    budget (every ``total iterations // 100``), so a shortened fit logs as often per iteration as
    the full run; ``"scaled"`` leaves it to ``LogCadence`` (100 to 200 logged points per fit)."""
    torch.set_num_threads(threads)
    model = build(algo, seed, steps, vectorization, threads, compile)
    solve = [OursSolveCallback(SolveTracker(*SOLVE_CRITERIA[algo][::-1]))] if algo in SOLVE_CRITERIA else []
    cadence = {}
    if log_cadence == "full":
        cadence["log_every_n_steps"] = default_log_every_n_steps(math.ceil(STEPS[algo] / step_env_steps(model)))
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[*solve, *callbacks(model)],
                         **cadence)
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    trainer.fit(model)
    if profiler is not None:
        profiler.disable()
    return model, time.perf_counter() - start


def measure_row(algo: str, vectorization: str, compile: bool, steps: int, args: argparse.Namespace) -> dict[str, Any]:
    probe = Probe(vectorization, args.seed, args.piece_seconds)

    def probing(model: Any) -> list[Probe]:
        model.default_datamodule.requested_iterations_per_step = 1  # the probe reads each iteration's batch
        return [probe]

    fit(algo, args.seed, steps, vectorization, args.threads, compile, probing, log_cadence=args.log_cadence)
    if probe.result is None:
        raise RuntimeError(f"{algo}: the probe fit ended before its steady state; raise --steps-scale")
    p = probe.result
    watches: list[Stopwatch] = []

    def stopwatch(model: Any) -> list[Stopwatch]:
        watches.append(Stopwatch(model))
        return watches

    model, wall = fit(algo, args.seed, steps, vectorization, args.threads, compile, stopwatch,
                      log_cadence=args.log_cadence)
    (watch,) = watches
    per_iter = p["iteration_env_steps"]
    a, b, c = 1 / p["env_s_per_step"], 1 / p["act_s_per_step"], per_iter / p["update_s"]
    limit = 1 / (1 / a + 1 / b + 1 / c)
    (t0, c0, s0), (t1, c1, s1) = watch.first, watch.last
    d = {key: s1[key] - s0[key] for key in s0}  # seconds of each piece in the steady part
    steady_s = t1 - t0
    iterations = c1["num_iterations"] - c0["num_iterations"]
    env_steps = c1["num_env_steps_sampled"] - c0["num_env_steps_sampled"]
    off_policy = hasattr(model, "num_gradient_steps")
    seconds = {  # the steady part's time, piece by piece (they add up to steady_s)
        "env": d["env"],
        "act": d["sample"] - d["env"] - d["add"] if off_policy else d["fragment"] - d["env"],
        "update": d["update"],
        "sample_extra": d["add"] if off_policy else d["sample"] - d["fragment"],
        "learn_extra": d["learn"] - d["update"],
        "loop": steady_s - d["sample"] - d["learn"],
    }
    total_steps = int(model.counters["num_env_steps_sampled"])
    in_fit = seconds["env"] + seconds["act"] + seconds["update"]
    return {
        "algo": algo, "vectorization": vectorization, "resolved": resolve_vectorization(model.env_spec, vectorization),
        "compile": compile, "compiled": p["compiled"], "env_steps_per_iteration": per_iter, "updates": p["updates"],
        "log_every_n_steps": model.trainer.log_every_n_steps,
        "iterations_per_step": model.default_datamodule.iterations_per_step,
        "env_steps_per_s": a, "act_steps_per_s": b, "forward_steps_per_s": 1 / p["forward_s_per_step"],
        "update_steps_per_s": c, "limit_steps_per_s": limit, "update_us_per_iteration": p["update_s"] * 1e6,
        "fit_env_steps": total_steps, "fit_s": wall, "fit_steps_per_s": total_steps / wall,
        "fit_over_limit": total_steps / wall / limit, "once_s": wall - steady_s,
        "steady_s": steady_s, "steady_iterations": iterations, "steady_env_steps": env_steps,
        "steady_steps_per_s": env_steps / steady_s, "steady_over_limit": env_steps / steady_s / limit,
        "in_fit_limit_steps_per_s": env_steps / in_fit, "steady_over_in_fit_limit": in_fit / steady_s,
        "in_fit_steps_per_s": {key: env_steps / seconds[key] for key in ("env", "act", "update") if seconds[key] > 0},
        "share": {key: value / steady_s for key, value in seconds.items()},
        "us_per_iteration": {key: 1e6 * value / max(iterations, 1) for key, value in seconds.items()},
    }


# --------------------------------------------------------------------------- reporting
def row_label(row: dict[str, Any]) -> str:
    """``sync``, ``auto+c`` (compiled), ``auto+c!`` (asked to compile, fell back to eager)."""
    name = row["vectorization"] + ("" if not row["compile"] else "+c" if row["compiled"] else "+c!")
    return name if row["resolved"] == row["vectorization"] else f"{name} ({row['resolved']})"


def print_rows(algo: str, steps: int, rows: list[dict[str, Any]]) -> None:
    first = rows[0]
    env = ATARI_GAME if algo == ATARI else ENV_IDS[algo]
    print(f"\n== {algo.upper()} on {env}: {first['env_steps_per_iteration']} env steps and {first['updates']} "
          f"update(s) per iteration, {first['iterations_per_step']} iteration(s) per training step; fit of "
          f"{steps:,} env steps, logging every {first['log_every_n_steps']} training steps ==")
    print(f"{'':<28}{'apart, env steps/s':-^45} {'fit, env steps/s':-^40}  {'% of the steady fit':-^36} "
          f"{'rest, µs/iteration':-^30}")
    shares = "".join(f"{k:>6}" for k in ("env", "act", "upd", "smp+", "lrn+", "loop"))
    rest = "".join(f"{k:>10}" for k in ("smp+", "lrn+", "loop"))
    print(f"{'row':<28}{'env':>9}{'act':>9}{'(fwd)':>9}{'update':>9}{'limit':>9} {'fit':>8}{'/limit':>7}"
          f"{'steady':>8}{'/limit':>7}{'once s':>8}  {shares} {rest}")
    keys = ("env", "act", "update", "sample_extra", "learn_extra", "loop")
    for r in rows:
        print(f"{row_label(r):<28}{r['env_steps_per_s']:>9,.0f}{r['act_steps_per_s']:>9,.0f}"
              f"{r['forward_steps_per_s']:>9,.0f}{r['update_steps_per_s']:>9,.0f}{r['limit_steps_per_s']:>9,.0f} "
              f"{r['fit_steps_per_s']:>8,.0f}{r['fit_over_limit']:>7.2f}{r['steady_steps_per_s']:>8,.0f}"
              f"{r['steady_over_limit']:>7.2f}{r['once_s']:>8.1f}  "
              + "".join(f"{100 * r['share'][k]:>6.0f}" for k in keys) + " "
              + "".join(f"{r['us_per_iteration'][k]:>10,.0f}" for k in keys[3:]), flush=True)


def short_path(filename: str) -> str:
    for marker in ("site-packages/", "/lightning_rl/"):
        if marker in filename:
            return ("lightning_rl/" if marker == "/lightning_rl/" else "") + filename.rsplit(marker, 1)[1]
    return filename


def profile(algo: str, steps: int, args: argparse.Namespace) -> dict[str, Any]:
    """One eager fit under cProfile: the top functions of lightning_rl and pytorch_lightning by
    cumulative time, then the top functions by own time, per iteration."""
    profiler = cProfile.Profile()
    vectorization = "sync" if algo in (*OFF_POLICY, ATARI) else args.vectorization[0]
    model, wall = fit(algo, args.seed, steps, vectorization, args.threads, False, profiler=profiler,
                      log_cadence=args.log_cadence)
    iterations = int(model.counters["num_iterations"])
    if args.profile_out:
        profiler.dump_stats(args.profile_out)
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (primitive calls, calls, own s, cumulative s, ..)}
    rows = [{"function": f"{short_path(f)}:{line}({name})", "calls": nc, "own_s": tt, "cum_s": ct}
            for (f, line, name), (_, nc, tt, ct, _) in stats.items()]
    ours = sorted((r for r in rows if "lightning_rl/" in r["function"] or "pytorch_lightning/" in r["function"]),
                  key=lambda r: -r["cum_s"])[:25]
    own = sorted(rows, key=lambda r: -r["own_s"])[:20]
    print(f"\n== profile of {algo.upper()} ({vectorization}, eager): {model.counters['num_env_steps_sampled']:,} env "
          f"steps, {iterations} iterations in {wall:.1f}s under cProfile ({1e6 * wall / iterations:,.0f} µs/it) ==")
    for title, top in (("by cumulative time, lightning_rl and pytorch_lightning", ours), ("by own time, all", own)):
        print(f"-- {title}\n{'cum µs/it':>10}{'own µs/it':>10}{'calls/it':>9}  function")
        for r in top:
            print(f"{1e6 * r['cum_s'] / iterations:>10,.0f}{1e6 * r['own_s'] / iterations:>10,.0f}"
                  f"{r['calls'] / iterations:>9.1f}  {r['function']}")
    return {"algo": algo, "vectorization": vectorization, "wall_s": wall, "iterations": iterations,
            "by_cumulative": ours, "by_own": own}


# --------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algos", default=",".join(ALGOS), help="comma-separated subset of ppo,a2c,dqn,sac (default all)")
    p.add_argument("--atari", action="store_true", help="also PPO on Breakout, Nature CNN (needs ale-py)")
    p.add_argument("--steps-scale", type=float, default=0.2, help="x compare_sb3.py's budgets (default 0.2)")
    p.add_argument("--vectorization", default="sync,auto",
                   help="PPO/A2C vectorizations (default sync,auto; DQN, SAC and Atari run sync)")
    p.add_argument("--compile", default="off,on", help="off and/or on (default both)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-cadence", choices=("full", "scaled"), default="full",
                   help="log_every_n_steps of the unscaled budget's run (default), or of the shortened fit's")
    p.add_argument("--piece-seconds", type=float, default=1.0, help="timing of each piece, seconds (default 1)")
    p.add_argument("--profile", metavar="ALG", help="only profile one eager fit of ALG (ppo, a2c, dqn, sac, atari)")
    p.add_argument("--profile-out", metavar="PATH", help="with --profile: also save the raw stats (pstats, snakeviz)")
    p.add_argument("--json", metavar="PATH", help="write the rows (or the profile) as JSON")
    args = p.parse_args(argv)
    args.algos = [a.strip().lower() for a in args.algos.split(",") if a.strip()]
    if set(args.algos) - set(ALGOS):
        p.error(f"unknown algos {sorted(set(args.algos) - set(ALGOS))}; choose from {','.join(ALGOS)}")
    if args.atari and importlib.util.find_spec("ale_py") is None:
        print("--atari: ale-py is not installed (pip install ale-py), PPO on Breakout skipped", flush=True)
    elif args.atari:
        args.algos.append(ATARI)
    args.vectorization = [v.strip() for v in args.vectorization.split(",") if v.strip()]
    args.compile = [c.strip() == "on" for c in args.compile.split(",") if c.strip()]
    if set(args.vectorization) - {"sync", "auto", "vector_entry_point", "async", "envpool"} or not args.compile:
        p.error("--vectorization takes sync, auto, vector_entry_point, async or envpool; --compile off and/or on")
    if args.profile is not None and args.profile not in (*ALGOS, ATARI):
        p.error(f"--profile takes one of {','.join((*ALGOS, ATARI))}")
    if args.steps_scale <= 0 or args.threads < 1 or args.piece_seconds <= 0:
        p.error("--steps-scale, --threads and --piece-seconds must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    silence()
    torch.set_num_threads(args.threads)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"python {platform.python_version()}, torch {torch.__version__}, pytorch_lightning {pl.__version__}, "
          f"numpy {np.__version__}; torch threads {args.threads}; cpus {os.cpu_count()}; load average {load}",
          flush=True)
    if args.profile is not None:
        report: Any = profile(args.profile, max(1, int(STEPS[args.profile] * args.steps_scale)), args)
    else:
        report = {"threads": args.threads, "steps_scale": args.steps_scale, "load_avg_start": load, "rows": []}
        for algo in args.algos:
            steps = max(1, int(STEPS[algo] * args.steps_scale))
            vectorizations = ["sync"] if algo in (*OFF_POLICY, ATARI) else args.vectorization
            rows = [measure_row(algo, v, c, steps, args) for v in vectorizations for c in args.compile]
            print_rows(algo, steps, rows)
            report["rows"].extend(rows)
        report["load_avg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
        print(f"\nload average at end {report['load_avg_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(json_safe(report), f, indent=1)


if __name__ == "__main__":
    main()
