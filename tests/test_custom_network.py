"""Custom networks: an encoder of the user's own in front of the heads (from Python, from YAML
through the CLI), activations by name, import path or class, and checkpoints that rebuild them."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from lightning_rl import A2C, A3C, APPO, IMPALA, PPO
from lightning_rl.loading import load_model
from lightning_rl.nn.encoders import resolve_activation
from tests.conftest import fit_in_halves, quiet_trainer

ROOT = Path(__file__).resolve().parents[1]


class TwoLayerEncoder(nn.Module):
    """An importable encoder (``tests.test_custom_network.TwoLayerEncoder``) without ``out_features``:
    the width is found by running it once."""

    def __init__(self, observation_space: gym.Space, width: int = 24) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(observation_space.shape[0], width), nn.GELU(), nn.Linear(width, width))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


def encoders_of(model, policy="default_policy") -> list[nn.Module]:
    return [m for m in model.policies[policy].modules() if isinstance(m, TwoLayerEncoder)]


@pytest.mark.parametrize("activation", ["gelu", "GELU", "torch.nn.GELU", nn.GELU])
def test_activation_by_name_import_path_or_class(activation):
    model = PPO(env="CartPole-v1", activation=activation, seed=0)
    acts = [m for m in model.policy.pi_encoder if not isinstance(m, nn.Linear)]
    assert len(acts) == 2 and all(type(m) is nn.GELU for m in acts)
    assert model.hparams.activation in ("gelu", "GELU", "torch.nn.GELU", "torch.nn.modules.activation.GELU")


def test_unknown_activation_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown activation 'gleu'.*'gelu'"):
        resolve_activation("gleu")
    with pytest.raises(ValueError, match=r"not an nn\.Module class"):
        resolve_activation("torch.tanh")


@pytest.mark.parametrize("form", ["class", "partial", "mapping", "path"])
def test_encoder_in_front_of_both_heads_in_every_form(form):
    encoder = {"class": TwoLayerEncoder, "partial": functools.partial(TwoLayerEncoder, width=24),
               "mapping": {"class_path": "tests.test_custom_network.TwoLayerEncoder", "init_args": {"width": 24}},
               "path": "tests.test_custom_network.TwoLayerEncoder"}[form]
    model = PPO(env="CartPole-v1", encoder=encoder, hiddens=[16], seed=0)
    policy = model.policy
    assert len(encoders_of(model)) == 2  # one per trunk (vf_share_layers=False)
    assert policy.pi_encoder[1].in_features == 24 and policy.pi_head.in_features == 16
    # the checkpoint keeps plain data: the import path and arguments
    hparam = model.hparams.encoder
    assert (hparam if form == "path" else hparam["class_path"]) == "tests.test_custom_network.TwoLayerEncoder"
    shared = PPO(env="CartPole-v1", encoder=encoder, hiddens=[], vf_share_layers=True, seed=0)
    assert len(encoders_of(shared)) == 1 and shared.policy.pi_head.in_features == 24


def test_encoder_keeps_its_own_initialization():
    torch.manual_seed(3)
    fresh = TwoLayerEncoder(gym.spaces.Box(-1, 1, (4,)))
    model = PPO(env="CartPole-v1", encoder=TwoLayerEncoder, seed=3)
    # built under the same seed, the user's layers are what their constructor made (no orthogonal re-init)
    assert torch.equal(encoders_of(model)[0].net[0].weight, fresh.net[0].weight)


def test_encoder_errors_name_the_encoder_and_the_problem():
    class Wrong(nn.Module):
        def __init__(self, observation_space):
            super().__init__()

        def forward(self, obs):
            return obs.sum(-1)  # [N], not [N, features]

    with pytest.raises(ValueError, match=r"encoder .*Wrong.* must map \[N, \*obs_shape\] to \[N, features\], "
                                         r"returned \(2,\)"):
        PPO(env="CartPole-v1", encoder=Wrong)
    with pytest.raises(TypeError, match=r"encoder <function .*<lambda>.* returned int, not an nn\.Module"):
        PPO(env="CartPole-v1", encoder=lambda space: 3)
    with pytest.raises(ImportError, match=r"encoder 'no_such_module.Enc': importing no_such_module failed"):
        PPO(env="CartPole-v1", encoder={"class_path": "no_such_module.Enc"})
    with pytest.raises(ValueError, match="unknown keys"):
        PPO(env="CartPole-v1", encoder={"class_path": "torch.nn.Identity", "args": {}})


@pytest.mark.parametrize("algo", [A2C, IMPALA, APPO, A3C])
def test_other_actor_critics_take_an_encoder(algo):
    model = algo(env="CartPole-v1", encoder=TwoLayerEncoder, seed=0)
    assert len(encoders_of(model)) == 2


def test_recurrent_policy_reads_the_encoder_output():
    model = PPO(env="CartPole-v1", encoder=TwoLayerEncoder, hiddens=[], use_lstm=True, seed=0)
    assert model.policy.pi_lstm.input_size == 24
    actions, state = model.compute_actions(np.zeros((3, 4), dtype=np.float32))
    assert actions.shape == (3,) and state.shape[0] == 3


def test_checkpoint_reloads_without_arguments_and_resumes_exactly(tmp_path):
    def make():
        return PPO(env="CartPole-v1", encoder={"class_path": "tests.test_custom_network.TwoLayerEncoder",
                                               "init_args": {"width": 12}}, activation=nn.SiLU, num_envs=2,
                   rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=2, seed=0)

    full, _, resumed = fit_in_halves(make, tmp_path, batches=2)
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    loaded = PPO.load_from_checkpoint(tmp_path / "mid.ckpt")
    assert encoders_of(loaded)[0].net[0].out_features == 12
    assert type(loaded.policy.pi_encoder[2]) is nn.SiLU


def test_unimportable_encoder_must_be_passed_again_on_load(tmp_path):
    class Local(TwoLayerEncoder):
        pass

    model = PPO(env="CartPole-v1", encoder=Local, seed=0)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=1)
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    with pytest.raises(ValueError, match=r"encoder=<callable .*Local>: the checkpoint was trained with this "
                                         r"callable.*Pass it again"):
        PPO.load_from_checkpoint(tmp_path / "m.ckpt")
    loaded = PPO.load_from_checkpoint(tmp_path / "m.ckpt", encoder=Local)
    assert torch.equal(loaded.policy.pi_head.weight, model.policy.pi_head.weight)


def test_encoder_from_yaml_trains_validates_records_and_resumes(tmp_path):
    """The documented custom-network config (docs/guides/custom-network.md) through the CLI, each step a subprocess."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "examples"), str(ROOT)])}

    def cli(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "lightning_rl.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return proc.stdout

    short = ["--model.init_args.iterations_per_epoch", "2", "--trainer.enable_progress_bar", "false",
             "--trainer.default_root_dir", str(tmp_path)]
    cli("fit", "-c", str(ROOT / "examples" / "custom_network.yaml"), "--model.init_args.total_env_steps", "512",
        *short)
    ckpt = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)
    assert saved["hyper_parameters"]["encoder"] == {"class_path": "custom_network.ResidualEncoder",
                                                   "init_args": {"features": 64, "blocks": 2}}
    assert any("blocks.1" in k for k in saved["state_dict"])  # the YAML's init_args built the network
    assert "val/episode_return_mean" in cli("validate", "--ckpt_path", str(ckpt), "--trainer.enable_progress_bar",
                                            "false", "--trainer.default_root_dir", str(tmp_path / "val"),
                                            "--model.evaluation_num_episodes", "2")
    cli("record", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "agent.gif"), "--num-episodes", "1",
        "--max-frames", "60")
    assert Image.open(tmp_path / "agent.gif").n_frames > 1
    cli("fit", "-c", str(ROOT / "examples" / "custom_network.yaml"), "--model.init_args.total_env_steps", "1024",
        "--ckpt_path", str(ckpt), *short)
    resumed = [torch.load(c, weights_only=True)["lightning_rl"]["global_counters"]["num_env_steps_sampled"]
               for c in tmp_path.glob("lightning_logs/version_1/checkpoints/*.ckpt")]
    assert max(resumed) > 512, resumed  # continued past the checkpoint's 512 steps


