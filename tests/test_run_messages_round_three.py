"""Issue 35, items 13-15: a resumed run says when its budget re-times a schedule, a run stopped
by a callback says why; Lightning's, ALE's and Ray's noise is silenced where it starts."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(300)


# ----------------------------------------------------------------------------- item 13: budget and schedules
class Records(logging.Handler):
    """What Lightning's rank-zero logger lets through (its filters applied)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def lightning_info():
    logger = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    records, level = Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)  # tests/conftest.py quiets Lightning's loggers to errors
    try:
        yield records.messages
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)


SCHEDULED = dict(num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=1, hiddens=(8,),
                 iterations_per_epoch=2, seed=0, lr=1e-3, lr_schedule="linear")


def test_a_larger_budget_at_resume_retimes_a_linear_schedule_and_says_so(tmp_path, lightning_info):
    """The rule (SB3's too): a schedule derived from the budget ends at the budget the run has now."""
    from lightning_rl import PPO
    from tests.conftest import quiet_trainer

    first = PPO(total_env_steps=128, **SCHEDULED)
    trainer = quiet_trainer(max_epochs=-1)
    trainer.fit(first)
    assert first.current(first.lr_points, first.lr) == 0.0  # decayed to 0 at its budget
    trainer.save_checkpoint(tmp_path / "a.ckpt", weights_only=False)
    lightning_info.clear()

    resumed = PPO(total_env_steps=256, **SCHEDULED)
    quiet_trainer(max_epochs=-1).fit(resumed, ckpt_path=tmp_path / "a.ckpt", weights_only=True)
    said = [m for m in lightning_info if "resumes" in m]
    assert said == ["PPO resumes at 128 env steps with total_env_steps=256 (was 128); the schedules derived from "
                    "the budget end at the new one: lr_schedule ends at 256 (was 128), so lr is 0.0005 (was 0)"]
    assert resumed.global_counters["num_env_steps_sampled"] == 256

    lightning_info.clear()  # the same budget, or a schedule that no budget sets: nothing to say
    constant = {**SCHEDULED, "lr_schedule": "constant"}
    first = PPO(total_env_steps=64, **constant)
    trainer = quiet_trainer(max_epochs=-1)
    trainer.fit(first)
    trainer.save_checkpoint(tmp_path / "c.ckpt", weights_only=False)
    quiet_trainer(max_epochs=-1).fit(PPO(total_env_steps=128, **constant), ckpt_path=tmp_path / "c.ckpt",
                                     weights_only=True)
    assert not [m for m in lightning_info if "resumes" in m]


# ----------------------------------------------------------------------------- item 14: early stops
def test_a_callback_that_stops_the_run_early_is_named_with_its_reason(lightning_info):
    from pytorch_lightning.callbacks import EarlyStopping

    from lightning_rl import PPO
    from tests.conftest import quiet_trainer

    model = PPO(total_env_steps=10_000, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16,
                num_sgd_iter=1, hiddens=(8,), iterations_per_epoch=2, seed=0, evaluation_interval=1,
                evaluation_num_episodes=2)
    stop = EarlyStopping(monitor="val/episode_return_mean", mode="max", stopping_threshold=1.0)
    quiet_trainer(max_epochs=-1, callbacks=[stop], num_sanity_val_steps=0).fit(model)
    said = [m for m in lightning_info if "stopped early" in m]
    assert len(said) == 1
    assert said[0].startswith("PPO stopped early, at 64 env steps of total_env_steps=10,000: EarlyStopping: "
                              "Stopping threshold reached: val/episode_return_mean = "), said
    assert "Signaling" not in said[0]

    lightning_info.clear()  # a run that ends at its budget says nothing of the kind
    model = PPO(total_env_steps=64, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=1,
                hiddens=(8,), iterations_per_epoch=2, seed=0)
    quiet_trainer(max_epochs=-1).fit(model)
    assert not [m for m in lightning_info if "stopped early" in m]


# ----------------------------------------------------------------------------- item 15: noise
def test_lightnings_tips_are_not_logged_and_its_other_lines_are(lightning_info, tmp_path):
    import pytorch_lightning as pl

    import lightning_rl.algorithms  # noqa: F401  # installs the filter

    pl.Trainer(default_root_dir=tmp_path, accelerator="cpu", devices=1, max_epochs=1)  # a logger, a ModelCheckpoint
    assert lightning_info, "the handler saw nothing: the test would pass on any code"
    assert not [m for m in lightning_info if "Tip" in m or "litlogger" in m or "litmodels" in m], lightning_info


def test_a_budget_is_the_limit_without_lightnings_max_epochs_warning():
    from lightning_rl import PPO
    from tests.conftest import quiet_trainer

    small = dict(num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=1, hiddens=(8,),
                 iterations_per_epoch=1, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = quiet_trainer()  # no max_epochs
        trainer.fit(PPO(total_env_steps=64, **small))
    assert not [w for w in caught if "max_epochs" in str(w.message)], [str(w.message) for w in caught]
    assert trainer.max_epochs == -1

    trainer = quiet_trainer(max_epochs=1000)  # given explicitly: it stands
    trainer.fit(PPO(total_env_steps=32, **small))
    assert trainer.max_epochs == 1000


def test_an_atari_env_prints_no_ale_banner(tmp_path):
    pytest.importorskip("ale_py")
    script = "from lightning_rl.data.envs import gym_make\ngym_make('ALE/Pong-v5').reset(seed=0)\nprint('ok')"
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "ok", proc.stderr[-3000:]
    assert "Stella" not in proc.stderr + proc.stdout and "A.L.E" not in proc.stderr + proc.stdout


def test_the_runs_own_ray_gets_a_token_of_its_own(monkeypatch):
    from lightning_rl.data.workers.ray_actors import AUTH_VARIABLES, restore_environ, run_token_auth

    for name in AUTH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    before = run_token_auth()
    assert os.environ["RAY_AUTH_MODE"] == "token" and len(os.environ["RAY_AUTH_TOKEN"]) == 64
    restore_environ(before)
    assert not [name for name in AUTH_VARIABLES if name in os.environ]

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the user's choice stands
    assert run_token_auth() == {} and "RAY_AUTH_TOKEN" not in os.environ


RAY_SCRIPT = textwrap.dedent("""
    import ray
    from lightning_rl.data.workers.ray_actors import restore_environ, run_token_auth
    before = run_token_auth()
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    print(ray.get(ray.put(7)))
    ray.shutdown()
    restore_environ(before)
""")


def test_a_local_ray_started_that_way_warns_of_no_token_and_writes_nothing_to_home(tmp_path):
    pytest.importorskip("ray")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT))  # RAY_TMPDIR: the suite's (tests/conftest.py)
    proc = subprocess.run([sys.executable, "-c", RAY_SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=200)
    assert proc.returncode == 0 and proc.stdout.strip() == "7", proc.stderr[-3000:]
    assert "Token authentication" not in proc.stderr, proc.stderr[-3000:]
    assert not (home / ".ray").exists()
