"""An unset ``lr_schedule`` (``None``): DQN, IMPALA and APPO decay the learning rate linearly to 0 at
``total_env_steps`` (constant without a budget); APEX and the others keep it constant. Proven by
the rate the optimizer steps with after a short fit, not by the resolved points alone."""

from __future__ import annotations

import pytest

from lightning_rl import A2C, APEX, APPO, DQN, IMPALA, PPO, SAC, TD3
from tests.conftest import quiet_trainer

SMALL = {
    DQN: dict(learning_starts=32, train_freq=16, num_gradient_steps=1, train_batch_size=16, hiddens=(16,)),
    APEX: dict(num_workers=0, learning_starts=32, rollout_fragment_length=16, train_batch_size=16, hiddens=(16,)),
    IMPALA: dict(num_workers=0, num_envs=2, rollout_fragment_length=10, train_batch_size=20, hiddens=(16,)),
    APPO: dict(num_workers=0, num_envs=2, rollout_fragment_length=10, train_batch_size=20, hiddens=(16,)),
    PPO: dict(num_envs=2, rollout_fragment_length=10, sgd_minibatch_size=20, num_sgd_iter=1, hiddens=(16,)),
    A2C: dict(num_envs=2, rollout_fragment_length=10, hiddens=(16,)),
    SAC: dict(env="Pendulum-v1", learning_starts=32, train_freq=16, num_gradient_steps=1, train_batch_size=16,
              hiddens=(16,)),
    TD3: dict(env="Pendulum-v1", learning_starts=32, train_freq=16, num_gradient_steps=1, train_batch_size=16,
              hiddens=(16,)),
}
LR = 1e-3
BUDGET = 1000


def lr_of_the_last_step(algo: type, **settings) -> tuple[float, int]:
    """The learning rate of the optimizer after 4 iterations, and the env steps sampled before the
    last of them (what a schedule reads)."""
    model = algo(**{**SMALL[algo], "seed": 0, "lr": LR, "iterations_per_epoch": 4, **settings})
    quiet_trainer(max_epochs=1).fit(model)
    optimizers = model.optimizers()
    optimizer = optimizers[0] if isinstance(optimizers, list) else optimizers
    sampled = model.counters["num_env_steps_sampled"]
    per_iteration = sampled // model.counters["num_iterations"]
    return optimizer.param_groups[0]["lr"], sampled - per_iteration


@pytest.mark.parametrize("algo", [DQN, IMPALA, APPO])
def test_an_unset_lr_schedule_decays_linearly_to_0_at_the_budget(algo):
    lr, before_last = lr_of_the_last_step(algo, total_env_steps=BUDGET)
    assert before_last > 0
    assert lr == pytest.approx(LR * (1 - before_last / BUDGET), rel=1e-6)


@pytest.mark.parametrize("algo", [DQN, IMPALA, APPO])
def test_without_a_budget_an_unset_lr_schedule_is_constant(algo):
    model = algo(**{**SMALL[algo], "seed": 0, "lr": LR, "total_env_steps": None})
    assert model.lr_points is None


@pytest.mark.parametrize("algo", [APEX, PPO, A2C, SAC, TD3])
def test_the_others_keep_an_unset_lr_schedule_constant(algo):
    lr, _ = lr_of_the_last_step(algo, total_env_steps=BUDGET)
    assert lr == LR


def test_an_explicit_linear_schedule_without_a_budget_says_what_to_do():
    with pytest.raises(ValueError, match="set total_env_steps or pass lr_schedule='constant'"):
        DQN(lr_schedule="linear", total_env_steps=None)
