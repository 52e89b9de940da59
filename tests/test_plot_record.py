"""Learning-curve plots from real CSV / TensorBoard logs, and GIFs of agents loaded from checkpoints."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

from lightning_rl import A2C, PPO, plotting, recording
from lightning_rl.loading import load_model
from lightning_rl.plotting import collect_curves, find_runs, load_curve, plot_curves
from lightning_rl.recording import record
from tests.conftest import quiet_trainer

RETURN = "rollout/episode_return_mean"
PG_LOSS = "learner/default_policy/learner_stats/pg_loss"
ITERATIONS = 8
BATCH = 4 * 64


def _needs(*modules: str) -> None:
    for name in modules:
        pytest.importorskip(name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two seeds of a short PPO CartPole run, each logged to CSV and TensorBoard; seed 0 checkpointed."""
    root = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        model = PPO(env="CartPole-v1", num_envs=4, rollout_fragment_length=64, seed=seed,
                    total_env_steps=BATCH * ITERATIONS)
        loggers = [CSVLogger(root / "csv", name=f"seed{seed}"), TensorBoardLogger(root / "tb", name=f"seed{seed}")]
        trainer = quiet_trainer(logger=loggers, log_every_n_steps=1)
        trainer.fit(model)
        if seed == 0:
            trainer.save_checkpoint(root / "ppo_cartpole.ckpt")
    return root


def _check_png(path, min_colours: int = 20) -> None:
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG"
        assert im.size[0] > 100 and im.size[1] > 100
        colours = im.convert("RGB").getcolors(maxcolors=1 << 24)
        assert len(colours) > min_colours, f"{path} looks blank ({len(colours)} colours)"


# ----------------------------------------------------------------------------- reading logs
def test_load_curve_csv_and_tensorboard_agree(runs):
    csv_steps, csv_values = load_curve(runs / "csv" / "seed0")
    tb_steps, tb_values = load_curve(runs / "tb" / "seed0")
    assert len(csv_steps) >= ITERATIONS - 2  # the first iterations may have no finished episode yet
    assert csv_steps[-1] == BATCH * ITERATIONS  # x axis: env steps
    assert set(csv_steps.tolist()) <= {BATCH * i for i in range(1, ITERATIONS + 1)}
    np.testing.assert_array_equal(csv_steps, tb_steps)
    np.testing.assert_allclose(csv_values, tb_values, rtol=1e-5)  # TensorBoard stores float32
    assert np.all((csv_values >= 8) & (csv_values <= 500))
    steps, pg_loss = load_curve(runs / "csv" / "seed0" / "version_0" / "metrics.csv", PG_LOSS)
    assert len(steps) == ITERATIONS and np.isfinite(pg_loss).all()


def test_a_dir_with_both_loggers_prefers_csv_unless_told(runs, tmp_path):
    both = tmp_path / "both"
    shutil.copytree(runs / "csv" / "seed0" / "version_0", both)
    for f in (runs / "tb" / "seed0" / "version_0").glob("events.out.tfevents.*"):
        shutil.copy(f, both)
    assert find_runs(both) == [both / "metrics.csv"]
    assert find_runs(both, source="tensorboard") == [both]
    np.testing.assert_allclose(load_curve(both, source="tensorboard")[1], load_curve(both)[1], rtol=1e-5)


def test_several_runs_under_one_dir_are_listed(runs):
    assert len(find_runs(runs / "csv")) == 2
    assert len(find_runs(runs)) == 4  # csv/seed0, csv/seed1, tb/seed0, tb/seed1
    with pytest.raises(ValueError, match="holds 2 runs"):
        load_curve(runs / "csv")


def test_no_logs_names_the_dir(tmp_path):
    empty = tmp_path / "nothing_here"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        load_curve(empty)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_curve(tmp_path / "missing")
    _needs("matplotlib")
    with pytest.raises(FileNotFoundError, match="nothing_here"):
        plot_curves([empty], tmp_path / "x.png")


