"""Issue 35, items 9-11: the command line starts without torch for its help and argument errors,
lists an algorithm's settings one line each, and names the extra of a missing optional dependency
in one line (items 13-15: tests/test_run_messages_round_three.py)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_main

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
HEAVY = ("torch", "pytorch_lightning", "lightning_fabric", "gymnasium", "numpy")

pytestmark = pytest.mark.timeout(300)


def one_error_line(err: str, command: str | None = "fit") -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"lightning-rl{' ' + command if command else ''}: error: "), err[-3000:]
    return lines[0]


# ----------------------------------------------------------------------------- item 11: start-up
FAST_COMMANDS = [
    ["--help"],
    ["fit", "--help"],
    ["validate", "-h"],
    ["test", "--help"],
    ["fit", "--model", "PPO", "--model.num_env", "3"],
    ["fit", "--model", "dqn", "--model.init_args.learning_start", "3"],
    ["fit", "--model", "TRPO"],
    ["fti", "--model", "PPO"],
    ["fit", "--model", "PPO", "--trainer.max_epochz", "3"],
    [],
]

FAST_SCRIPT = """
import json, sys, time
from lightning_rl.cli import main
results = []
for argv in {commands!r}:
    start = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    results.append([argv, code, time.perf_counter() - start])
sys.stdout.flush()
print("RESULT", json.dumps({{"results": results, "heavy": sorted(m for m in {heavy!r} if m in sys.modules)}}))
"""


def test_help_and_argument_errors_import_neither_torch_nor_lightning(tmp_path):
    """``lightning-rl --help``, ``fit --help`` and a misspelled command line answer from the
    source alone: torch and Lightning (seconds to import) are never imported."""
    script = FAST_SCRIPT.format(commands=FAST_COMMANDS, heavy=HEAVY)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    result = json.loads(proc.stdout.rsplit("RESULT ", 1)[1])
    assert result["heavy"] == [], proc.stderr[-3000:]
    codes = {" ".join(argv): code for argv, code, _ in result["results"]}
    assert codes == {"--help": 0, "fit --help": 0, "validate -h": 0, "test --help": 0,
                     "fit --model PPO --model.num_env 3": 2, "fit --model dqn --model.init_args.learning_start 3": 2,
                     "fit --model TRPO": 2, "fti --model PPO": 2, "fit --model PPO --trainer.max_epochz 3": 2, "": 2}
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert errors == [
        "lightning-rl fit: error: --model.num_env: PPO has no setting 'num_env'; did you mean --model.num_envs? "
        "(all of them: lightning-rl fit --model.help PPO)",
        "lightning-rl fit: error: --model.learning_start: DQN has no setting 'learning_start'; did you mean "
        "--model.learning_starts? (all of them: lightning-rl fit --model.help DQN)",
        "lightning-rl fit: error: --model TRPO: no such algorithm (the algorithms: A2C, A3C, APEX, APPO, DDPG, DQN, "
        "IMPALA, PPO, SAC, TD3)",
        "lightning-rl: error: unknown command 'fti'; did you mean fit? (the commands: fit, validate, test, plot, "
        "record, tune)",
        "lightning-rl fit: error: --trainer.max_epochz: pl.Trainer has no argument 'max_epochz'; did you mean "
        "--trainer.max_epochs? (all of them: lightning-rl fit --help)",
        "lightning-rl: error: a command is required: fit, validate, test, plot, record, tune (lightning-rl --help)",
    ], proc.stderr[-3000:]


def test_importing_lightning_rl_imports_no_torch_until_a_name_is_used(tmp_path):
    script = (f"import sys, lightning_rl\nassert lightning_rl.__version__\n"
              f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
              "from lightning_rl import PPO, evaluate\nimport lightning_rl.algorithms as a\n"
              "assert PPO is a.PPO is lightning_rl.PPO and {'PPO', 'SampleBatch'} <= set(dir(lightning_rl))\n"
              "assert set(lightning_rl.__all__) <= set(dir(lightning_rl))\n"
              "try:\n    lightning_rl.TRPO\nexcept AttributeError as err:\n    print(err)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["[]", "module 'lightning_rl' has no attribute 'TRPO'"]


def test_the_settings_read_from_the_source_are_the_algorithms_signatures():
    """What ``lightning-rl fit --model PPO --model.X`` is checked against before any import."""
    import lightning_rl.algorithms as algorithms
    from lightning_rl.checkpoint import algorithm_names
    from lightning_rl.cli_source import ALGORITHMS, _declared_settings

    assert list(ALGORITHMS) == algorithm_names()[: len(ALGORITHMS)]
    declared = _declared_settings()
    for name in ALGORITHMS:
        signature = inspect.signature(getattr(algorithms, name).__init__)
        assert declared[name] == set(signature.parameters) - {"self"}, name


def test_the_trainer_arguments_read_from_the_source_are_pl_trainers():
    import pytorch_lightning as pl

    from lightning_rl.cli_source import _trainer_arguments

    arguments = _trainer_arguments()
    assert [name for name, _, _ in arguments] == [p for p in inspect.signature(pl.Trainer.__init__).parameters
                                                  if p != "self"]
    described = dict((name, text) for name, _, text in arguments)
    assert described["max_epochs"].startswith("Stop training once this number of epochs is reached")


def test_a_unique_prefix_of_a_trainer_argument_is_still_lightnings_to_take(capsys, tmp_path, monkeypatch):
    """argparse takes ``--trainer.max_epoch`` for ``--trainer.max_epochs``: the early check does
    not call it a misspelling."""
    import yaml

    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(["fit", "--model", "PPO", "--trainer.max_epoch", "3", "--print_config"], capsys)
    assert code == 0, err[-3000:]
    assert yaml.safe_load(out)["trainer"]["max_epochs"] == 3


# ----------------------------------------------------------------------------- item 10: one line per setting
def test_model_help_is_one_line_per_setting(capsys):
    from lightning_rl import PPO

    code, out, _ = run_main(["fit", "--model.help", "ppo"], capsys)
    assert code == 0
    settings = [p for p in inspect.signature(PPO.__init__).parameters if p != "self"]
    lines = out.splitlines()
    assert len(lines) == len(settings) + 2, out
    assert [line.split()[0] for line in lines[2:]] == [f"--model.{name}" for name in settings]
    assert lines[0].startswith("PPO: ")
    by_name = {line.split()[0].removeprefix("--model."): line for line in lines[2:]}
    assert by_name["env"].split()[1] == "CartPole-v1" and "gymnasium id" in by_name["env"]
    assert by_name["clip_param"].split()[1] == "0.2" and "surrogate clip range epsilon" in by_name["clip_param"]
    assert "Wrapper" not in out and "subclasses" not in out  # no gymnasium classes listed for env


def test_fit_help_lists_every_trainer_argument_once(capsys):
    import pytorch_lightning as pl

    code, out, _ = run_main(["fit", "--help"], capsys)
    assert code == 0
    arguments = [p for p in inspect.signature(pl.Trainer.__init__).parameters if p != "self"]
    flags = [line.split()[0] for line in out.splitlines() if line.startswith("  --trainer.")]
    assert flags == ["--trainer.ARGUMENT", *[f"--trainer.{name}" for name in arguments]]
    assert "lightning-rl fit --model.help PPO" in out
    assert len(out.splitlines()) < len(arguments) + 30


# ----------------------------------------------------------------------------- item 9: missing extras
def block(monkeypatch, *modules: str, unload: tuple[str, ...] = ()) -> None:
    """Make ``import module`` fail as it does when the package is not installed, and drop the
    already imported ``unload`` modules so that they import again (and fail)."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)
    for name in [m for m in sys.modules if m.startswith(unload) and sys.modules[m] is not None]:
        monkeypatch.delitem(sys.modules, name)


