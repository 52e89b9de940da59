"""Learning test, SAC: a seeded run with an env-step budget (never a wall-clock limit).

The suite's longest test (about 500 s on one core): ``slow``, kept out of CI like the other
single-agent learning runs (tests/test_learning.py), and run over 5 seeds by ``benchmarks/learning.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from lightning_rl import SAC, evaluate
from tests.test_learning import train

# A budget of env steps, not of time: pytest-timeout's global 900 s (a hang guard) is too tight when
# pytest-xdist's workers share the cores with each other and with DDP ranks.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_sac_pendulum_greedy_minus_200_within_20k_steps():
    model = SAC(env="Pendulum-v1", seed=0, total_env_steps=20_000)
    curve = train(model)
    returns = evaluate(model, num_episodes=10, seed=123)
    assert np.mean(returns) >= -200, (returns, str(curve))
