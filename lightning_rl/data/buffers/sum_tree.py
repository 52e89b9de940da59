"""Array-based segment trees (sum and min) for prioritized replay.

Our own, because neither numpy nor torch has one: a complete binary tree in one flat
array, node ``i`` with children ``2i`` and ``2i + 1``, root at ``1`` and the ``P`` leaves
(``P`` the power of two >= ``size``) at ``[P, 2P)``. All leaves lie at the same depth, so a
batch of updates or prefix-sum searches walks the tree level by level with one numpy
operation per level for the whole batch: ``O(log P)`` numpy calls, no per-element loop.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

_JUMP_LEVEL = 12  # prefix searches start at the level of 4096 nodes (one searchsorted)


class SegmentTree:
    """``size`` leaves combined by ``op`` (``np.add`` or ``np.minimum``) into every internal node.

    Leaves not yet set (and the padding up to a power of two) hold ``neutral``.
    """

    def __init__(self, size: int, op: Callable[[np.ndarray, np.ndarray], np.ndarray], neutral: float) -> None:
        if size < 1:
            raise ValueError(f"a segment tree needs at least one leaf, got size={size}")
        self.size = int(size)
        self.num_leaves = 1 << (self.size - 1).bit_length()  # P: power of two >= size
        self.depth = self.num_leaves.bit_length() - 1  # levels below the root
        self.op = op
        self.neutral = float(neutral)
        self.tree = np.full(2 * self.num_leaves, self.neutral, dtype=np.float64)

    @property
    def nbytes(self) -> int:
        return self.tree.nbytes

    @property
    def leaves(self) -> np.ndarray:
        """``[size]`` view of the leaf values (write through ``update``, not here)."""
        return self.tree[self.num_leaves : self.num_leaves + self.size]

    def root(self) -> float:
        """``op`` over all leaves."""
        return float(self.tree[1])

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        """Leaf values at ``index`` (``[B]`` ints in ``[0, size)``)."""
        return self.tree.take(np.asarray(index) + self.num_leaves)

    def update(self, index: np.ndarray, values: np.ndarray | float) -> None:
        """Set leaves ``index`` (``[B]``) to ``values`` (``[B]`` or scalar) and refresh their ancestors.

        With repeated indexes the last value wins (numpy assignment order). The lower
        levels are one gather-combine-scatter over the batch each (repeated parents all
        write the same value); once a level has no more nodes than the batch has
        elements, the rest of the tree up to the root is recomputed level by level with
        whole-slice operations, which is cheaper than gathering.
        """
        node = np.asarray(index, dtype=np.int64) + self.num_leaves
        if node.size == 0:
            return
        tree, op = self.tree, self.op
        tree[node] = values
        level_nodes = self.num_leaves
        for _ in range(self.depth):
            if level_nodes <= 2 * max(node.size, 32):
                self._rebuild_above(level_nodes)
                return
            level_nodes >>= 1
            node >>= 1
            left = node << 1
            tree[node] = op(tree.take(left), tree.take(left + 1))

    def _rebuild_above(self, level_nodes: int) -> None:
        """Recompute all nodes above the level that holds ``level_nodes`` nodes."""
        tree, op = self.tree, self.op
        lo = level_nodes >> 1
        while lo >= 1:
            op(tree[2 * lo : 4 * lo : 2], tree[2 * lo + 1 : 4 * lo : 2], out=tree[lo : 2 * lo])
            lo >>= 1

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves (after writing ``tree`` wholesale)."""
        tree, op = self.tree, self.op
        for level in range(self.depth - 1, -1, -1):
            lo, hi = 1 << level, 2 << level
            tree[lo:hi] = op(tree[2 * lo : 2 * hi : 2], tree[2 * lo + 1 : 2 * hi : 2])


