"""Deterministic evaluation episodes on separate envs (the sampling engine's, ``data/samplers/engine.py``).

Every evaluation, test and ``record`` episode is capped (``episode_step_cap``): at the env's own
time limit where it declares one (``max_episode_steps``, an ALE game's frame limit, envpool's),
else at ``evaluation_max_episode_steps`` (``DEFAULT_MAX_EPISODE_STEPS``), so that an env that
never ends cannot hang a run; an episode cut there counts its return so far, and a warning
names the env (once per env and process). During ``fit`` the same number of steps without any
episode end is said once (``EpisodeEnds``): the episode statistics then never report.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities import rank_zero_warn
from pytorch_lightning.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader

from lightning_rl.batch import DEFAULT_POLICY_ID
from lightning_rl.data.envs.make import EnvSpec, make_env
from lightning_rl.data.samplers.engine import EnvSampler
from lightning_rl.inference import Acting

#: Steps after which an evaluation, test or ``record`` episode of an env without a time limit of
#: its own is cut (the ``evaluation_max_episode_steps`` setting's default).
DEFAULT_MAX_EPISODE_STEPS = 10_000

# the envs whose cut episodes were already reported (said once per env and process)
_CUT_SAID: set[str] = set()


# ----------------------------------------------------------------------------- the cap
def env_step_limit(env: gym.Env) -> int | None:
    """The agent steps after which ``env`` ends an episode by itself, if it declares it: a
    ``TimeLimit`` wrapper (``max_episode_steps``), or an ALE game's frame limit
    (``max_num_frames_per_episode``) over its frame skip; ``None`` when it declares none."""
    limits = []
    spec = getattr(env, "spec", None)
    if spec is not None and spec.max_episode_steps:
        limits.append(int(spec.max_episode_steps))
    skip, layer = 1, env
    while True:
        if isinstance(layer, gym.wrappers.TimeLimit):
            limits.append(int(layer._max_episode_steps))
        if not isinstance(layer, gym.Wrapper):
            break
        skip *= int(vars(layer).get("frame_skip", 1))  # AtariPreprocessing's (its own, not an inner env's)
        layer = layer.env
    ale = getattr(layer, "ale", None)
    if ale is not None and hasattr(ale, "getInt"):
        frames = ale.getInt("max_num_frames_per_episode")
        frameskip = getattr(layer, "_frameskip", 1)
        skip *= frameskip if isinstance(frameskip, int) else 1
        if frames > 0:
            limits.append(math.ceil(frames / max(skip, 1)))
    return min(limits) if limits else None


def vector_env_step_limit(envs: gym.vector.VectorEnv, spec: EnvSpec) -> int | None:
    """``env_step_limit`` of the envs of a vector env built from ``spec``: envpool's own limit,
    a ``SyncVectorEnv``'s first env's, else that of one env made from ``spec`` for the question."""
    base = envs.unwrapped
    if hasattr(base, "max_episode_steps"):  # envpool's adapter (data/envs/envpool_env.py)
        limit = base.max_episode_steps
        return int(limit) if limit else None
    if isinstance(base, gym.vector.SyncVectorEnv):
        return env_step_limit(base.envs[0])
    probe = make_env(spec)
    try:
        return env_step_limit(probe)
    finally:
        probe.close()


def episode_step_cap(own_limit: int | None, max_episode_steps: int | None) -> tuple[int, bool]:
    """``(cap, own)``: the env's own limit where it has one, else ``max_episode_steps``
    (``DEFAULT_MAX_EPISODE_STEPS`` when ``None``)."""
    if own_limit:
        return int(own_limit), True
    return int(max_episode_steps or DEFAULT_MAX_EPISODE_STEPS), False


def say_cut(env: Any, cap: int, own: bool, cut: int, of: int, what: str = "evaluation") -> None:
    """Warn, once per env and process, that ``cut`` of ``of`` episodes reached the cap."""
    name = repr(env)
    if name in _CUT_SAID:
        return
    _CUT_SAID.add(name)
    if own:
        why = f"the env's own limit of {cap} steps, at which it did not end them"
    else:
        why = (f"evaluation_max_episode_steps={cap} steps: the env sets no time limit of its own "
               "(give it one with gymnasium.wrappers.TimeLimit, or set evaluation_max_episode_steps)")
    warnings.warn(f"{what}: {cut} of {of} episodes of env {name} were cut at {why}; their returns so far are "
                  "counted (said once per env)", UserWarning, stacklevel=3)


def max_episode_steps_of(module: Any) -> int:
    """The module's ``evaluation_max_episode_steps``, ``DEFAULT_MAX_EPISODE_STEPS`` without one."""
    return int(getattr(module, "evaluation_max_episode_steps", None) or DEFAULT_MAX_EPISODE_STEPS)


