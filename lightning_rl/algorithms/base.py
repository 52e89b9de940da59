"""Algorithm: the Lightning module every algorithm is.

One Lightning training step is one training iteration on one policy batch (manual
optimization): ``postprocess`` computes the targets, the algorithm's ``learn_on_batch`` does
the update, the counters move. The policies and the action path live in ``policies.py``, the
update step in ``update.py``, the Trainer wiring in ``callbacks/trainer_wiring.py``, checkpoint
state in ``checkpoint.py``, process settings in ``process.py``.
"""

from __future__ import annotations

import multiprocessing.context
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import TrainerFn, TrainerStatus
from pytorch_lightning.utilities import rank_zero_warn
from torch import nn

from lightning_rl.algorithms.common import (
    EnvSettings,
    MultiAgentSettings,
    NetworkSettings,
    OptimizationSettings,
    RunSettings,
)
from lightning_rl.algorithms.state import algorithm_state, restore_algorithm_state
from lightning_rl.batch import MultiAgentBatch
from lightning_rl.callbacks.trainer_wiring import TrainerWiring
from lightning_rl.checkpoint import class_path, loading_class, multi_agent_algorithms, register_algorithm
from lightning_rl.checkpoint_data import check_not_placeholder
from lightning_rl.counters import count_iteration, new_counters, summed_over_ranks
from lightning_rl.data.base import EnvDataModule, IterationStream, lightning_seed, new_generator, rank_seed
from lightning_rl.data.envs import env_spec
from lightning_rl.data.multi_agent import is_multi_agent_env
from lightning_rl.distributed import (
    bypass_ddp_gradient_sync,
    destroy_gloo_group_at_exit,
    multiprocessing_refused,
    world_size,
)
from lightning_rl.evaluation import EpisodeEnds, EvaluationHooks
from lightning_rl.functional import piecewise_linear
from lightning_rl.inference import ActionAPI
from lightning_rl.learner_info import LazyLearnerInfo, LearnerInfoBuilder
from lightning_rl.nonfinite import check_updates
from lightning_rl.policies import Policies
from lightning_rl.process import ProcessSettings
from lightning_rl.settings import (
    check_settings,
    group_of,
    hyperparameters,
    no_caller,
    received_settings,
    resolve_schedule,
    settings,
)
from lightning_rl.update import LossFn, UpdateStep


def _of_policies(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.policies, name), doc=doc)


