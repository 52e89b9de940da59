"""Stable-Baselines3 as an oracle for one of our off-policy learners: its ``train`` is started
from our initial weights and fed the minibatches, and the noise, our fit drew; the weights
both end at are then compared (tests/test_td3.py, tests/test_off_policy.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from lightning_rl import SampleBatch

NoiseDraws = Callable[[torch.Generator, int], list[Tensor]]
Drawn = list[tuple[SampleBatch, list[Tensor]]]


def record_updates(monkeypatch: pytest.MonkeyPatch, model: Any, draws: NoiseDraws) -> Drawn:
    """Every minibatch ``model.update`` receives, with the noise its update draws from
    ``learner_generator`` (``draws(copy of the generator, rows)``, in the update's order)."""
    drawn: Drawn = []
    update = model.update

    def recording_update(policy_id: str, batch: SampleBatch) -> Any:
        generator = torch.Generator().set_state(model.learner_generator.get_state())
        drawn.append((SampleBatch({k: v.clone() for k, v in batch.items()}),
                      draws(generator, len(batch[SampleBatch.OBS]))))
        return update(policy_id, batch)

    monkeypatch.setattr(model, "update", recording_update)
    return drawn


def copy_weights(ours: Sequence[Tensor], theirs: Iterable[nn.Module]) -> None:
    """Our parameters, in order, into each of ``theirs`` (same shapes, asserted)."""
    with torch.no_grad():
        for module in theirs:
            params = list(module.parameters())
            assert [p.shape for p in params] == [p.shape for p in ours]
            for p, q in zip(params, ours, strict=True):
                p.copy_(q)


def train_on(monkeypatch: pytest.MonkeyPatch, theirs: Any, drawn: Drawn, action_half: float) -> None:
    """SB3's ``train`` over exactly our minibatches (actions in its ``[-1, 1]`` replay scale) with
    our noise in place of each ``Tensor.normal_`` it draws."""
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    samples = iter(ReplayBufferSamples(
        observations=b[SampleBatch.OBS].float(), actions=b[SampleBatch.ACTIONS].float() / action_half,
        next_observations=b[SampleBatch.NEXT_OBS].float(),
        dones=b[SampleBatch.TERMINATEDS].float().unsqueeze(-1), rewards=b[SampleBatch.REWARDS].float().unsqueeze(-1),
        discounts=b[SampleBatch.DISCOUNTS].float().unsqueeze(-1)) for b, _ in drawn)
    noises = iter(noise for _, draws in drawn for noise in draws)
    theirs.set_logger(Logger(folder=None, output_formats=[]))
    theirs.replay_buffer.sample = lambda batch_size, env=None: next(samples)
    with monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, "normal_", lambda self, mean=0.0, std=1.0: self.copy_(next(noises)))
        theirs.train(gradient_steps=len(drawn), batch_size=len(drawn[0][0][SampleBatch.OBS]))
    assert next(noises, None) is None and next(samples, None) is None  # every draw used, in order


def assert_same_weights(pairs: Iterable[tuple[Iterable[Tensor], Iterable[Tensor]]], atol: float = 5e-6) -> None:
    """Every weight within ``atol`` (float32 rounding of fused and unfused Adam; SAC's actor also
    SB3's ``+1e-6`` inside its ``log(1 - tanh^2)``, ~1.7e-6 after 24 updates; a temperature read
    after its step instead of before moves SAC's critics by ~1.6e-5)."""
    for ours, theirs in pairs:
        for p, q in zip(ours, theirs, strict=True):
            torch.testing.assert_close(p.detach().reshape(q.shape), q.detach(), rtol=0, atol=atol)
