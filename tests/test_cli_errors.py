"""The ``lightning-rl`` command line as a user meets it: one-line errors, forgiving input,
``test`` and no ``predict``, resuming with overrides, every setting described. In-process
(``lightning_rl.cli.main``) except the console script's own ``sys.path``."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from jsonargparse import ArgumentParser

import lightning_rl
from lightning_rl import PPO
from lightning_rl.cli import RLCLI
from lightning_rl.evaluation import evaluate
from lightning_rl.recording import add_arguments
from lightning_rl.recording import main as record_main
from tests.conftest import quiet_trainer, run_main

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = ("PPO", "A2C", "DQN", "SAC", "TD3", "DDPG", "IMPALA", "APPO", "APEX", "A3C")
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
# what a small PPO fit takes: 64 env steps per iteration
SMALL_PPO = dict(num_envs=4, rollout_fragment_length=16, sgd_minibatch_size=32, num_sgd_iter=2, iterations_per_epoch=1)


@pytest.fixture(scope="module")
def ppo_ckpt(tmp_path_factory) -> Path:
    """A finished PPO run of 2 iterations (128 env steps), saved as the CLI would resume it."""
    path = tmp_path_factory.mktemp("ppo") / "ppo.ckpt"
    model = PPO(total_env_steps=128, seed=0, **SMALL_PPO)
    trainer = quiet_trainer(max_epochs=-1)
    trainer.fit(model)
    assert model.global_counters["num_iterations"] == 2
    trainer.save_checkpoint(path)
    return path


def the_error(err: str, command: str = "fit") -> str:
    """The one error line of ``err`` (and nothing that looks like a traceback or a report)."""
    lines = [line for line in err.splitlines() if "error" in line.lower() or line.startswith(("  ", "Traceback"))]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"lightning-rl {command}: error: "), err[-3000:]
    assert "Traceback" not in err and "Namespace(" not in err and "usage:" not in err, err[-3000:]
    return lines[0]


def printed_metric(stdout: str, name: str) -> float:
    """A metric from the table Lightning prints after ``test`` (plain or rich)."""
    found = re.search(rf"{re.escape(name)}\W*?(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)", stdout)
    assert found, stdout[-3000:]
    return float(found.group(1))


def written_counters(root: Path) -> list[dict[str, int]]:
    return [torch.load(ckpt, weights_only=True)["lightning_rl"]["global_counters"]
            for ckpt in sorted(root.rglob("*.ckpt"))]


# ----------------------------------------------------------------------------- item 14: one-line errors
@pytest.mark.parametrize(("args", "message"), [
    (["--model", "PPO", "--model.gamma", "1.5"], "gamma must be in (0, 1], got 1.5"),
    (["--model", "PPO", "--model.lr", "-0.001"], "lr must be positive, got -0.001"),
    (["--model", "DQN", "--model.env", "Pendulum-v1"], "DQN needs Discrete actions"),
    (["--model", "PPO", "--model.num_env", "3"], "--model.num_env: PPO has no setting 'num_env'; did you mean "
                                                 "--model.num_envs?"),
    (["--model", "SAC", "--model.init_args.learning_start", "3"], "did you mean --model.learning_starts?"),
    # (subclasses other tests defined in this process follow the built-in ones)
    (["--model", "TRPO"], "--model TRPO: no such algorithm (the algorithms: A2C, A3C, APEX, APPO, DDPG, DQN, IMPALA, "
                          "PPO, SAC, TD3"),
    (["--model", "PPO", "--model.gamma", "abc"], "--model.gamma: expected float, got 'abc'"),
    (["--model", "PPO", "--model.max_seq_len", "1.5"], "--model.max_seq_len: expected int, got '1.5'"),
    (["--model", "PPO", "--trainer.max_epochs", "abc"], "--trainer.max_epochs: expected int, got 'abc'"),
    (["--model.num_envs", "3"], "no algorithm chosen: add --model NAME"),
    (["--model", "PPO", "--trainer.gradient_clip_val", "0.5"], "set the maximum gradient norm with --model.grad_clip"),
    (["--model", "PPO", "--model.env", "CartPol-v1"], "unknown env id 'CartPol-v1': Environment `CartPol` doesn't "
                                                      "exist. Did you mean: `CartPole`?"),
])
def test_a_bad_command_line_is_one_line_naming_what_is_wrong(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["fit", *args, "--model.total_env_steps", "64", *QUIET], capsys)
    assert code == 2
    assert message in the_error(err)
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize(("name", "total"), [("ppo", "1e5"), ("Ppo", "100000.0"), ("PPO", "1.0E5")])
def test_an_algorithm_in_any_case_and_an_integral_float_budget_are_accepted(name, total, capsys, tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(["fit", "--model", name, "--model.total_env_steps", total, "--print_config"], capsys)
    assert code == 0, err[-3000:]
    model = yaml.safe_load(out)["model"]
    assert model["class_path"] == "lightning_rl.PPO"
    assert model["init_args"]["total_env_steps"] == 100_000 and type(model["init_args"]["total_env_steps"]) is int


def test_a_text_file_as_checkpoint_is_our_error_not_torchs_advice(capsys, tmp_path, monkeypatch):
    """fit, validate, test and record: one line saying what the file is; never torch's suggestion to
    load it with ``weights_only=False`` (which would run code)."""
    monkeypatch.chdir(tmp_path)
    text = tmp_path / "config.yaml"
    text.write_text("model:\n  class_path: lightning_rl.PPO\n")
    for command, extra in (("fit", ["--model", "PPO"]), ("fit", []), ("validate", []), ("test", [])):
        code, _, err = run_main([command, *extra, "--ckpt_path", str(text)], capsys)
        assert code == 2
        line = the_error(err, command)
        assert f"checkpoint {str(text)!r} is corrupt or truncated, or not a checkpoint: a text file" in line
        assert "weights_only" not in err
    assert record_main(["--ckpt_path", str(text), "--out", str(tmp_path / "a.gif")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lightning-rl record: error: ") and "a text file" in err and "weights_only" not in err

    pickled = tmp_path / "pickled.ckpt"  # a zip whose pickle names a function (harmless here: never called)
    torch.save({"state_dict": {}, "payload": CallsGetcwd()}, pickled)
    code, _, err = run_main(["validate", "--ckpt_path", str(pickled)], capsys)
    assert code == 2
    line = the_error(err, "validate")
    assert f"checkpoint {str(pickled)!r} holds objects other than plain data, which a safe load" in line
    assert "posix.getcwd" in line and "set to `False`" not in line and "weights_only=False" not in line


class CallsGetcwd:
    def __reduce__(self):
        return os.getcwd, ()


def test_record_on_another_env_names_both_spaces(ppo_ckpt, capsys, tmp_path):
    assert record_main(["--ckpt_path", str(ppo_ckpt), "--env", "Acrobot-v1", "--out", str(tmp_path / "a.gif")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"lightning-rl record: error: checkpoint {str(ppo_ckpt)!r} was trained on env 'CartPole-v1'")
    assert "action space Discrete(2)" in err and "fit env 'Acrobot-v1'" in err and "action space Discrete(3)" in err
    assert "(6,), float32" in err and "(4,), float32" in err
    assert not (tmp_path / "a.gif").exists()


def test_record_algo_help_lists_every_algorithm():
    """Each name as a whole entry of the list (``"PPO" in help`` would also match ``APPO``)."""
    (algo,) = [a for a in add_arguments(argparse.ArgumentParser())._actions if a.dest == "algo"]
    listed = re.fullmatch(r"algorithm class \((.*)\); default: the checkpoint's", algo.help)
    assert listed, algo.help
    # the built-in algorithms first, sorted (subclasses other tests defined in this process follow)
    assert listed.group(1).split(", ")[: len(ALGORITHMS)] == sorted(ALGORITHMS), algo.help


# ----------------------------------------------------------------------------- item 7: test, no predict
def test_test_plays_greedy_episodes_on_test_envs_and_logs_test_metrics(ppo_ckpt, capsys, tmp_path, monkeypatch):
    """``trainer.test(model)`` and ``lightning-rl test --ckpt_path``: ``evaluation_num_episodes``
    greedy episodes on envs seeded ``seed + 200_000`` (validation's are ``+ 100_000``), logged as
    ``test/episode_return_mean/min/max``; the command line's ``evaluation_num_episodes`` is used."""
    model = PPO.load_from_checkpoint(ppo_ckpt, weights_only=True)
    expected = evaluate(model, num_episodes=3, seed=200_000)
    model.evaluation_num_episodes = 3
    (metrics,) = quiet_trainer().test(model, verbose=False)
    assert metrics["test/episode_return_mean"] == pytest.approx(np.mean(expected))
    assert metrics["test/episode_return_min"] == min(expected) and metrics["test/episode_return_max"] == max(expected)

    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(["test", "--ckpt_path", str(ppo_ckpt), "--model.evaluation_num_episodes", "3",
                               "--trainer.logger", "false", *QUIET], capsys)
    assert code == 0, err[-3000:]
    assert printed_metric(out, "test/episode_return_mean") == pytest.approx(np.mean(expected))


def test_predict_is_not_offered(capsys):
    code, _, err = run_main(["predict", "--model", "PPO"], capsys)
    assert code == 2
    line = the_error(err, "predict")
    assert "not offered" in line and "lightning-rl test --ckpt_path" in line and "model.predict(obs)" in line
    assert set(RLCLI.subcommands()) == {"fit", "validate", "test"}


# ----------------------------------------------------------------------------- item 10: resume
def test_resume_honours_a_new_budget_and_a_finished_run_trains_nothing(ppo_ckpt, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["fit", "--model", "PPO", "--ckpt_path", str(ppo_ckpt), "--model.total_env_steps", "256",
                             "--trainer.default_root_dir", str(tmp_path / "more"), *QUIET], capsys)
    assert code == 0, err[-3000:]
    assert written_counters(tmp_path / "more")[-1]["num_env_steps_sampled"] == 256  # not the checkpoint's 128

    code, _, err = run_main(["fit", "--ckpt_path", str(ppo_ckpt), "--trainer.default_root_dir", str(tmp_path / "done"),
                             *QUIET], capsys)  # the algorithm from the checkpoint
    assert code == 0, err[-3000:]
    assert all(c["num_iterations"] == 2 for c in written_counters(tmp_path / "done"))  # no iteration more

    model = PPO(total_env_steps=128, seed=0, **SMALL_PPO)  # the Python API: the same budget, spent
    quiet_trainer(max_epochs=-1).fit(model, ckpt_path=ppo_ckpt)
    assert model.global_counters["num_iterations"] == 2 and model.global_counters["num_env_steps_sampled"] == 128


CHANGED = {"total_env_steps": 4096, "iterations_per_epoch": 3, "iterations_per_step": 2,
           "evaluation_interval": 2, "evaluation_num_episodes": 4, "evaluation_max_episode_steps": 500,
           "num_cpu_threads": 2, "cpu_affinity": False, "compile": True, "check_finite": False,
           "sampler_timeout_s": 30.0, "restart_failed_workers": True, "sampler_backend": "ray",
           "ray_address": "10.0.0.1:6379", "num_cpus_per_worker": 2.0, "custom_resources_per_worker": {"cpu_node": 1.0}}


def test_every_resumable_setting_is_taken_from_the_command_line(ppo_ckpt, tmp_path, capsys, monkeypatch):
    """Each of ``RESUMABLE_SETTINGS`` given with ``--ckpt_path`` reaches the model (PPO's, and
    IMPALA's worker settings); every other setting is the checkpoint's."""
    from lightning_rl import IMPALA

    impala = IMPALA(num_workers=0, num_envs=2, rollout_fragment_length=10, train_batch_size=20, total_env_steps=20,
                    seed=0)
    trainer = quiet_trainer(max_epochs=-1)
    trainer.fit(impala)
    trainer.save_checkpoint(tmp_path / "impala.ckpt")
    built = []
    monkeypatch.setattr(RLCLI, "_run_subcommand", lambda self, subcommand: built.append(self.model))
    monkeypatch.chdir(tmp_path)
    tested = set()
    for name, ckpt in (("PPO", ppo_ckpt), ("IMPALA", tmp_path / "impala.ckpt")):
        saved = torch.load(ckpt, weights_only=True)["hyper_parameters"]
        given = {k: v for k, v in CHANGED.items() if k in saved}
        assert all(saved[k] != v for k, v in given.items())
        tested |= set(given)
        args = [a for k, v in given.items() for a in (f"--model.{k}", yaml.safe_dump(v).split("\n")[0])]
        code, _, err = run_main(["fit", "--model", name, "--ckpt_path", str(ckpt), *args, *QUIET], capsys)
        assert code == 0, err[-3000:]
        hparams = {k: v for k, v in built.pop().hparams.items() if not k.startswith("_")}
        assert {k: hparams[k] for k in given} == given
        kept = set(hparams) - set(given)
        assert json.dumps({k: hparams[k] for k in kept}, sort_keys=True) == json.dumps({k: saved[k] for k in kept},
                                                                                     sort_keys=True)
    from lightning_rl.cli import RESUMABLE_SETTINGS

    assert tested == set(CHANGED) == set(RESUMABLE_SETTINGS)


def test_the_cli_guide_lists_every_setting_a_resume_may_change():
    """docs/guides/cli.md's "Resuming" names exactly ``RESUMABLE_SETTINGS``, in their order."""
    import re
    from pathlib import Path

    from lightning_rl.cli import RESUMABLE_SETTINGS

    guide = (Path(__file__).parents[1] / "docs" / "guides" / "cli.md").read_text()
    sentence = guide.split("command line may change only", 1)[1].split(". A different value", 1)[0]
    assert tuple(re.findall(r"`(\w+)`", sentence)) == RESUMABLE_SETTINGS


KEEPS = ", and a run continued from a checkpoint keeps its settings except {settings}"


@pytest.mark.parametrize(("args", "message"), [
    (["--model.hiddens", "[32]"], "--model.hiddens [32]: checkpoint {ckpt!r} was trained with [64, 64]" + KEEPS),
    (["--model.lr", "0.01"], "--model.lr 0.01: checkpoint {ckpt!r} was trained with 0.0003" + KEEPS),
    (["--model.env", "Acrobot-v1"], "--model.env 'Acrobot-v1': checkpoint {ckpt!r} was trained with 'CartPole-v1'"
                                    + KEEPS),
    (["--model", "DQN"], "--model DQN: checkpoint {ckpt!r} was written by PPO; leave --model out to take the "
                         "checkpoint's"),
])
def test_resume_refuses_by_name_what_cannot_change(ppo_ckpt, args, message, capsys, tmp_path, monkeypatch):
    """The whole error line, which names the setting, the checkpoint's value and what may change."""
    from lightning_rl.cli import RESUMABLE_SETTINGS

    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["fit", "--ckpt_path", str(ppo_ckpt), *args, *QUIET], capsys)
    assert code == 2
    expected = message.format(ckpt=str(ppo_ckpt), settings=", ".join(RESUMABLE_SETTINGS))
    assert the_error(err) == f"lightning-rl fit: error: {expected}"
    assert not list(tmp_path.rglob("*.ckpt"))


