"""Custom envs by ``"module:Id-v0"`` with ``env_kwargs``: the kwargs reach every place that makes
envs (training, async workers, evaluation, recording, a registered vector_entry_point), a
checkpoint reloads the same env, and the commands of docs/guides/custom-env.md run as written."""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from lightning_rl import PPO, evaluate
from lightning_rl.batch import DEFAULT_POLICY_ID
from lightning_rl.data.envs import GymMake, close_vector_env, make_vector_env, reset_vector_env, step_vector_env
from lightning_rl.recording import record
from tests.conftest import fit_in_halves, fit_iterations, sample_once

ROOT = Path(__file__).resolve().parents[1]
MODULE = "kwprobe_envs"  # written into a tmp dir on sys.path: nothing in the repo registers it
ENV = f"{MODULE}:KwProbe-v0"
KWARGS = {"size": 5, "fill": 0.25}

PROBE_SOURCE = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np


    class KwProbe(gym.Env):
        """Observations filled with ``fill`` of shape (size,), reward ``fill``, 3-step episodes."""

        metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

        def __init__(self, size=3, fill=0.0, render_mode=None):
            self.size, self.fill, self.render_mode = size, fill, render_mode
            self.observation_space = gym.spaces.Box(-10.0, 10.0, (size,), dtype=np.float32)
            self.action_space = gym.spaces.Discrete(2)
            self.t = 0

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.full(self.size, self.fill, dtype=np.float32), {}

        def step(self, action):
            self.t += 1
            return np.full(self.size, self.fill, dtype=np.float32), float(self.fill), self.t >= 3, False, {}

        def render(self):
            return np.full((8, 8, 3), 200, dtype=np.uint8)


    gym.register(id="KwProbe-v0", entry_point=KwProbe)
