"""Learning test, DQN: a seeded run with an env-step budget (never a wall-clock limit); ``slow``,
kept out of CI like the other single-agent learning runs (tests/test_learning.py), and run over 5
seeds by ``benchmarks/learning.py``.

The on-policy ones are in tests/test_learning.py, SAC's in tests/test_learning_sac.py.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
from pytorch_lightning.callbacks import EarlyStopping

from lightning_rl import DQN
from tests.conftest import quiet_trainer

# A budget of env steps, not of time: pytest-timeout's global 900 s (a hang guard) is too tight when
# pytest-xdist's workers share the cores with each other and with DDP ranks.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_dqn_cartpole_greedy_475_within_60k_steps():
    """Greedy evaluation (10 episodes) every ~5k env steps; EarlyStopping ends the run at 475."""
    model = DQN(env="CartPole-v1", seed=0, total_env_steps=60_000, lr_schedule="linear", iterations_per_epoch=78,
                evaluation_interval=1, evaluation_num_episodes=10)
    evaluations = []

    class Record(pl.Callback):
        def on_validation_end(self, trainer, pl_module):
            if not trainer.sanity_checking:
                evaluations.append((pl_module.counters["num_env_steps_sampled"],
                                    float(trainer.callback_metrics["val/episode_return_mean"])))

    stop = EarlyStopping(monitor="val/episode_return_mean", mode="max", stopping_threshold=475, patience=1000)
    quiet_trainer(callbacks=[Record(), stop], num_sanity_val_steps=0).fit(model)
    best = max(r for _, r in evaluations)
    assert best >= 475 and model.counters["num_env_steps_sampled"] <= 60_000, evaluations
