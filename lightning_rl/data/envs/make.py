"""What to build: an env spec from an env id or a factory (``GymMake``, ``env_spec``), the
registered id behind it and its checks, one env (``make_env``), and the vectorization of the
vector env that ``vector.make_vector_env`` builds from it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import gymnasium as gym

from lightning_rl.data.envs.atari import is_atari_id, make_atari, register_ale
from lightning_rl.data.envs.envpool_env import envpool_task
from lightning_rl.extras import missing_dependency_error

__all__ = ["VECTORIZATIONS", "EnvSpec", "GymMake", "Vectorization", "check_env", "env_id_of", "env_spec", "gym_make",
           "make_env", "resolve_env", "resolve_vectorization"]

Vectorization = Literal["auto", "sync", "async", "vector_entry_point", "envpool"]
VECTORIZATIONS = ("auto", "sync", "async", "vector_entry_point", "envpool")


class GymMake:
    """``gymnasium.make(env_id, **kwargs)`` as a picklable zero-argument factory with a readable
    repr: what a registered id with ``env_kwargs`` becomes, so every place that makes envs (and
    every async worker) makes the same env. The vector-env code knows it is an id, so
    ``vectorization="auto"`` still finds a registered ``vector_entry_point``."""

    __module__ = "lightning_rl.data.envs"  # its public path, and the type name env state records (state.py)

    def __init__(self, env_id: str, kwargs: dict[str, Any] | None = None) -> None:
        self.env_id = env_id
        self.kwargs = dict(kwargs or {})

    def __call__(self, **overrides: Any) -> gym.Env:
        return gym_make(self.env_id, **{**self.kwargs, **overrides})

    def __repr__(self) -> str:
        return f"GymMake({self.env_id!r}, {self.kwargs!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GymMake) and (self.env_id, self.kwargs) == (other.env_id, other.kwargs)

    __hash__ = None  # type: ignore[assignment]  # kwargs are mutable


EnvSpec = str | Callable[[], gym.Env]


def gym_make(env_id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make``, except that an ALE id gets the standard Atari preprocessing
    (``atari.make_atari``; its steps are switched by ``kwargs``) and ALE's banner is not printed
    (once per env process otherwise). An optional dependency the env lacks (Box2D, MuJoCo, ...) is
    an ``ImportError`` naming the env and the extra that installs it."""
    try:
        if is_atari_id(env_id):
            _quiet_ale()
            return make_atari(env_id, **kwargs)
        return gym.make(env_id, **kwargs)
    except (ImportError, gym.error.DependencyNotInstalled) as err:
        missing = missing_dependency_error(err, f"env {env_id!r}")
        if missing is None:
            raise
        raise missing from err


def _quiet_ale() -> None:
    """ALE's logger at warnings and errors only: its info is the ``A.L.E: Arcade Learning
    Environment`` / ``[Powered by Stella]`` banner that every env process would print."""
    try:
        import ale_py
    except ImportError:
        return  # make_atari says what to install
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Warning)


def env_id_of(env: Any) -> str | None:
    """The registered id behind ``env`` (a string or a ``GymMake``), else ``None``."""
    if isinstance(env, str):
        return env
    return env.env_id if isinstance(env, GymMake) else None


