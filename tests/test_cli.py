"""The ``lightning-rl`` CLI in subprocesses: every example YAML, validate from its checkpoint,
--model selection, --print_config round trip."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.test_async_faults import processes_of
from tests.test_env_faults import live_pids

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "examples" / "configs").glob("*.yaml"))
SHORT = {  # a few iterations of each config
    "ppo_cartpole": ["--model.init_args.total_env_steps", "512", "--model.init_args.iterations_per_epoch", "1"],
    "ppo_pendulum": ["--model.init_args.total_env_steps", "4096", "--model.init_args.rollout_fragment_length", "512"],
    "a2c_cartpole": ["--model.init_args.total_env_steps", "400", "--model.init_args.iterations_per_epoch", "5"],
    "dqn_cartpole": ["--model.init_args.total_env_steps", "1024", "--model.init_args.iterations_per_epoch", "4"],
    "impala_cartpole": ["--model.init_args.total_env_steps", "2000", "--model.init_args.iterations_per_epoch", "2"],
    "apex_cartpole": ["--model.init_args.total_env_steps", "1536", "--model.init_args.iterations_per_epoch", "4",
                      "--model.init_args.learning_starts", "256", "--model.init_args.evaluation_num_episodes", "2"],
    "a3c_cartpole": ["--model.init_args.total_env_steps", "800", "--model.init_args.iterations_per_epoch", "5",
                     "--model.init_args.evaluation_num_episodes", "2"],
    "appo_cartpole": ["--model.init_args.total_env_steps", "2000", "--model.init_args.iterations_per_epoch", "2"],
    "appo_pendulum": ["--model.init_args.total_env_steps", "2048", "--model.init_args.iterations_per_epoch", "4",
                      "--model.init_args.evaluation_num_episodes", "2"],
    "ppo_speaker_listener": ["--model.init_args.total_env_steps", "1600", "--model.init_args.iterations_per_epoch", "2",
                             "--model.init_args.evaluation_num_episodes", "2"],
    "ppo_atari": ["--model.init_args.total_env_steps", "256", "--model.init_args.num_envs", "2",
                  "--model.init_args.sgd_minibatch_size", "64", "--model.init_args.iterations_per_epoch", "1",
                  "--model.init_args.evaluation_num_episodes", "1"],
    "dqn_atari": ["--model.init_args.total_env_steps", "256", "--model.init_args.learning_starts", "128",
                  "--model.init_args.buffer_size", "1000", "--model.init_args.iterations_per_epoch", "32",
                  "--model.init_args.evaluation_num_episodes", "1"],
    "impala_atari": ["--model.init_args.total_env_steps", "320", "--model.init_args.num_envs", "2",
                     "--model.init_args.train_batch_size", "80", "--model.init_args.iterations_per_epoch", "2",
                     "--model.init_args.evaluation_num_episodes", "1"],
    "sac_pendulum": ["--model.init_args.total_env_steps", "300", "--model.init_args.iterations_per_epoch", "150",
                     "--model.init_args.evaluation_num_episodes", "2"],
    "td3_pendulum": ["--model.init_args.total_env_steps", "300", "--model.init_args.iterations_per_epoch", "150",
                     "--model.init_args.evaluation_num_episodes", "2"],
    # MuJoCo (the mujoco extra): the short forms also show that --model.init_args.env picks the env
    "td3_mujoco": ["--model.init_args.env", "HalfCheetah-v5", "--model.init_args.total_env_steps", "300",
                   "--model.init_args.learning_starts", "200", "--model.init_args.hiddens", "[32]",
                   "--model.init_args.iterations_per_epoch", "150", "--model.init_args.evaluation_num_episodes", "1"],
    "sac_mujoco": ["--model.init_args.env", "Walker2d-v5", "--model.init_args.total_env_steps", "300",
                   "--model.init_args.learning_starts", "200", "--model.init_args.hiddens", "[32]",
                   "--model.init_args.iterations_per_epoch", "150", "--model.init_args.evaluation_num_episodes", "1"],
    "ppo_mujoco": ["--model.init_args.total_env_steps", "512", "--model.init_args.rollout_fragment_length", "256",
                   "--model.init_args.iterations_per_epoch", "1", "--model.init_args.evaluation_num_episodes", "1"],
}


def lightning_rl(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "lightning_rl.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def test_every_config_has_a_short_form():
    assert {c.stem for c in CONFIGS} == set(SHORT)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.stem)
def test_fit_from_config_then_validate_from_its_checkpoint(config, tmp_path):
    """Every shipped config, with its budget cut short: the fit ends with ``last.ckpt`` holding the
    final counters (whatever the config's evaluation_interval: APEX and A3C validate, and so
    save by cadence, every 2nd epoch only), and ``validate`` runs from it."""
    if "mujoco" in config.stem:
        pytest.importorskip("gymnasium.envs.mujoco", reason='MuJoCo is not installed: pip install -e ".[mujoco]"')
    lightning_rl("fit", "-c", str(config), *SHORT[config.stem], "--trainer.default_root_dir", str(tmp_path),
                 "--trainer.enable_progress_bar", "false", cwd=tmp_path)
    assert not live_pids(processes_of(tmp_path), grace_s=3.0)  # no sampler process (IMPALA/APPO) outlives it
    (version,) = (tmp_path / "lightning_logs").glob("version_*")
    assert (version / "config.yaml").is_file()
    ckpt = version / "checkpoints" / "last.ckpt"
    budget = int(SHORT[config.stem][SHORT[config.stem].index("--model.init_args.total_env_steps") + 1])
    counters = {c.name: torch.load(c, weights_only=True)["lightning_rl"]["global_counters"]
                for c in version.glob("checkpoints/*.ckpt")}
    assert counters[ckpt.name]["num_env_steps_sampled"] >= budget, counters
    assert all(counters[ckpt.name]["num_iterations"] >= c["num_iterations"] for c in counters.values()), counters
    out = lightning_rl("validate", "--ckpt_path", str(ckpt), "--trainer.default_root_dir", str(tmp_path / "val"),
                       "--trainer.enable_progress_bar", "false", cwd=tmp_path)
    assert "val/episode_return_mean" in out.stdout


def test_model_selected_by_name_on_the_command_line(tmp_path):
    lightning_rl("fit", "--model", "A2C", "--model.env", "CartPole-v1", "--model.iterations_per_epoch", "3",
                 "--model.total_env_steps", "null", "--trainer.max_epochs", "2", "--trainer.default_root_dir",
                 str(tmp_path), "--trainer.enable_progress_bar", "false", cwd=tmp_path)
    ckpt = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=True)["lightning_rl"]
    assert state["algorithm"].endswith("A2C") and state["global_counters"]["num_iterations"] == 6


@pytest.mark.parametrize("config", [c for c in CONFIGS if c.stem in ("ppo_cartpole", "dqn_cartpole")],
                         ids=lambda c: c.stem)
def test_print_config_round_trip(config, tmp_path):
    first = lightning_rl("fit", "-c", str(config), "--print_config", cwd=tmp_path).stdout
    (tmp_path / "printed.yaml").write_text(first)
    second = lightning_rl("fit", "-c", str(tmp_path / "printed.yaml"), "--print_config", cwd=tmp_path).stdout
    assert yaml.safe_load(first) == yaml.safe_load(second)
    model = yaml.safe_load(first)["model"]
    assert model["class_path"] == f"lightning_rl.{config.stem.split('_')[0].upper()}"
    assert model["init_args"]["env"] == "CartPole-v1"


def test_help_lists_the_tools(tmp_path):
    out = subprocess.run([sys.executable, "-m", "lightning_rl.cli", "--help"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert "lightning-rl plot" in out.stdout and "lightning-rl record" in out.stdout
    assert "lightning-rl tune -c CONFIG.yaml --search-space ppo" in out.stdout


@pytest.mark.parametrize(("env", "message"), [
    ("no_such_envmod:Foo-v0", "env 'no_such_envmod:Foo-v0': importing no_such_envmod failed: "
                              "No module named 'no_such_envmod'"),
    ("NoSuchEnv-v9", "unknown env id 'NoSuchEnv-v9'"),
])
def test_a_bad_env_is_named_not_reported_as_a_union_mismatch(env, message, capsys, tmp_path, monkeypatch):
    from lightning_rl.cli import main

    monkeypatch.chdir(tmp_path)  # in-process: a parse error, before anything is built or written
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--model", "PPO", "--model.env", env, "--model.env_kwargs", "{size: 5}"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert message in err and "Union" not in err


def warning_lines(stderr: str) -> list[str]:
    """Python warnings (``path.py:LINE: message``, Lightning's format, or ``...Warning:``), Lightning's
    ``weights_only`` notice and SDL's display/audio errors, as printed on stderr."""
    pattern = re.compile(r"\.py:\d+: |Warning\b|weights_only|XDG_RUNTIME_DIR|ALSA|error:", re.IGNORECASE)
    return [line for line in stderr.splitlines() if pattern.search(line)]


def test_a_normal_fit_validate_resume_record_and_python_fit_print_no_warnings(tmp_path):
    """The CLI's fit (with a ModelCheckpoint of its own, as the SB3 block of docs/guides/from-sb3.md has), validate
    from its checkpoint, resuming it into the next version folder, record; and an example script
    (the Python API)."""
    config = ROOT / "examples" / "configs" / "ppo_cartpole.yaml"
    common = ["-c", str(config), "--model.init_args.evaluation_num_episodes", "2", "--trainer.default_root_dir",
              str(tmp_path), "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor",
              "val/episode_return_mean", "--trainer.callbacks.mode", "max"]
    fit = lightning_rl("fit", *common, "--model.init_args.total_env_steps", "512", cwd=tmp_path)
    assert not warning_lines(fit.stderr), fit.stderr[-4000:]
    ckpt = max((tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("*.ckpt"))  # last.ckpt
    validate = lightning_rl("validate", "--ckpt_path", str(ckpt), "--trainer.default_root_dir", str(tmp_path / "val"),
                            cwd=tmp_path)
    assert not warning_lines(validate.stderr), validate.stderr[-4000:]
    resume = lightning_rl("fit", *common, "--model.init_args.total_env_steps", "1024", "--ckpt_path", str(ckpt),
                          cwd=tmp_path)
    assert not warning_lines(resume.stderr), resume.stderr[-4000:]
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER")}
    record = subprocess.run([sys.executable, "-m", "lightning_rl.cli", "record", "--ckpt_path", str(ckpt), "--out",
                             str(tmp_path / "a.gif"), "--num_episodes", "1"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env=env)
    assert record.returncode == 0, record.stderr[-4000:]
    assert (tmp_path / "a.gif").stat().st_size > 0
    assert not warning_lines(record.stderr + record.stdout), record.stderr[-4000:]
    example = subprocess.run([sys.executable, str(ROOT / "examples" / "ppo_cartpole.py"), "--total-env-steps", "512",
                              "--log-dir", str(tmp_path / "runs")], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert example.returncode == 0, example.stderr[-4000:]
    assert not warning_lines(example.stderr), example.stderr[-4000:]


def test_without_tensorboard_the_cli_logs_to_csv_without_lightnings_install_notice(tmp_path, monkeypatch):
    """An install without the tensorboard extra: Lightning's default logger would fall back to CSV
    with a notice to ``pip install lightning[extra]`` (another package); the CLI picks CSV itself."""
    import warnings

    from pytorch_lightning.loggers import CSVLogger
    from pytorch_lightning.trainer.connectors.logger_connector import logger_connector

    import lightning_rl.cli
    import lightning_rl.cli_lightning

    monkeypatch.setattr(logger_connector, "_TENSORBOARD_AVAILABLE", False)
    monkeypatch.setattr(logger_connector, "_TENSORBOARDX_AVAILABLE", False)
    monkeypatch.setattr(lightning_rl.cli_lightning, "tensorboard_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = lightning_rl.cli.cli(["--model", "PPO", "--model.env", "CartPole-v1",
                                      "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert not [w for w in caught if "lightning[extra]" in str(w.message)]
    assert type(built.trainer.logger) is CSVLogger and built.trainer.logger.save_dir == str(tmp_path)

    import lightning_rl.loggers  # what the examples use

    monkeypatch.setattr(lightning_rl.loggers, "tensorboard_available", lambda: False)
    assert type(lightning_rl.loggers.default_logger(tmp_path, name="run")) is CSVLogger
