"""``lightning-rl tune`` (issue 39): search spaces, trials as ordinary fits with their own configs,
a study kept in SQLite that resumes and is shared by processes, pruning, failed trials, and the
best config that ``fit`` runs as is. Trials are tiny (PPO on CartPole, 256 env steps, an evaluation
of 2 greedy episodes every 2 iterations)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml

from lightning_rl.cli import cli
from lightning_rl.cli_source import _declared_settings
from lightning_rl.tune_spaces import BUILT_IN, SpaceError, load_space, parse_space, suggest
from lightning_rl.tune_trial import TrialError, TrialReporter, run_trial
from tests.conftest import default_sigint, run_main
from tests.test_env_faults import live_pids

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[1]
BUDGET = 256
CONFIG = {
    "model": {"class_path": "lightning_rl.PPO", "init_args": {
        "env": "CartPole-v1", "num_envs": 2, "rollout_fragment_length": 32, "num_sgd_iter": 2,
        "sgd_minibatch_size": 32, "hiddens": [16], "total_env_steps": BUDGET, "iterations_per_epoch": 2,
        "evaluation_interval": 1, "evaluation_num_episodes": 2, "num_cpu_threads": 1, "seed": 0}},
    "trainer": {"enable_progress_bar": False, "enable_model_summary": False, "num_sanity_val_steps": 0,
                "logger": {"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": "logs"}}},
}
SPACE = {
    "lr": {"type": "float", "low": "1e-4", "high": "1e-2", "log": True},
    "gamma": {"type": "categorical", "choices": [0.9, 0.99]},
    "hiddens": {"type": "categorical", "choices": [[16], [8, 8]]},
}
METRIC = "val/episode_return_mean"


@pytest.fixture
def study_dir(tmp_path, monkeypatch):
    """A working directory with ``ppo.yaml`` and ``space.yaml``; the study goes to ``study.db``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ppo.yaml").write_text(yaml.safe_dump(CONFIG))
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    return tmp_path


def tune_args(*extra: str) -> list[str]:
    return ["tune", "-c", "ppo.yaml", "--search-space", "space.yaml", "--seed", "0", *extra]


def load(study_dir: Path, name: str = "ppo-space") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{study_dir / 'study.db'}")


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("lightning-rl tune: error: "), err[-3000:]
    return lines[0].removeprefix("lightning-rl tune: error: ")


# ----------------------------------------------------------------------------- spaces
def test_a_space_file_is_parsed_and_sampled_into_settings():
    space = parse_space({**SPACE, "num_sgd_iter": {"type": "int", "low": 2, "high": 8, "step": 2},
                         "sgd_minibatch_size": {"type": "same_as", "setting": "num_sgd_iter"}})
    assert space["lr"].low == 1e-4 and space["lr"].high == 1e-2 and space["lr"].log  # "1e-4": YAML 1.1's string
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        settings = suggest(trial, space)
        assert 1e-4 <= settings["lr"] <= 1e-2 and settings["gamma"] in (0.9, 0.99)
        assert settings["hiddens"] in ([16], [8, 8]) and trial.params["hiddens"] in ("[16]", "[8, 8]")
        assert settings["num_sgd_iter"] in (2, 4, 6, 8) and settings["sgd_minibatch_size"] == settings["num_sgd_iter"]
        study.tell(trial, 0.0)


