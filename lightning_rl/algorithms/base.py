"""RLModule: the Lightning plumbing every algorithm shares.

One Lightning training step is one training iteration on one policy batch (manual
optimization); the algorithm's ``learn_on_batch`` does the update. The base keeps the
iteration loop, the policies, the one action path (``compute_actions``) and the counters;
process settings (``process.py``), collectives (``distributed.py``), checkpoint safety
(``checkpoint.py``) and inference outside Lightning (``inference.py``) live in modules of
their own.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import os
import time
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

import gymnasium as gym
import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelSummary, TQDMProgressBar
from pytorch_lightning.trainer.states import TrainerFn, TrainerStatus
from pytorch_lightning.utilities import rank_zero_info
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lightning_rl import inference
from lightning_rl.batch import DEFAULT_POLICY_ID, MultiAgentBatch
from lightning_rl.checkpoint import (
    CheckedCheckpointIO,
    algorithm_registry,
    builtin_algorithm,
    callable_placeholder,
    check_not_placeholder,
    class_path,
    pack_rank_states,
    register_algorithm,
    unpack_rank_state,
)
from lightning_rl.data.base import EnvDataModule, eval_mode, new_generator, policy_state, rank_seed
from lightning_rl.data.envs import EnvSpec, env_spaces, env_spec
from lightning_rl.data.multi_agent import agent_spaces, is_multi_agent_env, policy_spaces
from lightning_rl.data.spaces import flatten_observation, flatten_observation_space, is_raw_observation, is_structured
from lightning_rl.distributed import FlatGradients, bypass_ddp_gradient_sync, check_strategy, sum_over_ranks
from lightning_rl.evaluation import evaluate
from lightning_rl.functional import piecewise_linear
from lightning_rl.learner_info import LearnerInfoBuilder
from lightning_rl.nn.encoders import activation_hparam, encoder_hparam
from lightning_rl.nn.recurrent import EPISODE_STARTS, PREV_ACTIONS, PREV_REWARDS, STATE_IN, STATE_OUT
from lightning_rl.process import ProcessSettings
from lightning_rl.update import LossFn, UpdateStep, nonfinite_terms

log = logging.getLogger(__name__)

COUNTER_NAMES = (
    "num_env_steps_sampled",
    "num_env_steps_trained",
    "num_agent_steps_sampled",
    "num_agent_steps_trained",
    "num_iterations",
    "num_grad_updates",
    "num_target_updates",
)


Schedule = str | Sequence[Sequence[float]] | None
# agent id -> policy id: any callable, or a table (plain data, so checkpoints and YAML hold it)
PolicyMapping = dict[str, str] | Callable[[str], str]


def resolve_schedule(
    name: str, schedule: Schedule, initial: float, total_env_steps: int | None, unset: str = "constant"
) -> list[tuple[float, float]] | None:
    """``"constant"`` -> no schedule; ``"linear"`` -> ``initial`` down to 0 over
    ``total_env_steps``; a list of ``[env_step, value]`` points -> piecewise linear. ``None`` (not
    set) -> ``unset``, where ``"linear"`` means linear over a budget and constant without one."""
    if schedule is None:
        schedule = "linear" if unset == "linear" and total_env_steps is not None else "constant"
    if schedule == "constant":
        return None
    if schedule == "linear":
        if total_env_steps is None:
            raise ValueError(f"{name}='linear' decays to 0 over total_env_steps, which is None: set total_env_steps "
                             f"or pass {name}='constant'")
        return [(0.0, initial), (float(total_env_steps), 0.0)]
    if isinstance(schedule, str):
        raise ValueError(f"{name} must be 'constant', 'linear' or a list of [env_step, value], got {schedule!r}")
    points = [(float(t), float(v)) for t, v in schedule]
    if not points or any(b[0] <= a[0] for a, b in pairwise(points)):
        raise ValueError(f"{name} points must be non-empty with increasing env steps, got {schedule!r}")
    return points


def check_positive(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be positive, got {value}")


def check_gamma(gamma: float) -> None:
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")


class MappingTable:
    """A ``policy_mapping_fn`` given as ``{agent_id: policy_id}``; an agent not in it is an error."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = dict(table)

    def __call__(self, agent_id: str) -> str:
        try:
            return self.table[agent_id]
        except KeyError:
            raise ValueError(f"agent {agent_id!r} is not in policy_mapping_fn {self.table}") from None


def default_policy_mapping(agent_id: str) -> str:
    """Every agent acts with the one default policy (parameter sharing)."""
    return DEFAULT_POLICY_ID


