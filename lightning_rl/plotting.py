"""Learning curves from training logs: episode return against env steps.

Reads the metrics that training writes, from either logger Lightning ships:

- ``CSVLogger``: ``metrics.csv`` (column ``step`` is the global env-step count);
- ``TensorBoardLogger``: ``events.out.tfevents.*`` files (needs ``pip install tensorboard``).

A *run* is one ``metrics.csv`` file, or one directory holding event files. Each log dir
given may hold one run or several (e.g. ``runs/`` with ``seed0/version_0``,
``seed1/version_0``, ...), and every run under it that logged the metric is drawn. A run
that did not log it (say the version dir of a ``lightning-rl validate`` run, which has only
``val/…`` metrics) or has fewer than 2 points of it is skipped with a warning naming the
run and what it has; when no run is left, it is a ``ValueError`` — never empty axes.

An *experiment* is one line: runs of the same algorithm with the same settings, seeds
excepted, read from each run's ``hparams.yaml`` (which Lightning's loggers write, the algorithm
included); settings that do not change what is learned (threads, evaluation, ``compile``) are
not told apart either. Runs without ``hparams.yaml`` form one experiment of their own. The runs
of one line are taken as seeds: their curves are interpolated onto a common env-step grid and
drawn as the mean with a min–max (or ±std) band; with several lines each is labelled with the
algorithm and the settings that differ. With ``labels`` (one per log dir) each distinct label
is its own line instead, pooling the runs of the log dirs that carry it.

Runs of different envs (the ``env`` of their ``hparams.yaml``) are drawn on panels of their own,
one per env, each titled by its env, so a CartPole return and a Pendulum return never share an
axis; a line's label then tells the algorithms of one env apart. With one env there is one axis.

A run that was interrupted and resumed lives in two version folders (``version_0``, then
``version_1`` resumed from a checkpoint of it): the resumed one is joined to the run it
continues, into one run (its points from where the resumed run's begin). The run it
continues is the one whose folder holds the checkpoint the CLI's ``config.yaml`` names
(``ckpt_path``); otherwise (the Python API) the run with the same settings and seed, apart from
what a resume may change (the budget), whose env steps it continues: its first point comes
after that run's first and at most two logging intervals after that run's last.

Runs of different lengths (one stopped early, or still running): the mean and band cover
only the env-step range that *every* run of the line covers, so at each step they are
taken over all the runs and the legend's "mean of n runs" holds everywhere (a mean over
whichever runs remain would jump when a run drops out). Nothing is cut away, though: the
part of each run outside that common range is drawn as a thin line of the same colour, and
a warning gives each run's first and last env step and the common range. Runs of one line
that share no range cannot be pooled: a ``ValueError`` (give them different labels).
:func:`collect_curves` returns exactly what is drawn.

Drawing needs matplotlib (``pip install matplotlib``, or the ``plot`` extra).

``docs/learning_curve.png`` (PPO on CartPole-v1 with the rl-zoo settings, 3 seeds) was
made with this script, ``train.py``::

    import sys
    import pytorch_lightning as pl
    from pytorch_lightning.loggers import CSVLogger
    from lightning_rl import PPO

    seed = int(sys.argv[1])
    model = PPO(env="CartPole-v1", num_envs=8, rollout_fragment_length=32, num_sgd_iter=20, sgd_minibatch_size=256,
                lr=1e-3, lr_schedule="linear", clip_param_schedule="linear", gamma=0.98, lambda_=0.8,
                total_env_steps=100_000, seed=seed)
    trainer = pl.Trainer(logger=CSVLogger("/tmp/lc/runs", name=f"seed{seed}"), log_every_n_steps=1,
                         enable_progress_bar=False, enable_checkpointing=False, accelerator="cpu")
    trainer.fit(model)

run for the three seeds, then drawn (mean and min–max band) with::

    for s in 0 1 2; do python train.py $s & done; wait
    python -m lightning_rl.plotting /tmp/lc/runs --out docs/learning_curve.png --labels PPO \\
        --title "PPO on CartPole-v1 (rl-zoo settings)"

(``lightning-rl plot`` takes the same arguments). All three seeds reach a return of 500
by about 90k env steps.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from lightning_rl.extras import missing_dependency
from lightning_rl.plotting_curves import Band, Curve, collect_curves
from lightning_rl.plotting_logs import (
    DEFAULT_METRIC,
    PathLikeStr,
    Source,
    _read_yaml,  # noqa: F401  (read by the tests as plotting._read_yaml)
    find_runs,
    load_curve,
)

__all__ = ["DEFAULT_METRIC", "Curve", "collect_curves", "find_runs", "load_curve", "main", "plot_curves"]


# ----------------------------------------------------------------------------- drawing
def plot_curves(
    log_dirs: PathLikeStr | Sequence[PathLikeStr],
    out: PathLikeStr,
    metric: str = DEFAULT_METRIC,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    band: Band = "minmax",
    source: Source = "auto",
) -> Path:
    """Draw ``metric`` against env steps from ``log_dirs`` into the image ``out`` (PNG); returns its path.

    Without ``labels`` each experiment (algorithm and settings) found under ``log_dirs`` is a
    line, its runs the seeds (see the module docstring); runs of different envs are drawn on
    panels of their own, one per env, titled by it (``title`` then heads the figure). With
    ``labels`` (one per log dir) each distinct label is one line, pooling the runs under
    the log dirs that carry it. A line of several runs is their mean on a common env-step
    grid with a ``band`` of ``"minmax"`` (default), ``"std"`` (mean ± one std) or
    ``"none"``; a line of one run is that run. The lines are :func:`collect_curves`'s,
    with its warnings and errors.
    """
    if band not in ("minmax", "std", "none"):
        raise ValueError(f"band must be 'minmax', 'std' or 'none', got {band!r}")
    figure_cls, canvas_cls, ticker = _matplotlib()
    curves = collect_curves(log_dirs, metric, labels, source)

    panels: dict[str | None, list[Curve]] = {}  # one per env
    for curve in curves:
        panels.setdefault(curve.env, []).append(curve)
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig = figure_cls(figsize=(7.0 if cols == 1 else 5.6 * cols, 4.2 * rows), dpi=100)
    canvas_cls(fig)
    heading = title if title is not None else metric
    for i, (env, group) in enumerate(panels.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        _draw_panel(ax, group, band)
        ax.xaxis.set_major_formatter(ticker.EngFormatter())  # 100 k rather than 100000
        ax.set_xlabel("env steps")
        ax.set_ylabel(metric)
        ax.set_title(heading if len(panels) == 1 else env if env is not None else "env not logged, or mixed")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
    if len(panels) > 1:
        fig.suptitle(heading)
    fig.tight_layout()

    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, format=None if out_path.suffix else "png")
    return out_path


def _draw_panel(ax, curves: Sequence[Curve], band: Band) -> None:
    """The lines of ``curves`` on ``ax``: each run, or the mean of several with its band and thin ends."""
    band_labelled = outside_labelled = False
    for curve in curves:
        n = len(curve.runs)
        if n == 1:
            ax.plot(curve.steps, curve.values[0], linewidth=1.6, label=curve.label or None)
            continue
        name = f"{curve.label} (mean of {n} runs)" if curve.label else f"mean of {n} runs"
        (line,) = ax.plot(curve.steps, curve.mean, linewidth=1.8, label=name)
        for _, steps, values in curve.outside:
            outside_name = None if outside_labelled else "single runs, outside the shared range"
            ax.plot(steps, values, linewidth=0.8, alpha=0.7, color=line.get_color(), label=outside_name)
            outside_labelled = True
        low_high = curve.band(band)
        if low_high is None:
            continue
        band_name = None if band_labelled else ("min–max" if band == "minmax" else "± std")
        ax.fill_between(curve.steps, *low_high, color=line.get_color(), alpha=0.2, linewidth=0, label=band_name)
        band_labelled = True


def _matplotlib():
    try:
        from matplotlib import ticker
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            "plotting needs matplotlib: pip install matplotlib (or pip install 'lightning-rl[plot]')"
        ) from err
    return Figure, FigureCanvasAgg, ticker


# ----------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``plot`` subcommand's arguments (for wiring into a CLI's subparsers)."""
    parser.add_argument("log_dir", nargs="+", help="CSV or TensorBoard log dirs (runs of one algorithm and settings, "
                        "seeds excepted, are one line; a resumed run continues its own; each env "
                        "is a panel of its own)")
    parser.add_argument("--out", default="curve.png", help="image to write (default: curve.png)")
    parser.add_argument("--metric", default=DEFAULT_METRIC, help=f"metric to draw (default: {DEFAULT_METRIC})")
    parser.add_argument("--labels", nargs="+", default=None,
                        help="one label per log dir; each distinct label is its own line")
    parser.add_argument("--title", default=None, help="plot title (default: the metric); with several envs "
                        "it heads the figure and each panel is titled by its env")
    parser.add_argument("--band", choices=("minmax", "std", "none"), default="minmax",
                        help="band around the mean of several runs (default: minmax)")
    parser.add_argument("--source", choices=("auto", "csv", "tensorboard"), default="auto",
                        help="which logs to read when a dir holds both (default: auto = CSV first)")
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    """Run the parsed ``plot`` arguments; prints where the image was written. Returns an exit code.

    The warnings of :func:`collect_curves` (runs skipped, ranges that differ) go to stderr
    as ``lightning-rl plot: warning: ...`` lines, errors as one ``error:`` line (exit 1).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = plot_curves(args.log_dir, args.out, metric=args.metric, labels=args.labels, title=args.title,
                              band=args.band, source=args.source)
        except (FileNotFoundError, ValueError, ImportError) as err:
            failure: Exception | None = err
        else:
            failure = None
    for warning in caught:
        print(f"lightning-rl plot: warning: {warning.message}", file=sys.stderr)
    if failure is not None:
        print(f"lightning-rl plot: error: {missing_dependency(failure) or failure}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``lightning-rl plot <log_dir>... --out curve.png [--metric M] [--labels ...]`` (argv without ``plot``)."""
    parser = add_arguments(argparse.ArgumentParser(prog="lightning-rl plot", description=__doc__.split("\n")[0]))
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
