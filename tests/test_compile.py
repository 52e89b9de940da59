"""compile=True (issue 10): the compiled update step equals the eager one up to float rounding,
compiles each graph once under lr/clip schedules, resumes exactly, stops on a non-finite loss
before stepping, and falls back to eager with one warning where inductor cannot compile."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo.utils as dynamo_utils

from lightning_rl import A2C, DQN, PPO, SAC, TD3
from lightning_rl.nonfinite import NonFiniteLossError
from tests.conftest import quiet_trainer
from tests.space_envs import CueMatch, binary_cue_match
from tests.test_non_finite import SMALL_PPO, bad_env

# Every flag the compiled step reads: schedules (lr, clip), KL penalty, value clipping, entropy,
# PER weights, double Q, the temperature; 20 PPO iterations.
CONFIGS = {
    "ppo": (PPO, dict(num_envs=4, rollout_fragment_length=32, num_sgd_iter=2, sgd_minibatch_size=32, hiddens=(32, 32),
                      lr_schedule="linear", clip_param_schedule="linear", kl_coeff=0.2, kl_target=1e-3,
                      vf_clip_param=1.0, entropy_coeff=0.01, total_env_steps=20 * 128)),
    "a2c": (A2C, dict(num_envs=4, rollout_fragment_length=5, hiddens=(32,), lr_schedule="linear",
                      total_env_steps=20 * 20)),
    "ppo_pendulum": (PPO, dict(env="Pendulum-v1", num_envs=2, rollout_fragment_length=32, num_sgd_iter=2,
                               sgd_minibatch_size=32, hiddens=(16,), total_env_steps=5 * 64)),
    # Dict observations with MultiDiscrete (with start) and MultiBinary actions (issue 15)
    "ppo_multi_discrete": (PPO, dict(env=CueMatch, num_envs=4, rollout_fragment_length=16, num_sgd_iter=2,
                                     sgd_minibatch_size=32, hiddens=(16,), entropy_coeff=0.01, total_env_steps=5 * 64)),
    "a2c_multi_binary": (A2C, dict(env=binary_cue_match, num_envs=4, rollout_fragment_length=5, hiddens=(16,),
                                   total_env_steps=10 * 20)),
    "dqn": (DQN, dict(num_envs=2, learning_starts=32, train_freq=8, num_gradient_steps=2, train_batch_size=16,
                      hiddens=(32,), prioritized_replay=True, lr_schedule="linear", total_env_steps=96)),
    "sac": (SAC, dict(env="Pendulum-v1", learning_starts=32, train_batch_size=16, hiddens=(16,),
                      prioritized_replay=True, total_env_steps=40)),
    # the actor (and the targets) on every second critic update: its step compiled apart
    "td3": (TD3, dict(env="Pendulum-v1", learning_starts=32, train_batch_size=16, hiddens=(16,),
                      prioritized_replay=True, total_env_steps=44)),
}
GRAPHS = {"ppo": 1, "a2c": 1, "ppo_pendulum": 1, "ppo_multi_discrete": 1, "a2c_multi_binary": 1, "dqn": 1, "sac": 3,
          "td3": 2}


def fit(model, ckpt_path=None, **trainer_kwargs):
    trainer = quiet_trainer(**trainer_kwargs)
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer


def optimizer_state(trainer) -> list[torch.Tensor]:
    return [t for opt in trainer.optimizers for s in opt.state.values() for t in s.values()]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_compiled_update_matches_eager_and_compiles_each_graph_once(name):
    cls, kwargs = CONFIGS[name]
    eager = cls(seed=0, **kwargs)
    eager_trainer = fit(eager)
    torch.compiler.reset()
    before = dynamo_utils.counters["stats"]["unique_graphs"]
    compiled = cls(seed=0, compile=True, **kwargs)
    with torch._dynamo.config.patch(error_on_recompile=True):  # a schedule or a new row count never recompiles
        trainer = fit(compiled)
    assert dynamo_utils.counters["stats"]["unique_graphs"] - before == GRAPHS[name]
    assert all(step.compiled for step in compiled._update_steps.values())
    assert trainer.global_step == eager_trainer.global_step > 0
    assert compiled.counters == eager.counters
    for a, b in zip(eager.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=2e-5)
    for a, b in zip(optimizer_state(eager_trainer), optimizer_state(trainer), strict=True):  # torch.optim state stepped
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5)


def test_models_of_one_process_share_compiled_steps_and_keep_their_own_values(monkeypatch):
    """A second model of the same settings reuses the first one's compiled graph (no new trace:
    a sweep's trials, a notebook's reruns); one of other settings gets a graph of its own on the
    same code object, up to ``_GRAPHS_PER_CODE``, then a fresh code object. Every model trains on
    its own values: B after A (another seed, ``vf_loss_coeff``, ``entropy_coeff``) ends bit-equal
    to B first, and A after B bit-equal to A alone (compiled_code.shared_code)."""
    from lightning_rl import compiled_code

    cls, kwargs = CONFIGS["a2c"]

    def trained(**extra) -> list[torch.Tensor]:
        model = cls(compile=True, **{**kwargs, **extra})
        fit(model)
        assert all(step.compiled for step in model._update_steps.values())
        return [p.detach().clone() for p in model.parameters()]

    def fresh() -> None:
        torch.compiler.reset()
        compiled_code._SHARED_CODE.clear()

    b_settings, a_settings = dict(seed=0), dict(seed=1, vf_loss_coeff=0.25, entropy_coeff=0.05)
    fresh()
    a_alone = trained(**a_settings)
    fresh()
    b_first = trained(**b_settings)
    graphs = dynamo_utils.counters["stats"]["unique_graphs"]
    b_again = trained(**b_settings)
    assert dynamo_utils.counters["stats"]["unique_graphs"] == graphs  # reused, not traced again
    a_after = trained(**a_settings)
    b_last = trained(**b_settings)
    assert [len(codes) for codes in compiled_code._SHARED_CODE.values()] == [1]
    for first, *others in zip(b_first, b_again, b_last, strict=True):
        assert all(torch.equal(first, other) for other in others)
    assert all(torch.equal(x, y) for x, y in zip(a_alone, a_after, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a_after, b_first, strict=True))

    fresh()
    monkeypatch.setattr(compiled_code, "_GRAPHS_PER_CODE", 1)
    trained(**b_settings)
    assert torch.equal(trained(**a_settings)[0], a_alone[0])
    assert [len(codes) for codes in compiled_code._SHARED_CODE.values()] == [2]  # the full one left for a fresh one


def test_compiled_resume_is_exact(tmp_path):
    """Stop after 10 iterations, resume to 20: the same weights as 20 uninterrupted compiled iterations."""
    cls, kwargs = CONFIGS["ppo"]
    full = cls(seed=0, compile=True, **kwargs)
    fit(full)
    first = cls(seed=0, compile=True, **{**kwargs, "iterations_per_epoch": 10})
    fit(first, max_epochs=1).save_checkpoint(tmp_path / "half.ckpt")
    second = cls(seed=0, compile=True, **{**kwargs, "iterations_per_epoch": 10})
    fit(second, ckpt_path=tmp_path / "half.ckpt")
    assert second.counters == full.counters
    for a, b in zip(full.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b)


def test_compiled_non_finite_loss_stops_fit_before_stepping():
    model = PPO(**{**SMALL_PPO, "env": bad_env("reward", at=20, value=1e30), "check_finite": False, "compile": True})
    initial = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at iteration 1 .*'loss/default_policy' update: "
                                                 r".*vf_loss.*weights were not stepped"):
        fit(model, max_epochs=5)
    # Iteration 0 stepped; iteration 1's first minibatch was non-finite: its weights are iteration 0's.
    reference = PPO(**{**SMALL_PPO, "env": bad_env("reward", at=20, value=1e30), "check_finite": False})
    fit(reference, max_steps=1)
    for a, b in zip(reference.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(initial, model.parameters()))
    assert all(torch.isfinite(p).all() for p in model.parameters())


FALLBACK = textwrap.dedent("""
    import warnings, torch
    from lightning_rl import PPO
    from tests.conftest import quiet_trainer
    kwargs = dict(num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=2, hiddens=(8,),
                  total_env_steps=64, seed=0)
    eager = PPO(**kwargs)
    quiet_trainer().fit(eager)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = PPO(compile=True, **kwargs)
        quiet_trainer().fit(compiled)
    ours = [str(w.message) for w in caught if "could not be compiled" in str(w.message)]
    assert len(ours) == 1, ours
    assert "runs eagerly" in ours[0] and ("g++" in ours[0] or "compiler" in ours[0].lower()), ours[0]
    assert not any(s.compiled for s in compiled._update_steps.values())
    assert all(torch.equal(a, b) for a, b in zip(eager.parameters(), compiled.parameters()))
    print("FALLBACK OK:", ours[0])