SMALL = ["--model.total_env_steps", "64", "--model.num_envs", "1", *QUIET]


@pytest.mark.parametrize(("args", "blocked", "unload", "expected"), [
    (["--model", "PPO", "--model.env", "LunarLander-v3"], ["Box2D"], ("gymnasium.envs.box2d",),
     "env 'LunarLander-v3' needs Box2D, which is not installed: pip install -e \".[box2d]\""),
    (["--model", "SAC", "--model.env", "HalfCheetah-v5"], ["mujoco"], ("gymnasium.envs.mujoco",),
     "env 'HalfCheetah-v5' needs MuJoCo, which is not installed: pip install -e \".[mujoco]\""),
    (["--model", "DQN", "--model.env", "ALE/Pong-v5"], ["ale_py"], (),
     "env 'ALE/Pong-v5' needs ale-py: pip install -e \".[atari]\""),
    (["--model", "PPO", "--model.vectorization", "envpool"], ["envpool"], (),
     "vectorization='envpool' needs envpool: pip install -e \".[envpool]\""),
    (["--model", "PPO", "--model.env", "mpe2.simple_spread_v3.parallel_env"], ["pettingzoo"], ("mpe2",),
     "PettingZoo is not installed (the multiagent extra): pip install -e \".[multiagent]\""),
    (["--model", "IMPALA", "--model.sampler_backend", "ray", "--model.num_workers", "1"], ["ray"], (),
     "sampler_backend='ray' needs Ray: pip install -e \".[ray]\""),
])
def test_a_missing_optional_dependency_is_one_line_naming_the_extra(args, blocked, unload, expected, capsys,
                                                                    tmp_path, monkeypatch):
    import lightning_rl.algorithms  # noqa: F401  # imported before anything is blocked

    monkeypatch.chdir(tmp_path)
    block(monkeypatch, *blocked, unload=unload)
    code, _, err = run_main(["fit", *args, *SMALL], capsys)
    assert code == 2, err[-3000:]
    assert one_error_line(err) == f"lightning-rl fit: error: {expected}"
    assert "gymnasium[" not in err and "Traceback" not in err


def test_plot_without_matplotlib_names_the_plot_extra(capsys, tmp_path, monkeypatch):
    run = tmp_path / "run" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("step,rollout/episode_return_mean\n10,1.0\n20,2.0\n")
    block(monkeypatch, "matplotlib", unload=("matplotlib",))
    code, _, err = run_main(["plot", str(tmp_path / "run"), "--out", str(tmp_path / "c.png")], capsys)
    assert code == 1
    assert one_error_line(err, "plot") == ("lightning-rl plot: error: plotting needs matplotlib: pip install "
                                           "matplotlib (or pip install -e \".[plot]\")")


def test_record_without_pygame_names_the_plot_extra_not_plain_pygame(capsys, tmp_path, monkeypatch):
    """gymnasium's advice, ``pip install "gymnasium[classic-control]"``, installs plain pygame,
    which clashes with the pygame-ce of every extra."""
    from lightning_rl import PPO
    from tests.conftest import quiet_trainer

    model = PPO(total_env_steps=64, num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, num_sgd_iter=1,
                hiddens=(8,), seed=0)
    trainer = quiet_trainer(max_epochs=-1)
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "ppo.ckpt", weights_only=False)
    block(monkeypatch, "pygame")
    code, _, err = run_main(["record", "--ckpt_path", str(tmp_path / "ppo.ckpt"), "--out", str(tmp_path / "a.gif")],
                            capsys)
    assert code == 1
    assert one_error_line(err, "record") == ("lightning-rl record: error: pygame-ce is not installed (the plot "
                                             "extra): pip install -e \".[plot]\"")
