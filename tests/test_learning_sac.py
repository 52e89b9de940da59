"""Learning test, SAC: a seeded run with an env-step budget (never a wall-clock limit).

The suite's longest test (about 500 s on one core): a file of its own, so that pytest-xdist
(``--dist loadfile``) starts it first and runs everything else on the other workers meanwhile.
"""

from __future__ import annotations

import numpy as np
import pytest

from lightning_rl import SAC, evaluate
from tests.test_learning import train

# A budget of env steps, not of time: pytest-timeout's global 900 s (a hang guard) is too tight when
# pytest-xdist's workers share the cores with each other and with DDP ranks.
pytestmark = pytest.mark.timeout(1800)


def test_sac_pendulum_greedy_minus_200_within_20k_steps():
    model = SAC(env="Pendulum-v1", seed=0, total_env_steps=20_000)
    curve = train(model)
    returns = evaluate(model, num_episodes=10, seed=123)
    assert np.mean(returns) >= -200, (returns, str(curve))
