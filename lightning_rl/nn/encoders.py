"""Your own network in front of an algorithm's heads, and activations by name or class.

An encoder is any ``nn.Module`` factory that takes the observation space::

    class MyEncoder(nn.Module):
        def __init__(self, observation_space: gym.Space, features: int = 128) -> None: ...
        def forward(self, obs: Tensor) -> Tensor: ...  # [N, *obs_shape] float -> [N, features]

given as the class (or ``functools.partial`` of it), its import path, or - from YAML and
the CLI - the ``class_path``/``init_args`` mapping Lightning's CLI uses for classes::

    model:
      encoder:
        class_path: my_package.nets.MyEncoder
        init_args: {features: 128}

A checkpoint keeps the import path and arguments (never code), so ``load_from_checkpoint``,
``lightning-rl validate`` and ``lightning-rl record`` rebuild the same network.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from lightning_rl.checkpoint_data import check_not_placeholder

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU, "swish": nn.SiLU, "gelu": nn.GELU,
    "leaky_relu": nn.LeakyReLU, "mish": nn.Mish, "softplus": nn.Softplus, "sigmoid": nn.Sigmoid,
    "identity": nn.Identity, "linear": nn.Identity,
}

# Encoders by name (``encoder="nature_cnn"``); a checkpoint keeps the name.
ENCODERS: dict[str, str] = {
    "nature_cnn": "lightning_rl.nn.cnn.NatureCNN",
    "impala_cnn": "lightning_rl.nn.cnn.ImpalaCNN",
    "multi_input": "lightning_rl.nn.cnn.MultiInputEncoder",
}

# Plain data or a class in the annotation, so the CLI reads a YAML mapping as data (a Callable in
# the union would make jsonargparse turn it into a closure no checkpoint can keep). A
# ``functools.partial`` of a class, or any factory, is accepted from Python as well.
EncoderSpec = dict[str, Any] | str | type[nn.Module] | None
Activation = str | type[nn.Module]


def import_path(obj: Any) -> str | None:
    """``"module.QualName"`` that imports back to ``obj``, or None (a lambda, a local class,
    something defined in ``__main__``, which another process cannot import)."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not name or module == "__main__" or "<" in name:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}.{name}" if found is obj else None


def import_object(path: str, what: str) -> Any:
    """The object at ``"package.module.Name"``; errors name ``what`` and the failing import."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"{what} {path!r} is not an import path (package.module.Name)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(f"{what} {path!r}: importing {module_name} failed: {err}") from err
    try:
        return functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise ImportError(f"{what} {path!r}: module {module_name} has no {attr!r}") from None


def resolve_activation(activation: Activation) -> type[nn.Module]:
    """An activation class from a name (``"gelu"``), an import path (``"torch.nn.Hardswish"``)
    or the class itself."""
    if isinstance(activation, type) and issubclass(activation, nn.Module):
        return activation
    if isinstance(activation, str):
        check_not_placeholder("activation", activation)  # a class a checkpoint could not name
        if activation.lower() in ACTIVATIONS:
            return ACTIVATIONS[activation.lower()]
        if "." in activation:
            cls = import_object(activation, "activation")
            if isinstance(cls, type) and issubclass(cls, nn.Module):
                return cls
            raise ValueError(f"activation {activation!r} is {cls!r}, not an nn.Module class")
    raise ValueError(f"unknown activation {activation!r}: use one of {sorted(ACTIVATIONS)}, an nn.Module class "
                     "or its import path")


def activation_hparam(activation: Activation) -> Activation:
    """What a checkpoint keeps of ``activation``: a class as its import path."""
    if isinstance(activation, type):
        return import_path(activation) or activation
    return activation


def encoder_hparam(encoder: EncoderSpec) -> EncoderSpec:
    """What a checkpoint keeps of ``encoder``: plain data (``{"class_path", "init_args"}``)
    wherever the factory is importable; otherwise the factory, which the checkpoint stores as
    a placeholder to be passed again."""
    if encoder is None or isinstance(encoder, (str, dict)):
        return encoder
    func, kwargs = encoder, {}
    if isinstance(encoder, functools.partial) and not encoder.args:
        func, kwargs = encoder.func, dict(encoder.keywords)
    path = import_path(func)
    if path is None:
        return encoder
    return {"class_path": path, "init_args": kwargs} if kwargs else {"class_path": path}


def encoder_factory(encoder: EncoderSpec) -> Callable[[gym.Space], nn.Module] | None:
    """``encoder`` in any accepted form as a callable ``observation_space -> nn.Module``."""
    if encoder is None or callable(encoder):
        return encoder
    if isinstance(encoder, str):
        check_not_placeholder("encoder", encoder)  # a factory a checkpoint could not name: pass it again
        if encoder not in ENCODERS and "." not in encoder:
            raise ValueError(f"unknown encoder {encoder!r}: use one of {', '.join(ENCODERS)}, an nn.Module class "
                             "or its import path")
        encoder = {"class_path": ENCODERS.get(encoder, encoder)}
    if isinstance(encoder, dict) and encoder.get("class_path") in ENCODERS:
        encoder = {**encoder, "class_path": ENCODERS[encoder["class_path"]]}
    if not isinstance(encoder, dict) or "class_path" not in encoder:
        raise ValueError(f"encoder must be an nn.Module factory, its import path or a mapping with class_path "
                         f"(and init_args), got {encoder!r}")
    unknown = set(encoder) - {"class_path", "init_args"}
    if unknown:
        raise ValueError(f"encoder mapping has unknown keys {sorted(unknown)}: use class_path and init_args")
    factory = import_object(encoder["class_path"], "encoder")
    if not callable(factory):
        raise ValueError(f"encoder {encoder['class_path']!r} is {factory!r}, which cannot be called")
    return functools.partial(factory, **dict(encoder.get("init_args") or {}))


def build_encoder(encoder: EncoderSpec, observation_space: gym.Space, input_shape: tuple[int, ...]) -> tuple[
        nn.Module, int]:
    """``(module, output width)``: the user's encoder for ``observation_space``, checked on a
    dummy batch ``[2, *input_shape]``; an error names the encoder and what went wrong."""
    factory = encoder_factory(encoder)
    assert factory is not None
    name = getattr(factory, "func", factory)
    module = factory(observation_space)
    if not isinstance(module, nn.Module):
        raise TypeError(f"encoder {name!r} returned {type(module).__name__}, not an nn.Module")
    out_features = getattr(module, "out_features", None)
    if isinstance(out_features, int):
        return module, out_features
    training = module.training
    try:
        with torch.no_grad():
            out = module.eval()(torch.zeros((2, *input_shape)))
    except Exception as err:
        raise ValueError(f"encoder {name!r} failed on a batch of observations shaped {(2, *input_shape)}: "
                         f"{type(err).__name__}: {err}") from err
    finally:
        module.train(training)
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"encoder {name!r} must map [N, *obs_shape] to [N, features], returned {shape}")
    return module, int(out.shape[1])
