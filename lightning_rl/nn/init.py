"""Initializers that give the same weights whatever torch's thread count."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def orthogonal_(weight: Tensor, gain: float) -> None:
    """``nn.init.orthogonal_`` on one thread: the last bits of its QR decomposition depend on
    torch's thread count, and a seeded run must not (1 ulp in a 64x64 layer grows into a
    different run)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        nn.init.orthogonal_(weight, gain)
    finally:
        torch.set_num_threads(threads)
