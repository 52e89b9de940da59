"""Capture and restore an env's state as plain data, so loading a checkpoint never runs code.

A checkpoint is a file a user may get from anywhere. Pickling the envs into it meant
``pickle.loads`` at load time, which runs whatever the file asks for. Here the state is a tree
of dict / list / tuple / str / int / float / bool / None / ``torch.Tensor`` that
``torch.load(weights_only=True)`` reads, and restoring writes those plain values into a *fresh*
env built from the same hyperparameters: nothing is imported, unpickled, or built from a class
named in the data.

``capture_env_state`` walks the env's object graph by attribute name (vector env, wrappers,
sub-envs, spaces, RNGs): numpy arrays become tensors, RNGs their state, enums their name, and an
object met a second time becomes a reference to the path where it was first met, so shared
objects (``single_action_space`` is the first sub-env's space) stay shared after a restore.
Functions, classes and modules are skipped: the fresh env has its own.

Limits: only state held in Python objects is seen. Objects whose state lives elsewhere (C
structs such as MuJoCo or Box2D worlds, locks, files, sockets, other processes such as
``AsyncVectorEnv``'s workers; a class whose ``env_state_unsupported`` says why, such as
envpool's adapter) raise ``UnsupportedEnvState`` naming the attribute, so the caller
can warn and reset those envs instead of silently restoring wrong state. So does any other
error met while capturing (a type without ``__module__``, such as SWIG's ``SwigPyObject`` in
Box2D envs; a property that raises): capturing raises nothing else. Class and module
attributes are not env state and are not captured.
"""

from __future__ import annotations

import enum
import functools
import multiprocessing.connection
import multiprocessing.process
import random
import subprocess
import types
import typing
from collections import Counter, OrderedDict, defaultdict, deque
from typing import Any

import gymnasium as gym
import numpy as np
import torch

TAG = "__tag__"
_PLAIN = (type(None), bool, int, float, str)
_SKIP = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type,
         functools.partial, np.ufunc)
# Pure-Python wrappers around state held by other processes (files, sockets and locks are C objects).
_OUTSIDE = (gym.vector.AsyncVectorEnv, multiprocessing.process.BaseProcess, multiprocessing.connection.Connection,
            subprocess.Popen)
_SKIPPED = {TAG: "skip"}
_MISSING = object()


class UnsupportedEnvState(Exception):
    """Some of the env's state cannot be captured as plain data (the message names where)."""


def _type_name(x: object) -> str:
    return _class_name(type(x))


def _class_name(cls: type) -> str:
    """``module.qualname``, or what of it the class has (SWIG's ``SwigPyObject`` has no ``__module__``)."""
    try:
        qualname = type.__dict__["__qualname__"].__get__(cls)
    except Exception:
        qualname = "<unnamed type>"
    try:
        return f"{cls.__module__}.{qualname}"
    except Exception:
        return qualname


@functools.cache
def _why_not_plain(cls: type) -> str | None:
    """Why instances of ``cls`` cannot be captured attribute by attribute, or None."""
    if issubclass(cls, _OUTSIDE):
        return "holds state outside Python objects (OS resources or other processes)"
    declared = getattr(cls, "env_state_unsupported", None)  # a class that knows it (envpool_env.py)
    if isinstance(declared, str):
        return declared
    for c in cls.__mro__:
        # Classes written in Python are heap types; C types are static (pybind11's are heap types).
        if c not in (object, typing.Generic) and not (c.__flags__ & (1 << 9) and c.__name__ != "pybind11_object"):
            return f"is implemented in C ({_class_name(c)})"
        slots = c.__dict__.get("__slots__", ())
        if set([slots] if isinstance(slots, str) else slots) - {"__dict__", "__weakref__"}:
            return "keeps attributes in __slots__"
    return None


def _array(x: np.ndarray | np.generic, path: str) -> dict:
    a = np.asarray(x)
    if a.dtype.kind not in "biufc":
        raise UnsupportedEnvState(f"{path}: numpy {type(x).__name__} of dtype {a.dtype}")
    data = torch.from_numpy(np.array(a, dtype=a.dtype.newbyteorder("="), order="C", copy=True))
    return {TAG: "ndarray", "dtype": a.dtype.str, "scalar": isinstance(x, np.generic), "data": data}


