"""Checks and schedules shared by the algorithms' settings (validated where each is declared),
and what of them a checkpoint saves."""

from __future__ import annotations

import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

from lightning_rl.checkpoint import callable_placeholder
from lightning_rl.nn.encoders import activation_hparam, encoder_hparam

Schedule = str | Sequence[Sequence[float]] | None


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


def plain_hyperparameters(init_args: dict[str, Any], ignore: list[str]) -> dict[str, Any]:
    """The hyperparameters among ``init_args`` to save as something else than themselves: an
    importable encoder or activation class as its import path (plain data that reloads), any
    other callable (an env factory, a lambda) as its placeholder."""
    as_data = {k: f(init_args[k]) for k, f in (("encoder", encoder_hparam), ("activation", activation_hparam))
               if k in init_args and k not in ignore}
    as_data = {k: v for k, v in as_data.items() if not callable(v)}
    callables = {k: v for k, v in init_args.items() if callable(v) and k not in ignore and k not in as_data}
    return {**as_data, **{k: callable_placeholder(v) for k, v in callables.items()}}


# The one-line description of each setting several algorithms take, declared here once: an
# algorithm's own docstring lists only the settings it describes otherwise or alone, and
# ``document_settings`` writes the whole ``Args:`` section (``help(PPO)``, ``--model.help PPO``).
SETTINGS: dict[str, str] = {
    "env": (
        'gymnasium id (``"module:Id"`` imports ``module`` first) or a callable returning an Env or a '
        'PettingZoo env.'
    ),
    "env_kwargs": "keyword arguments for every env made (training, evaluation, ``record``), kept in checkpoints.",
    "num_envs": "envs stepped in parallel (per process under DDP).",
    "rollout_fragment_length": "env steps per env per iteration (the train batch: ``num_envs`` times this).",
    "total_env_steps": "stop ``fit`` once this many env steps were sampled (over DDP ranks); ``None``: Trainer limits.",
    "iterations_per_epoch": "training iterations per Lightning epoch: the cadence of checkpoints and validation.",
    "iterations_per_step": (
        "training iterations (sampling, then update) run back to back in one Lightning training step, which pays "
        "Lightning's per-step loop once for all: the same results, faster where an iteration is small (A2C; "
        "SAC and TD3 at one env step per iteration)."
    ),
    "seed": "seeds network init, sampling, shuffling and envs (``seed + 1000 * rank``); ``None``: random.",
    "vectorization": "``auto`` (the env's own vector env, if any), ``sync``, ``async``, ``vector_entry_point`` "
                     "or ``envpool`` (envpool's C++ envs for the ids it provides: ALE, classic control, MuJoCo).",
    "sampling_device": "device the policy acts on while sampling (the CPU beats a GPU round trip for small MLPs).",
    "num_cpu_threads": "torch intra-op threads during ``fit`` (restored after; one is fastest for small MLPs, as "
                       "rl-zoo sets); ``None`` leaves torch's setting alone.",
    "cpu_affinity": "under DDP on CPU, pin each local rank to its own share of the CPUs during ``fit`` (Linux).",
    "evaluation_interval": "epochs between greedy evaluations (Lightning validation, ``val/*``); ``None``: none.",
    "evaluation_num_episodes": "greedy episodes per evaluation (validation and test), one per env.",
    "evaluation_max_episode_steps": (
        "steps after which an evaluation, test or ``record`` episode is cut (its return so far counted, with a "
        "warning naming the env) when the env sets no time limit of its own."
    ),
    "check_finite": "raise on a NaN or infinite reward or observation, naming the field, the env and its step.",
    "compile": "run each update step as compiled graphs (same results up to rounding; else eager, with a warning).",
    "lr": "Adam's learning rate.",
    "lr_schedule": "``constant``/``None``, ``linear`` (to 0 at ``total_env_steps``) or ``[[env_step, lr], ...]``.",
    "gamma": "discount factor in (0, 1].",
    "lambda_": "GAE's lambda in [0, 1].",
    "grad_clip": "maximum global norm of the gradients (``None``: no clipping).",
    "standardize_fields": "batch columns standardized per policy batch before SGD: ``(x - mean) / max(1e-4, std)``.",
    "hiddens": "MLP layer sizes of the policy and of the value network (after ``encoder``).",
    "activation": "the MLP's activation: a name such as ``tanh``, an import path or an ``nn.Module`` class.",
    "vf_share_layers": "one MLP trunk for the policy and the value function (else two separate networks).",
    "log_std_init": "initial log standard deviation of the Gaussian policy (``Box`` actions).",
    "vf_loss_coeff": "weight of the value loss.",
    "entropy_coeff": "weight of the entropy bonus.",
    "policies": "multi-agent: policy ids, or ``{id: per-policy settings such as hiddens}``.",
    "policy_mapping_fn": "multi-agent: agent id -> policy id, a callable or an ``{agent: policy}`` table.",
    "policies_to_train": "multi-agent: the policies that learn (``None``: all).",
    "count_steps_by": (
        "``env_steps`` or ``agent_steps``: what the train batch, ``total_env_steps`` and schedules count."
    ),
    "use_lstm": "a recurrent policy: an LSTM cell after each MLP encoder.",
    "lstm_cell_size": "size of the LSTM cell (``use_lstm``).",
    "max_seq_len": "steps per training sequence; divides ``rollout_fragment_length``, at most ``sgd_minibatch_size``.",
    "lstm_use_prev_action": "feed the previous action (one-hot for ``Discrete``) to the LSTM.",
    "lstm_use_prev_reward": "feed the previous reward to the LSTM.",
    "encoder": "network before the MLP: an ``nn.Module`` class or factory of the observation space, or an import path.",
    "normalize_observations": "standardize observations by running statistics kept in the policy.",
    "observation_clip": "clip standardized observations to +- this (``None``: no clip).",
    "normalize_rewards": "divide rewards by the running std of the discounted return.",
    "reward_clip": "clip normalized rewards to +- this (``None``: no clip).",
    "num_workers": "sampler workers (per rank under DDP); 0 samples in the learner process.",
    "sampler_timeout_s": "seconds the learner waits for data (or a Ray actor's placement) before it raises.",
    "restart_failed_workers": "restart a worker that died (with a new seed) instead of raising.",
    "sampler_backend": "``processes`` (children of the learner, shared memory) or ``ray`` (Ray actors, any node).",
    "ray_address": "the Ray cluster the workers join (else ``RAY_ADDRESS``, else a local Ray for the run).",
    "num_cpus_per_worker": "CPUs each Ray actor asks for (``sampler_backend='ray'``; ``None``: 1).",
    "custom_resources_per_worker": "custom Ray resources each actor asks for, e.g. ``{'cpu_node': 1}`` (pins workers).",
    "learner_queue_size": "fragments that may wait for the learner.",
    "broadcast_interval": "training iterations between weight broadcasts to the workers.",
    "max_policy_lag": "drop (and count) fragments sampled over this many iterations before training (``None``: keep).",
    "buffer_size": "replay capacity in transitions (per process).",
    "learning_starts": "env steps (per process) of uniform random actions before learning starts.",
    "num_gradient_steps": "gradient steps per iteration (with ``train_freq``: the replay ratio).",
    "train_batch_size": "replayed rows per gradient step.",
    "n_step": "steps summed into each target (truncation ends the window but still bootstraps).",
    "double_q": "pick the bootstrap action with the online network (double DQN).",
    "dueling": "dueling heads, ``Q = V + A - mean(A)``.",
    "prioritized_replay_alpha": "priority exponent (0: uniform replay).",
    "prioritized_replay_beta": "importance-weight exponent at the start, annealed to 1 over ``total_env_steps``.",
    "prioritized_replay_eps": "added to each ``|td_error|`` so that no priority is 0.",
    "checkpoint_replay_buffer": "keep the replay buffer in checkpoints (exact resume); ``auto``: if it takes <= 1 GiB.",
    "replay_frame_stack": (
        "store stacked frames once (per step; APEX: per worker packet): ``auto`` for uint8 (K, H, W) frames of a "
        "K-frame-stack env."
    ),
    "num_sgd_iter": "training iterations each batch is used for (the reference's ``num_passes``).",
    "minibatch_buffer_size": "batches handed out round robin, each ``num_sgd_iter`` times.",
    "sgd_minibatch_size": "env steps per gradient step, in whole env columns shuffled each pass (``None``: one step).",
    "vtrace_clip_rho_threshold": "V-trace's clip of the importance ratio in the value targets (``None``: no clip).",
    "vtrace_clip_pg_rho_threshold": (
        "V-trace's clip of the importance ratio in the policy gradient (``None``: no clip)."
    ),
    "train_freq": "env steps per env sampled into the replay per iteration.",
    "prioritized_replay": "proportional prioritized replay (a sum tree) with importance weights.",
}

