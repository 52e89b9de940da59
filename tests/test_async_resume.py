"""Resume of APEX and A3C: exact with ``num_workers=0`` (the learner process samples: envs, RNG,
replay and open n-step windows are all in the checkpoint); with sampler workers the counters,
weights, optimizer and replay continue and the workers start fresh episodes."""

from __future__ import annotations

import pytest
import torch

from lightning_rl import A3C, APEX
from tests.conftest import fit_in_halves
from tests.test_async import no_process_left  # noqa: F401  (the fixture: no sampler process outlives a test)

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("no_process_left")]

SMALL = {
    APEX: dict(env="CartPole-v1", num_envs=2, rollout_fragment_length=8, hiddens=(16,), learning_starts=32,
               num_gradient_steps=2, train_batch_size=16, target_network_update_freq=64, buffer_size=500,
               seed=0, total_env_steps=None, iterations_per_epoch=4),
    A3C: dict(env="CartPole-v1", num_envs=2, rollout_fragment_length=5, hiddens=(16,), seed=0,
              total_env_steps=None, iterations_per_epoch=4),
}


def halves(algo, tmp_path, **kwargs):
    """``fit_in_halves`` of ``algo`` at the small settings."""
    return fit_in_halves(lambda: algo(**{**SMALL[algo], **kwargs}), tmp_path)


@pytest.mark.parametrize("algo", [APEX, A3C])
def test_resume_is_exact_when_synchronous(algo, tmp_path):
    full, _, resumed = halves(algo, tmp_path, num_workers=0)
    assert resumed.counters == full.counters
    assert resumed.counters["num_grad_updates"] > 0
    for x, y in zip(resumed.parameters(), full.parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    if algo is APEX:
        a, b = resumed.default_datamodule.buffer, full.default_datamodule.buffer
        assert a.num_added == b.num_added > 0
        assert torch.equal(a.state_dict(tensors=True)["obs"], b.state_dict(tensors=True)["obs"])


def test_apex_resume_with_workers_keeps_counters_and_replay(tmp_path):
    """Workers' envs are not bit-resumable; the replay, counters and weights are."""
    _, first, resumed = halves(APEX, tmp_path, num_workers=2)
    saved = torch.load(tmp_path / "mid.ckpt", weights_only=False)
    replay = saved["lightning_rl"]["datamodule"]["replay"]["ranks"][0]
    assert replay["buffer"]["num_added"] == first.default_datamodule.buffer.num_added > 0
    assert resumed.counters["num_iterations"] == 8
    assert resumed.counters["num_env_steps_sampled"] == 8 * 2 * 2 * 8  # iterations x workers x envs x steps
    assert resumed.counters["num_grad_updates"] == 2 * first.counters["num_grad_updates"] > 0
    assert resumed.default_datamodule.buffer.num_added > first.default_datamodule.buffer.num_added


def test_a3c_resume_with_workers_keeps_counters(tmp_path):
    _, first, resumed = halves(A3C, tmp_path, num_workers=2)
    assert first.counters["num_iterations"] == 4
    assert resumed.counters["num_iterations"] == 8
    # one or two packets (one per worker) an iteration, each 2 envs x 5 steps and one optimizer step
    assert resumed.counters["num_grad_updates"] >= 8 and resumed.counters["num_grad_updates"] > first.counters[
        "num_grad_updates"]
    assert resumed.counters["num_env_steps_sampled"] == 10 * resumed.counters["num_grad_updates"]
