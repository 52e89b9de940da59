"""IMPALA and APPO: every loss flag proven by value on a fixed off-policy batch, APPO's target
policy, the synchronous (deterministic) learners, and resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_rl import APPO, IMPALA, evaluate
from lightning_rl.data.learner_queue import POLICY_VERSION
from tests.conftest import fit_in_halves, fit_iterations, quiet_trainer
from tests.test_async import no_process_left  # noqa: F401  (the fixture: no sampler process outlives a test)

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("no_process_left")]

SMALL = dict(env="CartPole-v1", num_workers=0, num_envs=2, rollout_fragment_length=10, train_batch_size=40,
             seed=0, total_env_steps=None, iterations_per_epoch=4, hiddens=(16,))


def off_policy_batch(model: IMPALA):
    """One sampled batch whose behaviour log-probs are perturbed, so the importance ratios vary
    around 1 (the batch of a lagging sampler)."""
    dm = model.default_datamodule
    dm.connect(model)
    dm.setup("fit")
    try:
        batch = dm.sample().policy_batches["default_policy"]
    finally:
        dm.close()
    noise = torch.randn(batch["action_logp"].shape, generator=torch.Generator().manual_seed(1))
    batch["action_logp"] = batch["action_logp"] + 0.7 * noise
    return batch


def loss_terms(model: IMPALA, batch) -> dict[str, float]:
    total, stats = model.loss("default_policy", batch)
    return {"total_loss": float(total.detach()), **{k: float(v) for k, v in stats.items()}}


@pytest.mark.parametrize("algo", [IMPALA, APPO])
@pytest.mark.parametrize(("flag", "value", "changes", "keeps"), [
    ("vtrace_clip_rho_threshold", None, ["vf_loss", "pg_loss"], []),
    ("vtrace_clip_pg_rho_threshold", None, ["pg_loss"], ["vf_loss"]),
    ("vf_loss_coeff", 2.0, ["total_loss"], ["pg_loss", "vf_loss"]),
    ("entropy_coeff", 0.5, ["total_loss"], ["pg_loss", "vf_loss"]),
    ("gamma", 0.5, ["vf_loss", "pg_loss"], ["entropy"]),
    ("lambda_", 0.5, ["vf_loss", "pg_loss"], ["entropy"]),
])
def test_loss_flags_change_the_loss(algo, flag, value, changes, keeps):
    base = algo(**SMALL)
    batch = off_policy_batch(base)
    other = algo(**{**SMALL, flag: value})
    other.load_state_dict(base.state_dict())
    a, b = loss_terms(base, batch), loss_terms(other, batch)
    for key in changes:
        assert a[key] != pytest.approx(b[key], rel=1e-6), key
    for key in keeps:
        assert a[key] == pytest.approx(b[key], rel=1e-6), key


def test_loss_coefficients_by_value():
    base = IMPALA(**SMALL)
    batch = off_policy_batch(base)
    t = loss_terms(IMPALA(**{**SMALL, "vf_loss_coeff": 2.0, "entropy_coeff": 0.3}), batch)
    assert t["total_loss"] == pytest.approx(t["pg_loss"] + 2.0 * t["vf_loss"] - 0.3 * t["entropy"], rel=1e-5)


def test_appo_clip_param_and_kl_loss_by_value():
    base = APPO(**SMALL)
    batch = off_policy_batch(base)
    with torch.no_grad():  # a target policy that differs from the current one
        for p in base.target_policies.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    narrow, wide = APPO(**{**SMALL, "clip_param": 0.05}), APPO(**{**SMALL, "clip_param": 10.0})
    for m in (narrow, wide):
        m.load_state_dict(base.state_dict())
    n, w = loss_terms(narrow, batch), loss_terms(wide, batch)
    assert n["pg_loss"] != pytest.approx(w["pg_loss"], rel=1e-6)
    assert n["vf_loss"] == pytest.approx(w["vf_loss"], rel=1e-6) and n["kl"] > 0
    kl_model = APPO(**{**SMALL, "use_kl_loss": True, "kl_coeff": 0.7})
    kl_model.load_state_dict(base.state_dict())
    k, plain = loss_terms(kl_model, batch), loss_terms(base, batch)
    assert k["total_loss"] == pytest.approx(plain["total_loss"] + 0.7 * plain["kl"], rel=1e-5)


def test_appo_refreshes_its_target_policy_every_target_network_update_freq_trained_steps():
    model = APPO(**{**SMALL, "target_network_update_freq": 80})  # two 40-step batches
    fit_iterations(model, 4)
    assert model.counters["num_target_updates"] == 2
    for target, online in zip(model.target_policies.parameters(), model.policies.parameters()):
        assert torch.equal(target, online)  # refreshed after the 4th iteration
    fit_iterations(model, 1)
    assert not all(torch.equal(t, o) for t, o in zip(model.target_policies.parameters(), model.policies.parameters()))


@pytest.mark.parametrize("algo", [IMPALA, APPO])
def test_synchronous_runs_are_deterministic(algo):
    a, b = algo(**SMALL), algo(**SMALL)
    fit_iterations(a, 3)
    fit_iterations(b, 3)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("algo", [IMPALA, APPO])
def test_resume_continues_counters_and_weights_exactly_when_synchronous(algo, tmp_path):
    full, _, resumed = fit_in_halves(lambda: algo(**SMALL), tmp_path)
    assert resumed.counters == full.counters
    for x, y in zip(resumed.parameters(), full.parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_async_resume_continues_counters_and_learns(tmp_path):
    """Envs in worker processes are not bit-resumable: the resumed run keeps its counters,
    weights and optimizer, its workers start fresh episodes, and it keeps learning."""
    kwargs = {**SMALL, "num_workers": 2}
    first = IMPALA(**kwargs)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=4, default_root_dir=tmp_path)
    trainer.fit(first)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    resumed = IMPALA(**kwargs)
    quiet_trainer(max_epochs=2, limit_train_batches=4, default_root_dir=tmp_path).fit(
        resumed, ckpt_path=tmp_path / "mid.ckpt")
    assert resumed.counters["num_iterations"] == 8
    assert resumed.counters["num_env_steps_sampled"] == 8 * 40


def test_appo_learns_cartpole_synchronously():
    """Seeded and deterministic with ``num_workers=0``; random play scores about 22."""
    model = APPO(env="CartPole-v1", num_workers=0, seed=0, total_env_steps=150_000, iterations_per_epoch=50)
    quiet_trainer(max_epochs=-1).fit(model)
    assert np.mean(evaluate(model, num_episodes=10, seed=5)) > 150


def test_policy_versions_are_the_learner_iterations():
    model = IMPALA(**SMALL)
    seen = []
    original = model.learn_on_batch

    def spy(batch, builder):
        seen.append(batch.policy_batches["default_policy"][POLICY_VERSION].unique().tolist())
        return original(batch, builder)

    model.learn_on_batch = spy
    fit_iterations(model, 3)
    assert seen == [[0], [1], [2]]  # synchronous: always the current policy


@pytest.mark.parametrize(("size", "steps"), [(None, 1), (20, 2), (10, 4)])
def test_sgd_minibatch_size_cuts_whole_env_columns(size, steps):
    """40-step batches of [T=10, B=4]: minibatches of whole env columns, one gradient step each."""
    model = IMPALA(**{**SMALL, "sgd_minibatch_size": size})
    shapes = []
    original = model.loss

    def spy(policy_id, batch, *args):
        shapes.append(tuple(batch["actions"].shape))
        return original(policy_id, batch, *args)

    model.loss = spy
    fit_iterations(model, 2)
    assert model.counters["num_grad_updates"] == 2 * steps
    assert set(shapes) == {(10, (size or 40) // 10)}


def test_sgd_minibatch_size_must_be_whole_columns_dividing_the_batch():
    with pytest.raises(ValueError, match="whole env columns"):
        IMPALA(**{**SMALL, "sgd_minibatch_size": 15})
    with pytest.raises(ValueError, match="whole env columns"):
        IMPALA(**{**SMALL, "sgd_minibatch_size": 30})


@pytest.mark.parametrize("algo", [IMPALA, APPO])
def test_a_reset_row_cannot_make_the_loss_non_finite(algo):
    """A reset row's action was ignored by the env; whatever its log-probs, the loss stays finite
    and equal to the loss with a harmless value there (unclipped ratios, the worst case)."""
    model = algo(**{**SMALL, "vtrace_clip_rho_threshold": None, "vtrace_clip_pg_rho_threshold": None})
    batch = off_policy_batch(model)
    batch["valid"] = batch["valid"].clone()
    batch["valid"][5, 0] = False
    tame = loss_terms(model, batch)
    batch["action_logp"] = batch["action_logp"].clone()
    batch["action_logp"][5, 0] = -1e4  # ratio exp(1e4) = inf on that row
    wild = loss_terms(model, batch)
    assert np.isfinite(list(wild.values())).all()
    for key in ("total_loss", "pg_loss", "vf_loss"):
        assert wild[key] == pytest.approx(tame[key], rel=1e-6), key


@pytest.mark.parametrize("algo", [IMPALA, APPO])
def test_compiled_updates_match_eager(algo):
    """``compile=True`` runs the V-trace loss, its gradients and Adam as one compiled step: the same
    weights as the eager step up to float rounding (synchronous sampling, so the data are equal)."""
    eager, compiled = algo(**SMALL), algo(**{**SMALL, "compile": True})
    fit_iterations(eager, 3)
    fit_iterations(compiled, 3)
    for x, y in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    assert compiled._update_steps["loss/default_policy"].compiled  # it did not fall back to eager


def test_minibatch_buffer_size_interleaves_the_batches():
    """``minibatch_buffer_size=2, num_sgd_iter=2``: iterations train on batches a, b, a, b."""
    model = IMPALA(**{**SMALL, "minibatch_buffer_size": 2, "num_sgd_iter": 2})
    seen = []
    original = model.learn_on_batch

    def spy(batch, builder):
        seen.append((batch.env_steps, batch.policy_batches["default_policy"]["obs"][0, 0].clone()))
        return original(batch, builder)

    model.learn_on_batch = spy
    fit_iterations(model, 4)
    assert [steps for steps, _ in seen] == [40, 40, 0, 0]
    assert torch.equal(seen[0][1], seen[2][1]) and torch.equal(seen[1][1], seen[3][1])
    assert not torch.equal(seen[0][1], seen[1][1])
