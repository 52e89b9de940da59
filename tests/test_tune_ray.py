"""``lightning-rl tune --backend ray`` (issue 39, item 4): the trials of a study as Ray Tune trials
on a 2-node ``ray.cluster_utils.Cluster`` (one CPU per node, a CPU per trial: one trial per node
at a time), sampled by Optuna and stopped early by ASHA, written back to the SQLite study; every
Ray process gone afterwards."""

from __future__ import annotations

import os

import optuna
import pytest
import yaml

from tests.conftest import ray_temp_dir, run_main
from tests.ray_worker import descendants
from tests.test_env_faults import live_pids
from tests.test_tune import BUDGET, CONFIG, METRIC, SPACE

pytestmark = pytest.mark.timeout(400)
MB = 1024 ** 2


@pytest.fixture
def two_nodes():
    """A head node and a second node on this machine, one CPU each; both stopped after the test."""
    from ray.cluster_utils import Cluster

    before = set(descendants(os.getpid()))
    with ray_temp_dir() as temp:
        nodes = None
        try:
            nodes = Cluster(initialize_head=True, connect=False, head_node_args=dict(
                num_cpus=1, object_store_memory=100 * MB, include_dashboard=False, temp_dir=str(temp)))
            nodes.add_node(num_cpus=1, object_store_memory=100 * MB)
            nodes.wait_for_nodes()
            yield nodes
        finally:
            if nodes is not None:
                nodes.shutdown()
    started = set(descendants(os.getpid())) - before
    assert not live_pids(sorted(started), grace_s=10.0), "Ray processes outlived the test"


def test_ray_trials_spread_over_both_nodes_and_land_in_the_study(two_nodes, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ppo.yaml").write_text(yaml.safe_dump(CONFIG))
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    code, out, err = run_main(["tune", "-c", "ppo.yaml", "--search-space", "space.yaml", "--backend", "ray",
                               "--ray-address", two_nodes.address, "--n-trials", "4", "--seed", "0"], capsys)
    assert code == 0, (out + err)[-5000:]
    import ray

    assert not ray.is_initialized()  # tune joined the cluster for the search and left it
    study = optuna.load_study(study_name="ppo-space", storage="sqlite:///study.db")
    trials = study.get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"} and "COMPLETE" in {t.state.name for t in trials}
    assert len({t.user_attrs["node"] for t in trials}) == 2  # both nodes ran trials
    for trial in trials:
        assert trial.user_attrs["backend"] == "ray" and 0 < trial.user_attrs["env_steps"] <= BUDGET
        assert sorted(trial.intermediate_values)[-1] == trial.user_attrs["env_steps"]  # reported at env steps
        config = yaml.safe_load((tmp_path / "tune" / "ppo-space" / f"trial_{trial.number:04d}" / "trial.yaml")
                                .read_text())
        assert config["model"]["init_args"] == {**CONFIG["model"]["init_args"], **trial.user_attrs["settings"]}
    best = yaml.safe_load((tmp_path / "tune" / "ppo-space" / "best.yaml").read_text())
    assert best["model"]["init_args"]["lr"] == study.best_trial.params["lr"]
    assert f"best trials (maximizing {METRIC})" in out

    # the study goes on with the optuna backend, counting Ray's trials
    assert run_main(["tune", "-c", "ppo.yaml", "--search-space", "space.yaml", "--n-trials", "5"], capsys)[0] == 0
    assert [t.number for t in optuna.load_study(study_name="ppo-space", storage="sqlite:///study.db")
            .get_trials()] == [0, 1, 2, 3, 4]


def test_a_ray_trial_is_stored_done_pruned_or_failed_with_its_error():
    """How a Ray result becomes a trial of the stored study (no Ray needed)."""
    from types import SimpleNamespace

    import pandas as pd

    from lightning_rl.tune_ray import TRIAL, _stored_trial

    known = optuna.create_study(direction="maximize")
    for _ in range(3):
        trial = known.ask()
        trial.suggest_float("lr", 1e-4, 1e-2, log=True)
        known.tell(trial, 0.0)

    def result(sampled: int, steps: list[int], error: Exception | None = None):
        frame = pd.DataFrame({METRIC: [float(s) for s in steps], "env_steps": steps}) if steps else None
        return SimpleNamespace(config={TRIAL: {"number": 10 + sampled, "sampled": sampled, "path": "trial.yaml",
                                              "settings": {"lr": 0.1}}},
                               metrics_dataframe=frame, metrics={"node": "n1"}, error=error)

    number, done = _stored_trial(result(0, [128, 256]), known, METRIC, BUDGET, set())
    assert number == 10 and done.state.name == "COMPLETE" and done.value == 256.0
    assert done.intermediate_values == {128: 128.0, 256: 256.0} and done.user_attrs["env_steps"] == 256
    assert done.params == known.trials[0].params and done.user_attrs["node"] == "n1"
    _, pruned = _stored_trial(result(1, [128]), known, METRIC, BUDGET, {11})  # stopped by ASHA before the budget
    assert pruned.state.name == "PRUNED" and pruned.user_attrs["env_steps"] == 128
    _, cut = _stored_trial(result(1, [128]), known, METRIC, BUDGET, set())  # ended short otherwise: Ctrl-C
    assert cut.state.name == "FAIL" and cut.user_attrs["interrupted"]
    error = RuntimeError("ray::ImplicitFunc.train()\n  raise TrialError(...)\n"
                         "lightning_rl.tune_trial.TrialError: sgd_minibatch_size (4096) is larger than the train batch")
    _, failed = _stored_trial(result(2, [], error), known, METRIC, BUDGET, set())
    assert failed.state.name == "FAIL"
    assert failed.user_attrs["error"] == "sgd_minibatch_size (4096) is larger than the train batch"
