"""The bars of the sanity check, validation and test count the evaluation's episodes, not
Lightning's one batch called "env steps" (issue 35, item 12)."""

from __future__ import annotations

import re

import pytest

from lightning_rl import PPO
from tests.conftest import quiet_trainer


def _lines(out: str, start: str) -> list[str]:
    return [line.strip() for line in re.split(r"[\r\n]", out) if line.strip().startswith(start)]


@pytest.mark.timeout(120)
def test_evaluation_bars_count_episodes(capsys):
    model = PPO(num_envs=2, rollout_fragment_length=16, sgd_minibatch_size=16, seed=0, iterations_per_epoch=2,
                total_env_steps=64, evaluation_interval=1, evaluation_num_episodes=3)
    trainer = quiet_trainer(enable_progress_bar=True, num_sanity_val_steps=1)
    trainer.fit(model)
    trainer.validate(model, verbose=False)
    trainer.test(model, verbose=False)
    out = capsys.readouterr().out
    for start in ("Sanity Checking", "Validation", "Testing"):
        lines = _lines(out, start)
        assert lines, (start, out[-2000:])
        assert all(re.search(r"\| [0-3]/3 episodes ", line) for line in lines), (start, lines)
        assert any("3/3 episodes" in line for line in lines), (start, lines)
        assert not any("env steps" in line for line in lines), (start, lines)
    assert any("64/64 env steps" in line for line in _lines(out, "Epoch 0"))  # the training bar still counts steps