@pytest.mark.parametrize("kind", ["csv", "tb"])
def test_missing_metric_names_it_and_lists_the_available_ones(runs, kind):
    with pytest.raises(ValueError, match="no/such_metric") as err:
        load_curve(runs / kind / "seed0", metric="no/such_metric")
    assert RETURN in str(err.value) and PG_LOSS in str(err.value)


# ----------------------------------------------------------------------------- plotting
@pytest.mark.parametrize("kind", ["csv", "tb"])
def test_plot_two_seeds_as_mean_and_band(runs, tmp_path, kind):
    _needs("matplotlib", "PIL")
    out = plot_curves([runs / kind / "seed0", runs / kind / "seed1"], tmp_path / "plots" / "curve.png")
    assert out == tmp_path / "plots" / "curve.png"
    _check_png(out)


def test_plot_labels_are_lines_and_bands(runs, tmp_path):
    _needs("matplotlib", "PIL")
    # Two labelled lines (the csv seeds vs the tb seeds), std band; and one unlabelled single run.
    out = plot_curves([runs / "csv", runs / "tb"], tmp_path / "two.png", labels=["csv", "tensorboard"], band="std",
                      title="two lines")
    _check_png(out)
    _check_png(plot_curves(runs / "csv" / "seed1", tmp_path / "one.png", metric=PG_LOSS, band="none"))
    with pytest.raises(ValueError, match="one label per log dir"):
        plot_curves([runs / "csv"], tmp_path / "bad.png", labels=["a", "b"])
    with pytest.warns(UserWarning, match="skipping"), pytest.raises(ValueError, match="no/such_metric"):
        plot_curves([runs / "csv"], tmp_path / "bad.png", metric="no/such_metric")


