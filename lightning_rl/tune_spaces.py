"""Search spaces of ``lightning-rl tune``: each setting of an algorithm a distribution, read from
a YAML file or taken from the built-in space of an algorithm (``--search-space ppo``).

A space file maps setting names to distributions::

    lr: {type: float, low: 1e-5, high: 1e-2, log: true}
    num_sgd_iter: {type: int, low: 3, high: 30}
    gamma: {type: categorical, choices: [0.95, 0.99, 0.999]}
    hiddens: {type: categorical, choices: [[64, 64], [256, 256]]}
    num_gradient_steps: {type: same_as, setting: train_freq}

``float`` and ``int`` take ``low``, ``high``, ``log`` (uniform in the logarithm) and ``step``;
``categorical`` any YAML values (lists too: a network's layers); ``same_as`` gives a setting the
value sampled for another (SAC's gradient steps per iteration equal to its env steps, as rl-zoo
ties them). Imports nothing heavy: the command line checks a space before torch is imported.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("float", "int", "categorical", "same_as")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class SpaceError(ValueError):
    """A search space that cannot be sampled, or names a setting the algorithm does not have."""


@dataclass(frozen=True)
class Distribution:
    """How one setting is sampled.

    Args:
        kind: ``float``, ``int``, ``categorical`` or ``same_as``.
        low: the smallest value (``float``, ``int``).
        high: the largest value (``float``, ``int``), included.
        log: sample uniformly in the logarithm (``float``, ``int``; ``low`` must be positive).
        step: sample on a grid ``low, low + step, ...`` (``float``, ``int``; not with ``log``).
        choices: the values to choose among (``categorical``).
        setting: the setting whose sampled value this one takes (``same_as``).
    """

    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    setting: str | None = None


Space = dict[str, Distribution]


def as_number(value: Any) -> Any:
    """YAML 1.1 reads ``1e-5`` and ``1e5`` (no dot) as strings: a number written so is a number, an
    integer when it is integral and has no dot (``1e5`` -> 100000, for integer settings)."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        number = float(value)
        return int(number) if number.is_integer() and "." not in value else number
    return value