# ----------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(
    module: torch.nn.Module,
    env: EnvSpec | None = None,
    num_episodes: int = 10,
    seed: int | None = None,
    explore: bool = False,
    policy_id: str = DEFAULT_POLICY_ID,
    vectorization: str = "auto",
    max_episode_steps: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[float]:
    """Returns of ``num_episodes`` episodes, one per env of a fresh vector env, greedy by default.

    Each env plays exactly one episode (a whole game for Atari), so short episodes are not
    over-represented.
    ``env`` defaults to the module's own (``module.env_spec``).

    Every episode is capped: at the env's own time limit where it declares one, else at
    ``max_episode_steps`` steps (``None``: the module's ``evaluation_max_episode_steps``,
    10,000 without one); an episode cut there counts its return so far, and a warning names the
    env (once). On envpool's Atari games that wait for FIRE after a reset, every episode and
    life starts with a no-op step then a FIRE step, as the gymnasium path plays them
    (``LifeLossEnds``, ``FireReset``): envpool's own one FIRE frame is lost to a sticky action
    one time in four, and a FIRE held on from it is no new press. ``progress``, if given, is
    called after every env step with the number of episodes finished (it may raise to stop).
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    if max_episode_steps is None:
        max_episode_steps = max_episode_steps_of(module)
    if max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
    if env is None:
        env = module.env_spec
    if getattr(module, "multi_agent", False):  # team returns of a PettingZoo env
        return evaluate_multi_agent(module, env, num_episodes, seed, explore, max_episode_steps, progress)
    sampler = EnvSampler(env, num_episodes, vectorization, check_finite=False)
    try:
        sampler.open()
        cap, own = episode_step_cap(vector_env_step_limit(sampler.envs, env), max_episode_steps)
        fire = sampler.envs.metadata.get("fire_after_reset")  # envpool's Atari (data/envs/envpool_env.py)
        sampler.reset(seed)
        returns = np.zeros(num_episodes)
        finished = np.zeros(num_episodes, dtype=bool)
        steps = np.zeros(num_episodes, dtype=np.int64)  # steps of each env's (first) episode
        since_reset = np.zeros(num_episodes, dtype=np.int64)  # steps each env took since its last reset
        acting = Acting(module, policy_id, explore)  # carries a recurrent policy's state
        while not finished.all():
            actions = acting.act(sampler.obs)
            if fire is not None:  # a no-op step, then a FIRE step: FIRE held on from envpool's reset is no press
                actions = np.where(since_reset == 0, 0, np.where(since_reset == 1, fire, actions))
            _, rewards, terminateds, truncateds, valid = sampler.step(actions)  # Box actions clipped
            acting.observe(rewards, terminateds | truncateds)
            since_reset = np.where(valid, since_reset + 1, 0)  # (a step that only reset an env is not counted)
            steps += valid & ~finished
            # the episode statistics' returns: raw, and whole games' scores for Atari (data/envs/atari.py)
            for i, episode_return in sampler.envs.last_ended.items():
                if not finished[i]:
                    returns[i], finished[i] = episode_return, True
            cut = ~finished & (steps >= cap)
            if cut.any():
                returns[cut] = sampler.envs.episode_returns[cut]  # the return so far (Atari: the game's raw score)
                finished |= cut
                say_cut(env, cap, own, int(cut.sum()), num_episodes)
            if progress is not None:
                progress(int(finished.sum()))
    finally:
        sampler.close()
    return returns.tolist()


@torch.no_grad()
def evaluate_multi_agent(
    module: torch.nn.Module, env: Any, num_episodes: int = 10, seed: int | None = None, explore: bool = False,
    max_episode_steps: int | None = None, progress: Callable[[int], None] | None = None,
) -> list[float]:
    """Team returns (summed over agents) of ``num_episodes`` episodes of a PettingZoo parallel
    env, each agent acting with the policy ``module.policy_mapping_fn`` names for it; each
    episode cut after ``max_episode_steps`` env steps (``None``: the module's
    ``evaluation_max_episode_steps``), as ``evaluate``."""
    from lightning_rl.data.multi_agent import make_parallel_env

    cap = max_episode_steps or max_episode_steps_of(module)
    returns = []
    cut = 0
    made = make_parallel_env(env)
    try:
        for episode in range(num_episodes):
            obs, _ = made.reset(seed=None if seed is None else seed + episode)
            total, steps = 0.0, 0
            while made.agents:
                if steps >= cap:
                    cut += 1
                    break
                actions = {}
                for agent in made.agents:
                    action = module.compute_actions(np.asarray(obs[agent]), policy_id=module.policy_mapping_fn(agent),
                                                    explore=explore)
                    actions[agent] = action.item() if np.ndim(action) == 0 else action
                obs, rewards, _, _, _ = made.step(actions)
                total += float(sum(rewards.values()))
                steps += 1
                if progress is not None:
                    progress(episode)
            returns.append(total)
    finally:
        made.close()
    if cut:
        say_cut(env, cap, False, cut, num_episodes)
    if progress is not None:
        progress(num_episodes)
    return returns


def log_evaluation(module: Any, prefix: str, seed_offset: int) -> None:
    """An algorithm's validation or test step: ``evaluation_num_episodes`` greedy episodes
    seeded ``seed + seed_offset + 1000 * rank``, logged as ``<prefix>/episode_return_mean``
    (``_min``, ``_max``) at the global env-step count.

    A SIGTERM (Lightning's handler notes it; its evaluation loop would look only between
    batches, and this is its one batch) stops the episodes within a step: Lightning's
    ``SIGTERMException``, which ``InterruptCheckpoint`` turns into exit code 143. The progress
    bar, when it counts episodes (``EnvStepProgressBar``), is told each episode's end."""
    seed = None if module.seed is None else module.seed + seed_offset + 1000 * module.global_rank
    trainer = module.trainer
    shown = getattr(trainer.progress_bar_callback, "evaluation_episodes", None)

    def progress(episodes: int) -> None:
        if trainer.received_sigterm:
            raise SIGTERMException()
        if shown is not None:
            shown(episodes)

    returns = evaluate(module, module.env_spec, module.evaluation_num_episodes, seed=seed,
                       vectorization=getattr(module.default_datamodule, "vectorization", "auto"), progress=progress)
    sync = module.trainer.world_size > 1
    for stat, fn, reduce in (("mean", np.mean, "mean"), ("min", np.min, "min"), ("max", np.max, "max")):
        module.log(f"{prefix}/episode_return_{stat}", float(fn(returns)), sync_dist=sync, reduce_fx=reduce,
                   batch_size=1, prog_bar=stat == "mean")
    module.log("step", float(module.global_counters["num_env_steps_sampled"]), batch_size=1)