def test_plot_command_line(runs, tmp_path, capsys):
    _needs("matplotlib", "PIL")
    out = tmp_path / "cli.png"
    assert plotting.main([str(runs / "csv" / "seed0"), str(runs / "csv" / "seed1"), "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    _check_png(out)
    assert plotting.main([str(tmp_path / "missing"), "--out", str(out)]) == 1
    assert "missing" in capsys.readouterr().err
    assert plotting.main([str(runs / "csv"), "--metric", "nope", "--out", str(out)]) == 1
    assert RETURN in capsys.readouterr().err


# ----------------------------------------------------------------------------- which runs are plotted
VAL_RETURN = "val/episode_return_mean"


def _csv_run(path, columns: dict[str, list], steps: list[int]):
    """A ``metrics.csv`` like CSVLogger's: ``epoch``, ``step`` and ``columns`` (``None`` = empty cell)."""
    path.mkdir(parents=True, exist_ok=True)
    names = sorted(columns)
    rows = ["epoch,step," + ",".join(names)]
    for i, step in enumerate(steps):
        cells = ["" if columns[n][i] is None else str(columns[n][i]) for n in names]
        rows.append(f"0,{step}," + ",".join(cells))
    (path / "metrics.csv").write_text("\n".join(rows) + "\n")
    return path / "metrics.csv"


def _train_run(path, steps: list[int], values: list[float]):
    return _csv_run(path, {RETURN: values, "train/loss": [0.5] * len(steps)}, steps)


def _validate_run(path):
    """What a ``lightning-rl validate`` run's version dir holds: ``val/…`` metrics only, one row."""
    return _csv_run(path, {VAL_RETURN: [42.0], "val/episode_return_min": [40.0]}, [0])


def _tb_run(path, scalars: dict[str, list[tuple[int, float]]]):
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(path)) as writer:
        for tag, points in scalars.items():
            for step, value in points:
                writer.add_scalar(tag, value, step)
    return path


@pytest.mark.parametrize("kind", ["csv", "tb"])
def test_a_validate_run_beside_a_training_run_is_skipped_with_a_warning(tmp_path, kind):
    logs = tmp_path / "lightning_logs"
    steps, values = [256, 512, 768], [10.0, 20.0, 30.0]
    if kind == "csv":
        train = _train_run(logs / "version_0", steps, values)
        val = _validate_run(logs / "version_1")  # the last version dir: the one the old code drew
    else:
        _needs("tensorboard")
        train = _tb_run(logs / "version_0", {RETURN: list(zip(steps, values))})
        val = _tb_run(logs / "version_1", {VAL_RETURN: [(0, 42.0)]})
    with pytest.warns(UserWarning) as record_:
        curves = collect_curves(logs)
    messages = [str(w.message) for w in record_]
    assert messages == [f"skipping {str(val)!r}: it has no metric {RETURN!r}; its metrics: "
                        + (f"{VAL_RETURN}, val/episode_return_min" if kind == "csv" else VAL_RETURN)]
    [curve] = curves
    assert curve.runs == (train,) and curve.outside == ()
    np.testing.assert_array_equal(curve.steps, steps)
    np.testing.assert_allclose(curve.values, [values])


def test_runs_with_too_few_points_are_skipped_and_the_rest_plotted(tmp_path):
    train = _train_run(tmp_path / "a", [100, 200], [1.0, 2.0])
    one = _train_run(tmp_path / "b", [300], [5.0])
    empty = _csv_run(tmp_path / "c", {RETURN: [None, None], "train/loss": [1.0, 0.9]}, [100, 200])
    with pytest.warns(UserWarning) as record_:
        [curve] = collect_curves(tmp_path)
    assert sorted(str(w.message) for w in record_) == [
        f"skipping {str(one)!r}: it has 1 point(s) of {RETURN!r} (at env step 300), fewer than the 2 a curve needs",
        f"skipping {str(empty)!r}: it has 0 point(s) of {RETURN!r}, fewer than the 2 a curve needs",
    ]
    assert curve.runs == (train,)
    np.testing.assert_allclose(curve.values, [[1.0, 2.0]])


def test_no_run_with_the_metric_is_an_error_naming_dirs_and_metric(tmp_path):
    _needs("matplotlib")
    logs = tmp_path / "logs"
    _validate_run(logs / "version_0")
    _train_run(logs / "version_1", [100], [1.0])
    other = tmp_path / "other"
    _validate_run(other / "version_0")
    out = tmp_path / "curve.png"
    with pytest.warns(UserWarning, match="skipping"), pytest.raises(ValueError) as err:
        plot_curves([logs, other], out)
    assert str(err.value) == (
        f"no run under {str(logs)!r}, {str(other)!r} has metric {RETURN!r} to plot: 2 run(s) do not log it "
        f"(they log: {VAL_RETURN}, val/episode_return_min); 1 run(s) have fewer than 2 points of it"
    )
    assert not out.exists()  # no empty axes written


def test_a_label_left_without_runs_warns_and_the_others_are_drawn(tmp_path):
    _train_run(tmp_path / "ppo" / "version_0", [100, 200], [1.0, 2.0])
    _validate_run(tmp_path / "a2c" / "version_0")
    with pytest.warns(UserWarning) as record_:
        curves = collect_curves([tmp_path / "ppo", tmp_path / "a2c"], labels=["PPO", "A2C"])
    assert [c.label for c in curves] == ["PPO"]
    assert str(record_[-1].message) == f"no line for label 'A2C': none of its runs has {RETURN!r} to plot"


def test_runs_of_different_lengths_mean_over_the_shared_range_rest_drawn_thin(tmp_path):
    long = _train_run(tmp_path / "seed0", [100, 200, 300, 400], [1.0, 2.0, 3.0, 4.0])
    late = _train_run(tmp_path / "seed1", [50, 150, 250], [10.0, 20.0, 30.0])  # starts earlier, ends sooner
    with pytest.warns(UserWarning) as record_:
        [curve] = collect_curves(tmp_path)
    assert [str(w.message) for w in record_] == [
        f"the 2 runs cover different env-step ranges (first and last env step: {str(long)!r} [100, 400], "
        f"{str(late)!r} [50, 250]); the mean and band are drawn over the range they all cover, [100, 250], "
        "and the rest of each run as a thin line"
    ]
    assert curve.runs == (long, late)
    np.testing.assert_array_equal(curve.steps, [100, 150, 200, 250])  # both runs' steps inside [100, 250]
    np.testing.assert_allclose(curve.values, [[1.0, 1.5, 2.0, 2.5], [15.0, 20.0, 25.0, 30.0]])
    np.testing.assert_allclose(curve.mean, [8.0, 10.75, 13.5, 16.25])
    low, high = curve.band("minmax")
    np.testing.assert_allclose(low, [1.0, 1.5, 2.0, 2.5])
    np.testing.assert_allclose(high, [15.0, 20.0, 25.0, 30.0])
    low, high = curve.band("std")
    np.testing.assert_allclose(high - curve.mean, [7.0, 9.25, 11.5, 13.75])
    assert curve.band("none") is None
    # Nothing is dropped: each run's points outside [100, 250], joined at the edge of the shared range.
    (run_a, steps_a, values_a), (run_b, steps_b, values_b) = curve.outside
    assert run_a == long
    np.testing.assert_array_equal(steps_a, [250, 300, 400])
    np.testing.assert_allclose(values_a, [2.5, 3.0, 4.0])
    assert run_b == late
    np.testing.assert_array_equal(steps_b, [50, 100])
    np.testing.assert_allclose(values_b, [10.0, 15.0])


def test_runs_of_one_length_pool_without_warning(tmp_path):
    _train_run(tmp_path / "seed0", [100, 200, 300], [1.0, 2.0, 3.0])
    _train_run(tmp_path / "seed1", [100, 300], [3.0, 5.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        [curve] = collect_curves(tmp_path)
    np.testing.assert_array_equal(curve.steps, [100, 200, 300])
    np.testing.assert_allclose(curve.mean, [2.0, 3.0, 4.0])
    assert curve.outside == ()


def test_runs_sharing_no_range_are_an_error(tmp_path):
    first = _train_run(tmp_path / "version_0", [100, 200], [1.0, 2.0])
    resumed = _train_run(tmp_path / "version_1", [200, 300], [2.0, 3.0])  # e.g. a resumed run: one point shared
    with pytest.raises(ValueError, match="share no env-step range") as err:
        collect_curves(tmp_path)
    assert f"{str(first)!r} [100, 200]" in str(err.value) and f"{str(resumed)!r} [200, 300]" in str(err.value)


def _hparams(run, **settings):
    """``hparams.yaml`` beside a run's ``metrics.csv``, as Lightning's loggers write it (a tuple
    hyperparameter as ``!!python/tuple``)."""
    lines = [f"{k}: {v}" for k, v in {"env": "CartPole-v1", "lr": 0.001, "seed": 0, "total_env_steps": 1000,
                                      "algorithm": "lightning_rl.algorithms.ppo.PPO", **settings}.items()]
    lines += ["hiddens: !!python/tuple", "- 64", "- 64", "_instantiator: pytorch_lightning.cli.instantiate_module"]
    (run.parent / "hparams.yaml").write_text("\n".join(lines) + "\n")
    return run


def test_runs_of_different_algorithms_or_settings_are_different_lines(runs, tmp_path):
    """Seeds of one algorithm and settings are one line; another algorithm, or another ``lr``, is
    another line, labelled with what differs. The loggers' hparams.yaml names the algorithm."""
    ppo = [_hparams(_train_run(tmp_path / f"ppo{seed}", [100, 200], [1.0 + seed, 2.0]), seed=seed)
           for seed in (0, 1)]
    dqn = [_hparams(_train_run(tmp_path / f"dqn{seed}", [100, 200], [5.0, 6.0 + seed]), seed=seed,
                    algorithm="lightning_rl.algorithms.dqn.DQN") for seed in (0, 1)]
    slow = _hparams(_train_run(tmp_path / "slow", [100, 200], [0.0, 0.5]), lr=0.0003)
    fast = _hparams(_train_run(tmp_path / "fast", [100, 200], [3.0, 4.0]), num_cpu_threads=4, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        curves = {c.label: c for c in collect_curves(tmp_path)}
    assert set(curves) == {"PPO lr=0.001", "DQN", "PPO lr=0.0003"}
    assert set(curves["PPO lr=0.001"].runs) == {*ppo, fast}  # threads and seeds are not settings
    assert set(curves["DQN"].runs) == set(dqn)
    assert curves["PPO lr=0.0003"].runs == (slow,)
    np.testing.assert_allclose(curves["DQN"].mean, [5.0, 6.5])
    # labels still make the lines: the user's choice
    [both] = collect_curves([tmp_path / "ppo0", tmp_path / "dqn0"], labels=["mine", "mine"])
    assert both.label == "mine" and len(both.runs) == 2
    (logged,) = (runs / "csv" / "seed0").rglob("hparams.yaml")  # a real run's
    assert plotting._read_yaml(logged)["algorithm"] == "lightning_rl.algorithms.ppo.PPO"


def test_a_resumed_run_continues_its_own_curve(tmp_path):
    """``version_1`` resumed ``version_0`` (the Python API: same settings and seed, a larger budget,
    env steps that continue) and is drawn as one run with it; so is ``version_3``, which the CLI
    resumed from a mid-run checkpoint of ``version_2`` (its config.yaml names the file): its
    points replace ``version_2``'s from where it starts. The seed-1 run beside them is a seed of
    the same line; a run of seed 0 started afresh is not joined to anything."""
    logs = tmp_path / "lightning_logs"
    first = _hparams(_train_run(logs / "version_0", [100, 200, 300], [1.0, 2.0, 3.0]))
    resumed = _hparams(_train_run(logs / "version_1", [400, 500], [4.0, 5.0]), total_env_steps=2000)
    cli_first = _hparams(_train_run(logs / "version_2", [100, 200, 300], [1.0, 2.0, 3.0]), seed=1)
    cli_resumed = _hparams(_train_run(logs / "version_3", [300, 400, 500], [30.0, 40.0, 50.0]), seed=1)
    (logs / "version_3" / "config.yaml").write_text(
        "seed_everything: 1\nckpt_path: lightning_logs/version_2/checkpoints/epoch=1-step=200.ckpt\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        [curve] = collect_curves(logs)
    assert curve.runs == (first, cli_first) and curve.parts == ((first, resumed), (cli_first, cli_resumed))
    np.testing.assert_array_equal(curve.steps, [100, 200, 300, 400, 500])
    np.testing.assert_allclose(curve.values, [[1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 30.0, 40.0, 50.0]])

    again = _hparams(_train_run(logs / "version_4", [100, 200], [9.0, 9.0]))  # seed 0 afresh
    with pytest.warns(UserWarning, match="cover different env-step ranges"):
        [curve] = collect_curves(logs)
    assert curve.runs == (first, cli_first, again) and curve.parts[2] == (again,)


def test_plot_command_line_warns_on_stderr_and_exits_1_without_a_curve(tmp_path, capsys):
    _needs("matplotlib", "PIL")
    logs = tmp_path / "logs"
    _train_run(logs / "version_0", [100, 200, 300], [1.0, 2.0, 3.0])
    _train_run(logs / "version_1", [100, 200], [2.0, 4.0])
    val = _validate_run(logs / "version_2")
    out = tmp_path / "curve.png"
    assert plotting.main([str(logs), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"wrote {out}\n"
    assert captured.err.splitlines() == [
        f"lightning-rl plot: warning: skipping {str(val)!r}: it has no metric {RETURN!r}; "
        f"its metrics: {VAL_RETURN}, val/episode_return_min",
        f"lightning-rl plot: warning: the 2 runs cover different env-step ranges (first and last env step: "
        f"{str(logs / 'version_0' / 'metrics.csv')!r} [100, 300], {str(logs / 'version_1' / 'metrics.csv')!r} "
        "[100, 200]); the mean and band are drawn over the range they all cover, [100, 200], and the rest of "
        "each run as a thin line",
    ]
    _check_png(out)

    from lightning_rl.cli import main as cli_main

    missing_out = tmp_path / "none.png"
    assert cli_main(["plot", str(logs / "version_2"), "--out", str(missing_out)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("lightning-rl plot: warning: skipping")
    assert err[1:] == [f"lightning-rl plot: error: no run under {str(logs / 'version_2')!r} has metric {RETURN!r} "
                       f"to plot: 1 run(s) do not log it (they log: {VAL_RETURN}, val/episode_return_min)"]
    assert not missing_out.exists()


def test_plot_module_entry_point_exit_codes(tmp_path):
    _needs("matplotlib")
    _validate_run(tmp_path / "version_0")
    command = [sys.executable, "-m", "lightning_rl.plotting", str(tmp_path), "--out", str(tmp_path / "c.png")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1])
    assert done.returncode == 1, done.stderr
    assert "lightning-rl plot: error: no run under" in done.stderr and "Traceback" not in done.stderr
    _train_run(tmp_path / "version_1", [100, 200], [1.0, 2.0])
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr
    assert "lightning-rl plot: warning: skipping" in done.stderr and (tmp_path / "c.png").exists()


# ----------------------------------------------------------------------------- checkpoints
def test_load_model_infers_the_class(runs, tmp_path):
    model = load_model(runs / "ppo_cartpole.ckpt")
    assert type(model) is PPO and model.counters["num_env_steps_sampled"] == BATCH * ITERATIONS
    assert type(load_model(runs / "ppo_cartpole.ckpt", algo="ppo")) is PPO

    a2c = A2C(env="CartPole-v1", num_envs=2, rollout_fragment_length=8, seed=0, total_env_steps=16)
    trainer = quiet_trainer()
    trainer.fit(a2c)
    trainer.save_checkpoint(tmp_path / "a2c.ckpt")
    loaded = load_model(tmp_path / "a2c.ckpt")
    assert type(loaded) is A2C
    obs = np.zeros((3, 4), dtype=np.float32)
    np.testing.assert_array_equal(loaded.compute_actions(obs, explore=False), a2c.compute_actions(obs, explore=False))


def test_load_model_errors_name_the_file(runs, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.ckpt"):
        load_model(tmp_path / "nope.ckpt")
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match=r"garbage\.ckpt"):
        load_model(garbage)
    plain = tmp_path / "plain.pt"
    torch.save({"weights": torch.zeros(3)}, plain)
    with pytest.raises(ValueError, match=r"plain\.pt"):
        load_model(plain)
    with pytest.raises(ValueError, match="algorithm 'TRPO' is not defined in this process"):
        load_model(runs / "ppo_cartpole.ckpt", algo="TRPO")
    assert recording.main(["--ckpt_path", str(tmp_path / "nope.ckpt")]) == 1


# ----------------------------------------------------------------------------- recording
def _gif(path):
    from PIL import Image

    im = Image.open(path)
    assert im.format == "GIF"
    return im


def test_record_cartpole_gif_from_checkpoint(runs, tmp_path, capsys):
    _needs("PIL", "pygame")
    model = load_model(runs / "ppo_cartpole.ckpt")
    returns = record(model, tmp_path / "cartpole.gif", num_episodes=2, seed=0)
    assert len(returns) == 2 and all(r >= 8 for r in returns)
    with _gif(tmp_path / "cartpole.gif") as im:
        assert im.n_frames > 10 and im.size == (600, 400)
        assert im.n_frames <= sum(returns) + 2  # a reset frame per episode plus one per step
    # greedy and seeded: the same returns again
    assert record(model, tmp_path / "again.gif", num_episodes=2, seed=0) == returns

    out = tmp_path / "cli" / "agent.gif"
    code = recording.main(["--ckpt_path", str(runs / "ppo_cartpole.ckpt"), "--out", str(out), "--algo", "PPO",
                           "--num-episodes", "1", "--seed", "1"])
    assert code == 0 and str(out) in capsys.readouterr().out
    with _gif(out) as im:
        assert im.n_frames > 10


def test_record_pendulum_continuous_actions(tmp_path):
    _needs("PIL", "pygame")
    model = PPO(env="Pendulum-v1", num_envs=2, rollout_fragment_length=64, seed=0, total_env_steps=128)
    trainer = quiet_trainer()
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "pendulum.ckpt")
    loaded = load_model(tmp_path / "pendulum.ckpt")
    assert type(loaded) is PPO and isinstance(loaded.action_space, gym.spaces.Box)
    returns = record(loaded, tmp_path / "pendulum.gif", num_episodes=1, seed=0, fps=50)
    assert len(returns) == 1 and -2000 < returns[0] <= 0
    with _gif(tmp_path / "pendulum.gif") as im:
        assert im.n_frames > 10 and im.size == (500, 500)


def test_record_max_frames_and_env_factories(runs, tmp_path):
    _needs("PIL", "pygame")
    model = load_model(runs / "ppo_cartpole.ckpt")
    with pytest.warns(UserWarning, match="max_frames=12"):
        returns = record(model, tmp_path / "short.gif", num_episodes=3, seed=0, max_frames=12)
    assert len(returns) < 3
    with _gif(tmp_path / "short.gif") as im:
        assert im.n_frames <= 12

    def renders():
        return gym.make("CartPole-v1", render_mode="rgb_array")

    assert len(record(model, tmp_path / "factory.gif", num_episodes=1, env=renders, seed=0)) == 1
    with pytest.raises(ValueError, match="render_mode='rgb_array'"):
        record(model, tmp_path / "x.gif", env=lambda: gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="spaces"):
        record(model, tmp_path / "x.gif", env="Pendulum-v1")
    with pytest.raises(ValueError, match="unknown env id"):
        record(model, tmp_path / "x.gif", env="NoSuchEnv-v0")


def test_record_a_multi_agent_checkpoint(tmp_path, capsys):
    """MPE's speaker and listener, each acting with its own policy: ``lightning-rl record`` on a
    multi-agent checkpoint writes a GIF of the env's frames, and the team return it reports is
    the one evaluation gets on the same seed. A multi-agent env that cannot render is named."""
    _needs("PIL", "pygame", "mpe2")
    from lightning_rl.evaluation import evaluate_multi_agent
    from tests.multi_agent_envs import Relay

    model = PPO(env="mpe2.simple_speaker_listener_v4.parallel_env", policies=["speaker", "listener"],
                policy_mapping_fn={"speaker_0": "speaker", "listener_0": "listener"}, num_envs=1,
                rollout_fragment_length=25, sgd_minibatch_size=25, num_sgd_iter=1, total_env_steps=25, seed=0)
    trainer = quiet_trainer()
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "ma.ckpt", weights_only=False)
    out = tmp_path / "ma.gif"
    assert recording.main(["--ckpt_path", str(tmp_path / "ma.ckpt"), "--out", str(out), "--num-episodes", "1",
                           "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    loaded = load_model(tmp_path / "ma.ckpt")
    (team,) = evaluate_multi_agent(loaded, loaded.env_spec, num_episodes=1, seed=3)
    assert f"wrote {out} (PPO, episode returns: {team:.1f})" in printed
    with _gif(out) as im:
        assert im.size == (700, 700) and im.n_frames > 10  # MPE's frames: 25 steps and the reset (repeats merge)

    with pytest.raises(ValueError, match=r"multi-agent env .*Relay.* render_mode=None"):
        record(PPO(env=Relay, num_envs=1, rollout_fragment_length=4, sgd_minibatch_size=4), tmp_path / "r.gif")


# ----------------------------------------------------------------------------- packaging
def test_no_extra_names_plain_pygame():
    """``pygame`` and ``pygame-ce`` install the same ``pygame`` package, so an install with two extras
    that name different ones ends with whichever came last: every extra names pygame-ce."""
    import configparser

    from packaging.requirements import Requirement

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    extras = {name: [Requirement(line.split("#", 1)[0].strip()).name.lower()
                     for line in value.splitlines() if line.split("#", 1)[0].strip()]
              for name, value in config["options.extras_require"].items()}
    with_pygame = {name for name, reqs in extras.items() if any(r.startswith("pygame") for r in reqs)}
    assert {"plot", "test"} <= with_pygame
    assert not [name for name, reqs in extras.items() if "pygame" in reqs]
    assert all("pygame-ce" in extras[name] for name in with_pygame)
