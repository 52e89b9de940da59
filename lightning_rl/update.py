"""The update step: loss -> gradients -> DDP mean -> norm clipping -> optimizer step.

``UpdateStep`` runs it eagerly (the loss's backward through Lightning, the optimizer's own
``step``) or, with ``compile=True``, as compiled graphs. Small-network updates are bound by
per-op dispatch, not arithmetic, so the compiled step writes the whole update as one
fullgraph function: the loss as a pure function of (parameters, minibatch) differentiated by
``torch.func.grad_and_value``, norm clipping, and Adam/RMSprop as tensor math that updates
the real ``torch.optim`` state tensors in place (so Lightning still checkpoints, restores and
monitors the optimizers, and a run may resume with ``compile`` switched). Learning rates and
schedule values are 0-dim tensors filled before each call, so a schedule never recompiles,
and nothing in the step reads a value back to the host. On CUDA the graph is functional: it
returns the new parameters and optimizer state, which one ``_foreach_copy_`` swaps in after it,
so that inductor's ``reduce-overhead`` mode replays it as CUDA graphs (a graph that mutates its
inputs is not captured); the step counts live on the GPU there for the same reason.

A non-finite loss cannot raise inside a compiled graph without a host sync per step, so the
compiled step keeps an ``ok`` flag on the device: from the first non-finite loss on, the step
leaves parameters and optimizer state untouched, and the learner reads the flag once per
iteration (``nonfinite.check_updates``) and stops fit naming the term. The eager step raises
at once.

Under DDP the compiled step is two graphs around one flat all-reduce of the gradients.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from lightning_rl.compiled_code import shared_code
from lightning_rl.distributed import FlatGradients, world_size
from lightning_rl.nonfinite import NonFiniteLossError, flat_terms, nonfinite_error  # noqa: F401  (the error, importable here as in 0.1.0)

# (params or None for the module's own, minibatch, scalars) -> (loss, aux results)
LossFn = Callable[[dict[str, Tensor] | None, dict[str, Tensor], dict[str, Any]], tuple[Tensor, dict[str, Any]]]

_warned: set[str] = set()
_CPU_OPTIONS = {"size_asserts": False, "alignment_asserts": False, "realize_opcount_threshold": 4}


def call(module: nn.Module, params: Mapping[str, Tensor] | None, *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)``, with ``params`` (names as in ``module.named_parameters()``)
    in place of its own parameters when given: how a loss is written once for both the eager
    step (``params=None``) and the compiled, functional one."""
    if params is None:
        return module(*args, **kwargs)
    return torch.func.functional_call(module, dict(params), args, kwargs)


def policy_loss(loss: Callable[..., tuple[Tensor, dict[str, Any]]], policy_id: str) -> LossFn:
    """An algorithm's ``loss(policy_id, batch, params=None, scalars=None)`` of one policy as an
    ``UpdateStep`` loss. The eager step (``params=None``) lets the loss read its own parameters
    and schedule values; the compiled step passes both, the values as tensors."""
    return functools.partial(_policy_loss, loss, policy_id)


def _policy_loss(loss: Callable[..., Any], policy_id: str, params: dict[str, Tensor] | None, batch: Any,
                 scalars: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
    if params is None:
        return loss(policy_id, batch)
    return loss(policy_id, batch, params, scalars) if scalars else loss(policy_id, batch, params)


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=3)


# The hooks a Lightning backward and optimizer step call (``manual_backward``, ``LightningOptimizer.step``).
_STEP_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")


def hooks_free(owner: Any) -> bool:
    """Whether the eager step may call ``loss.backward()`` and the torch optimizer itself: the
    trainer runs one process in 32-bit precision and neither the module nor a callback overrides
    a hook of Lightning's backward and optimizer step. What Lightning would add is then only
    the hooks' dispatch, about a tenth of a small network's update on the CPU."""
    from pytorch_lightning.plugins.precision import Precision
    from pytorch_lightning.strategies import SingleDeviceStrategy
    from pytorch_lightning.utilities.model_helpers import is_overridden

    trainer = getattr(owner, "_trainer", None)
    if trainer is None or type(trainer.strategy) is not SingleDeviceStrategy:
        return False
    if type(trainer.precision_plugin) is not Precision or is_overridden("backward", owner, pl.LightningModule):
        return False
    return not any(is_overridden(hook, owner, pl.LightningModule) for hook in _STEP_HOOKS) and not any(
        is_overridden(hook, callback, pl.Callback) for callback in trainer.callbacks for hook in _STEP_HOOKS)