class EpisodeEnds:
    """Says once during ``fit`` that no episode of any env ended within the first
    ``evaluation_max_episode_steps`` steps of each env: fragments are fixed length, so training
    goes on, but the episode statistics (``rollout/episode_return_mean``) report only episodes
    that ended. ``Algorithm.training_step`` calls ``observe`` after each iteration."""

    def __init__(self) -> None:
        self.done = False  # an episode ended, or it was said

    def observe(self, module: Any, batch: Any) -> None:
        if self.done:
            return
        if getattr(batch, "info", {}).get("episode_returns"):
            self.done = True
            return
        envs = module.num_envs * max(1, getattr(module, "num_workers", 0) or 0)
        steps = module.counters["num_env_steps_sampled"] // max(envs, 1)
        cap = max_episode_steps_of(module)
        if steps >= cap:
            self.done = True
            rank_zero_warn(
                f"no episode of env {module.env_spec!r} ended in the first {steps} steps of each of its {envs} envs "
                f"(evaluation_max_episode_steps={cap}): training goes on, but the episode statistics "
                "(rollout/episode_return_mean) report only episodes that end. If the env never terminates, give it a "
                "time limit (gymnasium.wrappers.TimeLimit); evaluation cuts each episode at "
                f"evaluation_max_episode_steps", category=UserWarning)


class EvaluationHooks:
    """An algorithm's Lightning validation and test (``Algorithm`` inherits them): greedy
    episodes on envs of their own, logged at the global env-step count."""

    # whether fit validates: evaluation_interval, or the Trainer's own validation flags (set for
    # each fit by TrainerWiring.callbacks, validation_cadence)
    validates_in_fit = False

    def val_dataloader(self) -> Any:
        """One evaluation request per validation run: always for ``trainer.validate``, during
        ``fit`` when ``evaluation_interval`` or the Trainer's ``check_val_every_n_epoch`` /
        ``val_check_interval`` is set."""
        validating = self._trainer is not None and self.trainer.state.fn == TrainerFn.VALIDATING
        runs = validating or self.evaluation_interval or self.validates_in_fit
        return DataLoader(range(1), batch_size=None) if runs else []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """``evaluation_num_episodes`` greedy episodes on separate envs (per rank under DDP),
        logged at the global env-step count like the training metrics."""
        log_evaluation(self, "val", seed_offset=100_000)

    def test_dataloader(self) -> Any:
        """One evaluation request per ``trainer.test`` (``lightning-rl test``)."""
        return DataLoader(range(1), batch_size=None)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        """``evaluation_num_episodes`` greedy episodes on test envs of their own (seeded apart
        from validation's), logged as ``test/episode_return_mean`` (and ``_min``, ``_max``)."""
        log_evaluation(self, "test", seed_offset=200_000)