class SumTree(SegmentTree):
    """Sums of non-negative leaves, with proportional (prefix-sum) search."""

    def __init__(self, size: int) -> None:
        super().__init__(size, np.add, 0.0)

    def total(self) -> float:
        return self.root()

    def find_prefixsum(self, prefix: np.ndarray) -> np.ndarray:
        """For each ``prefix`` (``[B]`` floats in ``[0, total)``) the leaf ``i`` with
        ``sum(leaves[:i]) <= prefix < sum(leaves[:i + 1])``, as ``[B]`` int64.

        Only leaves with a positive value are returned (when ``total > 0``), whatever the
        float rounding at segment boundaries. The walk starts with one ``searchsorted``
        over the cumulative sums of a level of at most ``2**_JUMP_LEVEL`` nodes, then
        descends the remaining levels one numpy step each for the whole batch.
        """
        u = np.array(prefix, dtype=np.float64).reshape(-1)  # a copy: consumed below
        tree = self.tree
        jump = min(self.depth, _JUMP_LEVEL)
        lo = 1 << jump
        level = tree[lo : 2 * lo]
        before = np.zeros(lo + 1)
        np.cumsum(level, out=before[1:])  # before[i] = sum of level[:i]
        i = np.searchsorted(before[1:], u, side="right")  # first node whose cumulative sum exceeds u
        # A prefix past the last cumulative sum (rounding) goes to the last non-empty node.
        np.minimum(i, lo - 1 - int(np.argmax(level[::-1] > 0)), out=i)
        u -= before.take(i)
        node = i + lo
        for _ in range(self.depth - jump):
            left = node << 1
            left_sum = tree.take(left)
            right = u >= left_sum
            np.subtract(u, left_sum, out=u, where=right)
            node = left + right
        leaf = node - self.num_leaves
        empty = tree.take(node) <= 0
        if empty.any():  # rounding walked into an empty right subtree: redo those safely
            leaf[empty] = self._find_safe(np.asarray(prefix, dtype=np.float64).reshape(-1)[empty])
        return leaf

    def _find_safe(self, prefix: np.ndarray) -> np.ndarray:
        """``find_prefixsum`` from the root, never entering an empty subtree.

        At each node go right when the prefix reaches past the left subtree's sum and
        the right subtree is non-empty, or when the left subtree is empty. A node with a
        positive sum has a child with a positive sum, so the walk ends on a positive leaf.
        """
        u = prefix.copy()
        node = np.ones(u.shape, dtype=np.int64)
        tree = self.tree
        for _ in range(self.depth):
            left = node << 1
            left_sum = tree.take(left)
            right_sum = tree.take(left + 1)
            right = ((u >= left_sum) & (right_sum > 0)) | (left_sum <= 0)
            u -= left_sum * right
            node = left + right
        return node - self.num_leaves


class MinTree(SegmentTree):
    """Minima of the leaves; unset leaves are ``+inf``."""

    def __init__(self, size: int) -> None:
        super().__init__(size, np.minimum, np.inf)

    def min(self) -> float:
        return self.root()


class ProportionalPriorities:
    """Proportional prioritization (Schaul et al. 2016) over ``size`` slots: ``p**alpha`` in a
    sum tree (sampling) and a min tree (the largest importance weight). Slots without a
    transition have priority 0 (``+inf`` in the min tree). Shared by the replay buffers, which
    own the storage and say which slots are live."""

    def __init__(self, size: int, alpha: float, eps: float) -> None:
        if alpha < 0:
            raise ValueError(f"prioritized replay alpha must be >= 0, got {alpha}")
        if eps <= 0:
            raise ValueError(f"prioritized replay eps must be > 0, got {eps}")
        self.size, self.alpha, self.eps = int(size), float(alpha), float(eps)
        self.max_priority = 1.0  # largest |td| + eps seen (before the alpha power)
        self.sum_tree = SumTree(self.size)
        self.min_tree = MinTree(self.size)

    @property
    def nbytes(self) -> int:
        return self.sum_tree.nbytes + self.min_tree.nbytes

    def set(self, flat: np.ndarray, powered: np.ndarray | float) -> None:
        """Set slots ``flat`` to priorities ``powered`` (already ``p**alpha``)."""
        self.sum_tree.update(flat, powered)
        self.min_tree.update(flat, powered)

    def set_max(self, flat: np.ndarray) -> None:
        """New transitions: the largest priority seen, so each is replayed at least once soon."""
        self.set(flat, self.max_priority**self.alpha)

    def clear(self, flat: np.ndarray) -> None:
        self.sum_tree.update(flat, 0.0)
        self.min_tree.update(flat, np.inf)

    def from_td(self, td_errors: np.ndarray) -> np.ndarray:
        """``(|td| + eps)**alpha``, and ``max_priority`` raised to the largest ``|td| + eps``."""
        p = np.abs(np.asarray(td_errors, dtype=np.float64)) + self.eps
        if p.size:
            self.max_priority = max(self.max_priority, float(p.max()))
        return p**self.alpha

    def check_update(self, flat: np.ndarray, td: np.ndarray) -> None:
        if flat.shape != td.shape:
            raise ValueError(f"update_priorities: {flat.size} batch_indexes but {td.size} td_errors")
        if not np.isfinite(td).all():
            raise ValueError("update_priorities: td_errors contain NaN or inf")

    def draw(
        self, batch_size: int, rng: np.random.Generator, num_live: int, beta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """``batch_size`` slots in proportion to their priorities, stratified (one uniform draw in
        each of ``batch_size`` equal segments of the total), and their importance weights
        ``(N * P(i))**-beta / max_j (N * P(j))**-beta`` with ``N = num_live``."""
        total = self.sum_tree.total()
        prefix = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        flat = self.sum_tree.find_prefixsum(prefix)
        prob = self.sum_tree[flat] / total
        max_weight = (num_live * self.min_tree.min() / total) ** -beta
        weights = (num_live * prob) ** -beta / max_weight
        return flat, weights.astype(np.float32)

    def load(self, leaves: np.ndarray, live: np.ndarray, max_priority: float) -> None:
        """Restore saved leaf priorities (``live``: the slots holding a transition)."""
        leaves = np.asarray(leaves, dtype=np.float64)
        self.sum_tree.leaves[:] = leaves
        self.sum_tree.rebuild()
        self.min_tree.leaves[:] = np.where(live, leaves, np.inf)
        self.min_tree.rebuild()
        self.max_priority = float(max_priority)