# The packages whose classes' attributes ``dir(PPO)`` (and so ``help(PPO)``) leaves out: Lightning's
# and torch's, about 2,000 lines of help text, documented where they are defined. A user's
# subclass, lightning_rl's classes and ``KEPT_NAMES`` are listed.
FRAMEWORK_PACKAGES = ("builtins", "lightning", "lightning_fabric", "pytorch_lightning", "torch")
KEPT_NAMES = frozenset({"load_from_checkpoint", "__init__", "__doc__", "__module__"})


class AlgorithmType(type):
    """The algorithms' metaclass: ``dir(PPO)``, hence ``help(PPO)``, lists the settings and what
    lightning_rl and a user's subclasses define, plus ``load_from_checkpoint``; the methods of
    ``LightningModule`` and ``nn.Module`` stay inherited and reachable, and ``dir(model)`` (an
    instance, what completion reads) still lists them (``Algorithm.__dir__``)."""

    def __dir__(cls) -> list[str]:
        names = set(KEPT_NAMES)
        for klass in cls.__mro__:
            if klass.__module__.split(".")[0] not in FRAMEWORK_PACKAGES:
                names.update(klass.__dict__)
        return sorted(names)


class SettingsGroup:
    """A group of settings several algorithms take (``algorithms/common.py``): a class whose
    keyword-only ``__init__`` parameters are settings, declared there once; it stores what it
    took and passes the rest on (``super().__init__(**settings)``). An algorithm takes a group by
    inheriting it."""


