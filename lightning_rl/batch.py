"""Policy batches: named columns of tensors with a common leading dimension.

Column names used across the library (``SampleBatch.OBS`` etc.):

========================  ==================================================
``obs``                   observation the action was taken in
``actions``               action sent to the env (before clipping to bounds)
``rewards``               reward of that step
``terminateds``           the episode ended in a terminal state
``truncateds``            the episode was cut (time limit); not terminal
``next_obs``              observation after the step (off-policy)
``action_logp``           log-probability of the action under the sampler
``vf_preds``              value estimate of ``obs`` under the sampler
``advantages``            GAE advantages (on-policy post-processing)
``value_targets``         targets of the value function
``seq_lens``              lengths of consecutive sequences (recurrent)
``batch_indexes``         replay-buffer indexes of the rows (off-policy)
``weights``               importance weights of the rows (prioritized replay)
``discounts``             ``gamma ** k`` for the bootstrap of an n-step target
``valid``                 ``[T, N]`` of a fragment: False on the reset rows of autoreset
``bootstrap_obs``         ``[N]`` of a fragment: the observation after its last step
``bootstrap_<input>``     ``[N]`` of a fragment: a recurrent policy's input after it
========================  ==================================================

A *fragment* is time-major: ``[T, N]`` columns of ``T`` steps of ``N`` envs, and ``[N]``
``bootstrap_*`` columns, what the learner reads after the last step (``docs/design.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from lightning_rl.functional import moments, standardized

DEFAULT_POLICY_ID = "default_policy"
BOOTSTRAP = "bootstrap_"  # prefix of a fragment's [N] columns: what is read after its last step
# what a recurrent policy reads besides the observation (and returns: state_out), per step
STATE_IN, STATE_OUT, EPISODE_STARTS = "state_in", "state_out", "episode_starts"
PREV_ACTIONS, PREV_REWARDS = "prev_actions", "prev_rewards"

_Index = slice | Tensor | np.ndarray | Sequence[int]


class SampleBatch(dict):
    """A dict of column name -> tensor, all with the same leading dimension ``count``.

    ``batch["obs"]`` returns a column; ``batch[idx]`` with a slice, index tensor or
    array returns a new ``SampleBatch`` of those rows.
    """

    OBS = "obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    NEXT_OBS = "next_obs"
    ACTION_LOGP = "action_logp"
    VF_PREDS = "vf_preds"
    ADVANTAGES = "advantages"
    VALUE_TARGETS = "value_targets"
    MASK = "mask"  # 0/1 rows of a padded minibatch that count in the loss
    SEQ_LENS = "seq_lens"
    BATCH_INDEXES = "batch_indexes"
    WEIGHTS = "weights"
    DISCOUNTS = "discounts"
    VALID = "valid"  # a fragment's real transitions (not the reset rows of next-step autoreset)
    BOOTSTRAP_OBS = BOOTSTRAP + "obs"

    def __init__(self, columns: Mapping[str, Tensor] | None = None, **kwargs: Tensor) -> None:
        super().__init__()
        for key, value in {**(columns or {}), **kwargs}.items():
            self[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(value, Tensor):
            value = torch.as_tensor(value)
        super().__setitem__(key, value)

    def __getitem__(self, key: str | _Index) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return super().__getitem__(key)
        return self.select(key)

    @property
    def count(self) -> int:
        """Number of rows (env or agent steps); ``seq_lens`` is not a row column."""
        for key, value in self.items():
            if key != self.SEQ_LENS:
                return int(value.shape[0])
        return 0

    def __len__(self) -> int:  # a batch's length is its row count, like a tensor's
        return self.count

    def num_columns(self) -> int:
        return dict.__len__(self)

    def select(self, index: _Index) -> SampleBatch:
        """Rows at ``index`` (slice, bool mask, or integer indices) as a new batch."""
        if isinstance(index, np.ndarray):
            index = torch.from_numpy(index)
        elif not isinstance(index, (slice, Tensor)):
            index = torch.as_tensor(index, dtype=torch.long)
        out = SampleBatch()
        for key, value in self.items():
            if key == self.SEQ_LENS:
                continue
            dict.__setitem__(out, key, value[index])
        return out

    @staticmethod
    def concat_samples(batches: Sequence[SampleBatch]) -> SampleBatch:
        """Concatenate batches row-wise; all must have the same columns."""
        if not batches:
            return SampleBatch()
        keys = list(batches[0].keys())
        for b in batches[1:]:
            if set(b.keys()) != set(keys):
                raise ValueError(f"cannot concat batches with columns {sorted(keys)} and {sorted(b.keys())}")
        return SampleBatch({k: torch.cat([b[k] for b in batches], dim=0) for k in keys})

    def concat(self, other: SampleBatch) -> SampleBatch:
        return SampleBatch.concat_samples([self, other])

    def _sequence_starts(self) -> Tensor:
        seq_lens = self[self.SEQ_LENS].long()
        return torch.cumsum(seq_lens, 0) - seq_lens

    def shuffle(self, generator: torch.Generator | None = None) -> SampleBatch:
        """Rows in random order; with ``seq_lens`` whole sequences are permuted."""
        if self.SEQ_LENS not in self:
            return self.select(torch.randperm(self.count, generator=generator))
        seq_lens = self[self.SEQ_LENS].long()
        starts = self._sequence_starts()
        order = torch.randperm(len(seq_lens), generator=generator)
        rows = torch.cat([torch.arange(starts[i], starts[i] + seq_lens[i]) for i in order.tolist()])
        out = self.select(rows)
        dict.__setitem__(out, self.SEQ_LENS, seq_lens[order])
        return out

    def minibatches(
        self, size: int, generator: torch.Generator | None = None, shuffle: bool = True
    ) -> Iterator[SampleBatch]:
        """Yield minibatches of ``size`` rows (the last may be smaller).

        With ``seq_lens`` present, minibatches hold whole sequences: a sequence is never
        split, so a minibatch holds sequences until adding the next would exceed ``size``.
        """
        if size <= 0:
            raise ValueError(f"minibatch size must be positive, got {size}")
        batch = self.shuffle(generator) if shuffle else self
        if self.SEQ_LENS not in batch:
            for start in range(0, batch.count, size):
                yield batch.select(slice(start, start + size))
            return
        seq_lens = batch[self.SEQ_LENS].long().tolist()
        first_seq, first_row, rows = 0, 0, 0
        for i, n in enumerate(seq_lens):
            if rows and rows + n > size:
                mb = batch.select(slice(first_row, first_row + rows))
                dict.__setitem__(mb, self.SEQ_LENS, batch[self.SEQ_LENS][first_seq:i])
                yield mb
                first_seq, first_row, rows = i, first_row + rows, 0
            rows += n
        if rows:
            mb = batch.select(slice(first_row, first_row + rows))
            dict.__setitem__(mb, self.SEQ_LENS, batch[self.SEQ_LENS][first_seq:])
            yield mb

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SampleBatch:
        """Every column on ``device``. CPU columns bound for a GPU go through pinned memory
        without blocking, so the copy of a whole batch overlaps the host's next work."""
        device = torch.device(device)
        out = SampleBatch()
        for key, value in self.items():
            if device.type == "cuda" and value.device.type == "cpu":
                value = value.pin_memory().to(device, non_blocking=True)
            else:
                value = value.to(device, non_blocking=non_blocking)
            dict.__setitem__(out, key, value)
        return out

    def as_multi_agent(self) -> MultiAgentBatch:
        """Wrap as a one-policy ``MultiAgentBatch`` under ``"default_policy"``."""
        return MultiAgentBatch({DEFAULT_POLICY_ID: self}, env_steps=self.count)

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self.items())
        return f"SampleBatch(count={self.count}, {cols})"


