"""Every PPO/A2C flag is proven to change the update (docs/design.md, "Tests (tiers)": tier 2)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from lightning_rl import A2C, PPO, SampleBatch
from lightning_rl.callbacks.trainer_wiring import TrainerWiring
from lightning_rl.functional import standardized, value_loss
from lightning_rl.process import rank_cpus, set_process_affinity
from tests.conftest import fit_iterations

BASE = dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=32, num_sgd_iter=2, sgd_minibatch_size=64,
            seed=3, vectorization="sync", total_env_steps=None)


def params_after(model, iterations: int = 1) -> torch.Tensor:
    fit_iterations(model, iterations)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def last_stats(model, iterations: int = 1) -> dict:
    """Learner stats of the last iteration, captured by wrapping ``on_iteration_end``."""
    seen = {}
    original = model.on_iteration_end

    def capture(info):
        seen.update(info["default_policy"]["learner_stats"])
        original(info)

    model.on_iteration_end = capture
    fit_iterations(model, iterations)
    return seen


def test_same_seed_same_weights():
    assert torch.equal(params_after(PPO(**BASE), 2), params_after(PPO(**BASE), 2))


def test_different_seed_different_weights():
    assert not torch.equal(params_after(PPO(**BASE)), params_after(PPO(**{**BASE, "seed": 4})))


@pytest.mark.parametrize(("num_sgd_iter", "minibatch"), [(1, 128), (3, 64), (2, 50), (4, 128)])
def test_optimizer_steps_per_iteration(num_sgd_iter, minibatch):
    model = PPO(**{**BASE, "num_sgd_iter": num_sgd_iter, "sgd_minibatch_size": minibatch})
    trainer = fit_iterations(model, 2)
    expected = num_sgd_iter * math.ceil(4 * 32 / minibatch)
    assert model.counters["num_grad_updates"] == 2 * expected
    assert trainer.global_step == 2 * expected  # Lightning counted the same optimizer steps


def test_standardize_fields_reaches_the_loss():
    seen = []

    class Spy(PPO):
        def loss(self, policy_id, batch):
            seen.append(batch[SampleBatch.ADVANTAGES].clone())
            return super().loss(policy_id, batch)

    fit_iterations(Spy(**{**BASE, "num_sgd_iter": 1, "sgd_minibatch_size": 128}), 1)
    on = seen.pop()
    assert abs(on.mean().item()) < 1e-5 and abs(on.std(unbiased=False).item() - 1) < 1e-4
    fit_iterations(Spy(**{**BASE, "num_sgd_iter": 1, "sgd_minibatch_size": 128, "standardize_fields": ()}), 1)
    off = seen.pop()
    assert off.std() > 1.5  # raw GAE advantages on CartPole are far from unit scale
    torch.testing.assert_close(standardized(off), on)


def test_standardize_fields_changes_weights():
    assert not torch.equal(params_after(PPO(**BASE)), params_after(PPO(**{**BASE, "standardize_fields": ()})))


def test_vf_clip_param_changes_value_loss():
    free = last_stats(PPO(**BASE), 2)["vf_loss"]
    clipped = last_stats(PPO(**{**BASE, "vf_clip_param": 1e-3}), 2)["vf_loss"]
    assert clipped != free


def test_vf_clip_param_keeps_the_larger_error_by_value():
    values, targets, old = torch.tensor([1.0, 0.0, 5.0]), torch.tensor([2.0, 0.0, 3.0]), torch.tensor([0.0, 0.5, 4.0])
    # clipped predictions (old +- 0.5): 0.5, 0.0, 4.5 -> squared errors 2.25, 0, 2.25; unclipped 1, 0, 4
    assert value_loss(values, targets, old, vf_clip_param=0.5).item() == pytest.approx((2.25 + 0 + 4) / 3)
    assert value_loss(values, targets).item() == pytest.approx((1 + 0 + 4) / 3)


def test_entropy_coeff_changes_update():
    a = params_after(PPO(**BASE))
    b = params_after(PPO(**{**BASE, "entropy_coeff": 0.5}))
    assert not torch.equal(a, b)


def test_entropy_coeff_raises_entropy():
    low = last_stats(PPO(**{**BASE, "num_sgd_iter": 8}), 3)["entropy"]
    high = last_stats(PPO(**{**BASE, "num_sgd_iter": 8, "entropy_coeff": 1.0}), 3)["entropy"]
    assert high > low


def test_kl_target_adapts_kl_coeff():
    tight = PPO(**{**BASE, "kl_coeff": 0.2, "kl_target": 1e-8})
    loose = PPO(**{**BASE, "kl_coeff": 0.2, "kl_target": 10.0})
    fit_iterations(tight, 1)
    fit_iterations(loose, 1)
    assert tight.kl_coeff["default_policy"] == pytest.approx(0.3)
    assert loose.kl_coeff["default_policy"] == pytest.approx(0.1)


def test_kl_coeff_changes_update():
    assert not torch.equal(params_after(PPO(**BASE)), params_after(PPO(**{**BASE, "kl_coeff": 5.0})))


def test_clip_param_changes_update():
    a = params_after(PPO(**{**BASE, "num_sgd_iter": 6}))
    b = params_after(PPO(**{**BASE, "num_sgd_iter": 6, "clip_param": 1e-3}))
    assert not torch.equal(a, b)


def test_lr_schedule_linear_decays():
    model = PPO(**{**BASE, "lr": 1e-3, "lr_schedule": "linear", "total_env_steps": 4 * 32 * 4})
    stats = last_stats(model, 3)
    # third iteration starts after 256 of 512 steps: lr = 1e-3 * (1 - 256/512)
    assert stats["cur_lr"] == pytest.approx(5e-4)
    assert model.optimizers().param_groups[0]["lr"] == pytest.approx(5e-4)


def test_clip_param_schedule_points():
    model = PPO(**{**BASE, "clip_param_schedule": [[0, 0.3], [256, 0.1]]})
    assert last_stats(model, 2)["cur_clip_param"] == pytest.approx(0.3 - 0.2 * 128 / 256)


def test_lr_changes_update():
    assert not torch.equal(params_after(PPO(**BASE)), params_after(PPO(**{**BASE, "lr": 1e-2})))


def test_gamma_and_lambda_change_targets():
    def targets(**kw):
        seen = []

        class Spy(PPO):
            def loss(self, policy_id, batch):
                seen.append(batch[SampleBatch.VALUE_TARGETS].sum().item())
                return super().loss(policy_id, batch)

        fit_iterations(Spy(**{**BASE, **kw}), 1)
        return seen[0]

    base = targets()
    assert targets(gamma=0.5) != base
    assert targets(lambda_=0.0) != base


def test_network_flags_shape_the_policy():
    model = PPO(**{**BASE, "hiddens": (32,), "activation": "relu", "vf_share_layers": True})
    policy = model.policies["default_policy"]
    assert policy.vf_encoder is None
    assert [m.out_features for m in policy.pi_encoder if isinstance(m, torch.nn.Linear)] == [32]
    assert isinstance(policy.pi_encoder[1], torch.nn.ReLU)
    assert PPO(**BASE).policies["default_policy"].vf_encoder is not None


def test_log_std_init_sets_gaussian_std():
    model = PPO(env="Pendulum-v1", log_std_init=-1.0, seed=0)
    assert torch.allclose(model.policies["default_policy"].log_std, torch.full((1,), -1.0))


def test_a2c_one_gradient_step_per_iteration():
    model = A2C(env="CartPole-v1", num_envs=4, rollout_fragment_length=5, seed=0, total_env_steps=None)
    trainer = fit_iterations(model, 3)
    assert model.counters["num_grad_updates"] == 3 == trainer.global_step


def test_a2c_optimizer_flag():
    kw = dict(env="CartPole-v1", num_envs=4, rollout_fragment_length=5, seed=0, total_env_steps=None)
    rms, adam = A2C(**kw), A2C(**kw, optimizer="adam")
    fit_iterations(rms, 2)
    fit_iterations(adam, 2)
    assert isinstance(rms.optimizers().optimizer, torch.optim.RMSprop)
    assert isinstance(adam.optimizers().optimizer, torch.optim.Adam)
    rms_w, adam_w = (m.policies["default_policy"].pi_head.weight for m in (rms, adam))
    assert not torch.equal(rms_w, adam_w)


@pytest.mark.parametrize("threads", [1, 2, None])
def test_num_cpu_threads_set_during_fit_and_restored(threads):
    seen = []

    class Spy(PPO):
        def training_step(self, batch, batch_idx):
            seen.append(torch.get_num_threads())
            return super().training_step(batch, batch_idx)

    torch.set_num_threads(3)
    fit_iterations(Spy(**{**BASE, "num_cpu_threads": threads}), 1)
    assert seen == [threads or 3]
    assert torch.get_num_threads() == 3


def test_num_cpu_threads_restored_when_fit_fails():
    class Failing(PPO):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    torch.set_num_threads(3)
    with pytest.raises(RuntimeError, match="boom"):
        fit_iterations(Failing(**{**BASE, "num_cpu_threads": 1}), 1)
    assert torch.get_num_threads() == 3


def test_rank_cpus_splits_the_available_cpus():
    assert rank_cpus({0, 1}, 0, 2) == {0} and rank_cpus({0, 1}, 1, 2) == {1}
    assert rank_cpus(set(range(8)), 1, 2) == {4, 5, 6, 7}
    assert rank_cpus({2, 5, 7, 9}, 1, 2) == {7, 9}
    assert rank_cpus({0, 1}, 2, 3) == set()  # more ranks than CPUs: no pinning


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and 2 CPUs")
@pytest.mark.parametrize("cpu_affinity", [True, False])
def test_cpu_affinity_pins_a_ddp_rank_and_restores(cpu_affinity):
    before = os.sched_getaffinity(0)
    model = PPO(**{**BASE, "cpu_affinity": cpu_affinity})
    try:
        model.process_settings.apply(local_rank=1, local_world_size=2, on_cpu=True)  # rank 1 of a 2-process DDP run
        expected = rank_cpus(before, 1, 2) if cpu_affinity else before
        assert os.sched_getaffinity(0) == expected
        assert all(os.sched_getaffinity(int(t)) == expected for t in os.listdir("/proc/self/task"))
        TrainerWiring().on_fit_end(None, model)  # after fit
        assert os.sched_getaffinity(0) == before
    finally:
        set_process_affinity(before)