def declare_settings(cls: type, root: type) -> None:
    """Give ``cls.__init__`` the full signature of ``cls``'s settings, each declared once.

    The settings of ``cls`` are, in order, the root's (``Algorithm.__init__``), those of every
    ``SettingsGroup`` and algorithm class it inherits, then its own: the keyword parameters of
    each class's own ``__init__``, which passes the others on as ``**settings``. A class
    changes an inherited default with ``setting_defaults = {name: value}`` and takes a setting
    out of its signature with ``fixed_settings = {name: value}`` (the value it always passes).
    An ``__init__`` without ``**`` lists all its settings itself (older subclasses do).

    ``help(cls)``, editors' signature help, the CLI (``--model.help``) and ``load_from_checkpoint``
    read that signature; a call is bound to it (unknown names raise), its defaults filled in,
    and every class's ``__init__`` gets the settings by keyword. What the outermost call
    received (the settings of the class instantiated) is kept for ``save_hyperparameters``."""
    params: dict[str, inspect.Parameter] = {}
    for klass in _declaring_classes(cls, root):
        own, complete = _own_settings(klass)
        if complete:
            params = {}
        params.update(own)
        for name, value in klass.__dict__.get("setting_defaults", {}).items():
            if name not in params:
                raise TypeError(f"{klass.__name__}.setting_defaults: {name!r} is not a setting of {klass.__name__}")
            params[name] = params[name].replace(default=value)
        for name in klass.__dict__.get("fixed_settings", {}):
            if params.pop(name, None) is None:
                raise TypeError(f"{klass.__name__}.fixed_settings: {name!r} is not a setting of {klass.__name__}")
    first = next(iter(params), None)
    ordered = [p.replace(kind=p.POSITIONAL_OR_KEYWORD if name == first else p.KEYWORD_ONLY)
               for name, p in params.items()]
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    signature = inspect.Signature([self_param, *ordered])
    cls.__init__ = _bound_init(cls, signature, dict(cls.__dict__.get("fixed_settings", {})))


def _declaring_classes(cls: type, root: type) -> list[type]:
    """The algorithm classes of ``cls``'s MRO from ``root`` down to ``cls``, each preceded by
    the groups it brings in the order its bases list them."""
    order: list[type] = []
    groups: list[type] = []
    for klass in reversed(cls.__mro__):
        if issubclass(klass, root):  # (an algorithm class is a SettingsGroup too when it takes one)
            order += [*groups, klass]
            groups = []
        elif issubclass(klass, SettingsGroup) and klass is not SettingsGroup:
            groups.insert(0, klass)
    return order