@pytest.mark.parametrize("raw, message", [
    ({"lr": [1e-4, 1e-2]}, "lr: expected a distribution"),
    ({"lr": {"type": "float", "low": 1e-2, "high": 1e-4}}, "lr: 'low' must be below 'high'"),
    ({"lr": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}, "lr: a log distribution needs 'low' > 0"),
    ({"num_envs": {"type": "int", "low": 1.5, "high": 4}}, "num_envs: int needs a numeric 'low' (an integer)"),
    ({"gamma": {"type": "categorical", "choices": []}}, "gamma: categorical needs a non-empty list"),
    ({"gamma": {"type": "categorical", "values": [0.9]}},
     "gamma: a categorical distribution takes choices, not values"),
    ({"a": {"type": "same_as", "setting": "b"}}, "a: same_as names 'b', which is no sampled setting"),
])
def test_a_bad_distribution_is_named_with_what_is_wrong(raw, message):
    with pytest.raises(SpaceError, match="^search space: " + message.replace("(", r"\(").replace(")", r"\)")):
        parse_space(raw)


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_every_built_in_space_samples_settings_its_algorithm_takes(name):
    """Each name is a setting of the algorithm, and sampled values build it (types and ranges)."""
    import lightning_rl

    _, space, algorithm = load_space(name)
    assert set(space) <= _declared_settings()[algorithm]
    env = {"PPO": "CartPole-v1", "A2C": "CartPole-v1", "DQN": "CartPole-v1", "IMPALA": "CartPole-v1",
           "APPO": "CartPole-v1"}.get(algorithm, "Pendulum-v1")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(3):
        trial = study.ask()
        settings = suggest(trial, space)
        getattr(lightning_rl, algorithm)(env=env, num_envs=4, total_env_steps=100_000, **settings)
        study.tell(trial, 0.0)


def test_settings_given_on_the_command_line_are_read_as_yaml_numbers_included():
    from lightning_rl.tune import _fixed_settings

    assert _fixed_settings(["--model.total_env_steps", "1e5", "--model.init_args.lr=3e-4", "--model.hiddens",
                            "[64, 64]", "--trainer.max_time", "00:00:10:00"]) == \
        ({"total_env_steps": 100_000, "lr": 3e-4, "hiddens": [64, 64]}, {"max_time": "00:00:10:00"})


def test_a_setting_the_algorithm_lacks_is_one_line_before_any_trial(study_dir, capsys):
    (study_dir / "bad.yaml").write_text("lr: {type: float, low: 1e-5, high: 1e-2, log: true}\n"
                                        "clip_range: {type: categorical, choices: [0.1, 0.2]}\n")
    code, _, err = run_main(["tune", "-c", "ppo.yaml", "--search-space", "bad.yaml"], capsys)
    assert code == 2
    assert one_error_line(err) == ("--search-space bad.yaml: PPO has no setting 'clip_range'; did you mean "
                                   "clip_param? (all of them: lightning-rl fit --model.help PPO)")
    code, _, err = run_main(tune_args("--model.num_env", "3"), capsys)
    assert code == 2 and one_error_line(err).startswith("--model.num_env: PPO has no setting 'num_env'; did you "
                                                        "mean num_envs?")
    assert not (study_dir / "study.db").exists() and not (study_dir / "tune").exists()