def _check_id(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registry entry of ``env_id``; ``"module:Id-v0"`` imports ``module`` first (it
    registers the env), as ``gymnasium.make`` does. Errors name the env and what failed."""
    module, _, name = env_id.rpartition(":")
    if is_atari_id(name):
        register_ale(env_id)
    if module:
        try:
            importlib.import_module(module)
        except Exception as err:  # ModuleNotFoundError, or the module's own error while importing
            why = str(err) if isinstance(err, ImportError) else f"{type(err).__name__}: {err}"
            raise ValueError(f"env {env_id!r}: importing {module} failed: {why}") from err
    try:
        return gym.spec(name)
    except gym.error.Error as err:  # NameNotFound, VersionNotFound, ...
        where = f" (importing {module} did not register it)" if module else ""
        raise ValueError(f"unknown env id {env_id!r}{where}: {err}") from None


def env_spec(env: EnvSpec, env_kwargs: dict[str, Any] | None = None, vectorization: str = "auto") -> EnvSpec:
    """One env spec from ``env`` and its keyword arguments: an id with kwargs becomes a
    ``GymMake``, a callable with kwargs a ``functools.partial``; without kwargs ``env`` is
    returned as it is. A string naming a factory by import path is resolved first (see
    ``resolve_env``). With ``vectorization="envpool"`` the id is checked against envpool's
    (``resolve_vectorization``), not gymnasium's registry."""
    env = resolve_env(env)
    if vectorization == "envpool":
        resolve_vectorization(env, vectorization)
    if env_kwargs is None:
        return env
    if not isinstance(env_kwargs, dict) or not all(isinstance(k, str) for k in env_kwargs):
        raise TypeError(f"env_kwargs must be a dict with string keys, got {env_kwargs!r}")
    if isinstance(env, str):
        if vectorization != "envpool":
            _check_id(env)
        return GymMake(env, env_kwargs)
    if callable(env):
        return partial(env, **env_kwargs)
    raise TypeError(f"env must be a registered env id or a callable returning a gymnasium.Env, got {env!r}")


def check_env(env: EnvSpec, env_kwargs: dict[str, Any] | None = None, vectorization: str = "auto") -> None:
    """Raise ``ValueError``/``ImportError``/``TypeError`` naming the env if ``env`` cannot be
    resolved: an unknown id, a module that does not import. Makes no env."""
    spec = env_spec(env, env_kwargs, vectorization)
    env_id = env_id_of(spec)
    if env_id is not None and vectorization != "envpool":
        _check_id(env_id)


def resolve_env(env: EnvSpec) -> EnvSpec:
    """A string that is no registered env id but the import path of a callable
    (``"mpe2.simple_spread_v3.parallel_env"``) becomes that callable: how YAML and the CLI
    name an env factory (and the checkpoint keeps the string, which reloads). Anything else
    is returned as it is."""
    if not isinstance(env, str) or ":" in env or env in gym.registry:
        return env
    module_name, _, attr = env.rpartition(".")
    if not module_name:
        return env
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not (module_name + ".").startswith(err.name + "."):
            # the module exists but needs something that is not installed: say so
            raise ImportError(f"env {env!r}: importing {module_name} failed: {err}") from err
        return env  # no such module: the string is an env id (an unknown one is reported later)
    factory = getattr(module, attr, None)
    return factory if callable(factory) else env


def make_env(env: EnvSpec) -> gym.Env:
    """One env from a registered id (or a ``GymMake``) or a zero-argument callable returning a
    ``gymnasium.Env``."""
    env_id = env_id_of(env)
    if env_id is not None:
        _check_id(env_id)
        return gym_make(env_id) if isinstance(env, str) else env()
    if callable(env):
        made = env()
        if not isinstance(made, gym.Env):
            raise TypeError(f"env factory {env!r} returned {type(made).__name__}, not a gymnasium.Env")
        return made
    raise TypeError(f"env must be a registered env id or a callable returning a gymnasium.Env, got {env!r}")


def resolve_vectorization(env: EnvSpec, vectorization: str) -> str:
    """``"auto"`` picks the env's own batched implementation when it registers one, else
    ``"sync"``; never ``"envpool"``, which is asked for by name and takes the ids envpool
    provides (``envpool_env.envpool_task``)."""
    if vectorization not in VECTORIZATIONS:
        raise ValueError(f"vectorization must be one of {VECTORIZATIONS}, got {vectorization!r}")
    env_id = env_id_of(env)
    if vectorization == "envpool":
        if env_id is None:
            raise ValueError(f"vectorization='envpool' builds its envs from an env id (envpool's own), not from "
                             f"{env!r}; use 'sync' or 'async' for env factories")
        envpool_task(env_id)
        return vectorization
    if vectorization != "auto":
        if vectorization == "vector_entry_point" and (env_id is None or _check_id(env_id).vector_entry_point is None):
            raise ValueError(f"env {env!r} registers no vector_entry_point")
        return vectorization
    # ALE's own vector env preprocesses otherwise and autoresets in the same step: not for Atari
    if env_id is not None and _check_id(env_id).vector_entry_point is not None and not is_atari_id(env_id):
        return "vector_entry_point"
    return "sync"