def parse_distribution(name: str, raw: Any) -> Distribution:
    """One entry of a space file as a :class:`Distribution`; a :class:`SpaceError` saying what is
    wrong with it otherwise."""
    if not isinstance(raw, Mapping) or raw.get("type") not in KINDS:
        raise SpaceError(f"{name}: expected a distribution such as {{type: float, low: 1e-5, high: 1e-2, log: true}}"
                         f" (type: one of {', '.join(KINDS)}), got {raw!r}")
    kind = raw["type"]
    allowed = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"},
               "categorical": {"choices"}, "same_as": {"setting"}}[kind]
    extra = sorted(set(raw) - allowed - {"type"})
    if extra:
        raise SpaceError(f"{name}: a {kind} distribution takes {', '.join(sorted(allowed))}, not {', '.join(extra)}")
    if kind == "categorical":
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SpaceError(f"{name}: categorical needs a non-empty list of choices, got {choices!r}")
        return Distribution(kind, choices=tuple(as_number(c) for c in choices))
    if kind == "same_as":
        if not isinstance(raw.get("setting"), str):
            raise SpaceError(f"{name}: same_as needs the setting whose value it takes (setting: NAME)")
        return Distribution(kind, setting=raw["setting"])
    low, high, step = (as_number(raw.get(key)) for key in ("low", "high", "step"))
    log = raw.get("log")
    numeric = (int,) if kind == "int" else (int, float)
    for key, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, numeric):
            raise SpaceError(f"{name}: {kind} needs a numeric {key!r}{' (an integer)' if kind == 'int' else ''}, "
                             f"got {value!r}")
    if not low < high:
        raise SpaceError(f"{name}: 'low' must be below 'high', got {low} and {high}")
    if log not in (None, True, False):
        raise SpaceError(f"{name}: 'log' is true or false, got {log!r}")
    if log and low <= 0:
        raise SpaceError(f"{name}: a log distribution needs 'low' > 0, got {low}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, numeric) or step <= 0 or log):
        raise SpaceError(f"{name}: 'step' must be a positive {kind} and cannot go with log: true, got {step!r}")
    return Distribution(kind, low=low, high=high, log=bool(log), step=step)


def parse_space(raw: Any, source: str = "search space") -> Space:
    """A whole space (a mapping of setting names to distributions) from its YAML data."""
    if not isinstance(raw, Mapping) or not raw:
        raise SpaceError(f"{source}: expected a mapping of settings to distributions, got {raw!r}")
    try:
        space = {str(name): parse_distribution(str(name), value) for name, value in raw.items()}
    except SpaceError as err:
        raise SpaceError(f"{source}: {err}") from None
    for name, dist in space.items():
        if dist.kind == "same_as" and (dist.setting not in space or space[dist.setting].kind == "same_as"):
            raise SpaceError(f"{source}: {name}: same_as names {dist.setting!r}, which is no sampled setting of the "
                             "space")
    return space


def load_space(spec: str) -> tuple[str, Space, str | None]:
    """``--search-space``: a YAML file, or the name of a built-in space (``ppo``). Returns the
    space's name (the file's stem or the built-in's), the space, and the algorithm a built-in
    space is for (``None`` for a file)."""
    path = Path(spec)
    if not path.is_file() and spec.lower() in BUILT_IN:
        algorithm, raw = BUILT_IN[spec.lower()]
        return spec.lower(), parse_space(raw, f"--search-space {spec.lower()}"), algorithm
    if not path.is_file():
        raise SpaceError(f"--search-space {spec}: no such file, and no built-in space of that name (the built-in "
                         f"spaces: {', '.join(BUILT_IN)})")
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise SpaceError(f"--search-space {spec}: cannot read it as YAML: {' '.join(str(err).split())}") from None
    return path.stem, parse_space(raw, f"--search-space {spec}"), None


def check_names(space: Space, algorithm: str, settings: Collection[str], source: str) -> None:
    """A :class:`SpaceError` naming the first setting of ``space`` that ``algorithm`` does not take
    (and the setting meant, where one is close)."""
    for name in space:
        if name not in settings:
            close = difflib.get_close_matches(name, list(settings), n=1)
            meant = f"; did you mean {close[0]}?" if close else ""
            raise SpaceError(f"{source}: {algorithm} has no setting {name!r}{meant} (all of them: lightning-rl fit "
                             f"--model.help {algorithm})")


def _primitive(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def suggest(trial: Any, space: Space) -> dict[str, Any]:
    """Sample ``space`` with an Optuna trial: the settings of one run. A categorical's choices
    that are not plain scalars (lists) are offered to Optuna as their JSON text, which is what
    the study stores as the parameter."""
    values: dict[str, Any] = {}
    for name, dist in space.items():
        if dist.kind == "float":
            values[name] = trial.suggest_float(name, float(dist.low), float(dist.high), log=dist.log,
                                               step=None if dist.step is None else float(dist.step))
        elif dist.kind == "int":
            values[name] = trial.suggest_int(name, int(dist.low), int(dist.high), step=int(dist.step or 1),
                                             log=dist.log)
        elif dist.kind == "categorical":
            if all(_primitive(c) for c in dist.choices):
                values[name] = trial.suggest_categorical(name, list(dist.choices))
            else:
                values[name] = json.loads(trial.suggest_categorical(name, [json.dumps(c) for c in dist.choices]))
    for name, dist in space.items():
        if dist.kind == "same_as":
            values[name] = values[dist.setting]
    return {name: values[name] for name in space}


# ----------------------------------------------------------------------------- built-in spaces
# rl-zoo's ranges (utils/hyperparams_opt.py) in this package's setting names, where rl-zoo has the
# algorithm; its learning rate's upper bound of 1 is cut to 1e-2 (rates above diverge: trials spent
# on nothing). IMPALA and APPO after RLlib's tuned examples. A space never samples the env, the
# budget, the number of envs or workers: those are the config's.
_GAMMAS = [0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999]
_LAMBDAS = [0.8, 0.9, 0.92, 0.95, 0.98, 0.99, 1.0]
_GRAD_CLIPS = [0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0, 5.0]
_LR = {"type": "float", "low": 1e-5, "high": 1e-2, "log": True}


def _categorical(*choices: Any) -> dict[str, Any]:
    return {"type": "categorical", "choices": list(choices)}


BUILT_IN: dict[str, tuple[str, dict[str, Any]]] = {
    "ppo": ("PPO", {
        "lr": _LR,
        "gamma": _categorical(*_GAMMAS),
        "lambda_": _categorical(*_LAMBDAS),
        "entropy_coeff": {"type": "float", "low": 1e-8, "high": 0.1, "log": True},
        "clip_param": _categorical(0.1, 0.2, 0.3, 0.4),
        "num_sgd_iter": _categorical(1, 5, 10, 20),
        # rl-zoo's n_steps from 8 and batch_size to 512: a fragment of 128 steps per env keeps every
        # minibatch size valid from num_envs=4 on (a larger minibatch than the batch fails the trial)
        "rollout_fragment_length": _categorical(128, 256, 512, 1024, 2048),
        "sgd_minibatch_size": _categorical(32, 64, 128, 256, 512),
        "grad_clip": _categorical(*_GRAD_CLIPS),
        "vf_loss_coeff": {"type": "float", "low": 0.0, "high": 1.0},
        "hiddens": _categorical([64], [64, 64], [256, 256]),
        "activation": _categorical("tanh", "relu"),
    }),
    "a2c": ("A2C", {
        "lr": _LR,
        "lr_schedule": _categorical("constant", "linear"),
        "gamma": _categorical(*_GAMMAS),
        "lambda_": _categorical(*_LAMBDAS),
        "entropy_coeff": {"type": "float", "low": 1e-8, "high": 0.1, "log": True},
        "vf_loss_coeff": {"type": "float", "low": 0.0, "high": 1.0},
        "rollout_fragment_length": _categorical(8, 16, 32, 64, 128, 256, 512, 1024, 2048),
        "grad_clip": _categorical(*_GRAD_CLIPS),
        "optimizer": _categorical("rmsprop", "adam"),
        "hiddens": _categorical([64, 64], [256, 256]),
        "activation": _categorical("tanh", "relu"),
    }),
    "dqn": ("DQN", {
        "lr": _LR,
        "gamma": _categorical(*_GAMMAS),
        "train_batch_size": _categorical(16, 32, 64, 100, 128, 256, 512),
        "buffer_size": _categorical(10_000, 50_000, 100_000, 1_000_000),
        "epsilon_end": {"type": "float", "low": 0.0, "high": 0.2},
        # rl-zoo's exploration_fraction (0 to 0.5 of the budget), in env steps
        "epsilon_timesteps": {"type": "int", "low": 1_000, "high": 50_000, "log": True},
        "target_network_update_freq": _categorical(1, 1000, 5000, 10_000, 15_000, 20_000),
        "learning_starts": _categorical(0, 1000, 5000, 10_000, 20_000),
        "train_freq": _categorical(1, 4, 8, 16, 128, 256, 1000),
        "num_gradient_steps": _categorical(1, 2, 4, 8),
        "hiddens": _categorical([64], [64, 64], [256, 256]),
    }),
    "sac": ("SAC", {
        "lr": _LR,
        "gamma": _categorical(*_GAMMAS),
        "train_batch_size": _categorical(16, 32, 64, 128, 256, 512, 1024, 2048),
        "buffer_size": _categorical(10_000, 100_000, 1_000_000),
        "learning_starts": _categorical(0, 1000, 10_000, 20_000),
        "train_freq": _categorical(1, 4, 8, 16, 32, 64, 128, 256, 512),
        "num_gradient_steps": {"type": "same_as", "setting": "train_freq"},
        "tau": _categorical(0.001, 0.005, 0.01, 0.02, 0.05, 0.08),
        "hiddens": _categorical([64, 64], [256, 256], [400, 300]),
    }),
    "td3": ("TD3", {
        "lr": _LR,
        "gamma": _categorical(*_GAMMAS),
        "train_batch_size": _categorical(16, 32, 64, 100, 128, 256, 512, 1024, 2048),
        "buffer_size": _categorical(10_000, 100_000, 1_000_000),
        "train_freq": _categorical(1, 4, 8, 16, 32, 64, 128, 256, 512),
        "num_gradient_steps": {"type": "same_as", "setting": "train_freq"},
        "action_noise": _categorical("normal", "ornstein-uhlenbeck", None),
        "action_noise_sigma": {"type": "float", "low": 0.0, "high": 1.0},
        "tau": _categorical(0.001, 0.005, 0.01, 0.02, 0.05, 0.08),
        "hiddens": _categorical([64, 64], [256, 256], [400, 300]),
    }),
    "impala": ("IMPALA", {
        "lr": {"type": "float", "low": 1e-4, "high": 3e-3, "log": True},
        "gamma": _categorical(0.95, 0.98, 0.99, 0.995),
        "entropy_coeff": {"type": "float", "low": 1e-5, "high": 0.05, "log": True},
        "vf_loss_coeff": {"type": "float", "low": 0.1, "high": 1.0},
        "rollout_fragment_length": _categorical(20, 50, 100),
        "train_batch_size": _categorical(500, 1000, 2000),
        "num_sgd_iter": _categorical(1, 2),
        "grad_clip": _categorical(10.0, 40.0),
        "hiddens": _categorical([64, 64], [256, 256]),
    }),
    "appo": ("APPO", {
        "lr": {"type": "float", "low": 1e-4, "high": 3e-3, "log": True},
        "gamma": _categorical(0.95, 0.98, 0.99, 0.995),
        "entropy_coeff": {"type": "float", "low": 1e-5, "high": 0.05, "log": True},
        "vf_loss_coeff": {"type": "float", "low": 0.1, "high": 1.0},
        "clip_param": _categorical(0.1, 0.2, 0.3, 0.4),
        "rollout_fragment_length": _categorical(20, 50, 100),
        "train_batch_size": _categorical(500, 1000, 2000),
        "num_sgd_iter": _categorical(1, 2, 4),
        "grad_clip": _categorical(10.0, 40.0),
        "hiddens": _categorical([64, 64], [256, 256]),
    }),
}