def clip_grad_norm(params: list[Tensor], max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_`` in four ops (its per-tensor loop is what a small
    network's update pays on the CPU), with the same result to the bit: the norm of the
    per-tensor norms, gradients scaled by ``max_norm / (norm + 1e-6)`` where that is below 1."""
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))


class _Unsupported(Exception):
    """This optimizer or platform has no compiled step; the update runs eagerly."""


class UpdateStep:
    """One optimizer's update on a loss, eager or compiled.

    Args:
        owner: the ``Algorithm`` (the eager step backpropagates and clips through its Lightning
            API; errors name its counters).
        params: the parameters ``optimizer`` steps, by the names the loss reads them with.
        optimizer: the ``LightningOptimizer`` from ``owner.optimizers()``.
        loss_fn: ``(params, batch, scalars) -> (loss, aux)``; ``params`` is ``None`` in the eager
            step (use the modules' own parameters, e.g. through ``call``). ``aux`` holds the
            detached results to report; its non-finite entries are what an error names.
        grad_clip: max global gradient norm, or ``None``.
        compile: run compiled; falls back to eager with one warning naming the cause.
        name: for messages.
        counts_step: whether the step counts in Lightning's optimizer steps (``trainer.global_step``,
            what ``max_steps`` and ``ModelCheckpoint(every_n_train_steps)`` read). An update that
            steps several optimizers on one minibatch (SAC's temperature, critics and actor)
            counts one of them, so that ``global_step`` counts updates.
    """

    def __init__(
        self,
        owner: Any,
        params: Mapping[str, nn.Parameter],
        optimizer: Any,
        loss_fn: LossFn,
        grad_clip: float | None,
        compile: bool,
        name: str = "update",
        counts_step: bool = True,
    ) -> None:
        self.owner, self.optimizer, self.loss_fn = owner, optimizer, loss_fn
        self.names = [n for n, p in params.items() if p.requires_grad]
        self.params = [params[n] for n in self.names]
        self.grad_clip, self.name, self.counts_step = grad_clip, name, counts_step
        self.compiled = bool(compile)
        self._built = False
        self._ran = False
        self.ok: Tensor | None = None  # False once a non-finite loss was skipped (compiled only)
        self._scalars: dict[str, Tensor] = {}
        self._grads: FlatGradients | None = None  # the eager step's, laid out on first use
        self._direct: bool | None = None  # the eager step bypasses Lightning's hooks (hooks_free)

    # The compiled graph returns the new parameters and optimizer state instead of writing them
    # (None: on CUDA). CUDA graphs replay only graphs that mutate none of their inputs; on the CPU
    # the in-place graph saves the copies.
    functional: bool | None = None

    # ------------------------------------------------------------------ entry point
    def __call__(self, batch: Mapping[str, Any], scalars: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One update on ``batch``; returns the loss's ``aux`` results (tensors on the device)."""
        scalars = dict(scalars or {})
        tensors = {k: v for k, v in batch.items() if isinstance(v, Tensor)}
        if self.compiled:
            try:
                if not self._built:
                    self._build()
                return self._compiled_step(tensors, scalars)
            except Exception as e:
                if self._ran:
                    raise  # it compiled and ran before: this is a real error, not a platform gap
                cause = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                warn_once(f"compile=True: the {self.name} step could not be compiled ({cause[:300]}); "
                          "it runs eagerly instead (same results, slower)")
                self.compiled = False
        loss, aux = self.loss_fn(None, batch, scalars)
        self._eager_step(loss, flat_terms(aux, loss))
        return aux

    def _eager_step(self, loss: Tensor, terms: dict[str, Tensor]) -> None:
        """Backward of ``loss``, gradients averaged over DDP ranks (only those of the parameters
        the optimizer steps, as one flat all-reduce), norm clipping, step. A non-finite loss
        raises before anything is stepped, naming the first non-finite term."""
        if not torch.isfinite(loss):
            bad = [n for n, t in terms.items() if not torch.isfinite(t).all()]
            bad = [n for n in bad if n != "total_loss"] or bad  # name the term, not the sum
            raise nonfinite_error(self.owner, ": " + (", ".join(f"{n} = {terms[n].detach().float().mean().item()}"
                                                             for n in bad) if bad else f"loss = {loss.item()}"))
        if self._grads is None:
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            self._grads = FlatGradients(params)
        self._grads.zero()
        if self._direct is None:
            self._direct = hooks_free(self.owner)
        if self._direct:
            loss.backward()
        else:
            self.owner.manual_backward(loss)
        self._grads.all_reduce()
        if self.grad_clip is not None:
            clip_grad_norm(self._grads.params, self.grad_clip)
        torch_optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
        if not self.counts_step:  # the torch optimizer steps without Lightning's count
            torch_optimizer.step()
        elif self._direct:  # Lightning's count of optimizer steps (global_step) around the torch step
            self.optimizer._on_before_step()
            torch_optimizer.step()
            self.optimizer._on_after_step()
        else:
            self.optimizer.step()

    # ------------------------------------------------------------------ compiled path
    def _build(self) -> None:
        opt = getattr(self.optimizer, "optimizer", self.optimizer)
        self.torch_optimizer = opt
        if len(opt.param_groups) != 1:
            raise _Unsupported("optimizers with several parameter groups")
        group = opt.param_groups[0]
        if {id(p) for p in group["params"]} != {id(p) for p in self.params}:
            raise _Unsupported("the optimizer steps other parameters than the loss's")
        if isinstance(opt, torch.optim.Adam):
            if group.get("amsgrad") or group.get("weight_decay") or group.get("maximize"):
                raise _Unsupported("Adam with amsgrad, weight_decay or maximize")
            self.kind, self.state_keys = "adam", ("exp_avg", "exp_avg_sq")
        elif isinstance(opt, torch.optim.RMSprop):
            if group.get("momentum") or group.get("centered") or group.get("weight_decay") or group.get("maximize"):
                raise _Unsupported("RMSprop with momentum, centered, weight_decay or maximize")
            self.kind, self.state_keys = "rmsprop", ("square_avg",)
        else:
            raise _Unsupported(f"{type(opt).__name__} (only Adam and RMSprop have a compiled step)")
        device = self.params[0].device
        if self.functional is None:
            self.functional = device.type == "cuda"
        for p in self.params:  # the state torch.optim would create on its first step
            state = opt.state[p]
            if "step" not in state:
                state["step"] = torch.tensor(0.0, dtype=torch.float32,
                                             device=device if group.get("fused") or device.type == "cuda" else None)
            elif device.type == "cuda" and state["step"].device != device:
                # a CPU tensor would keep the graph off CUDA graphs; torch.optim reads it on any device
                state["step"] = state["step"].to(device)
            for key in self.state_keys:
                if key not in state:
                    state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
        self.lr = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
        self._lr_value = float(group["lr"])
        self.ok = torch.ones((), dtype=torch.bool, device=device)
        self.hyper = (tuple(group["betas"]), float(group["eps"])) if self.kind == "adam" else (
            float(group["alpha"]), float(group["eps"]))
        # CUDA: replayed as CUDA graphs. CPU (_CPU_OPTIONS): without inductor's checks of each
        # input's size and stride inside the graph (dynamo's guards check them before it runs),
        # ~7% of a small network's update; and with small pointwise results that several loops
        # read computed once (realize_opcount_threshold): inlined, Adam's bias corrections were
        # recomputed with two pows per 16 elements of every parameter, ~20% of DQN's update.
        how: dict[str, Any] = {"mode": "reduce-overhead"} if device.type == "cuda" else {"options": _CPU_OPTIONS}
        self.world = world_size()
        self.distributed = self.world > 1
        if self.distributed:
            self._grads_fn = torch.compile(shared_code(self._grads, self.name), fullgraph=True, **how)
            self._apply_fn = torch.compile(shared_code(self._apply, self.name), fullgraph=True, **how)
        else:
            self._step_fn = torch.compile(shared_code(self._fused_step, self.name), fullgraph=True, **how)
        self._built = True

    def _state_lists(self) -> tuple[list[Tensor], list[list[Tensor]]]:
        state = self.torch_optimizer.state
        steps = [state[p]["step"] for p in self.params]
        return steps, [[state[p][k] for k in self.state_keys] for p in self.params]

    def _tensor_scalars(self, scalars: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in scalars.items():
            if isinstance(value, Tensor):
                out[key] = value
                continue
            t = self._scalars.get(key)
            if t is None:
                t = self._scalars[key] = torch.tensor(float(value), dtype=torch.float32, device=self.lr.device)
            else:
                t.fill_(float(value))
            out[key] = t
        return out

    def _compiled_step(self, batch: dict[str, Tensor], scalars: dict[str, Any]) -> dict[str, Any]:
        lr = float(self.torch_optimizer.param_groups[0]["lr"])
        if lr != self._lr_value:
            self.lr.fill_(lr)
            self._lr_value = lr
        scalars = self._tensor_scalars(scalars)
        params = [p.detach() for p in self.params]
        steps, states = self._state_lists()
        if self.counts_step:
            self.optimizer._on_before_step()  # Lightning's optimizer-step bookkeeping (global_step)
        if self.distributed:
            flat, aux = self._grads_fn(params, batch, scalars)
            torch.distributed.all_reduce(flat)
            new = self._apply_fn(params, steps, states, flat, aux["__loss__"], self.lr, self.ok)
        else:
            aux, new = self._step_fn(params, steps, states, batch, scalars, self.lr, self.ok)
        if new is not None:
            # functional: the graph's outputs are swapped in here, outside it, and the results
            # cloned out of CUDA graphs' memory pool, which the next replay overwrites
            torch._foreach_copy_(_targets(params, steps, states, self.ok), new)
            aux = torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, Tensor) else t, aux)
        if self.counts_step:
            self.optimizer._on_after_step()
        self._ran = True
        aux = dict(aux)
        aux.pop("__loss__", None)
        return aux

    def _loss_and_grads(self, params: list[Tensor], batch: dict[str, Tensor], scalars: dict[str, Any]):
        def loss_of(ps: list[Tensor]) -> tuple[Tensor, dict[str, Any]]:
            loss, aux = self.loss_fn(dict(zip(self.names, ps)), batch, scalars)
            return loss, aux

        grads, (loss, aux) = torch.func.grad_and_value(loss_of, has_aux=True)(params)
        return grads, loss, {**aux, "__loss__": loss.detach()}

    def _grads(self, params, batch, scalars):
        grads, _, aux = self._loss_and_grads(params, batch, scalars)
        return torch.cat([g.reshape(-1) for g in grads]), aux

    def _apply(self, params, steps, states, flat, loss, lr, ok):
        flat = flat / self.world
        grads = [g.view_as(p) for g, p in zip(flat.split([p.numel() for p in params]), params)]
        return self._optimizer_math(params, steps, states, grads, loss, lr, ok)

    def _fused_step(self, params, steps, states, batch, scalars, lr, ok):
        grads, loss, aux = self._loss_and_grads(params, batch, scalars)
        return aux, self._optimizer_math(params, steps, states, grads, loss, lr, ok)

    def _optimizer_math(self, params, steps, states, grads, loss, lr, ok) -> list[Tensor] | None:
        """Clip, then Adam or RMSprop exactly as ``torch.optim`` computes them; nothing changes
        once ``ok`` is False (a non-finite loss in this fit). In place, returning None; or, with
        ``functional``, the new values of ``self._targets``' tensors, inputs untouched."""
        new = self._new_values(params, steps, states, grads, loss, lr, ok)
        if self.functional:
            return new
        for target, value in zip(_targets(params, steps, states, ok), new):
            target.copy_(value)
        return None

    def _new_values(self, params, steps, states, grads, loss, lr, ok) -> list[Tensor]:
        """The values after one step, in ``_targets``' order (a pure function of its inputs)."""
        good = ok & torch.isfinite(loss)
        if self.grad_clip is not None:
            # torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when above it.
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            coef = (self.grad_clip / (norm + 1e-6)).clamp(max=1.0)
            grads = [g * coef for g in grads]
        new_params, new_steps, new_states = [], [], []
        for p, g, step, state in zip(params, grads, steps, states):
            new_step = step + 1
            if self.kind == "adam":
                (beta1, beta2), eps = self.hyper
                exp_avg, exp_avg_sq = state
                new_avg = exp_avg.lerp(g, 1 - beta1)
                new_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * g * g
                bias1 = 1 - torch.pow(beta1, new_step)
                bias2_sqrt = torch.sqrt(1 - torch.pow(beta2, new_step))
                new_p = p - (lr / bias1) * new_avg / (new_avg_sq.sqrt() / bias2_sqrt + eps)
                new_state = [new_avg, new_avg_sq]
            else:
                alpha, eps = self.hyper
                (square_avg,) = state
                new_sq = square_avg * alpha + (1 - alpha) * g * g
                new_p = p - lr * g / (new_sq.sqrt() + eps)
                new_state = [new_sq]
            new_params.append(torch.where(good, new_p, p))
            new_steps.append(torch.where(good, new_step, step))
            new_states += [torch.where(good, n, old) for n, old in zip(new_state, state)]
        return new_params + new_steps + new_states + [good]


def _targets(params: list[Tensor], steps: list[Tensor], states: list[list[Tensor]], ok: Tensor) -> list[Tensor]:
    """The tensors one step writes, in the order ``UpdateStep._new_values`` returns them."""
    return [*params, *steps, *(t for state in states for t in state), ok]
