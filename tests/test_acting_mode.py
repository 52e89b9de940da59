"""Acting is eval mode everywhere: synchronous sampling acts with the learner's own policy
without updating its BatchNorm statistics or drawing Dropout masks, and training still runs
in train mode (workers, evaluation and ``predict`` already act in eval mode)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_rl import DQN, IMPALA, PPO, SAC
from tests.conftest import fit_iterations

pytestmark = pytest.mark.timeout(120)


class ModeProbe(nn.Module):
    """BatchNorm then Dropout in front of a policy's first layer; logs every call as
    ``(learning, grad enabled, training, output)``."""

    def __init__(self, width: int, learning: list[bool]) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(width)
        self.drop = nn.Dropout(0.5)
        self.learning = learning
        self.calls: list[tuple[bool, bool, bool, torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.drop(self.bn(x))
        self.calls.append((self.learning[0], torch.is_grad_enabled(), self.training, out.detach().clone()))
        return out


def probed(model, policy_ids=("default_policy",)) -> dict[str, ModeProbe]:
    """A ``ModeProbe`` in front of each policy's first MLP; ``learn_on_batch`` flags the learner's calls."""
    learning = [False]
    probes = {}
    for pid in policy_ids:
        policy = model.policies[pid]
        trunk = getattr(policy, "pi_encoder", None) or policy.encoder  # actor-critics / Q-networks and SAC's actor
        probes[pid] = ModeProbe(trunk[0].in_features, learning)
        trunk.insert(0, probes[pid])
    learn = model.learn_on_batch

    def flagged(batch, builder):
        learning[0] = True
        try:
            return learn(batch, builder)
        finally:
            learning[0] = False

    model.learn_on_batch = flagged
    return probes


def check(model, probes: dict[str, ModeProbe], iterations: int, obs: dict[str, torch.Tensor]) -> None:
    dm = model.default_datamodule
    sample = dm.sample
    statistics = []

    def sampling():
        before = {pid: (p.bn.running_mean.clone(), int(p.bn.num_batches_tracked)) for pid, p in probes.items()}
        batch = sample()
        after = {pid: (p.bn.running_mean.clone(), int(p.bn.num_batches_tracked)) for pid, p in probes.items()}
        statistics.append((before, after))
        return batch

    dm.sample = sampling
    fit_iterations(model, iterations)
    assert len(statistics) == iterations
    for before, after in statistics:  # sampling never updated the running statistics
        for pid in probes:
            assert after[pid][1] == before[pid][1], pid
            torch.testing.assert_close(after[pid][0], before[pid][0], rtol=0, atol=0)
    for pid, probe in probes.items():
        acting = [training for learning, _, training, _ in probe.calls if not learning]
        assert acting and not any(acting), f"{pid}: {sum(acting)} of {len(acting)} acting calls in train mode"
        learner = [training for learning, grad, training, _ in probe.calls if learning and grad]
        assert learner and all(learner), f"{pid}: the learner's updates ran in eval mode"
        assert int(probe.bn.num_batches_tracked) > 0  # and updated the statistics
    # after fit the module is in train mode, as Lightning left it; acting twice gives the same outputs
    for pid, probe in probes.items():
        assert model.policies[pid].training and probe.training
        probe.calls.clear()
        first = model.policy_outputs(obs[pid], pid, explore=False)
        second = model.policy_outputs(obs[pid], pid, explore=False)
        (*_, a), (*_, b) = probe.calls[:1] + probe.calls[-1:]
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        for key in first:
            torch.testing.assert_close(first[key], second[key], rtol=0, atol=0, msg=key)
        assert model.policies[pid].training and probe.training  # the modes are given back


def observations(n: int, dim: int) -> torch.Tensor:
    return torch.linspace(-1, 1, n * dim).reshape(n, dim)


def test_ppo_acts_in_eval_mode_and_trains_in_train_mode():
    model = PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=16, sgd_minibatch_size=32, num_sgd_iter=2,
                hiddens=(16,), seed=0, total_env_steps=None)
    check(model, probed(model), 3, {"default_policy": observations(8, 4)})


def test_impala_without_workers_acts_in_eval_mode_and_trains_in_train_mode():
    model = IMPALA(env="CartPole-v1", num_workers=0, num_envs=2, rollout_fragment_length=10, train_batch_size=40,
                   hiddens=(16,), seed=0, total_env_steps=None)
    check(model, probed(model), 3, {"default_policy": observations(8, 4)})


def test_dqn_acts_in_eval_mode_and_trains_in_train_mode():
    model = DQN(env="CartPole-v1", learning_starts=32, train_freq=16, train_batch_size=16, buffer_size=500,
                hiddens=(16,), seed=0, total_env_steps=None)
    check(model, probed(model), 4, {"default_policy": observations(8, 4)})


def test_sac_acts_in_eval_mode_and_trains_in_train_mode():
    model = SAC(env="Pendulum-v1", learning_starts=32, train_freq=16, train_batch_size=16, buffer_size=500,
                hiddens=(16,), seed=0, total_env_steps=None)
    check(model, probed(model), 4, {"default_policy": observations(8, 3)})


def test_multi_agent_ppo_acts_in_eval_mode_and_trains_in_train_mode():
    pytest.importorskip("pettingzoo")
    from tests.multi_agent_envs import Relay, by_agent

    model = PPO(env=Relay, policies=["p_runner", "p_helper"], policy_mapping_fn=by_agent, num_envs=2,
                rollout_fragment_length=12, sgd_minibatch_size=8, num_sgd_iter=1, total_env_steps=None, seed=0,
                hiddens=(16,))
    check(model, probed(model, ("p_runner", "p_helper")), 3,
          {pid: observations(8, 3) for pid in ("p_runner", "p_helper")})