""")


def test_without_a_cxx_compiler_compile_falls_back_to_eager_with_one_warning(tmp_path):
    env = {**os.environ, "CXX": str(tmp_path / "no-such-g++"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "OMP_NUM_THREADS": "1"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", FALLBACK], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "FALLBACK OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def _mutated_inputs(graphs) -> list[str]:
    """In-place ops (``copy_``, ``add_``, ...) applied to an input of dynamo's graphs."""
    found = []
    for gm in graphs:
        for node in gm.graph.nodes:
            name = getattr(node.target, "__name__", str(node.target))
            if getattr(node.target, "__module__", None) == "_operator":  # and_ is &; iand is &=
                in_place = name.startswith("i") and not name.startswith("is")
            else:
                in_place = name.endswith("_") and not name.endswith("__")
            if (node.op in ("call_method", "call_function") and in_place
                    and node.args and getattr(node.args[0], "op", None) == "placeholder"):
                found.append(f"{name}({node.args[0].name})")
    return found


@pytest.mark.parametrize("name", ["ppo", "a2c", "sac", "td3"])
def test_the_functional_step_for_cuda_graphs_mutates_no_input_and_steps_as_the_in_place_one(name, monkeypatch):
    """On CUDA the compiled step is functional (CUDA graphs skip graphs that mutate inputs, the
    'skipping cudagraphs due to mutated inputs' of issue 36): forced on the CPU here, its graphs
    write none of their inputs, and the fit ends where the in-place one does (Adam: PPO, SAC;
    RMSprop: A2C)."""
    from lightning_rl import update

    graphs: list = []
    real_compile = torch.compile

    def recording(fn, **kwargs):
        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward
        return real_compile(fn, backend=backend, fullgraph=kwargs.get("fullgraph", False))

    cls, kwargs = CONFIGS[name]
    monkeypatch.setattr(update.torch, "compile", recording)
    in_place = cls(seed=0, compile=True, **kwargs)
    in_place_trainer = fit(in_place)
    assert _mutated_inputs(graphs), "the check sees the in-place graph's writes"
    graphs.clear()
    monkeypatch.setattr(update.UpdateStep, "functional", True)
    functional = cls(seed=0, compile=True, **kwargs)
    trainer = fit(functional)
    assert graphs and all(step.compiled and step.functional for step in functional._update_steps.values())
    assert _mutated_inputs(graphs) == []
    assert functional.counters == in_place.counters
    for a, b in zip(in_place.parameters(), functional.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    for a, b in zip(optimizer_state(in_place_trainer), optimizer_state(trainer), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