''')


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("envmod")
    (folder / f"{MODULE}.py").write_text(PROBE_SOURCE)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)


def small_ppo(**kwargs) -> PPO:
    defaults = dict(env=ENV, env_kwargs=KWARGS, num_envs=2, rollout_fragment_length=8, iterations_per_epoch=1,
                    num_sgd_iter=1, sgd_minibatch_size=16, seed=0, total_env_steps=None)
    return PPO(**{**defaults, **kwargs})


def test_env_kwargs_reach_training_evaluation_and_recording(probe_dir, tmp_path):
    model = small_ppo()
    assert model.env_spec == GymMake(ENV, KWARGS)
    assert model.observation_space.shape == (5,)
    assert model.hparams.env == ENV and model.hparams.env_kwargs == KWARGS  # plain data in the checkpoint
    obs = sample_once(model).policy_batches[DEFAULT_POLICY_ID]["obs"]
    assert obs.shape[1:] == (5,) and torch.all(obs == 0.25)
    assert evaluate(model, num_episodes=2) == [0.75, 0.75]  # 3 steps of reward `fill`
    assert record(model, tmp_path / "probe.gif", num_episodes=1) == [0.75]


def test_env_kwargs_reach_async_env_workers(probe_dir):
    envs = make_vector_env(GymMake(ENV, KWARGS), 2, "async")
    try:
        obs, _ = reset_vector_env(envs, seed=0)
        assert obs.shape == (2, 5) and np.all(obs == 0.25)
    finally:
        close_vector_env(envs)


def test_env_kwargs_reach_the_sampler_processes_of_impala(probe_dir):
    from lightning_rl import IMPALA

    class ObsSeen(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.obs = batch.policy_batches[DEFAULT_POLICY_ID]["obs"]

    seen = ObsSeen()
    model = IMPALA(env=ENV, env_kwargs=KWARGS, num_workers=1, num_envs=2, rollout_fragment_length=8, seed=0,
                   total_env_steps=None)
    fit_iterations(model, 1, callbacks=[seen])
    assert seen.obs.shape[-1] == 5 and torch.all(seen.obs == 0.25)  # made in the worker process


def test_env_kwargs_reach_a_registered_vector_entry_point():
    # CartPole registers its own batched env; the kwargs go to it (Sutton and Barto's reward is 0 per step).
    envs = make_vector_env(GymMake("CartPole-v1", {"sutton_barto_reward": True}), 2, "auto")
    try:
        assert type(envs.unwrapped).__name__ == "CartPoleVectorEnv"
        reset_vector_env(envs, seed=0)
        _, rewards, *_ = step_vector_env(envs, np.zeros(2, dtype=np.int64))
        assert np.all(rewards == 0.0)
    finally:
        close_vector_env(envs)


def test_env_kwargs_of_a_callable_env(probe_dir):
    import kwprobe_envs

    model = small_ppo(env=kwprobe_envs.KwProbe, env_kwargs={"size": 4, "fill": 0.5})
    assert model.observation_space.shape == (4,)
    assert evaluate(model, num_episodes=1) == [1.5]


def test_env_kwargs_of_a_multi_agent_env_factory_named_by_import_path():
    pytest.importorskip("pettingzoo")
    model = small_ppo(env="tests.multi_agent_envs.Relay", env_kwargs={"length": 3, "leave_at": 2, "join_at": 1},
                      policies={"p_runner": {}, "p_helper": {}}, num_envs=1, rollout_fragment_length=6,
                      sgd_minibatch_size=4, policy_mapping_fn={"runner": "p_runner", "helper": "p_helper"})
    assert model.multi_agent
    assert sample_once(model).info["episode_lengths"] == [3, 3]  # Relay's default length is 6


def test_checkpoint_reloads_the_env_with_its_kwargs(probe_dir, tmp_path, capsys):
    model = small_ppo()
    trainer = fit_iterations(model, 1, default_root_dir=tmp_path)
    trainer.save_checkpoint(tmp_path / "probe.ckpt")
    loaded = PPO.load_from_checkpoint(tmp_path / "probe.ckpt", weights_only=True)
    assert loaded.env_spec == GymMake(ENV, KWARGS) and loaded.observation_space.shape == (5,)
    assert evaluate(loaded, num_episodes=1) == [0.75]
    from lightning_rl.recording import main as record_main

    gif = tmp_path / "other.gif"
    assert record_main(["--ckpt_path", str(tmp_path / "probe.ckpt"), "--out", str(gif), "--num-episodes", "1",
                        "--env_kwargs", "{size: 5, fill: 0.5}"]) == 0
    assert "episode returns: 1.5" in capsys.readouterr().out and gif.is_file()  # played with the new kwargs


def test_resume_with_env_kwargs_matches_an_uninterrupted_run(probe_dir, tmp_path):
    full, _, resumed = fit_in_halves(small_ppo, tmp_path, batches=2)
    assert full.counters == resumed.counters
    for a, b in zip(full.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_module_that_does_not_import_is_named():
    with pytest.raises(ValueError, match=r"env 'no_such_envmod:Foo-v0': importing no_such_envmod failed: "
                                         r"No module named 'no_such_envmod'"):
        PPO(env="no_such_envmod:Foo-v0")


def test_an_id_the_module_does_not_register_is_named(probe_dir):
    with pytest.raises(ValueError, match=rf"unknown env id '{MODULE}:Nope-v0' \(importing {MODULE} did not "
                                         r"register it\)"):
        PPO(env=f"{MODULE}:Nope-v0", env_kwargs={"size": 2})


# ----------------------------------------------------------------------------- the documented commands
def readme_commands() -> list[list[str]]:
    """The ``lightning-rl`` lines of the documented "Custom env" bash block (the one that trains
    ``my_envs:GridTarget-v0``, in README.md or docs/), split as a shell would."""
    from tests.doc_blocks import DOC_FILES, code_blocks

    (block,) = [b.code for path in DOC_FILES for b in code_blocks(path)
                if b.language == "bash" and "--model.env my_envs:GridTarget-v0" in b.code]
    block = block.replace("\\\n", " ")
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith(("lightning-rl", "PYTHONPATH="))]


def run_cli(*commands: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``lightning-rl`` commands run one after the other in one fresh Python process (each
    process pays seconds of imports) that finds ``my_envs`` on PYTHONPATH, as a user's would."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "examples" / "custom_env"), str(ROOT)])}
    script = (f"from lightning_rl.cli import main\nfor argv in {list(commands)!r}:\n"
              "    if main(argv) != 0:\n        raise SystemExit(argv)")
    proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_readme_custom_env_commands_train_validate_and_record_a_gif(tmp_path):
    commands = readme_commands()
    assert [c[c.index("lightning-rl") + 1] for c in commands] == ["fit", "validate", "record"]
    fit, validate, record_ = (c[c.index("lightning-rl") + 1:] for c in commands)
    assert "--model.env_kwargs" in fit
    # the documented run, cut to 2 iterations of 2 envs (later flags override earlier ones)
    run_cli([*fit, "--model.total_env_steps", "128", "--model.num_envs", "2", "--model.rollout_fragment_length",
             "32", "--model.iterations_per_epoch", "2", "--model.num_sgd_iter", "1",
             "--model.evaluation_num_episodes", "2", "--trainer.num_sanity_val_steps", "0"], cwd=tmp_path)
    pattern = validate[validate.index("--ckpt_path") + 1]
    assert record_[record_.index("--ckpt_path") + 1] == pattern
    (ckpt,) = glob.glob(str(tmp_path / pattern))  # what the shell expands
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert state["hyper_parameters"]["env_kwargs"] == {"size": 5}
    assert state["lightning_rl"]["global_counters"]["num_env_steps_sampled"] >= 128

    out = run_cli([ckpt if a == pattern else a for a in validate], [ckpt if a == pattern else a for a in record_],
                  cwd=tmp_path)
    assert "val/episode_return_mean" in out.stdout  # played on GridTarget size 5, from the checkpoint alone
    assert "wrote agent.gif" in out.stdout
    from PIL import Image

    with Image.open(tmp_path / record_[record_.index("--out") + 1]) as image:
        assert image.n_frames > 1 and image.size == (5 * 16, 5 * 16)