class Replay(Protocol):
    """Where an off-policy learner draws its minibatches (one per gradient step when prioritized,
    all of an iteration's at once when uniform) and returns the priorities of exactly the rows
    it drew (``ReplayDataModule``)."""

    prioritized_replay: bool

    def sample_minibatch(self, policy_id: str, batch_size: int, beta: float | None = None) -> SampleBatch: ...

    def update_priorities(self, policy_id: str, batch_indexes: Any, td_error: Any) -> None: ...


class MultiAgentBatch:
    """Per-policy ``SampleBatch``es from ``env_steps`` environment steps.

    Learner code treats every batch as multi-agent; single-agent is the one-policy case.
    ``info`` carries what the sampler observed (episode returns, timings) for callbacks;
    it is not training data. ``replay`` (off-policy) is where the learner draws its
    minibatches from, or ``None`` while it may not learn yet.
    """

    def __init__(
        self,
        policy_batches: dict[str, SampleBatch],
        env_steps: int,
        info: dict[str, Any] | None = None,
        replay: Replay | None = None,
    ) -> None:
        self.policy_batches = policy_batches
        self.env_steps = int(env_steps)
        self.info: dict[str, Any] = info or {}
        self.replay = replay

    @property
    def count(self) -> int:
        return self.env_steps

    def agent_steps(self) -> int:
        return sum(b.count for b in self.policy_batches.values())

    def as_multi_agent(self) -> MultiAgentBatch:
        return self

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MultiAgentBatch:
        return MultiAgentBatch(
            {pid: b.to(device, non_blocking) for pid, b in self.policy_batches.items()},
            self.env_steps,
            self.info,
            self.replay,
        )

    def __repr__(self) -> str:
        return f"MultiAgentBatch(env_steps={self.env_steps}, policy_batches={self.policy_batches})"


