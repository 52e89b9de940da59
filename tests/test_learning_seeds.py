"""Learning over seeds with the defaults: what a user gets at the end of ``fit`` (slow; kept out of
CI, run with ``python -m pytest -m slow tests/test_learning_seeds.py``).

Each test fits an algorithm with nothing but its defaults and a seed, five seeds, and plays 20
greedy episodes after ``fit``; at least 4 of the 5 final returns must reach the target. The same
runs, with curves and a table, are ``python benchmarks/learning.py --algos dqn_cartpole,
impala_cartpole,appo_cartpole``. IMPALA and APPO run their default 2 sampler worker processes, so
their runs are not deterministic (the order in which fragments arrive depends on timing); DQN's are.
"""

from __future__ import annotations

import numpy as np
import pytest

from lightning_rl import APPO, DQN, IMPALA, evaluate
from tests.conftest import quiet_trainer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

SEEDS = (0, 1, 2, 3, 4)


def final_greedy_returns(algo: type, **settings) -> list[float]:
    finals = []
    for seed in SEEDS:
        model = algo(seed=seed, **settings)
        quiet_trainer().fit(model)
        finals.append(float(np.mean(evaluate(model, num_episodes=20, seed=seed + 10_000))))
    return finals


@pytest.mark.parametrize("algo", [IMPALA, APPO])
def test_async_defaults_end_at_greedy_400_on_4_of_5_seeds(algo):
    """CartPole-v1, 2 sampler workers, 500k env steps: the defaults."""
    finals = final_greedy_returns(algo)
    assert sum(f >= 400 for f in finals) >= 4, finals


def test_dqn_defaults_end_at_greedy_475_on_4_of_5_seeds():
    """CartPole-v1, 60k env steps: the defaults (the learning rate decays to 0 at the budget)."""
    finals = final_greedy_returns(DQN)
    assert sum(f >= 475 for f in finals) >= 4, finals
