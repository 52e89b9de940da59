"""LearnerInfoBuilder: one result dict per policy from many learn-on-batch calls.

Whatever the setup (one minibatch or hundreds, one policy or many), the learner
info has the same structure: ``{policy_id: {"learner_stats": {...}, "td_error": ..., ...}}``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from lightning_rl.batch import DEFAULT_POLICY_ID

LEARNER_STATS_KEY = "learner_stats"


def _to_python(value: Any) -> Any:
    """Tensors and numpy scalars to floats / arrays, so results never hold graph or device memory."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        return value.item() if value.numel() == 1 and value.dim() == 0 else value.cpu().numpy()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _is_numeric(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, numbers.Number):
        return True
    return isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.number)


def reduce_leaf(name: str, values: list[Any]) -> Any:
    """Reduce the values one leaf took over all learn-on-batch calls.

    ``td_error`` is concatenated (priorities must survive); ``min_*`` takes the min,
    ``max_*`` the max; numbers (and numeric arrays, over all elements) the nan-mean;
    ``None`` stays ``None`` (``None`` among numbers is skipped); anything else (strings,
    objects) keeps its last value.
    """
    values = [_to_python(v) for v in values]
    if name == "td_error":
        return np.concatenate([np.atleast_1d(np.asarray(v)) for v in values], axis=0)
    if all(v is None for v in values):
        return None
    values = [v for v in values if v is not None]
    if all(isinstance(v, numbers.Real) for v in values):  # the common case, without numpy's per-call cost
        finite = [float(v) for v in values if v == v]
        if not finite:
            return math.nan
        if name.startswith("min_"):
            return min(finite)
        if name.startswith("max_"):
            return max(finite)
        return math.fsum(finite) / len(finite)
    if not all(_is_numeric(v) for v in values):
        return values[-1]
    # Arrays of any shape reduce over all their elements, like scalars.
    arr = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in values])
    if arr.size == 0 or np.isnan(arr).all():
        return math.nan
    if name.startswith("min_"):
        return float(np.nanmin(arr))
    if name.startswith("max_"):
        return float(np.nanmax(arr))
    return float(np.nanmean(arr))


def _reduce_tree(results: list[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    keys: list[str] = []
    for r in results:  # union of keys, in first-seen order
        keys.extend(k for k in r if k not in keys)
    for key in keys:
        values = [r[key] for r in results if key in r]
        if isinstance(values[0], Mapping):
            out[key] = _reduce_tree([v for v in values if isinstance(v, Mapping)])
        else:
            out[key] = reduce_leaf(key, values)
    return out


class LearnerInfoBuilder:
    """Collects learn-on-batch results per policy and reduces them once in ``finalize``."""

    def __init__(self) -> None:
        self._results: dict[str, list[Mapping[str, Any]]] = {}
        self._finalized = False

    def add_learn_on_batch_results(
        self, results: Mapping[str, Any], policy_id: str = DEFAULT_POLICY_ID
    ) -> None:
        """Add one policy's results (a nested dict) from one learn-on-batch call."""
        if self._finalized:
            raise RuntimeError("LearnerInfoBuilder was already finalized; create a new one per iteration")
        self._results.setdefault(policy_id, []).append(results)

    def add_learn_on_batch_results_multi_agent(self, all_policies_results: Mapping[str, Mapping[str, Any]]) -> None:
        """Add ``{policy_id: results}`` from one multi-agent learn-on-batch call."""
        for policy_id, results in all_policies_results.items():
            self.add_learn_on_batch_results(results, policy_id)

    def finalize(self) -> dict[str, dict[str, Any]]:
        """Reduce every policy's results leaf by leaf (see ``reduce_leaf``); call once.

        Tensor results stay on their device until here and come to the host in one transfer
        per device (a ``.item()`` per stat per minibatch would sync hundreds of times per
        iteration on a GPU)."""
        self._finalized = True
        return {pid: _reduce_tree(rs) for pid, rs in _to_host(self._results).items()}


class LazyLearnerInfo(Mapping[str, Any]):
    """``builder.finalize()`` as a read-only mapping, reduced on first read: what a training
    step returns, so that iterations whose learner info nobody reads (not logged, no KL to adapt)
    skip the reduction and its device-to-host transfer."""

    def __init__(self, builder: LearnerInfoBuilder) -> None:
        self._builder: LearnerInfoBuilder | None = builder
        self._info: dict[str, dict[str, Any]] = {}

    def _finalized(self) -> dict[str, dict[str, Any]]:
        if self._builder is not None:
            self._info, self._builder = self._builder.finalize(), None
        return self._info

    def __getitem__(self, policy_id: str) -> dict[str, Any]:
        return self._finalized()[policy_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._finalized())

    def __len__(self) -> int:
        return len(self._finalized())

    def __repr__(self) -> str:
        return repr(self._finalized())


def _collect(tree: Any, out: list[torch.Tensor]) -> None:
    if isinstance(tree, Mapping):
        for v in tree.values():
            _collect(v, out)
    elif isinstance(tree, list):
        for v in tree:
            _collect(v, out)
    elif isinstance(tree, torch.Tensor):
        out.append(tree)


def _to_host(results: dict[str, list[Mapping[str, Any]]]) -> dict[str, list[Mapping[str, Any]]]:
    """The tensors of ``results`` replaced by host copies, fetched with one transfer per device."""
    tensors: list[torch.Tensor] = []
    _collect(results, tensors)
    if not tensors:
        return results
    host: dict[int, Any] = {}
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    for group in groups.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group]).cpu()
        flat = (flat.float() if flat.dtype in (torch.bfloat16, torch.float16) else flat).numpy()  # bf16-mixed stats
        offset = 0
        for t in group:
            n = t.numel()
            host[id(t)] = flat[offset].item() if t.dim() == 0 else flat[offset:offset + n].reshape(t.shape).copy()
            offset += n
    return _replace(results, host)


def _replace(tree: Any, host: dict[int, Any]) -> Any:
    if isinstance(tree, Mapping):
        return {k: _replace(v, host) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_replace(v, host) for v in tree]
    if isinstance(tree, torch.Tensor):
        return host[id(tree)]
    return tree

