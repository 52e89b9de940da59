"""Weight broadcasts carry the policy's whole state: parameters and buffers (BatchNorm running
statistics, normalizers), to IMPALA/APPO/APEX sampler workers and to A3C workers alike; a
sampling copy on another device gets them too; per-policy settings an algorithm does not take
(``normalize_observations`` where nothing updates the statistics) are refused by name."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest
import torch
from torch import nn

from lightning_rl import A3C, APPO, DQN, IMPALA, PPO
from lightning_rl.data.async_gradients import GradientTask
from lightning_rl.data.learner_queue import POLICY_VERSION
from tests.test_async import no_process_left, started  # noqa: F401  (no_process_left: the fixture)

pytestmark = pytest.mark.timeout(120)


class BatchNormEncoder(nn.Module):
    """Linear -> BatchNorm -> tanh: its output reads the BatchNorm's running statistics in eval mode."""

    def __init__(self, observation_space: gym.Space, features: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(observation_space.shape[0], features), nn.BatchNorm1d(features), nn.Tanh())
        self.out_features = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float())


def batch_norms(module: nn.Module) -> list[nn.BatchNorm1d]:
    return [m for m in module.modules() if isinstance(m, nn.BatchNorm1d)]


def set_statistics(module: nn.Module, mean: float, var: float) -> None:
    """What training in train mode does to the running statistics (here by value)."""
    with torch.no_grad():
        for bn in batch_norms(module):
            bn.running_mean.fill_(mean)
            bn.running_var.fill_(var)
            bn.num_batches_tracked.fill_(11)


def test_impala_workers_act_with_the_broadcast_batchnorm_statistics():
    model = IMPALA(env="CartPole-v1", num_workers=1, num_envs=2, rollout_fragment_length=10, train_batch_size=20,
                   seed=0, total_env_steps=None, hiddens=(16,), encoder=BatchNormEncoder, max_policy_lag=0,
                   sampler_timeout_s=20.0)
    policy = model.policies["default_policy"]
    assert len(batch_norms(policy)) == 2  # the policy's and the value function's encoder
    dm = started(model)
    try:
        dm.sample()
        set_statistics(policy, 0.5, 4.0)
        model.policies.version += 1  # an iteration trained (it changed only buffers)
        model.counters["num_iterations"] = 3
        sb = dm.sample().policy_batches["default_policy"]  # max_policy_lag=0: only fragments of version 3
        assert (sb[POLICY_VERSION] == 3).all()
        obs = sb["obs"].flatten(0, 1)
        policy.eval()  # as the workers act
        with torch.no_grad():
            expected = policy.value(obs).reshape(sb["vf_preds"].shape)
            set_statistics(policy, 0.0, 1.0)  # the statistics the worker started with
            stale = policy.value(obs).reshape(sb["vf_preds"].shape)
        torch.testing.assert_close(sb["vf_preds"], expected, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(sb["vf_preds"], stale, atol=1e-3)  # the statistics do change the values
    finally:
        dm.close()


class _ProbeGradientTask(GradientTask):
    """A3C's worker task, also reporting the worker's BatchNorm statistics in its loss terms."""

    def make(self, policy, rollout, valid, bootstrap_obs):
        tensors, extra = super().make(policy, rollout, valid, bootstrap_obs)
        bn = batch_norms(policy)[0]
        extra["stats"].update(probe_mean=float(bn.running_mean[0]), probe_var=float(bn.running_var[0]),
                              probe_batches=float(bn.num_batches_tracked))
        return tensors, extra


def test_a3c_workers_compute_gradients_with_the_broadcast_buffers():
    model = A3C(env="CartPole-v1", num_workers=1, num_envs=2, rollout_fragment_length=5, seed=0,
                total_env_steps=None, hiddens=(16,), encoder=BatchNormEncoder, sampler_timeout_s=20.0)
    dm = model.default_datamodule
    dm.gradient_task = _ProbeGradientTask(0.99, 1.0, 0.5, 0.0)
    dm.connect(model)
    dm.setup("fit")
    try:
        first = dm.sample()
        assert first.info["worker_stats"][0]["probe_mean"] == 0.0
        set_statistics(model.policies["default_policy"], 0.25, 9.0)
        model.policies.version += 1
        model.counters["num_iterations"] = 4
        deadline = time.monotonic() + 20
        while True:  # the packet computed after the applied one's slot came back, with the new state
            batch = dm.sample()
            if (batch.info[POLICY_VERSION] == 4).all() or time.monotonic() > deadline:
                break
        assert (batch.info[POLICY_VERSION] == 4).all()
        stats = batch.info["worker_stats"][0]
        assert (stats["probe_mean"], stats["probe_var"], stats["probe_batches"]) == (0.25, 9.0, 11.0)
    finally:
        dm.close()


def test_a_sampling_copy_on_another_device_has_the_buffers_and_acts_in_eval_mode():
    model = PPO(env="CartPole-v1", num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=16, seed=0,
                hiddens=(16,), encoder=BatchNormEncoder, normalize_observations=True, total_env_steps=None)
    policy = model.policies["default_policy"]
    other = torch.device("cpu", 0)  # not the module's device (as sampling_device="cpu" is for a GPU learner)
    assert other != model.device
    assert model.sampling_policy("default_policy", other) is not policy
    set_statistics(policy, 0.5, 4.0)
    policy.obs_rms.update(torch.randn(32, 4) * 3 + 1)
    model.policies.version += 1  # an iteration trained
    copy = model.sampling_policy("default_policy", other)
    assert not any(m.training for m in copy.modules())
    for name, value in policy.state_dict().items():
        torch.testing.assert_close(copy.state_dict()[name], value, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("algo", [IMPALA, APPO, DQN])
@pytest.mark.parametrize("setting", ["normalize_observations", "normalize_rewards", "hidens"])
def test_per_policy_settings_the_algorithm_does_not_take_are_refused_by_name(algo, setting):
    with pytest.raises(ValueError, match=rf"^policies\['default_policy'\] sets {setting}, which {algo.__name__} "
                                         r"does not take per policy; its per-policy settings are .*hiddens"):
        algo(env="CartPole-v1", policies={"default_policy": {setting: True}}, seed=0)


def test_per_policy_normalize_observations_stays_where_the_learner_updates_it():
    model = PPO(env="CartPole-v1", policies={"default_policy": {"normalize_observations": True}}, seed=0)
    assert model.policies["default_policy"].obs_rms is not None
