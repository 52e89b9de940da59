"""Lightning warnings no user can act on are silenced only while a run lasts (``KnownWarnings``):
importing lightning_rl installs no warning filter, a fit prints none of them, and the filters
are as they were once it ends."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from lightning_rl import PPO
from lightning_rl.callbacks.known_warnings import KNOWN_WARNINGS
from tests.conftest import quiet_trainer

pytestmark = pytest.mark.timeout(120)


IMPORT_CODE = """
import sys, warnings
callers = []
def recording(original):
    def add(*args, **kwargs):
        callers.append(sys._getframe(1).f_code.co_filename)
        return original(*args, **kwargs)
    return add
warnings.filterwarnings = recording(warnings.filterwarnings)
warnings.simplefilter = recording(warnings.simplefilter)
import lightning_rl, lightning_rl.algorithms, lightning_rl.cli
lightning_rl.cli._lightning()  # Lightning's CLI, imported when a command runs
print(sum("lightning_rl" in c for c in callers), len(callers))
"""


def test_importing_lightning_rl_installs_no_warning_filter():
    """Other libraries install filters on import (not ours to judge); no file of lightning_rl does."""
    out = subprocess.run([sys.executable, "-c", IMPORT_CODE], capture_output=True, text=True, timeout=100, check=True)
    ours, everyone = map(int, out.stdout.split())
    assert everyone > 0 and ours == 0, out.stdout  # the recorder saw the libraries' filters


def test_a_fit_prints_no_dataloader_advice_and_restores_the_filters():
    before = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inside = list(warnings.filters)
        model = PPO(env="CartPole-v1", num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8,
                    num_sgd_iter=1, hiddens=(8,), seed=0, iterations_per_epoch=2, total_env_steps=None)
        quiet_trainer(max_epochs=1).fit(model)
        assert warnings.filters == inside  # teardown put back what was there
    messages = [str(w.message) for w in caught]
    for advice in ("does not have many workers", "`IterableDataset` has `__len__` defined"):
        assert not [m for m in messages if advice in m], messages
    assert warnings.filters == before
    assert {message for _, message in KNOWN_WARNINGS} >= {r"The '\w+' does not have many workers",
                                                          r"Your `IterableDataset` has `__len__` defined"}
