"""``plot`` draws runs of different envs on panels of their own, one per env, each titled by its env:
a CartPole return and a Pendulum return on one axis, labelled by algorithm only, would read as
two algorithms on one task."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from lightning_rl import plotting
from lightning_rl.plotting import collect_curves, plot_curves

RETURN = "rollout/episode_return_mean"


def _run(folder, env: str, algorithm: str, seed: int, values: list[float]):
    """A CSVLogger version folder: ``metrics.csv`` and the ``hparams.yaml`` naming the env and algorithm."""
    folder.mkdir(parents=True)
    rows = ["epoch,step," + RETURN] + [f"0,{100 * (i + 1)},{v}" for i, v in enumerate(values)]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
    (folder / "hparams.yaml").write_text(f"env: {env}\nseed: {seed}\nlr: 0.001\n"
                                         f"algorithm: lightning_rl.algorithms.{algorithm.lower()}.{algorithm}\n")
    return folder / "metrics.csv"


@pytest.fixture
def figures(monkeypatch):
    """Every matplotlib figure ``plot_curves`` builds, kept for the test to read."""
    pytest.importorskip("matplotlib")
    built = []
    figure_cls, canvas_cls, ticker = plotting._matplotlib()

    class Kept(figure_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(plotting, "_matplotlib", lambda: (Kept, canvas_cls, ticker))
    return built


def test_runs_of_two_envs_are_two_panels_titled_by_env(tmp_path, figures):
    cartpole = [_run(tmp_path / f"ppo{s}", "CartPole-v1", "PPO", s, [20.0 + s, 200.0, 500.0]) for s in (0, 1)]
    pendulum = _run(tmp_path / "sac0", "Pendulum-v1", "SAC", 0, [-1500.0, -800.0, -200.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = plot_curves(tmp_path, tmp_path / "curve.png", title="two envs")
    assert out.is_file()
    (fig,) = figures
    axes = {ax.get_title(): ax for ax in fig.get_axes()}
    assert set(axes) == {"CartPole-v1", "Pendulum-v1"}  # one panel per env, titled by it
    assert fig.get_suptitle() == "two envs"
    # each panel holds its env's line, labelled by its algorithm
    assert [line.get_label() for line in axes["CartPole-v1"].get_lines()] == ["PPO (mean of 2 runs)"]
    assert [line.get_label() for line in axes["Pendulum-v1"].get_lines()] == ["SAC"]
    np.testing.assert_allclose(axes["Pendulum-v1"].get_lines()[0].get_ydata(), [-1500.0, -800.0, -200.0])
    assert all(ax.get_ylabel() == RETURN for ax in axes.values())

    curves = {c.env: c for c in collect_curves(tmp_path)}
    assert set(curves) == {"CartPole-v1", "Pendulum-v1"}
    assert set(curves["CartPole-v1"].runs) == set(cartpole) and curves["Pendulum-v1"].runs == (pendulum,)


def test_one_algorithm_on_two_envs_is_one_line_per_panel(tmp_path, figures):
    """The same algorithm and settings on two envs: the env tells the panels apart, so each line is
    labelled by its algorithm alone."""
    _run(tmp_path / "cartpole", "CartPole-v1", "PPO", 0, [20.0, 500.0])
    _run(tmp_path / "pendulum", "Pendulum-v1", "PPO", 0, [-1500.0, -200.0])
    plot_curves(tmp_path, tmp_path / "curve.png")
    (fig,) = figures
    titles = [ax.get_title() for ax in fig.get_axes()]
    assert sorted(titles) == ["CartPole-v1", "Pendulum-v1"]
    assert [[line.get_label() for line in ax.get_lines()] for ax in fig.get_axes()] == [["PPO"], ["PPO"]]
    assert fig.get_suptitle() == RETURN


def test_runs_of_one_env_keep_one_axis_titled_as_asked(tmp_path, figures):
    _run(tmp_path / "ppo", "CartPole-v1", "PPO", 0, [20.0, 500.0])
    _run(tmp_path / "dqn", "CartPole-v1", "DQN", 0, [10.0, 300.0])
    plot_curves(tmp_path, tmp_path / "curve.png", title="CartPole")
    (fig,) = figures
    (ax,) = fig.get_axes()
    assert ax.get_title() == "CartPole"
    assert sorted(line.get_label() for line in ax.get_lines()) == ["DQN", "PPO"]