def multi_agent_algorithms() -> list[str]:
    """The names of lightning_rl's algorithms whose ``supports_multi_agent`` is set, sorted."""
    return sorted(path.rsplit(".", 1)[-1] for path, cls in algorithm_registry().items()
                  if path.startswith("lightning_rl.algorithms.") and not path.endswith("Module")
                  and cls.supports_multi_agent)


class NonFiniteLossError(FloatingPointError):
    """A loss term became NaN or infinite; raised before the optimizer steps on it."""


class _FitLifecycle(pl.Callback):
    """A failed or interrupted ``fit`` skips ``on_fit_end`` and ``teardown``: give the process
    its threads and CPUs back and close the envs (terminating env worker processes)."""

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not isinstance(pl_module, RLModule):
            return
        pl_module.process_settings.restore()
        dm = pl_module.active_datamodule
        if isinstance(dm, EnvDataModule) and dm is not trainer.datamodule:  # Lightning tells its own
            dm.on_exception(exception)


class RLModule(pl.LightningModule):
    """Base of all algorithms: policies, counters, the action path, the iteration loop.

    Subclasses build ``self.policies`` (a ``ModuleDict`` by policy id) and their default
    DataModule (``self.default_datamodule``, from their own hyperparameters), and implement
    ``learn_on_batch``.

    Args:
        env: a registered gymnasium id or any callable returning a ``gymnasium.Env``
            (lambda, closure, class, ``functools.partial``). ``"module:Env-v0"`` imports
            ``module`` first (the env's registration), as ``gymnasium.make`` does.
        env_kwargs: keyword arguments for ``gymnasium.make(env, ...)`` or the env factory,
            passed wherever envs are made (training, evaluation, recording); plain data, so a
            checkpoint keeps them and reloads the same env.
        total_env_steps: stop ``fit`` once this many env steps were sampled (summed over
            DDP ranks; agents' steps where the algorithm counts steps by agent steps);
            ``None`` leaves stopping to the Trainer's limits.
        seed: seeds network init, action sampling, minibatch shuffling and the envs
            (``seed + 1000 * rank`` under DDP); ``None`` for random.
        num_cpu_threads: torch intra-op threads during ``fit`` (restored afterwards). Small
            MLPs run fastest on one thread, and several threads spin badly on a busy machine
            (rl-zoo sets 1 too); ``None`` leaves torch's setting alone.
        cpu_affinity: under DDP on CPU, pin each local rank to its own share of the CPUs
            this process may use (Linux; restored after ``fit``). Ranks that synchronize
            every minibatch then stop migrating between cores and waiting on each other.
        evaluation_interval: epochs between evaluations (``None`` = no evaluation): Lightning
            validation then plays ``evaluation_num_episodes`` greedy episodes on separate
            envs and logs ``val/episode_return_mean``, which ``ModelCheckpoint(monitor=...)``
            and ``EarlyStopping`` can use.
        compile: run every update step as compiled graphs (``update.py``); where compiling
            cannot work it falls back to eager with one warning. Same results up to float
            rounding; see the README for when it pays.
    """

    def __init__(
        self,
        *,
        env: EnvSpec,
        env_kwargs: dict[str, Any] | None = None,
        total_env_steps: int | None,
        seed: int | None,
        num_cpu_threads: int | None,
        cpu_affinity: bool,
        evaluation_interval: int | None,
        evaluation_num_episodes: int,
        compile: bool = False,
            policies: Sequence[str] | dict[str, dict[str, Any]] | None = None,
        policy_mapping_fn: PolicyMapping | None = None,
        policies_to_train: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        check_not_placeholder("env", env)
        # One picklable spec from here on: hparams keep the plain env and env_kwargs.
        env = env_spec(env, env_kwargs)
        check_not_placeholder("policy_mapping_fn", policy_mapping_fn)
        if isinstance(policy_mapping_fn, dict):  # plain data: a checkpoint keeps it and reloads it
            policy_mapping_fn = MappingTable(policy_mapping_fn)
        if total_env_steps is not None and total_env_steps < 1:
            raise ValueError(f"total_env_steps must be >= 1 or None, got {total_env_steps}")
        check_positive(evaluation_interval=evaluation_interval, evaluation_num_episodes=evaluation_num_episodes)
        self.env_spec = env
        self.total_env_steps = total_env_steps
        self.seed = seed
        self.evaluation_interval = evaluation_interval
        self.evaluation_num_episodes = evaluation_num_episodes
        self.process_settings = ProcessSettings(num_cpu_threads, cpu_affinity)
        self.compile = bool(compile)
        self._update_steps: dict[str, UpdateStep] = {}  # built once per fit
        self.multi_agent = is_multi_agent_env(env)
        if self.multi_agent and not self.supports_multi_agent:
            raise ValueError(f"{type(self).__name__} does not take multi-agent (PettingZoo) envs; "
                             f"{', '.join(multi_agent_algorithms())} do")
        if isinstance(policies, dict):
            self.policy_config = {pid: dict(cfg or {}) for pid, cfg in policies.items()}
        else:
            self.policy_config = {pid: {} for pid in (policies or [DEFAULT_POLICY_ID])}
        if not self.multi_agent and (list(self.policy_config) != [DEFAULT_POLICY_ID] or policy_mapping_fn):
            raise ValueError("policies and policy_mapping_fn need a multi-agent env (a PettingZoo env factory), "
                             f"which env={env!r} is not")
        if self.multi_agent:
            self.policy_mapping_fn = policy_mapping_fn or default_policy_mapping
            self.raw_observation_space: gym.Space | None = None  # agents' spaces are used as they are
            spaces = agent_spaces(env)
            self.policy_spaces = policy_spaces(spaces, list(self.policy_config), self.policy_mapping_fn)
        else:
            self.policy_mapping_fn = None
            raw_obs_space, action_space = env_spaces(env)
            # Dict/Tuple observations arrive flattened (make_vector_env); predict flattens raw ones
            self.raw_observation_space = raw_obs_space  # the env's own; observation_space is the flattened one
            spaces = {"agent_0": (flatten_observation_space(raw_obs_space), action_space)}
            self.policy_spaces = {DEFAULT_POLICY_ID: spaces["agent_0"]}
        self.policy_agents: dict[str, list[str]] = {pid: [] for pid in self.policy_spaces}  # possible agents
        for agent in spaces:
            self.policy_agents[self.policy_mapping_fn(agent) if self.multi_agent else DEFAULT_POLICY_ID].append(agent)
        # the first policy's spaces: what single-agent code reads
        self.observation_space, self.action_space = next(iter(self.policy_spaces.values()))
        self.counters: dict[str, int] = dict.fromkeys(COUNTER_NAMES, 0)
        self.global_counters: dict[str, int] = dict(self.counters)
        self.policies = nn.ModuleDict()
        self.policies_to_train: list[str] = list(policies_to_train or self.policy_config)
        unknown = [p for p in self.policies_to_train if p not in self.policy_config]
        if unknown:
            raise ValueError(f"policies_to_train names {unknown}, which are not among the policies "
                             f"{list(self.policy_config)}")
        self.shuffle_generator = new_generator(seed)
        self.learner_generator = new_generator(seed)  # moves to the learner's device in setup()
        self.default_datamodule: EnvDataModule | None = None
        self._default_datamodule_active = False
        self._sampling_copies: dict[tuple[str, torch.device], tuple[int, nn.Module]] = {}
        self._flat_grads: dict[Any, FlatGradients] = {}  # by optimizer, laid out once per fit
        self._weights_version = 0
        self._pending_datamodule_state: dict[str, Any] | None = None
        self._resumed_without_sampler_state = False
        self.resume_command: list[str] | None = None  # lightning-rl arguments, for the message after Ctrl-C

    supports_multi_agent = False  # algorithms whose sampler and learner handle several policies set it
    # what lr_schedule=None means: "linear" decays to 0 at total_env_steps (constant without a budget)
    lr_schedule_unset = "constant"
    # what total_env_steps and schedules count: env steps, or agents' steps (count_steps_by="agent_steps")
    budget_counter = "num_env_steps_sampled"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_algorithm(cls)  # checkpoints and the CLI resolve algorithms among the defined ones

    def save_hyperparameters(self, *args: Any, ignore: Sequence[str] | str | None = None, frame: Any = None,
                             logger: bool = True) -> None:
        """Lightning's ``save_hyperparameters``, except that callable hyperparameters (an env
        factory, a lambda) are kept as a ``"<callable name>"`` placeholder: Lightning would drop
        the ones it cannot pickle, and a checkpoint that holds code cannot load safely."""
        frame = frame if frame is not None else inspect.currentframe().f_back
        init_args = {k: v for k, v in frame.f_locals.items() if k not in ("self", "__class__")}
        ignore = [ignore] if isinstance(ignore, str) else list(ignore or [])
        # an importable encoder or activation class is kept as its import path: plain data that reloads
        as_data = {k: f(init_args[k]) for k, f in (("encoder", encoder_hparam), ("activation", activation_hparam))
                   if k in init_args and k not in ignore}
        as_data = {k: v for k, v in as_data.items() if not callable(v)}
        callables = {k: v for k, v in init_args.items() if callable(v) and k not in ignore and k not in as_data}
        replaced = {**as_data, **{k: callable_placeholder(v) for k, v in callables.items()}}
        super().save_hyperparameters(*args, ignore=ignore + list(replaced), frame=frame, logger=logger)
        for name, value in replaced.items():
            self._hparams[name] = value
            self._hparams_initial[name] = copy.deepcopy(value)
        # what loggers record (hparams.yaml) beside the settings, so `plot` tells algorithms apart
        self._hparams_initial.setdefault("algorithm", class_path(type(self)))

    # ----------------------------------------------------------------- policies
    def check_spaces(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        """Raise if a DataModule's envs do not match the spaces the policies were built for."""
        if observation_space != self.observation_space or action_space != self.action_space:
            raise ValueError(
                f"the DataModule's envs have spaces {observation_space}, {action_space}, but the "
                f"module was built for {self.observation_space}, {self.action_space}"
            )

    def build_policies(self, make: Callable[..., nn.Module], **defaults: Any) -> None:
        """One network per policy, ``make(observation_space, action_space, **settings)``: the
        algorithm's ``defaults`` overridden by the policy's own settings (``policies={id: {...}}``),
        initialised from ``seed`` without touching torch's global RNG. A policy's settings may only
        override ``defaults``: any other (``normalize_observations`` where the algorithm never
        updates the statistics, a misspelled name) is a ``ValueError`` naming it."""
        for policy_id, settings in self.policy_config.items():
            unknown = sorted(set(settings) - set(defaults))
            if unknown:
                raise ValueError(
                    f"policies[{policy_id!r}] sets {', '.join(unknown)}, which {type(self).__name__} does not take per "
                    f"policy; its per-policy settings are {', '.join(sorted(defaults))}"
                )
        with torch.random.fork_rng():
            if self.seed is not None:
                torch.manual_seed(self.seed)
            for policy_id, (obs_space, action_space) in self.policy_spaces.items():
                settings = {**defaults, **self.policy_config[policy_id]}
                self.policies[policy_id] = make(obs_space, action_space, **settings)

    def sampling_policy(self, policy_id: str, device: torch.device) -> nn.Module:
        """The policy on ``device`` for sampling: itself, or a copy (in eval mode) whose
        parameters and buffers are refreshed after each iteration. Act with it in eval mode
        (``policy_outputs`` and the DataModules' sampling do)."""
        policy = self.policies[policy_id]
        if device == self.device:  # the policies live on the module's device (cheaper than asking a parameter)
            return policy
        version, policy_copy = self._sampling_copies.get((policy_id, device), (-1, None))
        if policy_copy is None:
            policy_copy = copy.deepcopy(policy).to(device).eval()
        if version != self._weights_version:
            with torch.no_grad():
                for target, source in zip(policy_state(policy_copy), policy_state(policy), strict=True):
                    target.copy_(source)
            self._sampling_copies[(policy_id, device)] = (self._weights_version, policy_copy)
        return policy_copy

    def exploration_kwargs(self, policy_id: str) -> dict[str, Any]:
        """Extra keyword arguments of an exploring ``compute_actions`` (e.g. DQN's epsilon)."""
        return {}

    def policy_outputs(
        self,
        obs: Tensor,
        policy_id: str = DEFAULT_POLICY_ID,
        explore: bool = True,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        inputs: dict[str, Tensor] | None = None,
    ) -> dict[str, Tensor]:
        """The one action path, shared by samplers, evaluation and users: the policy's outputs
        (``actions`` and, for actor-critics, ``action_logp``, ``vf_preds``) for a batch
        ``[N, *obs_shape]``, computed on ``device`` (a refreshed copy when the policy lives
        elsewhere) with the algorithm's exploration when ``explore``. ``inputs``: what a
        recurrent policy reads besides the observation (``state_in``, ``episode_starts``...);
        it then returns ``state_out`` too. The policy acts in eval mode (Dropout off, BatchNorm
        not updated); its submodules' modes are restored after."""
        device = self.device if device is None else torch.device(device)
        policy = self.sampling_policy(policy_id, device)
        kwargs = self.exploration_kwargs(policy_id) if explore else {}
        kwargs.update({k: v.to(device) for k, v in (inputs or {}).items()})
        # (sampling puts the policies in eval mode once per iteration: no per-step walk of the submodules)
        with eval_mode(policy) if policy.training else contextlib.nullcontext():
            return policy.compute_actions(obs.to(device), explore=explore, generator=generator, **kwargs)

    def is_recurrent(self, policy_id: str = DEFAULT_POLICY_ID) -> bool:
        """Whether the policy carries a state between steps (``use_lstm``)."""
        return bool(getattr(self.policies[policy_id], "recurrent", False))

    def initial_state(self, policy_id: str, n: int) -> Tensor:
        """A recurrent policy's state at an episode's start for ``n`` envs (CPU)."""
        return self.policies[policy_id].initial_state(n)

    @torch.no_grad()
    def compute_actions(
        self, obs: np.ndarray | Tensor, policy_id: str = DEFAULT_POLICY_ID, explore: bool = True,
        state: np.ndarray | Tensor | None = None, episode_start: np.ndarray | Tensor | None = None,
        prev_action: np.ndarray | Tensor | None = None, prev_reward: np.ndarray | Tensor | None = None,
    ) -> Any:
        """Actions for a batch ``[N, *obs_shape]`` (or one observation); numpy in, numpy out.
        With a Dict/Tuple observation space, ``obs`` may also be one raw observation or a batch
        in that structure (arrays with a leading ``[N]``): it is flattened as the envs' are.

        A recurrent policy (``use_lstm``) returns ``(actions, next state)``: it reads ``state``
        (``[N, state_size]``; zeros when None), zeroes it where ``episode_start`` (``[N]`` bool),
        and reads the previous action and reward where it was built to (zeros when None)."""
        is_numpy = not isinstance(obs, Tensor)
        raw_space = self.raw_observation_space
        # one Dict/Tuple observation, or a batch of them in that structure
        if is_raw_observation(obs) and raw_space is not None and is_structured(raw_space):
            obs = flatten_observation(obs, raw_space)
        obs_t = torch.as_tensor(np.asarray(obs) if is_numpy else obs)
        single = tuple(obs_t.shape) == tuple(self.policy_spaces[policy_id][0].shape or ())
        if single:
            obs_t = obs_t.unsqueeze(0)
        inputs = None
        if self.is_recurrent(policy_id):
            given = {STATE_IN: state, EPISODE_STARTS: episode_start, PREV_ACTIONS: prev_action,
                     PREV_REWARDS: prev_reward}
            n = obs_t.shape[0]
            inputs = {k: torch.as_tensor(np.asarray(v) if not isinstance(v, Tensor) else v) for k, v in given.items()
                      if v is not None}
            # per env: a row of state or of a Box action, a scalar otherwise
            inputs = {k: v.reshape(n, -1) if k in (STATE_IN, PREV_ACTIONS) else v.reshape(n) for k, v in inputs.items()}
            if STATE_IN in inputs:
                inputs[STATE_IN] = inputs[STATE_IN].float()
        out = self.policy_outputs(obs_t, policy_id, explore=explore, inputs=inputs)
        actions = out["actions"][0] if single else out["actions"]
        if is_numpy:
            actions = actions.cpu().numpy()
            action_space = self.policy_spaces[policy_id][1]
            if isinstance(action_space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
                actions = actions.astype(action_space.dtype)  # what the space's contains() accepts
        if inputs is None:
            return actions
        next_state = out[STATE_OUT][0] if single else out[STATE_OUT]
        return actions, next_state.cpu().numpy() if is_numpy else next_state

    def predict(
        self,
        obs: np.ndarray | Tensor,
        state: Any = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        policy_id: str = DEFAULT_POLICY_ID,
    ) -> tuple[np.ndarray | Tensor, Any]:
        """``(actions, state)`` with Stable-Baselines3's signature (see ``inference.predict``)."""
        return inference.predict(self, obs, state, episode_start, deterministic, policy_id)

    def export_policy(self, path: str | os.PathLike[str], policy_id: str = DEFAULT_POLICY_ID) -> torch.jit.ScriptModule:
        """Save the greedy policy as TorchScript (see ``inference.export_policy``)."""
        return inference.export_policy(self, path, policy_id)

    # ---------------------------------------------------------------- data
    def train_dataloader(self) -> Any:
        # Only called when fit() got no DataModule: the default one built from our hparams.
        dm = self.default_datamodule
        if dm is None:
            raise NotImplementedError(f"{type(self).__name__} builds no default DataModule: pass one to fit()")
        dm.trainer = self.trainer
        dm.connect(self)
        dm.setup("fit")
        if self._pending_datamodule_state is not None:  # resuming: continue the envs where they were
            dm.load_state_dict(self._pending_datamodule_state)
            self._pending_datamodule_state = None
        self._default_datamodule_active = True
        return dm.train_dataloader()

    @property
    def active_datamodule(self) -> pl.LightningDataModule | None:
        """The DataModule feeding this fit: the Trainer's, or the default one."""
        if self._trainer is not None and self.trainer.datamodule is not None:
            return self.trainer.datamodule
        return self.default_datamodule if self._default_datamodule_active else None

    def teardown(self, stage: str) -> None:
        if self._default_datamodule_active and stage == "fit":
            self.default_datamodule.teardown(stage)  # closes the envs; keeps their last state
            self._default_datamodule_active = False

    # ---------------------------------------------------------------- learning
    def postprocess(self, batch: MultiAgentBatch) -> MultiAgentBatch:
        """The targets an algorithm computes from what the sampler gave, on the learner (GAE for
        the policy-gradient methods); the batch as it is by default."""
        return batch

    def learn_on_batch(self, batch: MultiAgentBatch, builder: LearnerInfoBuilder) -> int:
        """Update the policies to train on one iteration's batch; add results to ``builder``.
        Returns the number of rows trained on (``num_agent_steps_trained``; single-agent, also
        ``num_env_steps_trained``)."""
        raise NotImplementedError

    def on_iteration_end(self, learner_info: dict[str, Any]) -> None:
        """Per-iteration updates after learning, with the global counters of this iteration."""

    def current(self, points: list[tuple[float, float]] | None, constant: float) -> float:
        """A schedule's value at the global steps sampled before this iteration (env steps, or
        agent steps with ``count_steps_by="agent_steps"``; the same on every DDP rank)."""
        if points is None:
            return constant
        return piecewise_linear(points, self.global_counters[self.budget_counter])

    @staticmethod
    def set_lr(lr: float, *optimizers: torch.optim.Optimizer) -> float:
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        return lr

    def policy_optimizer(self, policy_id: str) -> Any:
        optimizers = self.optimizers()
        if not isinstance(optimizers, list):
            return optimizers
        return optimizers[self.policies_to_train.index(policy_id)]

    def optimize(
        self, optimizer: Any, loss: Tensor, grad_clip: float | None, terms: dict[str, Tensor] | None = None
    ) -> None:
        """One step: backward of ``loss``, gradients averaged over DDP ranks (only those of the
        parameters ``optimizer`` steps, as one flat all-reduce), norm clipping, step.

        A non-finite loss stops fit before anything is stepped; the error names the first
        non-finite term of ``terms`` (``pg_loss``, ``vf_loss`` ...) and the iteration."""
        if not torch.isfinite(loss):
            bad = [n for n, t in (terms or {}).items() if isinstance(t, Tensor) and not torch.isfinite(t).all()]
            bad = [n for n in bad if n != "total_loss"] or bad  # name the term, not the sum
            raise NonFiniteLossError(
                f"non-finite loss at iteration {self.counters['num_iterations']} "
                f"(env step {self.global_counters['num_env_steps_sampled']}): "
                + (", ".join(f"{n} = {terms[n].detach().float().mean().item()}" for n in bad) if bad
                   else f"loss = {loss.item()}")
                + "; the weights were not stepped"
            )
        grads = self._flat_grads.get(optimizer)
        if grads is None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            grads = self._flat_grads[optimizer] = FlatGradients(params)
        grads.zero()
        self.manual_backward(loss)
        grads.all_reduce()
        if grad_clip is not None:
            self.clip_gradients(optimizer, grad_clip, gradient_clip_algorithm="norm")
        optimizer.step()

    def update_step(
        self, name: str, params: dict[str, nn.Parameter], optimizer: Any, loss_fn: LossFn,
        grad_clip: float | None,
    ) -> UpdateStep:
        """The ``UpdateStep`` called ``name`` (built on first use in each fit): eager, or
        compiled with ``compile=True``."""
        step = self._update_steps.get(name)
        if step is None:
            step = self._update_steps[name] = UpdateStep(
                self, params, optimizer, loss_fn, grad_clip, self.compile, name
            )
        return step

    def check_updates(self, learner_info: dict[str, Any]) -> None:
        """Stop fit if a compiled step met a non-finite loss this iteration (one host read of
        the steps' flags per iteration; the eager step raises at once)."""
        steps = [s for s in self._update_steps.values() if s.ok is not None]
        if not steps or bool(torch.stack([s.ok for s in steps]).all()):
            return
        bad = nonfinite_terms(learner_info)
        bad = [n for n in bad if n != "total_loss"] or bad
        raise NonFiniteLossError(
            f"non-finite loss at iteration {self.counters['num_iterations']} "
            f"(env step {self.global_counters['num_env_steps_sampled']}) in the "
            + ", ".join(repr(s.name) for s in steps if not s.ok) + " update"
            + (f": {', '.join(bad)}" if bad else "")
            + "; the weights were not stepped from that minibatch on"
        )

    def training_step(self, batch: MultiAgentBatch, batch_idx: int) -> dict[str, Any]:
        start = time.perf_counter()
        bypass_ddp_gradient_sync(self.trainer)
        batch = self.postprocess(batch.as_multi_agent())
        builder = LearnerInfoBuilder()
        trained = self.learn_on_batch(batch, builder)
        learner_info = builder.finalize()
        self.check_updates(learner_info)
        self._weights_version += 1
        c = self.counters
        c["num_env_steps_sampled"] += batch.env_steps
        c["num_agent_steps_sampled"] += batch.info.get("agent_steps_sampled", batch.agent_steps())
        # multi-agent: the rows trained are agents' steps; the env steps are the batch's
        c["num_env_steps_trained"] += (batch.env_steps if trained else 0) if self.multi_agent else trained
        c["num_agent_steps_trained"] += trained
        c["num_iterations"] += 1
        self.global_counters = self._counters_over_ranks(c)
        self.on_iteration_end(learner_info)
        if self.total_env_steps is not None and self.global_counters[self.budget_counter] >= self.total_env_steps:
            self.trainer.should_stop = True
        return {"learner_info": learner_info, "learn_time_s": time.perf_counter() - start}

    def _counters_over_ranks(self, counters: dict[str, int]) -> dict[str, int]:
        if self.trainer.world_size == 1:
            return dict(counters)
        local = torch.tensor([counters[k] for k in COUNTER_NAMES], dtype=torch.float64, device=self.device)
        return {k: int(v) for k, v in zip(COUNTER_NAMES, sum_over_ranks(local).tolist())}

    def mean_over_ranks(self, value: float) -> float:
        """``value`` averaged over DDP ranks (itself in one process): for what is adapted from
        learner info (PPO's KL coefficient), so every rank adapts identically."""
        if self.trainer.world_size == 1:
            return value
        total = sum_over_ranks(torch.tensor([value], dtype=torch.float64, device=self.device))
        return float(total.item()) / self.trainer.world_size

    # ---------------------------------------------------------------- evaluation
    def val_dataloader(self) -> Any:
        """One evaluation request per validation run: always for ``trainer.validate``, during
        ``fit`` only when ``evaluation_interval`` is set."""
        validating = self._trainer is not None and self.trainer.state.fn == TrainerFn.VALIDATING
        if not validating and not self.evaluation_interval:
            return []
        return DataLoader(range(1), batch_size=None)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """``evaluation_num_episodes`` greedy episodes on separate envs (per rank under DDP),
        logged at the global env-step count like the training metrics."""
        self._log_evaluation("val", seed_offset=100_000)

    def test_dataloader(self) -> Any:
        """One evaluation request per ``trainer.test`` (``lightning-rl test``)."""
        return DataLoader(range(1), batch_size=None)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        """``evaluation_num_episodes`` greedy episodes on test envs of their own (seeded apart
        from validation's), logged as ``test/episode_return_mean`` (and ``_min``, ``_max``)."""
        self._log_evaluation("test", seed_offset=200_000)

    def _log_evaluation(self, prefix: str, seed_offset: int) -> None:
        returns = evaluate(
            self,
            self.env_spec,
            self.evaluation_num_episodes,
            seed=None if self.seed is None else self.seed + seed_offset + 1000 * self.global_rank,
            vectorization=getattr(self.default_datamodule, "vectorization", "auto"),
        )
        sync = self.trainer.world_size > 1
        self.log(f"{prefix}/episode_return_mean", float(np.mean(returns)), sync_dist=sync, batch_size=1,
                 prog_bar=True)
        self.log(f"{prefix}/episode_return_min", float(np.min(returns)), sync_dist=sync, reduce_fx="min",
                 batch_size=1)
        self.log(f"{prefix}/episode_return_max", float(np.max(returns)), sync_dist=sync, reduce_fx="max",
                 batch_size=1)
        self.log("step", float(self.global_counters["num_env_steps_sampled"]), batch_size=1)

    # ---------------------------------------------------------------- Lightning hooks
    def setup(self, stage: str) -> None:
        # The update's own random numbers (SAC's reparameterized actions) come from a seeded
        # generator on the learner's device, per rank, saved in checkpoints: never from torch's
        # global RNG, which the seed does not reach.
        rank = self.trainer.global_rank if self._trainer is not None else 0
        self.learner_generator = new_generator(rank_seed(self.seed, rank), self.device)

    def on_fit_start(self) -> None:
        trainer = self.trainer
        self.process_settings.apply(trainer.local_rank, trainer.num_devices, self.device.type == "cpu")
        check_strategy(trainer)
        self._flat_grads = {}
        self._update_steps = {}
        # Lightning turns "no limit given" into max_epochs=1000; with an env-step budget the
        # budget is the limit, so lift the epoch cap (a user's explicit max_epochs of 1000
        # is indistinguishable and is lifted too, as documented in the README).
        fit_loop = trainer.fit_loop
        if self.total_env_steps and fit_loop.max_epochs == 1000 and trainer.max_steps == -1:
            fit_loop.max_epochs = -1

    def on_train_start(self) -> None:
        # Resuming a run whose budget is spent trains nothing (Lightning would start another epoch).
        if self.total_env_steps is not None and self.global_counters[self.budget_counter] >= self.total_env_steps:
            rank_zero_info(
                f"{type(self).__name__} already sampled {self.global_counters[self.budget_counter]} of "
                f"total_env_steps={self.total_env_steps}: nothing to train (raise total_env_steps to continue)"
            )
            self.trainer.should_stop = True

    def on_fit_end(self) -> None:
        self.process_settings.restore()

    def configure_callbacks(self) -> list[pl.Callback]:
        from lightning_rl.callbacks import (
            EnvStepProgressBar,
            FinalCheckpoint,
            InterruptCheckpoint,
            KnownWarnings,
            LearnerInfoCallback,
            LogCadence,
            RolloutMetricsCallback,
        )

        if self._trainer is not None:
            self._configure_trainer(self.trainer)
        present = {type(cb) for cb in self.trainer.callbacks} if self._trainer is not None else set()
        callbacks: list[pl.Callback] = [
            cb() for cb in (LearnerInfoCallback, RolloutMetricsCallback, LogCadence, _FitLifecycle, FinalCheckpoint,
                            KnownWarnings)
            if cb not in present
        ]
        if self._trainer is not None:
            if InterruptCheckpoint not in present:
                # in the run's checkpoint folder; the CLI sets resume_command (its arguments)
                callbacks.append(InterruptCheckpoint(resume_command=self.resume_command))
            # Swapped in the Trainer's list, not returned (that prints an "override" notice). Lightning's
            # default bar restarts every epoch; ours counts the run's env steps. The summary at depth 2
            # shows each policy's parameter count, not just the ModuleDict's.
            trainer_callbacks = self.trainer.callbacks
            for i, cb in enumerate(trainer_callbacks):
                if type(cb) is TQDMProgressBar:
                    trainer_callbacks[i] = EnvStepProgressBar.like(cb)
                elif type(cb) is ModelSummary and cb._max_depth == 1:  # Lightning's default
                    trainer_callbacks[i] = ModelSummary(max_depth=2)
        return callbacks

    def _configure_trainer(self, trainer: pl.Trainer) -> None:
        """The two Trainer settings the module owns, set here because this is the first hook
        Lightning calls on the module, before it restores a checkpoint and before callbacks'
        ``setup`` reads the validation cadence (EarlyStopping's ``check_on_train_epoch_end``):
        resuming reads checkpoints safely, and validation runs every ``evaluation_interval`` epochs."""
        strategy = trainer.strategy
        if not isinstance(strategy.checkpoint_io, CheckedCheckpointIO):
            strategy.checkpoint_io = CheckedCheckpointIO(strategy.checkpoint_io, self)
        if self.evaluation_interval is not None:
            trainer.check_val_every_n_epoch = self.evaluation_interval

    # ---------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Plain values and tensors only, so the file loads with weights_only=True. What differs
        # between DDP ranks (counters, RNG, the default DataModule's envs and replay) is
        # gathered per rank; a DataModule given to the Trainer gathers its own (EnvDataModule).
        interrupted = self._trainer is not None and self.trainer.state.status == TrainerStatus.INTERRUPTED
        local = {
            "counters": dict(self.counters),
            "shuffle_generator": self.shuffle_generator.get_state(),
            "learner_generator": self.learner_generator.get_state(),
            "learner_generator_device": self.learner_generator.device.type,
            "torch_rng": torch.get_rng_state(),
        }
        dm_state = self.default_datamodule.state_dict() if self.default_datamodule is not None else None
        checkpoint["lightning_rl"] = {
            "algorithm": class_path(type(self)),
            "base_algorithm": class_path(builtin_algorithm(type(self))),
            "global_counters": dict(self.global_counters),
            "ranks": pack_rank_states(local, interrupted),
            "datamodule": dm_state,
            **self.extra_state(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("lightning_rl", {})
        self.global_counters.update(state.get("global_counters", {}))
        trainer = self._trainer
        rank, size = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        fitting = trainer is not None and trainer.state.fn == TrainerFn.FITTING
        mine = unpack_rank_state(state.get("ranks"), rank, size, "counters and RNG", warn=fitting)
        if mine is not None:
            self.counters.update(mine["counters"])
            self.shuffle_generator.set_state(mine["shuffle_generator"])
            if mine.get("learner_generator_device") == self.learner_generator.device.type:  # same kind of device
                self.learner_generator.set_state(mine["learner_generator"])
            torch.set_rng_state(mine["torch_rng"])
        else:  # another world size: local counters as an even share of the global ones
            self.counters.update({k: v // size for k, v in self.global_counters.items()})
        self._pending_datamodule_state = state.get("datamodule")
        self.load_extra_state(state)

    def extra_state(self) -> dict[str, Any]:
        """Algorithm state saved beside the weights: plain values, identical on every rank."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what ``extra_state`` saved."""
