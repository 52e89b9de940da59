"""Docs that cannot rot: the site (``mkdocs.yml``, ``docs/``) builds with ``--strict`` (no broken
link, anchor or reference, no docstring griffe cannot read), its hyperparameter reference is the
algorithms' signatures, every Python code block of README.md and docs/ runs, and every YAML
config block builds its model.

A block runs as written, in a fresh namespace, in a temporary directory, with ``examples/`` on
``sys.path`` (a block may import an example's module, as its text says) and gymnasium's registry
restored after it. Training gets a short budget: ``pytorch_lightning.Trainer`` is replaced by one
that fits one epoch of at most 2 iterations (and validates at most one batch). A block after a
``<!-- test: tag -->`` line is run by the test that names the tag, with its own budget and
assertions (tests/test_examples.py), and is skipped here."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import gymnasium as gym
import pytest
import pytorch_lightning as pl

from tests.doc_blocks import DOC_FILES, ROOT, code_blocks

PYTHON_BLOCKS = [b for path in DOC_FILES for b in code_blocks(path) if b.language in ("python", "py")]
YAML_CONFIGS = [b for path in DOC_FILES for b in code_blocks(path)
                if b.language in ("yaml", "yml") and "class_path: lightning_rl." in b.code]


def test_the_docs_have_python_blocks_and_every_one_is_found():
    assert len(PYTHON_BLOCKS) >= 2 and len(YAML_CONFIGS) >= 1
    assert {b.path.name for b in PYTHON_BLOCKS if b.tagged} >= {"README.md"}
    # a block in a language this test would not run must say what it is
    for path in DOC_FILES:
        for block in code_blocks(path):
            assert block.language, f"{block.name}: a code block without a language"


class ShortTrainer(pl.Trainer):
    """A Trainer whose ``fit`` stops after 2 iterations of one epoch: a doc block's training, short."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.update(max_epochs=1, limit_train_batches=2, limit_val_batches=1, enable_progress_bar=False,
                      enable_model_summary=False)
        super().__init__(*args, **kwargs)


@pytest.mark.parametrize("block", [b for b in PYTHON_BLOCKS if not b.tagged], ids=lambda b: b.name)
def test_python_block_runs(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.setattr(pl, "Trainer", ShortTrainer)
    registry = dict(gym.envs.registry)
    try:
        # as its own module would run it: without this file's `from __future__ import annotations`
        exec(compile(block.code, block.name, "exec", dont_inherit=True), {"__name__": "__doc_block__"})
    finally:
        gym.envs.registry.clear()
        gym.envs.registry.update(registry)


@pytest.mark.parametrize("block", YAML_CONFIGS, ids=lambda b: b.name)
def test_yaml_config_block_builds_its_model(block, monkeypatch):
    """A documented config names a real algorithm, settings it takes (its model is built from them)
    and ``pl.Trainer`` arguments that exist."""
    import importlib

    import yaml

    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # an encoder of an example's module
    config = yaml.safe_load(block.code)
    module, _, name = config["model"]["class_path"].rpartition(".")
    getattr(importlib.import_module(module), name)(**config["model"].get("init_args", {}))
    unknown = set(config.get("trainer") or {}) - set(inspect.signature(pl.Trainer.__init__).parameters)
    assert not unknown, f"{block.name}: no such Trainer arguments {unknown}"


def test_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, a page left out of the nav, a missing
    API reference or a docstring the reference cannot parse fails the build (mkdocs.yml)."""
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-5000:]
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "pip install -e" in home  # the README is the home page

    import lightning_rl

    reference = (site / "reference" / "hyperparameters" / "index.html").read_text(encoding="utf-8")
    for name in ("PPO", "A2C", "DQN", "SAC", "TD3", "DDPG", "IMPALA", "APPO", "APEX", "A3C"):
        for setting in inspect.signature(getattr(lightning_rl, name).__init__).parameters:
            if setting != "self":
                assert f"<code>{setting}</code>" in reference, (name, setting)
    api = (site / "reference" / "algorithms" / "index.html").read_text(encoding="utf-8")
    assert api.count("normalize_observations") >= 2  # PPO's inherited settings are in its signature


def test_the_readme_and_quickstart_name_every_extra_setup_cfg_has():
    """The README's install line and the quickstart's list of extras are setup.cfg's extras."""
    import configparser
    import re

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = set(cfg["options.extras_require"])
    readme = (ROOT / "README.md").read_text()
    assert set(re.search(r"# extras: (.*)", readme).group(1).split(", ")) == extras
    quickstart = (ROOT / "docs" / "guides" / "quickstart.md").read_text()
    listed = quickstart.split("The extras: ", 1)[1].split("\n\n", 1)[0]
    assert {name for name in re.findall(r"`(\w+)`", listed) if name in extras} == extras