def test_without_optuna_the_error_is_one_line_naming_the_extra(study_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ModuleNotFoundError
    code, _, err = run_main(tune_args("--n-trials", "1"), capsys)
    assert code == 2
    assert one_error_line(err) == 'Optuna is not installed (the optuna extra): pip install -e ".[optuna]"'
    assert not (study_dir / "study.db").exists()


# ----------------------------------------------------------------------------- reporting and pruning
class FakeTrial:
    def __init__(self, prune_below: float = -math.inf) -> None:
        self.reports: list[tuple[int, float]] = []
        self.attrs: dict = {}
        self.prune_below = prune_below

    def report(self, value, step):
        self.reports.append((step, value))

    def should_prune(self):
        return self.reports[-1][1] < self.prune_below

    def set_user_attr(self, key, value):
        self.attrs[key] = value


def evaluation(reporter: TrialReporter, steps: int, value: float) -> SimpleNamespace:
    """One validation end seen by ``reporter``: the metric logged at ``steps`` env steps."""
    trainer = SimpleNamespace(sanity_checking=False, is_global_zero=True, should_stop=False, global_step=0,
                              callback_metrics={METRIC: value},
                              strategy=SimpleNamespace(reduce_boolean_decision=lambda decision, all: decision))
    reporter.on_validation_end(trainer, SimpleNamespace(global_counters={"num_env_steps_sampled": steps}))
    return trainer


def test_the_reporter_reports_at_env_steps_on_a_grid_and_stops_the_fit_to_prune():
    trial = FakeTrial(prune_below=0.0)
    reporter = TrialReporter(trial, METRIC, report_every=100)
    for steps, value in ((64, 5.0), (128, 6.0), (192, 7.0), (256, 8.0)):
        assert not evaluation(reporter, steps, value).should_stop
    # 192 rounds down to 100 as 128 did: reported once, at the first evaluation past each multiple
    assert trial.reports == [(0, 5.0), (100, 6.0), (200, 8.0)]
    assert reporter.history == [(64, 5.0), (128, 6.0), (192, 7.0), (256, 8.0)] and trial.attrs["env_steps"] == 256
    assert evaluation(reporter, 320, -1.0).should_stop and reporter.pruned_at == 320


def test_a_nan_metric_fails_the_trial_with_the_value_and_its_env_steps(tmp_path):
    def fit_logging_nan(args, trainer_defaults):  # a fit whose evaluation logged NaN
        (reporter,) = trainer_defaults["callbacks"]
        evaluation(reporter, 64, 3.0)
        evaluation(reporter, 128, float("nan"))

    with pytest.raises(TrialError, match=f"^{METRIC} is nan at 128 env steps$"):
        run_trial(fit_logging_nan, tmp_path / "trial.yaml", FakeTrial(), METRIC)


def test_the_pruner_stops_a_trial_at_its_first_evaluation_and_the_study_records_it(study_dir, capsys, monkeypatch):
    monkeypatch.setattr("lightning_rl.tune_study.make_pruner", lambda name, warmup: optuna.pruners.ThresholdPruner(
        lower=1e9))  # every return is below: pruned at the first report
    code, out, _ = run_main(tune_args("--n-trials", "2", "--report-every", "0"), capsys)
    assert code == 1, out  # no trial done: no best.yaml
    trials = load(study_dir).get_trials()
    assert [t.state.name for t in trials] == ["PRUNED", "PRUNED"]
    for trial in trials:
        assert list(trial.intermediate_values) == [128] and trial.user_attrs["env_steps"] == 128 < BUDGET
        # the fit ended cleanly: its final checkpoint is there
        assert list(Path(f"tune/ppo-space/trial_{trial.number:04d}").rglob("last.ckpt"))
    assert "trial 1 pruned: pruned at 128 env steps" in out


@pytest.mark.parametrize("name, cls", [("median", "MedianPruner"), ("halving", "SuccessiveHalvingPruner"),
                                       ("none", "NopPruner")])
def test_each_pruner_flag_gives_its_pruner_and_median_waits_a_third_of_the_budget(study_dir, name, cls):
    from lightning_rl.cli import cli as fit
    from lightning_rl.tune import prepare
    from lightning_rl.tune_study import open_study

    study = open_study(prepare(["-c", "ppo.yaml", "--search-space", "space.yaml", "--pruner", name], fit))
    assert type(study.pruner).__name__ == cls
    if name == "median":  # each trial reports after 128 and 256 env steps: the first report is never pruned
        assert study.pruner._n_warmup_steps == BUDGET // 3 and study.pruner._n_startup_trials == 5


def test_average_last_1_takes_the_last_evaluation_and_0_is_refused(study_dir, capsys):
    code, _, err = run_main(tune_args("--n-trials", "1", "--average-last", "0"), capsys)
    assert code == 2 and one_error_line(err) == "--average-last: expected an integer >= 1, got 0"
    code, _, err = run_main(tune_args("--n-trials", "1", "--average-last", "1"), capsys)
    assert code == 0, err[-3000:]
    (trial,) = load(study_dir).get_trials()
    assert trial.value == trial.intermediate_values[250] != trial.intermediate_values[120]


# ----------------------------------------------------------------------------- studies
def test_no_trial_starts_after_the_timeout(study_dir, capsys):
    code, _, err = run_main(tune_args("--n-trials", "5", "--timeout", "0"), capsys)
    assert code == 1 and load(study_dir).get_trials() == []
    assert "no trial is done yet, so there is no best.yaml" in err


def test_three_trials_then_best_yaml_that_fit_runs_and_a_trial_rerun_by_fit_alone(study_dir, capsys):
    code, out, err = run_main(tune_args("--n-trials", "3"), capsys)
    assert code == 0, err[-3000:]
    study = load(study_dir)
    trials = study.get_trials()
    assert [(t.number, t.state.name) for t in trials] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE")]
    root = study_dir / "tune" / "ppo-space"
    for trial in trials:
        run_dir = root / f"trial_{trial.number:04d}"
        config = yaml.safe_load((run_dir / "trial.yaml").read_text())
        assert config["model"]["init_args"] == {**CONFIG["model"]["init_args"], **trial.user_attrs["settings"]}
        assert config["trainer"]["default_root_dir"] == str(Path("tune/ppo-space") / run_dir.name)
        assert config["trainer"]["logger"]["init_args"]["save_dir"] == config["trainer"]["default_root_dir"]
        assert (run_dir / "lightning_logs" / "version_0" / "metrics.csv").is_file()  # its own logs
        # reported at every evaluation (128 and 256 env steps), rounded down to multiples of 10 (the
        # first digit of a twentieth of the budget: --report-every auto)
        assert trial.user_attrs["env_steps"] == BUDGET and sorted(trial.intermediate_values) == [120, 250]
        # its value: the mean of its last 3 evaluations (--average-last's default), here both
        assert trial.value == pytest.approx(sum(trial.intermediate_values.values()) / 2)
    # the table: every trial, best first, with its settings
    best = study.best_trial
    table = out[out.index("best trials"):]
    assert [int(line.split()[0]) for line in table.splitlines()[2:5]] == \
        [t.number for t in sorted(trials, key=lambda t: -t.value)]
    assert f"lr={best.params['lr']:.4g}" in table
    assert {p.name for p in root.glob("*.png")} == {"history.png", "curves.png", "importances.png"}

    # best.yaml is the config with the best settings, and fit runs it as is, to the same result
    config = yaml.safe_load((root / "best.yaml").read_text())
    assert config["model"]["init_args"] == {**CONFIG["model"]["init_args"], **best.user_attrs["settings"]}
    assert config["trainer"] == CONFIG["trainer"]
    run = cli_fit(root / "best.yaml")
    assert run.model.hparams["lr"] == best.params["lr"] and list(run.model.hparams["hiddens"]) == \
        best.user_attrs["settings"]["hiddens"]
    assert float(run.trainer.callback_metrics[METRIC]) == best.intermediate_values[250]  # its last evaluation
    # a trial's config reruns it with fit alone, into its own folder
    rerun = cli_fit(root / "trial_0001" / "trial.yaml")
    assert float(rerun.trainer.callback_metrics[METRIC]) == trials[1].intermediate_values[250]
    assert rerun.trainer.log_dir == str(Path("tune/ppo-space/trial_0001/lightning_logs/version_1"))


def cli_fit(config: Path):
    argv = sys.argv
    sys.argv = ["lightning-rl", "fit", "-c", str(config)]
    try:
        return cli(None)
    finally:
        sys.argv = argv


def test_a_second_run_resumes_the_study_and_counts_its_trials(study_dir, capsys):
    assert run_main(tune_args("--n-trials", "2"), capsys)[0] == 0
    assert sorted(p.name for p in (study_dir / "tune" / "ppo-space").glob("trial_*")) == ["trial_0000", "trial_0001"]
    code, out, _ = run_main(tune_args("--n-trials", "4"), capsys)
    assert code == 0
    trials = load(study_dir).get_trials()
    assert [(t.number, t.state.name) for t in trials] == [(i, "COMPLETE") for i in range(4)]
    assert "trial 0 started" not in out and "trial 2 started" in out and "trial 3 started" in out
    assert len({t.params["lr"] for t in trials}) == 4
    assert run_main(tune_args("--n-trials", "4"), capsys)[0] == 0  # nothing left to run
    assert len(load(study_dir).get_trials()) == 4


def test_failed_trials_are_recorded_with_their_error_and_the_study_goes_on(study_dir, capsys):
    (study_dir / "space.yaml").write_text(yaml.safe_dump({**SPACE, "sgd_minibatch_size": {
        "type": "categorical", "choices": [32, 4096]}}))
    study = optuna.create_study(study_name="ppo-space", storage="sqlite:///study.db", direction="maximize")
    study.enqueue_trial({"sgd_minibatch_size": 4096})  # larger than a batch of 2 envs x 32 steps
    study.enqueue_trial({"sgd_minibatch_size": 32})
    code, out, _ = run_main(tune_args("--n-trials", "2"), capsys)
    assert code == 0
    failed, done = load(study_dir).get_trials()
    assert (failed.state.name, done.state.name) == ("FAIL", "COMPLETE")
    assert failed.user_attrs["error"].startswith("sgd_minibatch_size (4096) ")
    assert "64" in failed.user_attrs["error"]  # the batch it is larger than
    assert f"trial 0 failed: {failed.user_attrs['error'][:100]}" in out


def test_a_trial_left_running_by_a_dead_process_runs_again_with_its_settings(study_dir, capsys):
    from lightning_rl.tune_study import HOST

    study = optuna.create_study(study_name="ppo-space", storage="sqlite:///study.db", direction="maximize")
    trial = study.ask()
    suggest(trial, parse_space(SPACE))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trial.set_user_attr("worker", f"{HOST}:{dead.pid}")
    assert run_main(tune_args("--n-trials", "1"), capsys)[0] == 0
    stale, retry = load(study_dir).get_trials()
    assert stale.state.name == "FAIL" and stale.user_attrs["interrupted"] and "ended during the trial" in \
        stale.user_attrs["error"]
    assert retry.state.name == "COMPLETE" and retry.params == stale.params and retry.user_attrs["retry_of"] == 0


def run_tune(study_dir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lightning_rl.cli", *tune_args(*args)], cwd=study_dir,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=default_sigint)  # Ctrl-C at its default, as from a terminal


def finish(*procs: subprocess.Popen, timeout: float = 240) -> list[str]:
    """The output of each ``tune`` process, once all have ended; each must have ended well in time."""
    deadline = time.monotonic() + timeout
    outs = []
    for proc in procs:
        try:
            outs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            outs.append(proc.communicate()[0] + f"\n(killed: not finished in {timeout} s)")
    for proc, out in zip(procs, outs, strict=True):
        assert proc.returncode == 0, out[-3000:]
    return outs


def workers_of(trials) -> set[int]:
    return {int(t.user_attrs["worker"].rsplit(":", 1)[1]) for t in trials}


def started(study_dir: Path) -> bool:
    """Whether the study in ``study_dir`` has a trial (its file is not touched before tune made it)."""
    if not (study_dir / "study.db").exists():
        return False
    try:
        return bool(load(study_dir).get_trials())
    except KeyError:  # (the study is not created yet)
        return False


def test_two_processes_on_one_sqlite_file_share_the_study_and_finish_n_together(study_dir):
    # trials long enough (about 2 s each) that the second process, started once the first has begun
    # its first trial, is importing torch while the first still has three to run: both run trials
    config = {**CONFIG, "model": {**CONFIG["model"], "init_args": {**CONFIG["model"]["init_args"],
                                                                   "total_env_steps": 16 * BUDGET}}}
    (study_dir / "ppo.yaml").write_text(yaml.safe_dump(config))
    first = run_tune(study_dir, "--n-trials", "4")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None and not started(study_dir):
        time.sleep(0.2)
    procs = [first, run_tune(study_dir, "--n-trials", "4", "--seed", "1")]
    outs = finish(*procs)
    trials = load(study_dir).get_trials()
    assert [(t.number, t.state.name) for t in trials] == [(i, "COMPLETE") for i in range(4)], outs
    assert workers_of(trials) == {proc.pid for proc in procs}  # both ran trials of the one study
    assert any("study 'ppo-space' (sqlite:///study.db): 4 finished (4 done, 0 pruned, 0 failed)" in out
               for out in outs)


def test_workers_share_the_study_and_none_outlives_the_command(study_dir):
    (out,) = finish(run_tune(study_dir, "--n-trials", "4", "--workers", "2"))
    trials = load(study_dir).get_trials()
    assert [(t.number, t.state.name) for t in trials] == [(i, "COMPLETE") for i in range(4)]
    assert len(workers_of(trials)) == 2 and "[worker 0] trial" in out and "[worker 1] trial" in out
    assert not live_pids(sorted(workers_of(trials)), grace_s=0.0)
    assert out.count("best trials") == 1 and (study_dir / "tune" / "ppo-space" / "best.yaml").is_file()


def test_ctrl_c_keeps_the_interrupted_trial_for_the_resumed_study(study_dir, capsys):
    long_trials(study_dir)
    proc = run_tune(study_dir, "--n-trials", "1")
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the first evaluation: the fit is under way
        lines.append(proc.stdout.readline())
        if "trial 0 started" in lines[-1]:
            break
    time.sleep(8)
    proc.send_signal(signal.SIGINT)
    out = "".join(lines) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out[-3000:]
    assert "trial 0 interrupted" in out and "1 interrupted" in out
    assert list((study_dir / "tune" / "ppo-space" / "trial_0000").rglob("interrupted.ckpt"))
    trials = load(study_dir).get_trials()
    assert [(t.state.name, t.user_attrs.get("interrupted")) for t in trials] == [("FAIL", True), ("WAITING", None)]
    # resumed (with a shorter budget): the interrupted trial runs again with its settings, not counted twice
    assert run_main(tune_args("--n-trials", "1", "--model.total_env_steps", str(BUDGET)), capsys)[0] == 0
    interrupted, retry = load(study_dir).get_trials()
    assert retry.state.name == "COMPLETE" and retry.params == interrupted.params and retry.user_attrs["retry_of"] == 0


def long_trials(study_dir: Path) -> None:
    """Trials that run until they are interrupted."""
    config = {**CONFIG, "model": {**CONFIG["model"], "init_args": {**CONFIG["model"]["init_args"],
                                                                     "total_env_steps": 200_000}}}
    (study_dir / "ppo.yaml").write_text(yaml.safe_dump(config))


def test_ctrl_c_on_workers_stops_each_trial_and_leaves_no_worker(study_dir):
    long_trials(study_dir)
    proc = run_tune(study_dir, "--n-trials", "2", "--workers", "2")
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum("trial" in line and "started" in line for line in lines) < 2:
        lines.append(proc.stdout.readline())
    time.sleep(8)  # both fits under way
    proc.send_signal(signal.SIGINT)  # the parent alone: the workers have their own session
    out = "".join(lines) + finish_interrupted(proc)
    trials = load(study_dir).get_trials()
    assert sorted((t.state.name, t.user_attrs.get("interrupted")) for t in trials) == \
        [("FAIL", True), ("FAIL", True), ("WAITING", None), ("WAITING", None)], out[-3000:]
    assert not live_pids(sorted(workers_of(trials[:2])), grace_s=0.0)
    assert len(list((study_dir / "tune" / "ppo-space").rglob("interrupted.ckpt"))) == 2
    assert "2 interrupted" in out


def finish_interrupted(proc: subprocess.Popen) -> str:
    try:
        out = proc.communicate(timeout=150)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(proc.communicate()[0][-3000:]) from None
    assert proc.returncode == 130, out[-3000:]
    return out


def _children() -> set[str]:
    return {p for p in os.listdir("/proc") if p.isdigit() and _child_of_this_test(int(p))}


@pytest.fixture(autouse=True)
def _no_stray_processes():
    """No process a test started outlives it (children the pytest worker already had, from an
    earlier test file, are not the test's)."""
    before = _children()
    yield
    assert not _children() - before


def _child_of_this_test(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and stat.rsplit(")", 1)[1].split()[0] != "Z"