def capture_env_state(envs: object) -> dict:
    """The state of ``envs`` (any env object, usually a vector env) as a tree of plain data.

    Raises ``UnsupportedEnvState`` naming the attribute path and type of the first object whose
    state cannot be captured this way, or the path where anything else went wrong; nothing else.
    """
    memo: dict[int, str] = {}
    alive: list[object] = []  # keeps temporaries (RNG states) alive so their ids are not reused

    def cap(x: Any, path: str) -> Any:
        try:
            if type(x) in _PLAIN:
                return x
            if isinstance(x, _SKIP):
                return _SKIPPED
            if isinstance(x, np.generic):  # immutable: never shared by identity
                return _array(x, path)
            if id(x) in memo:
                return {TAG: "ref", "path": memo[id(x)]}
            memo[id(x)] = path
            alive.append(x)
            if isinstance(x, torch.Tensor):
                return x.detach().clone()
            if isinstance(x, np.ndarray):
                return _array(x, path)
            if isinstance(x, enum.Enum):
                return {TAG: "enum", "name": x.name}
            if isinstance(x, np.dtype):
                if np.dtype(x.str) != x:
                    raise UnsupportedEnvState(f"{path}: structured numpy dtype {x}")
                return {TAG: "dtype", "str": x.str}
            if isinstance(x, np.random.Generator):
                return {TAG: "np_generator", "state": cap(x.bit_generator.state, f"{path}.bit_generator.state")}
            if isinstance(x, random.Random) and type(x) is not random.SystemRandom:
                return {TAG: "random", "state": cap(x.getstate(), f"{path}.getstate()")}
            if isinstance(x, deque):
                return {TAG: "deque", "maxlen": x.maxlen, "items": seq(x, path)}
            if type(x) in (list, tuple):
                return {TAG: type(x).__name__, "items": seq(x, path)}
            if type(x) in (dict, OrderedDict, defaultdict, Counter):  # restored into the fresh env's own dict
                keys = [cap(k, f"{path}.keys()[{i}]") for i, k in enumerate(x)]
                if any(k is _SKIPPED for k in keys):
                    raise UnsupportedEnvState(f"{path}: dict keyed by functions or classes")
                return {TAG: "dict", "keys": keys, "values": [cap(v, f"{path}[{k!r}]") for k, v in x.items()]}
            reason = _why_not_plain(type(x)) if hasattr(x, "__dict__") else "is not plain data and has no __dict__"
            if reason is not None:
                raise UnsupportedEnvState(f"{path}: {_type_name(x)} {reason}")
            attrs = {k: cap(v, f"{path}.{k}") for k, v in vars(x).items()}
            return {TAG: "object", "type": _type_name(x), "attrs": attrs}
        except UnsupportedEnvState:
            raise
        except Exception as err:  # whatever an object does when looked at: the innermost path names it
            raise UnsupportedEnvState(f"{path}: {type(err).__name__} while capturing: {err}") from err

    def seq(x: list | tuple | deque, path: str) -> list | dict:
        # Numpy scalars of one type (the episode-statistics queues) travel as one array, not
        # one tensor each: that keeps saving and loading fast.
        if len(x) > 1 and isinstance(x[0], np.generic) and all(type(v) is type(x[0]) for v in x):
            return _array(np.array(list(x)), f"{path}[:]")
        return [cap(v, f"{path}[{i}]") for i, v in enumerate(x)]

    try:
        return cap(envs, "envs")
    except RecursionError as err:  # nested deeper than Python's stack (raised again while naming the path)
        raise UnsupportedEnvState(f"envs: nested too deeply to capture ({err})") from err