# ---------------------------------------------------------------- the SGD epochs' minibatches
# Shuffled rows, or whole recurrent sequences, padded to one shape with a 0/1 ``mask`` where one
# shape is needed (the compiled step compiles once; a DDP rank without rows of a policy steps on
# masked-out rows).


def standardize(batch: SampleBatch, fields: Sequence[str], valid: Tensor | None,
                reduce: Callable[[Tensor], Tensor] | None, placeholder: bool = False) -> None:
    """Standardize ``fields`` of ``batch`` in place, ``(x - mean) / max(1e-4, std)``, over the
    ``valid`` rows (all where ``None``); with ``reduce`` (a sum over DDP ranks) the moments are
    the global batch's. A ``placeholder`` batch adds nothing to them."""
    for field in fields:
        if reduce is None and valid is None:
            batch[field] = standardized(batch[field])
            continue
        local = moments(batch[field], valid) * (0.0 if placeholder else 1.0)
        batch[field] = standardized(batch[field], moments=local if reduce is None else reduce(local))


def padded(batch: SampleBatch, rows: Tensor, size: int, keep: int | None = None) -> SampleBatch:
    """``rows`` of ``batch`` padded to ``size`` rows (copies of the first) with a 0/1 ``mask``;
    ``keep=0`` masks out every row."""
    pad = size - rows.numel()
    mask = torch.ones(size, device=rows.device)
    if keep == 0:
        mask.zero_()
    if pad > 0:
        rows = torch.cat([rows, rows[:1].expand(pad)])
        mask[size - pad:] = 0.0
    minibatch = batch.select(rows)
    minibatch[SampleBatch.MASK] = mask
    return minibatch


def shuffled_rows(batch: SampleBatch, num_minibatches: int, size: int, generator: torch.Generator,
                  device: torch.device, pad: bool, placeholder: bool = False) -> Iterator[SampleBatch]:
    """One epoch: the rows shuffled and cut into ``num_minibatches`` minibatches, each padded to
    ``size`` rows where ``pad``; a ``placeholder`` batch (or an empty cut) gives masked-out rows."""
    order = torch.randperm(batch.count, generator=generator).to(device)
    for rows in order.tensor_split(num_minibatches):
        if placeholder or rows.numel() == 0:  # nothing of this policy here this time
            yield padded(batch, torch.zeros(1, dtype=torch.long, device=device), size, keep=0)
        elif pad:
            yield padded(batch, rows, size)
        else:
            yield batch.select(rows)


def shuffled_sequences(batch: SampleBatch, num_minibatches: int, seq_len: int, generator: torch.Generator,
                       device: torch.device) -> Iterator[SampleBatch]:
    """One epoch of a recurrent batch (``[S * seq_len]`` rows, sequence after sequence): whole
    sequences shuffled and cut into ``num_minibatches`` minibatches of the same number of
    sequences (masked-out copies where they do not divide, so every rank and the compiled step
    see one shape), each ``[seq_len, sequences]`` time-major."""
    num_seqs = batch[SampleBatch.SEQ_LENS].numel()
    per = -(-num_seqs // num_minibatches)
    steps = torch.arange(seq_len, device=device)[:, None]
    order = torch.randperm(num_seqs, generator=generator).to(device)
    for seqs in order.tensor_split(num_minibatches):
        keep = torch.ones(per, device=device)
        if seqs.numel() < per:
            keep[seqs.numel():] = 0.0
            seqs = torch.cat([seqs, seqs[:1].expand(per - seqs.numel())])
        minibatch = batch.select((seqs[None, :] * seq_len + steps).flatten())
        minibatch[SampleBatch.MASK] = minibatch[SampleBatch.MASK] * keep.repeat(seq_len)
        yield minibatch