# ----------------------------------------------------------------------------- item 15: descriptions
@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_setting_of_every_algorithm_is_described(name):
    """By the docstring under its field (editors, ``lightning-rl fit --model.help PPO``), one line
    each, and as jsonargparse shows it (Lightning's CLI, which ``lightning_rl.cli`` sets up)."""
    from lightning_rl.cli_lightning import _lightning
    from lightning_rl.settings import setting_docs

    _lightning()  # the CLI's parsing settings: jsonargparse reads the fields' docstrings
    cls = getattr(lightning_rl, name)
    settings = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    documented = setting_docs(cls)
    assert [s for s in settings if not (documented.get(s) or "").strip()] == []
    assert [s for s in settings if "\n" in documented[s]] == []
    parser = ArgumentParser()
    parser.add_class_arguments(cls, "model")
    helps = {a.dest.removeprefix("model."): a.help for a in parser._actions if a.dest.startswith("model.")}
    assert set(settings) <= set(helps)
    assert [s for s in settings if not (helps[s] or "").strip() or helps[s].startswith("(type:")] == []


def test_fit_help_says_how_to_list_an_algorithms_settings(capsys):
    code, out, _ = run_main(["fit", "--help"], capsys)
    assert code == 0
    assert "lightning-rl fit --model.help PPO" in " ".join(out.split())
    code, out, _ = run_main(["fit", "--model.help", "ppo"], capsys)
    assert code == 0
    assert "surrogate clip range epsilon" in out and "--model.num_envs" in out


# ----------------------------------------------------------------------------- item 18: the console script
def test_the_console_script_imports_an_env_module_from_the_current_directory(tmp_path):
    script = Path(sys.executable).with_name("lightning-rl")
    assert script.is_file(), f"{script}: the package's console script (pip install -e .)"
    (tmp_path / "my_env_mod.py").write_text(textwrap.dedent("""
        import gymnasium as gym
        from gymnasium.envs.classic_control import CartPoleEnv

        gym.register("MyEnv-v0", entry_point=CartPoleEnv, max_episode_steps=7)
    """))
    # only non-empty entries: an empty one ("ROOT:") would put the current directory on sys.path
    # itself, and the test would pass without cli.main's own insertion
    pythonpath = [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    proc = subprocess.run([str(script), "test", "--model", "PPO", "--model.env", "my_env_mod:MyEnv-v0",
                           "--model.evaluation_num_episodes", "2", "--trainer.logger", "false", *QUIET],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 1.0 <= printed_metric(proc.stdout, "test/episode_return_mean") <= 7.0  # the registered env's: <= 7 steps
