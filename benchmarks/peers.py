"""PPO on CartPole-v1 at identical settings: lightning_rl (compiled and eager) against its peers.

Six implementations, one process, one set of settings (issue 36, item 4):

* ``ours-c`` / ``ours-e``: ``lightning_rl.PPO(..., compile=True / False)`` trained by
  ``pytorch_lightning.Trainer.fit`` (logger, checkpointing, progress bar and model summary off,
  as ``benchmarks/compare_sb3.py`` runs it), ``vectorization="sync"`` by default;
* ``cleanrl``: ``benchmarks/peers_cleanrl_style.py``, a CleanRL-style single-file PPO written for
  this benchmark (gymnasium ``SyncVectorEnv``, GAE, clipped loss, Adam);
* ``sb3``: Stable-Baselines3's ``PPO("MlpPolicy")`` on ``make_vec_env`` (a ``DummyVecEnv``);
* ``skrl``: skrl's torch ``PPO`` agent, ``RandomMemory`` and ``SequentialTrainer`` on a wrapped
  gymnasium ``SyncVectorEnv``;
* ``torchrl``: TorchRL's ``SyncDataCollector`` (``Collector`` where, as in torchrl 0.14, that name
  is gone; its default ``direct`` backend is the same single-process collector), ``GAE`` module and
  ``ClipPPOLoss``, on a gymnasium ``SyncVectorEnv`` in a ``GymWrapper``.

Settings, the same for all: 8 envs x 32 steps per env per iteration (256 rows), 20 epochs of one
minibatch of 256, Adam with lr 1e-3 constant, clip 0.2 constant, gamma 0.98, GAE lambda 0.8,
value-loss coefficient 0.5 on ``mean((V - target)^2)``, entropy coefficient 0, gradients clipped
to global norm 0.5, advantages standardized, ``torch.set_num_threads(1)`` (re-asserted before
every run), every env a Python gymnasium CartPole in the training process. Each budget is rounded
up to whole iterations: ``--steps 100000`` trains 391 iterations = 100,096 env steps everywhere.

Networks: separate actor and critic MLPs, 64-64 tanh, in all six. lightning_rl
(``vf_share_layers=False``) and Stable-Baselines3 (``MlpPolicy``) build them so by default, both
with orthogonal init (gain sqrt(2), policy head 0.01, value head 1); skrl and TorchRL have no
default network, so they get the CleanRL-style script's ``mlp`` (the same layers and init).

Not identical, by each library's design (the figures are as each is run by its users):

* Adam's eps is 1e-5 in lightning_rl, the CleanRL-style script, SB3 and TorchRL (set here, as
  TorchRL's own PPO examples do); skrl builds its Adam with PyTorch's 1e-8 and has no setting for
  it, so it is set to 1e-5 on the optimizer after construction.
* Advantage standardization: per iteration batch in lightning_rl and skrl, per minibatch in the
  CleanRL-style script, SB3 and TorchRL (``ClipPPOLoss(normalize_advantage=True)``); with one
  minibatch of 256 they coincide. The std's guard differs: ``max(std, 1e-4)`` in lightning_rl,
  ``max(std, 1e-6)`` in TorchRL, ``std + 1e-8`` in the CleanRL-style script, SB3 and skrl.
* Episode ends: lightning_rl resets an env in the step after its episode ended (gymnasium's
  next-step autoreset: that step counts as an env step, its row is dropped from the batch, about
  one row per episode); TorchRL's collector resets ended envs itself between steps
  (``autoreset_mode=DISABLED``, the mode it prefers); the CleanRL-style script, SB3 and skrl reset
  them within the ending step. A truncated episode (the 500-step limit) is bootstrapped from the
  value of its true last observation by lightning_rl, the CleanRL-style script, SB3 and TorchRL;
  skrl (``time_limit_bootstrap=True``) takes the value of the observation its trainer is handed
  next, which in a same-step-reset vector env is the new episode's first.
* skrl defaults overridden: ``rollouts`` 32, ``learning_epochs`` 20, ``mini_batches`` 1,
  ``discount_factor`` 0.98, ``gae_lambda`` 0.8, ``learning_rate`` 1e-3, ``value_clip`` 0.2 -> 0
  (no value clipping), ``value_loss_scale`` 2.5 -> 0.5, ``time_limit_bootstrap`` False -> True,
  and no TensorBoard writing or checkpoints (``write_interval``/``checkpoint_interval`` 0).
* TorchRL defaults overridden: ``ClipPPOLoss`` with ``loss_critic_type="l2"`` (default
  smooth L1), ``critic_coeff=0.5`` (default 1), ``entropy_bonus=False``, ``normalize_advantage=True``.
  Its GAE module (``average_gae=False``) computes advantages and value targets
  (``advantage + value``) once per iteration, before the epochs, as the other five do (TorchRL's
  own PPO examples recompute them before every epoch with the updated critic).
* ``torch.distributions`` argument validation: skrl and TorchRL switch it off process-wide when
  imported; SB3 and the CleanRL-style script run as their users run them, with PyTorch's default
  (on). Before every run it is set to what that implementation gets when used alone (lightning_rl
  has its own distributions, which do not validate).

Measured per run:

* ``steps/s whole``: env steps / wall time from before the algorithm object (and its envs, models
  and, for TorchRL and skrl, collector, memory and trainer) is constructed until ``fit`` /
  ``learn`` / ``train`` / the training loop returns, as a user pays it; ``ours-c`` includes its
  compile (dynamo's trace of the update step; inductor's code comes from its on-disk cache after
  the warm-up run, which pays the first compile of the process and prints its time).
* ``steps/s loop``: the same env steps / the training loop alone: ours from ``on_train_start`` to
  ``on_train_end`` (so ``ours-c``'s compile, done at the first update, is in it), SB3 from
  ``on_training_start`` to ``on_training_end``, skrl ``trainer.train()``, the CleanRL-style and
  TorchRL loops over their iterations.
* ``greedy``: after training, untimed, 10 greedy (argmax) episodes on one fresh CartPole-v1, the
  first reset seeded with ``seed + 10000``, the same protocol for all. The table shows the mean ±
  std over all episodes of all seeds.

Before the timed runs each implementation trains two iterations untimed (``--no-warmup`` skips
it), so the first timed run pays no lazy imports or first-call set-up. Runs alternate
implementations within each seed (ours-c s0, ours-e s0, cleanrl s0, sb3 s0, skrl s0, torchrl s0,
ours-c s1, ...), so drifts in machine load hit all alike. A peer whose library is missing is
skipped with one line naming the package to install (``pip install -e .[bench]`` installs them).
The small table helpers are this script's own, not imported from ``compare_sb3.py``: that script
imports Stable-Baselines3 at its top, and this one runs without it.

Usage::

    python benchmarks/peers.py                                   # 100k steps, seeds 0,1, all six
    python benchmarks/peers.py --steps 2048 --seeds 0            # smoke run, well under a minute
    python benchmarks/peers.py --only ours-c,sb3 --json peers.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")
os.environ.setdefault("PYTHONWARNINGS", "ignore")

import numpy as np  # noqa: E402
import peers_cleanrl_style as cleanrl  # noqa: E402
import torch  # noqa: E402
from torch.distributions import Distribution  # noqa: E402

ENV_ID = "CartPole-v1"
NUM_ENVS, NUM_STEPS = 8, 32
BATCH = NUM_ENVS * NUM_STEPS
EPOCHS = 20
LR, CLIP, GAMMA, LAMBDA, VF_COEF, ENT_COEF, MAX_GRAD_NORM = 1e-3, 0.2, 0.98, 0.8, 0.5, 0.0, 0.5
THREADS = 1
EVAL_EPISODES, EVAL_SEED_OFFSET = 10, 10_000
WARMUP_STEPS = 2 * BATCH
IMPLS = ("ours-c", "ours-e", "cleanrl", "sb3", "skrl", "torchrl")
PEERS = ("cleanrl", "sb3", "skrl", "torchrl")
# what each needs beyond torch and gymnasium: (module, pip package)
REQUIRES = {"ours-c": ("lightning_rl", "lightning-rl"), "ours-e": ("lightning_rl", "lightning-rl"),
            "sb3": ("stable_baselines3", "stable-baselines3"), "skrl": ("skrl", "skrl"),
            "torchrl": ("torchrl", "torchrl")}
TORCH_VALIDATES = Distribution._validate_args  # PyTorch's default (False only under python -O)


@dataclass
class Run:
    impl: str
    seed: int
    env_steps: int
    whole_s: float
    loop_s: float
    whole_steps_per_s: float
    loop_steps_per_s: float
    greedy_returns: list[float]


def iterations(steps: int) -> int:
    return max(1, math.ceil(steps / BATCH))


def greedy(act: Callable[[torch.Tensor], torch.Tensor], seed: int) -> list[float]:
    """``act``: ``[1, 4]`` observations -> greedy action; 10 episodes, the shared protocol."""
    def one(obs: np.ndarray) -> int:
        with torch.no_grad():
            return int(act(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)).reshape(()))

    return cleanrl.greedy_returns(one, ENV_ID, seed + EVAL_SEED_OFFSET, EVAL_EPISODES)


# --------------------------------------------------------------------------- implementations
# Each returns (env steps, loop seconds, act) for a run that started timing just before it was called.
def train_ours(seed: int, steps: int, compile: bool, vectorization: str) -> tuple[int, float, Callable]:
    import pytorch_lightning as pl

    from lightning_rl import PPO

    class LoopTimer(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
            self.start = time.perf_counter()

        def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
            self.seconds = time.perf_counter() - self.start

    model = PPO(
        env=ENV_ID, num_envs=NUM_ENVS, rollout_fragment_length=NUM_STEPS, num_sgd_iter=EPOCHS,
        sgd_minibatch_size=BATCH, lr=LR, lr_schedule="constant", clip_param=CLIP, clip_param_schedule="constant",
        gamma=GAMMA, lambda_=LAMBDA, vf_loss_coeff=VF_COEF, entropy_coeff=ENT_COEF, grad_clip=MAX_GRAD_NORM,
        seed=seed, total_env_steps=iterations(steps) * BATCH, vectorization=vectorization,
        num_cpu_threads=THREADS, compile=compile,
    )
    timer = LoopTimer()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[timer],
    )
    trainer.fit(model)
    policy = model.policy
    return (int(model.counters["num_env_steps_sampled"]), timer.seconds,
            lambda obs: policy.compute_actions(obs, explore=False)["actions"])


def train_cleanrl(seed: int, steps: int) -> tuple[int, float, Callable]:
    args = cleanrl.Args(
        env_id=ENV_ID, seed=seed, total_timesteps=iterations(steps) * BATCH, num_envs=NUM_ENVS, num_steps=NUM_STEPS,
        update_epochs=EPOCHS, num_minibatches=1, learning_rate=LR, gamma=GAMMA, gae_lambda=LAMBDA, clip_coef=CLIP,
        vf_coef=VF_COEF, ent_coef=ENT_COEF, max_grad_norm=MAX_GRAD_NORM, norm_adv=True, threads=THREADS,
    )
    agent, stats = cleanrl.train(args)
    return stats["env_steps"], stats["loop_s"], agent.greedy_action


def train_sb3(seed: int, steps: int) -> tuple[int, float, Callable]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class LoopTimer(BaseCallback):
        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            return True

        def _on_training_end(self) -> None:
            self.seconds = time.perf_counter() - self.start

    model = PPO(
        "MlpPolicy", make_vec_env(ENV_ID, n_envs=NUM_ENVS, seed=seed), n_steps=NUM_STEPS, batch_size=BATCH,
        n_epochs=EPOCHS, learning_rate=LR, clip_range=CLIP, gamma=GAMMA, gae_lambda=LAMBDA, vf_coef=VF_COEF,
        ent_coef=ENT_COEF, max_grad_norm=MAX_GRAD_NORM, normalize_advantage=True, seed=seed, device="cpu", verbose=0,
    )
    timer = LoopTimer()
    model.learn(total_timesteps=iterations(steps) * BATCH, callback=timer)
    model.get_env().close()
    policy = model.policy
    return int(model.num_timesteps), timer.seconds, lambda obs: policy._predict(obs, deterministic=True)


def train_skrl(seed: int, steps: int) -> tuple[int, float, Callable]:
    import gymnasium as gym
    from skrl.agents.torch.ppo import PPO, PPO_CFG
    from skrl.envs.wrappers.torch import wrap_env
    from skrl.memories.torch import RandomMemory
    from skrl.models.torch import CategoricalMixin, DeterministicMixin, Model
    from skrl.trainers.torch import SequentialTrainer
    from skrl.utils import set_seed

    class Policy(CategoricalMixin, Model):
        def __init__(self, observation_space: Any, action_space: Any) -> None:
            Model.__init__(self, observation_space=observation_space, action_space=action_space, device="cpu")
            CategoricalMixin.__init__(self, unnormalized_log_prob=True)
            self.net = cleanrl.mlp(self.num_observations, self.num_actions, head_std=0.01)

        def compute(self, inputs: dict, role: str = "") -> tuple[torch.Tensor, dict]:
            return self.net(inputs["observations"]), {}

    class Value(DeterministicMixin, Model):
        def __init__(self, observation_space: Any, action_space: Any) -> None:
            Model.__init__(self, observation_space=observation_space, action_space=action_space, device="cpu")
            DeterministicMixin.__init__(self, clip_actions=False)
            self.net = cleanrl.mlp(self.num_observations, 1, head_std=1.0)

        def compute(self, inputs: dict, role: str = "") -> tuple[torch.Tensor, dict]:
            return self.net(inputs["observations"]), {}

    set_seed(seed)  # random, numpy, torch, and the seed of the wrapped env's first reset
    env = wrap_env(gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(NUM_ENVS)],
                                            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP), wrapper="gymnasium")
    policy = Policy(env.observation_space, env.action_space)
    value = Value(env.observation_space, env.action_space)
    cfg = PPO_CFG(
        rollouts=NUM_STEPS, learning_epochs=EPOCHS, mini_batches=1, discount_factor=GAMMA, gae_lambda=LAMBDA,
        learning_rate=LR, grad_norm_clip=MAX_GRAD_NORM, ratio_clip=CLIP, value_clip=0.0, entropy_loss_scale=ENT_COEF,
        value_loss_scale=VF_COEF, time_limit_bootstrap=True,
        experiment={"write_interval": 0, "checkpoint_interval": 0},
    )
    agent = PPO(models={"policy": policy, "value": value}, memory=RandomMemory(memory_size=NUM_STEPS, num_envs=NUM_ENVS,
                device="cpu"), observation_space=env.observation_space, action_space=env.action_space, device="cpu",
                cfg=cfg)
    for group in agent.optimizer.param_groups:  # skrl's Adam has PyTorch's eps (1e-8); the others use 1e-5
        group["eps"] = 1e-5
    timesteps = iterations(steps) * NUM_STEPS
    trainer = SequentialTrainer(env=env, agents=agent, cfg={"timesteps": timesteps, "headless": True,
                                                            "disable_progressbar": True})
    start = time.perf_counter()
    trainer.train()
    loop_s = time.perf_counter() - start
    env.close()
    return timesteps * NUM_ENVS, loop_s, lambda obs: policy.net(obs).argmax(-1)


def train_torchrl(seed: int, steps: int) -> tuple[int, float, Callable]:
    import gymnasium as gym
    import torchrl.collectors
    from tensordict.nn import TensorDictModule
    from torchrl.envs import GymWrapper
    from torchrl.modules import ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    collector_cls = getattr(torchrl.collectors, "SyncDataCollector", None) or torchrl.collectors.Collector
    torch.manual_seed(seed)
    env = GymWrapper(gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(NUM_ENVS)],
                                               autoreset_mode=gym.vector.AutoresetMode.DISABLED),
                     categorical_action_encoding=True)
    env.set_seed(seed)
    actor_net = cleanrl.mlp(4, 2, head_std=0.01)
    actor = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["logits"]), in_keys=["logits"],
        distribution_class=torch.distributions.Categorical, spec=env.action_spec, return_log_prob=True,
    )
    critic = ValueOperator(cleanrl.mlp(4, 1, head_std=1.0), in_keys=["observation"])
    gae = GAE(gamma=GAMMA, lmbda=LAMBDA, value_network=critic, average_gae=False)
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=CLIP, entropy_bonus=False, critic_coeff=VF_COEF,
                              loss_critic_type="l2", normalize_advantage=True)
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR, eps=1e-5)
    kwargs = {} if collector_cls.__name__ == "SyncDataCollector" else {"auto_register_policy_transforms": False}
    collector = collector_cls(env, actor, frames_per_batch=BATCH, total_frames=iterations(steps) * BATCH, **kwargs)
    frames = 0
    start = time.perf_counter()
    for data in collector:  # [8 envs, 32 steps]
        frames += data.numel()
        with torch.no_grad():
            gae(data)  # "advantage" and "value_target" (= advantage + value), once per iteration
        rows = data.reshape(-1)
        for _ in range(EPOCHS):
            for index in torch.randperm(rows.numel()).split(BATCH):
                losses = loss_module(rows[index])
                loss = losses["loss_objective"] + losses["loss_critic"]
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
                optimizer.step()
    loop_s = time.perf_counter() - start
    collector.shutdown()
    env.close()
    return frames, loop_s, lambda obs: actor_net(obs).argmax(-1)


def run(impl: str, seed: int, steps: int, vectorization: str, evaluate: bool = True) -> Run:
    torch.set_num_threads(THREADS)
    # what the implementation gets when used alone: skrl and TorchRL turn validation off on import
    Distribution.set_default_validate_args(False if impl in ("skrl", "torchrl") else TORCH_VALIDATES)
    start = time.perf_counter()
    if impl in ("ours-c", "ours-e"):
        env_steps, loop_s, act = train_ours(seed, steps, impl == "ours-c", vectorization)
    else:
        env_steps, loop_s, act = {"cleanrl": train_cleanrl, "sb3": train_sb3, "skrl": train_skrl,
                                  "torchrl": train_torchrl}[impl](seed, steps)
    whole_s = time.perf_counter() - start
    torch.set_num_threads(THREADS)
    returns = greedy(act, seed) if evaluate else []
    return Run(impl, seed, env_steps, whole_s, loop_s, env_steps / whole_s, env_steps / loop_s, returns)


# --------------------------------------------------------------------------- reporting
def summarize(runs: list[Run], impls: list[str]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for impl in impls:
        mine = [r for r in runs if r.impl == impl]
        if not mine:
            continue
        episodes = [g for r in mine for g in r.greedy_returns]
        rows[impl] = {
            "runs": len(mine),
            "env_steps": mine[0].env_steps,
            "whole_steps_per_s_median": statistics.median(r.whole_steps_per_s for r in mine),
            "loop_steps_per_s_median": statistics.median(r.loop_steps_per_s for r in mine),
            "greedy_return_mean": float(np.mean(episodes)) if episodes else None,
            "greedy_return_std": float(np.std(episodes)) if episodes else None,
        }
    ours = rows.get("ours-c")
    for row in rows.values():
        for kind in ("whole", "loop"):
            row[f"ours_c_over_this_{kind}"] = (ours[f"{kind}_steps_per_s_median"] / row[f"{kind}_steps_per_s_median"]
                                               if ours else None)
    fastest: dict[str, Any] = {}
    peers = [impl for impl in rows if impl in PEERS]
    for kind in ("whole", "loop"):
        if peers:
            best = max(peers, key=lambda impl: rows[impl][f"{kind}_steps_per_s_median"])
            fastest[kind] = {"peer": best, "ours_c_over_it": rows[best][f"ours_c_over_this_{kind}"]}
    return {"impls": rows, "fastest_peer": fastest}


def print_table(summary: dict[str, Any], steps: int) -> None:
    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    print(f"\n== PPO on {ENV_ID}, {steps:,} env steps per run, steps/s medians over seeds ==")
    header = (f"{'impl':<9} {'runs':>4} {'steps/s whole':>14} {'steps/s loop':>13} {'greedy return (10 ep/seed)':>27} "
              f"{'ours-c/this whole':>18} {'ours-c/this loop':>17}")
    print(header)
    print("-" * len(header))
    for impl, row in summary["impls"].items():
        greedy_txt = ("-" if row["greedy_return_mean"] is None
                      else f"{row['greedy_return_mean']:.1f} ± {row['greedy_return_std']:.1f}")
        print(f"{impl:<9} {row['runs']:>4} {row['whole_steps_per_s_median']:>14,.0f} "
              f"{row['loop_steps_per_s_median']:>13,.0f} {greedy_txt:>27} {ratio(row['ours_c_over_this_whole']):>18} "
              f"{ratio(row['ours_c_over_this_loop']):>17}")
    for kind, best in summary["fastest_peer"].items():
        print(f"fastest peer ({kind}): {best['peer']}; ours-c / it = {ratio(best['ours_c_over_it'])}")


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100_000, help="env steps per run, rounded up to whole iterations "
                   "of 256 (default 100k; 2048 for a smoke run)")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    p.add_argument("--only", default=",".join(IMPLS), help=f"comma-separated subset of {','.join(IMPLS)}")
    p.add_argument("--vectorization", default="sync", help="ours' vectorization (default sync, one gymnasium env "
                   "per env as every peer; auto picks CartPole's numpy-batched vector_entry_point)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed two-iteration run of each impl")
    p.add_argument("--json", type=Path, help="write the runs and the summary to this file")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(IMPLS)
    if unknown or not args.only or not args.seeds or args.steps < 1:
        p.error(f"--only takes names from {','.join(IMPLS)} (got {sorted(unknown)}); --seeds and --steps non-empty, "
                "positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(THREADS)
    impls = []
    for impl in [i for i in IMPLS if i in args.only]:  # the fixed alternation order
        module, package = REQUIRES.get(impl, (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            print(f"{impl}: skipped, {module} is not installed (pip install {package})", flush=True)
        else:
            impls.append(impl)
    steps = iterations(args.steps) * BATCH
    load = os.getloadavg()
    names = ["torch", "gymnasium", *dict.fromkeys(REQUIRES[i][0] for i in impls if i in REQUIRES)]
    if "lightning_rl" in names:
        names.insert(names.index("lightning_rl") + 1, "pytorch_lightning")
    versions = {name: getattr(importlib.import_module(name), "__version__", "?") for name in names}
    # after the imports above, which set their own loggers' levels: no banners, INFO lines or warnings
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "skrl", "torchrl"):
        logging.getLogger(name).setLevel(logging.ERROR)
    print(f"python {platform.python_version()}, {', '.join(f'{k} {v}' for k, v in versions.items())}; torch threads "
          f"{THREADS}; cpus {os.cpu_count()}; load average at start {load}", flush=True)
    if not args.no_warmup:
        for impl in impls:
            start = time.perf_counter()
            run(impl, 0, WARMUP_STEPS, args.vectorization, evaluate=False)
            print(f"[{impl:<7}] warm-up, {WARMUP_STEPS} steps untimed: {time.perf_counter() - start:.1f}s"
                  + (" (the process's first compile)" if impl == "ours-c" else ""), flush=True)
    runs: list[Run] = []
    for seed in args.seeds:
        for impl in impls:
            r = run(impl, seed, args.steps, args.vectorization)
            runs.append(r)
            print(f"[{impl:<7} seed {seed}] {r.env_steps:,} steps: whole {r.whole_s:.1f}s = "
                  f"{r.whole_steps_per_s:,.0f}/s, loop {r.loop_s:.1f}s = {r.loop_steps_per_s:,.0f}/s; greedy "
                  f"{np.mean(r.greedy_returns):.1f} ± {np.std(r.greedy_returns):.1f}", flush=True)
    summary = summarize(runs, impls)
    print_table(summary, steps)
    load_end = os.getloadavg()
    print(f"load average at end {load_end}", flush=True)
    if args.json is not None:
        report = {"env": ENV_ID, "env_steps": steps, "seeds": args.seeds, "threads": THREADS,
                  "vectorization": args.vectorization, "versions": versions, "load_avg_start": list(load),
                  "load_avg_end": list(load_end), "summary": summary, "runs": [asdict(r) for r in runs]}
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