@settings
class Algorithm(MultiAgentSettings, NetworkSettings, OptimizationSettings, RunSettings, EnvSettings,  # (fields:
                ActionAPI, EvaluationHooks, pl.LightningModule):  # the last base's first)
    """Base of all algorithms: the iteration loop, the counters, the Lightning hooks.

    Subclasses build their networks into ``self.policies`` (``Policies.build``) and their
    default DataModule (``self.default_datamodule``), and implement ``learn_on_batch``.

    Settings are typed dataclass fields (``settings.settings``), each declared once with its
    default and the docstring under it: those every algorithm takes in the groups it inherits
    (``algorithms/common.py``: env and sampling, run, optimization, network, multi-agent), with
    PPO's defaults, the groups several algorithms take there too, and each algorithm's own in its
    class.
    ``__init__`` is the dataclass's (``env`` positional, the others keyword-only); each class's
    ``__post_init__`` (``super().__post_init__()`` first) does what its settings imply.
    """

    def __post_init__(self) -> None:
        received = received_settings(self)  # before anything replaces them (policies: the Policies module)
        pl.LightningModule.__init__(self)
        self.__dict__["_received_settings"] = received  # what save_hyperparameters keeps
        check_settings(self, received)
        self.automatic_optimization = False
        check_not_placeholder("env", self.env)
        check_not_placeholder("policy_mapping_fn", self.policy_mapping_fn)
        seed, vectorization = self.seed, self.vectorization
        # one picklable spec from here on; hparams keep env, env_kwargs
        env = self.env_spec = env_spec(self.env, self.env_kwargs, vectorization)
        # seed=None takes Lightning's seed at setup (take_seed); weights built now are reproducible
        # only if seed_everything already seeded torch's RNG (or they are restored from a checkpoint)
        self._seed_given = seed is not None
        self._weights_seeded = seed is not None or lightning_seed() is not None
        self.lr_points = resolve_schedule("lr_schedule", self.lr_schedule, self.lr, self.total_env_steps,
                                          self.lr_schedule_unset)
        self.evaluation_max_episode_steps = int(self.evaluation_max_episode_steps)
        self._episode_ends = EpisodeEnds()  # says once when no episode ends (evaluation.py)
        self.process_settings = ProcessSettings(self.num_cpu_threads, self.cpu_affinity)
        self.compile = bool(self.compile)
        self.multi_agent = is_multi_agent_env(env)
        if self.multi_agent and not self.supports_multi_agent:
            raise ValueError(f"{type(self).__name__} does not take multi-agent (PettingZoo) envs; "
                             f"{', '.join(multi_agent_algorithms())} do")
        self.policies = Policies(env, self.multi_agent, self.policies, self.policy_mapping_fn,
                                 self.policies_to_train, vectorization)
        # the resolved mapping (a table as a callable, the default one) and the ids fit updates
        self.policy_mapping_fn, self.policies_to_train = self.policies.policy_mapping_fn, self.policies.to_train
        self.counters = new_counters()
        self.global_counters: dict[str, int] = dict(self.counters)
        self.shuffle_generator = new_generator(seed)
        self.learner_generator = new_generator(seed)  # moves to the learner's device in setup()
        self.default_datamodule: EnvDataModule | None = None
        self._default_datamodule_active = False
        self._update_steps: dict[str, UpdateStep] = {}  # built once per fit
        self._pending_datamodule_state: dict[str, Any] | None = None
        self.resume_command: list[str] | None = None  # lightning-rl arguments, for the message after Ctrl-C
        self.save_hyperparameters()

    supports_multi_agent = False  # algorithms whose sampler and learner handle several policies set it
    # what lr_schedule=None means: "linear" decays to 0 at total_env_steps (constant without a budget)
    lr_schedule_unset = "constant"
    # what total_env_steps and schedules count: env steps, or agents' steps (count_steps_by="agent_steps")
    budget_counter = "num_env_steps_sampled"

    policy_spaces = _of_policies("policy_spaces", "``{policy id: (observation space, action space)}``.")
    policy_agents = _of_policies("policy_agents", "``{policy id: [the env's possible agents it acts for]}``.")
    raw_observation_space = _of_policies("raw_observation_space", "The env's own (unflattened) observation space.")
    observation_space = property(lambda self: next(iter(self.policy_spaces.values()))[0],
                                 doc="The first policy's observation space (what single-agent code reads).")
    action_space = property(lambda self: next(iter(self.policy_spaces.values()))[1],
                            doc="The first policy's action space.")

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for a process that multiprocessing is starting (strategy="ddp_spawn" pickles the
        # module into each rank): refused there, in the main process, before any rank starts.
        spawning = multiprocessing.context.get_spawning_popen()
        if spawning is not None:
            raise ValueError(multiprocessing_refused(getattr(spawning, "method", "spawn")))
        return super().__getstate__()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_algorithm(cls)  # checkpoints and the CLI resolve algorithms among the defined ones

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, hparams_file: Any = None,
                             strict: bool | None = None, weights_only: bool | None = None, **kwargs: Any) -> Any:
        """Lightning's ``load_from_checkpoint`` (``kwargs`` override saved settings), the file first
        read safely (``checkpoint.loading_class``): a missing, truncated or foreign file, or another
        algorithm's, is a ``CheckpointError`` naming it and what it holds, and
        ``Algorithm.load_from_checkpoint(path)`` builds the algorithm the file records. torch's
        global random state is left as it was (a resumed fit restores the run's)."""
        target = cls
        if isinstance(checkpoint_path, str | os.PathLike):
            target = loading_class(cls, checkpoint_path)
            weights_only = True if weights_only is None else weights_only  # as loading_class read it
        return super(Algorithm, target).load_from_checkpoint(checkpoint_path, map_location, hparams_file, strict,
                                                             weights_only, **kwargs)

    def save_hyperparameters(self, *args: Any, ignore: Sequence[str] | str | None = None, frame: Any = None,
                             logger: bool = True) -> None:
        """Lightning's ``save_hyperparameters`` of the settings this module was made with
        (``settings.hyperparameters``: callables kept as placeholders); ``frame`` is not read."""
        super().save_hyperparameters(hyperparameters(self, args, ignore), frame=no_caller(), logger=logger)
        # what loggers record (hparams.yaml) beside the settings, so `plot` tells algorithms apart
        self._hparams_initial.setdefault("algorithm", class_path(type(self)))

    # ----------------------------------------------------------------- acting (policies.py)
    def build_policies(self, make: Callable[..., nn.Module], **defaults: Any) -> None:
        """``Policies.build``: one ``make(observation_space, action_space, **settings)`` per policy."""
        self.policies.build(make, self.seed, type(self).__name__, **defaults)

    def env_settings(self) -> EnvSettings:
        """This algorithm's env settings, as its DataModule takes them: the env as one spec
        (``env_spec``, its keyword arguments folded in)."""
        return group_of(EnvSettings, self, env=self.env_spec, env_kwargs=None)

    def check_spaces(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        """Raise if a DataModule's envs do not match the spaces the policies were built for."""
        self.policies.check_spaces(observation_space, action_space)

    def sampling_policy(self, policy_id: str, device: torch.device) -> nn.Module:
        """The policy on ``device`` for sampling: itself, or a refreshed copy in eval mode."""
        return self.policies.sampling_copy(policy_id, device, self.device)

    def exploration_kwargs(self, policy_id: str) -> dict[str, Any]:
        """Extra keyword arguments of an exploring ``compute_actions`` (e.g. DQN's epsilon)."""
        return {}

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
    def training_step(self, batch: MultiAgentBatch | IterationStream, batch_idx: int) -> dict[str, Any]:
        if not isinstance(batch, IterationStream):
            return self.training_iteration(batch)
        # iterations_per_step: each iteration's batch is sampled after the previous update
        learn_time_s, output = 0.0, {}
        move = self.device != batch.datamodule.sampling_device  # as Lightning moves a batch of its own
        for one in batch:
            output = self.training_iteration(self.transfer_batch_to_device(one, self.device, 0) if move else one)
            learn_time_s += output["learn_time_s"]
            if self.trainer.should_stop or 0 < self.trainer.max_steps <= self.trainer.global_step:
                break
        return {**output, "learn_time_s": learn_time_s}

    def training_iteration(self, batch: MultiAgentBatch) -> dict[str, Any]:
        """One training iteration: post-process the batch, learn on it, count it; stops ``fit``
        when the budget is spent."""
        start = time.perf_counter()
        bypass_ddp_gradient_sync(self.trainer)
        batch = self.postprocess(batch.as_multi_agent())
        builder = LearnerInfoBuilder()
        trained = self.learn_on_batch(batch, builder)
        learner_info = LazyLearnerInfo(builder)
        check_updates(self._update_steps.values(), learner_info, self)
        self.policies.version += 1
        count_iteration(self.counters, batch, trained, self.multi_agent)
        self._episode_ends.observe(self, batch)
        self.global_counters = summed_over_ranks(self.counters, self.device)
        self.on_iteration_end(learner_info)
        if self.budget_spent():
            self.trainer.should_stop = True
        return {"learner_info": learner_info, "learn_time_s": time.perf_counter() - start}

    def postprocess(self, batch: MultiAgentBatch) -> MultiAgentBatch:
        """The targets an algorithm computes from what the sampler gave, on the learner (GAE for
        the policy-gradient methods); the batch as it is by default."""
        return batch

    def learn_on_batch(self, batch: MultiAgentBatch, builder: LearnerInfoBuilder) -> int:
        """Update the policies to train on one iteration's batch; add results to ``builder``.
        Returns the number of rows trained on (``num_agent_steps_trained``; single-agent, also
        ``num_env_steps_trained``)."""
        raise NotImplementedError

    def on_iteration_end(self, learner_info: Mapping[str, Any]) -> None:
        """Per-iteration updates after learning, with the global counters of this iteration."""

    def update_step(self, name: str, params: dict[str, nn.Parameter], optimizer: Any, loss_fn: LossFn,
                    grad_clip: float | None, counts_step: bool = True) -> UpdateStep:
        """The ``UpdateStep`` called ``name`` (built on first use in each fit; one per optimizer):
        eager, or compiled with ``compile=True``. ``counts_step=False``: its optimizer steps are not
        Lightning's ``global_step`` (the other optimizers of an update that counts one)."""
        if name not in self._update_steps:
            self._update_steps[name] = UpdateStep(self, params, optimizer, loss_fn, grad_clip, self.compile, name,
                                                  counts_step)
        return self._update_steps[name]

    def policy_optimizer(self, policy_id: str) -> Any:
        optimizers = self.optimizers()
        return optimizers[self.policies_to_train.index(policy_id)] if isinstance(optimizers, list) else optimizers

    def apply_lr(self, *optimizers: torch.optim.Optimizer) -> float:
        """Set this iteration's learning rate (``lr_schedule`` at the global steps) on ``optimizers``."""
        lr = self.current(self.lr_points, self.lr)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        return lr

    def current(self, points: list[tuple[float, float]] | None, constant: float) -> float:
        """A schedule's value at the global steps sampled before this iteration (env steps, or
        agent steps with ``count_steps_by="agent_steps"``; the same on every DDP rank)."""
        return constant if points is None else piecewise_linear(points, self.global_counters[self.budget_counter])

    def budget_spent(self) -> bool:
        """Whether ``total_env_steps`` is reached (by the global counter the budget counts)."""
        return self.total_env_steps is not None and self.global_counters[self.budget_counter] >= self.total_env_steps

    # ---------------------------------------------------------------- Lightning hooks
    @pl.LightningModule.trainer.setter
    def trainer(self, trainer: pl.Trainer | None) -> None:
        # set by trainer.fit/validate/test before Lightning reads the loop limits
        pl.LightningModule.trainer.fset(self, trainer)
        if trainer is not None:
            TrainerWiring.attached(self, trainer)

    def configure_callbacks(self) -> list[pl.Callback]:
        return TrainerWiring.callbacks(self, self._trainer)

    def take_seed(self, seed: int | None) -> None:
        """Seed a module made with ``seed=None`` (at ``setup``, with the seed of ``pl.seed_everything``;
        resuming, with the run's): its generators, its default DataModule, evaluation, and the
        ``seed`` its checkpoints and logged hyperparameters record. ``None`` changes nothing."""
        if seed is None or self._seed_given:
            return
        self.seed = seed
        for hparams in (self.hparams, getattr(self, "_hparams_initial", {})):
            if "seed" in hparams:
                hparams["seed"] = seed
        self.shuffle_generator = new_generator(seed)
        if self.default_datamodule is not None:
            self.default_datamodule.seed = seed

    def setup(self, stage: str) -> None:
        if self.seed is None:
            self.take_seed(lightning_seed())
        # The update's own random numbers (SAC's reparameterized actions) come from a seeded
        # generator on the learner's device, per rank, saved in checkpoints: never from torch's
        # global RNG, which the seed does not reach.
        rank = self.trainer.global_rank if self._trainer is not None else 0
        self.learner_generator = new_generator(rank_seed(self.seed, rank), self.device)
        if world_size() > 1:
            destroy_gloo_group_at_exit()

    def on_fit_start(self) -> None:
        self._update_steps = {}
        if self.seed is not None and not self._weights_seeded:  # seed_everything came after the module was made
            self._weights_seeded = True  # said once
            name = type(self).__name__
            rank_zero_warn(f"{name} was made before seed_everything({self.seed}), without seed=, so its initial "
                           f"weights are unseeded (its envs and sampling follow seed {self.seed}): for a reproducible "
                           f"run call seed_everything before making it, or pass {name}(seed={self.seed})")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        interrupted = self._trainer is not None and self.trainer.state.status == TrainerStatus.INTERRUPTED
        checkpoint["lightning_rl"] = algorithm_state(self, interrupted)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainer = self._trainer
        rank, size = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        fitting = trainer is not None and trainer.state.fn == TrainerFn.FITTING
        if fitting:  # a module made with seed=None continues the run's seed; its weights are the run's
            self.take_seed(checkpoint.get(self.CHECKPOINT_HYPER_PARAMS_KEY, {}).get("seed"))
            self._weights_seeded = True
        self._pending_datamodule_state = restore_algorithm_state(self, checkpoint.get("lightning_rl", {}), rank,
                                                                 size, fitting)

    def extra_state(self) -> dict[str, Any]:
        """Algorithm state saved beside the weights: plain values, identical on every rank."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what ``extra_state`` saved."""


RLModule = Algorithm  # the name before 0.1 (RLlib's RLModule is a network; this is the algorithm)