def restore_env_state(envs: object, state: dict) -> None:
    """Write ``state`` (from ``capture_env_state``) into ``envs``, a fresh env of the same structure.

    Only plain values are assigned (numbers, strings, numpy arrays rebuilt from tensors, RNG
    states, container contents); objects are restored in place, never created. A structural
    mismatch raises ``ValueError`` naming the path, malformed data ``ValueError`` or ``TypeError``;
    ``envs`` is then partly restored and should be closed and rebuilt.
    """
    done: dict[str, Any] = {}  # path -> restored value, for references

    def res(cur: Any, s: Any, path: str) -> Any:
        if type(s) in _PLAIN:
            return s
        tag = s.get(TAG) if type(s) is dict else "tensor" if isinstance(s, torch.Tensor) else None
        if tag == "ref":
            return done[_str(s["path"], path)]
        if tag == "tensor":
            out = s.detach().clone()
        elif tag == "ndarray":
            dtype = np.dtype(_str(s["dtype"], path))
            if dtype.kind not in "biufc" or not isinstance(s["data"], torch.Tensor):
                raise ValueError(f"{path}: malformed array")
            out = s["data"].detach().cpu().numpy().astype(dtype, copy=True)
            out = out[()] if s["scalar"] is True else out
        elif tag == "enum":
            if not isinstance(cur, enum.Enum):
                raise ValueError(f"{path}: the state holds an enum, the fresh env {_type_name(cur)}")
            out = cur if cur.name == _str(s["name"], path) else type(cur)[s["name"]]
        elif tag == "dtype":
            text = _str(s["str"], path)
            out = cur if isinstance(cur, np.dtype) and cur.str == text else np.dtype(text)
        elif tag == "np_generator":
            out = cur if isinstance(cur, np.random.Generator) else np.random.default_rng()
            out.bit_generator.state = res(_MISSING, s["state"], f"{path}.bit_generator.state")
        elif tag == "random":
            out = cur if isinstance(cur, random.Random) else random.Random()
            out.setstate(res(_MISSING, s["state"], f"{path}.getstate()"))
        elif tag in ("list", "deque"):
            fresh = list(cur) if isinstance(cur, list | deque) else []
            if tag == "list":
                out = cur if isinstance(cur, list) else []
            else:
                out = cur if isinstance(cur, deque) and cur.maxlen == s["maxlen"] else deque(maxlen=s["maxlen"])
            done[path] = out  # before the items, which may refer to it
            items = seq(fresh, s["items"], path)
            out.clear()
            out.extend(items)
        elif tag == "tuple":
            out = tuple(seq(list(cur) if isinstance(cur, tuple) else [], s["items"], path))
        elif tag == "dict":
            out = done[path] = cur if isinstance(cur, dict) else {}
            fresh, keys, values = dict(out), s["keys"], s["values"]
            if type(keys) is not list or type(values) is not list or len(keys) != len(values):
                raise ValueError(f"{path}: malformed dict")
            keys = [res(_MISSING, k, f"{path}.keys()[{i}]") for i, k in enumerate(keys)]
            out.clear()
            out.update({k: keep(fresh.get(k, _MISSING), v, f"{path}[{k!r}]") for k, v in zip(keys, values)})
        elif tag == "object":
            if cur is _MISSING or _type_name(cur) != _str(s["type"], path) or type(s["attrs"]) is not dict:
                found = "nothing" if cur is _MISSING else _type_name(cur)
                raise ValueError(f"{path}: the state holds a {s['type']!r} object, the fresh env {found}")
            out = done[path] = cur
            attrs = vars(cur)
            for name, v in s["attrs"].items():
                attrs[_str(name, path)] = keep(attrs.get(name, _MISSING), v, f"{path}.{name}")
        else:
            raise ValueError(f"{path}: not env state ({type(s).__name__} {tag!r})")
        done[path] = out
        return out

    def seq(fresh: list, items: Any, path: str) -> list:
        if type(items) is dict and items.get(TAG) == "ndarray":  # numpy scalars packed into one array
            return list(res(_MISSING, items, f"{path}[:]"))
        if type(items) is not list:
            raise ValueError(f"{path}: malformed sequence")
        fresh = fresh[: len(items)] + [_MISSING] * (len(items) - len(fresh))
        return [keep(f, v, f"{path}[{i}]") for i, (f, v) in enumerate(zip(fresh, items))]

    def keep(cur: Any, s: Any, path: str) -> Any:
        """A skipped value (a function, a class) stays the fresh env's own."""
        if type(s) is dict and s.get(TAG) == "skip":
            if cur is _MISSING:
                raise ValueError(f"{path}: the fresh env has nothing here")
            return cur
        return res(cur, s, path)

    if type(state) is not dict or state.get(TAG) != "object":
        raise ValueError("not an env state: the top level must be a captured object")
    try:
        res(envs, state, "envs")
    except (KeyError, IndexError) as err:
        raise ValueError(f"malformed env state: missing {err}") from None


def _str(x: Any, path: str) -> str:
    if type(x) is not str:
        raise ValueError(f"{path}: expected a string, got {type(x).__name__}")
    return x