@pytest.mark.timeout(120)
def test_sampler_workers_run_the_encoder():
    """A3C's worker processes get a copy of the policy, encoder included, and send its gradients."""
    from tests.test_async import children
    from tests.test_env_faults import live_pids

    before = set(children())
    model = A3C(env="CartPole-v1", encoder=TwoLayerEncoder, num_workers=1, num_envs=2, rollout_fragment_length=5,
                seed=0, total_env_steps=None, sampler_timeout_s=30.0)
    start = encoders_of(model)[0].net[0].weight.detach().clone()
    quiet_trainer(max_epochs=1, limit_train_batches=3).fit(model)
    assert not live_pids([p for p in children() if p not in before], grace_s=3.0)
    assert model.counters["num_grad_updates"] == 3
    assert not torch.equal(encoders_of(model)[0].net[0].weight, start)  # the workers' gradients reached it


def test_a_subclass_defined_in_a_training_script_records_and_validates(tmp_path):
    """A ``class MyPPO(PPO)`` in a script's ``__main__`` is not defined in ``record``'s or
    ``validate``'s process: its checkpoint loads as PPO (same weights), with a warning naming it."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        from lightning_rl import PPO
        from tests.conftest import quiet_trainer

        class MyPPO(PPO):
            pass

        model = MyPPO(env="CartPole-v1", num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, seed=0)
        trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
        trainer.fit(model)
        trainer.save_checkpoint("my.ckpt")
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return proc

    run(str(script))
    saved = torch.load(tmp_path / "my.ckpt", weights_only=True)["lightning_rl"]
    assert saved["algorithm"] == "__main__.MyPPO" and saved["base_algorithm"] == "lightning_rl.algorithms.ppo.PPO"
    recorded = run("-m", "lightning_rl.cli", "record", "--ckpt_path", "my.ckpt", "--out", "a.gif", "--num-episodes",
                   "1", "--max-frames", "30")
    assert "'__main__.MyPPO' is not defined in this process: loading it as" in recorded.stderr
    assert Image.open(tmp_path / "a.gif").n_frames > 1
    validated = run("-m", "lightning_rl.cli", "validate", "--ckpt_path", "my.ckpt", "--trainer.enable_progress_bar",
                    "false", "--trainer.logger", "false", "--model.evaluation_num_episodes", "2")
    assert "val/episode_return_mean" in validated.stdout and "'__main__.MyPPO' is not defined" in validated.stderr
    with pytest.warns(UserWarning, match="MyPPO"):
        loaded = load_model(tmp_path / "my.ckpt")
    assert type(loaded) is PPO
    weights = torch.load(tmp_path / "my.ckpt", weights_only=True)["state_dict"]
    assert torch.equal(loaded.policy.pi_head.weight.detach(), weights["policies.default_policy.pi_head.weight"])