def _own_settings(klass: type) -> tuple[dict[str, inspect.Parameter], bool]:
    """The settings ``klass``'s own ``__init__`` declares (types resolved), and whether that
    ``__init__`` lists all its settings (no ``**``)."""
    init = klass.__dict__.get("__init__")
    init = getattr(init, "_declared_by", init)  # the wrapped original of an algorithm class
    if init is None:
        return {}, False
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # a type only importable under TYPE_CHECKING: keep the annotation's text
        hints = {}
    params = list(inspect.signature(init).parameters.values())[1:]
    own = {p.name: p.replace(annotation=hints.get(p.name, p.annotation)) for p in params
           if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return own, not any(p.kind == p.VAR_KEYWORD for p in params)


def _bound_init(cls: type, signature: inspect.Signature, fixed: dict[str, Any]) -> Callable[..., None]:
    original = cls.__dict__.get("__init__")
    declared_by = getattr(original, "_declared_by", original)
    call = declared_by if declared_by is not None else super(cls, cls).__init__

    @functools.wraps(call)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError as err:
            raise TypeError(f"{cls.__name__}: {err}") from None
        bound.apply_defaults()
        settings = {name: value for name, value in bound.arguments.items() if name != "self"}
        self.__dict__.setdefault("_received_settings", settings)  # the outermost call's: the class's settings
        call(self, **settings, **fixed)

    __init__.__signature__ = signature  # type: ignore[attr-defined]
    __init__.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()
                                if p.annotation is not p.empty}
    __init__._declared_by = declared_by  # type: ignore[attr-defined]
    return __init__


def hyperparameters(module: Any, names: Sequence[str] = (), ignore: Sequence[str] | str | None = None
                    ) -> dict[str, Any]:
    """What a checkpoint keeps of the settings ``module`` was made with (those the outermost
    ``__init__`` received, defaults filled in; ``names``: only these; less ``ignore``): callable
    ones (an env factory, a lambda) as a ``"<callable name>"`` placeholder, since Lightning would
    drop the ones it cannot pickle and a checkpoint that holds code cannot load safely; an
    importable encoder or activation class as its import path."""
    ignore = [ignore] if isinstance(ignore, str) else list(ignore or [])
    settings = dict(module.__dict__.get("_received_settings", {}))
    if names:
        settings = {name: settings[name] for name in names}
    settings = {k: v for k, v in settings.items() if k not in ignore}
    return {**settings, **plain_hyperparameters(settings, ignore)}


def no_caller() -> types.FrameType:
    """A frame without a caller: given it, Lightning's ``save_hyperparameters`` looks for no
    ``__init__`` arguments on the stack and keeps exactly the dict it is given."""
    def frame() -> Any:
        yield
    return frame().gi_frame


_ENTRY = re.compile(r"^(\s+)(\w+): (.*)$")


def document_settings(cls: type) -> None:
    """Rewrite ``cls.__doc__``'s ``Args:`` section to describe every parameter of ``cls.__init__``
    in signature order: its own line where the docstring has one, else the line of the nearest
    class it inherits that describes it, else ``SETTINGS``' line. Parameters described nowhere
    are left out (a user's subclass may not document its own)."""
    doc = cls.__doc__ or ""
    lines = doc.split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
    own: dict[str, str] = {}
    if start is None:
        indent = "    "
        while lines and not lines[-1].strip():
            lines.pop()
        head, tail = [*lines, ""], []
        start = len(head)
        head.append(indent + "Args:")
    else:
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        head, end, name = lines[: start + 1], start + 1, None
        entry = indent + "    "
        while end < len(lines):
            line = lines[end]
            match = _ENTRY.match(line)
            if match and match.group(1) == entry:
                name = match.group(2)
                own[name] = match.group(3).strip()
            elif name is not None and line.startswith(entry + " ") and line.strip():
                own[name] += " " + line.strip()  # a continuation line
            else:
                break
            end += 1
        tail = lines[end:]
    cls._setting_docs = dict(own)  # type: ignore[attr-defined]  # what its subclasses inherit
    params = [p.name for p in inspect.signature(cls.__init__).parameters.values()
              if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    entries = [f"{indent}    {p}: {text}" for p in params if (text := setting_description(cls, p))]
    entries += [f"{indent}    {p}: {text}" for p, text in own.items() if p not in params]  # documented elsewhere
    cls.__doc__ = "\n".join([*head, *entries, *tail])


def setting_description(cls: type, name: str) -> str | None:
    """The one-line description of setting ``name`` of ``cls``: the nearest class's in its MRO
    that describes it, else the shared one in ``SETTINGS``."""
    for klass in cls.__mro__:
        text = klass.__dict__.get("_setting_docs", {}).get(name)
        if text:
            return text
    return SETTINGS.get(name)
