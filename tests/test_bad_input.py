"""Bad input is a clear error at construction, before any training."""

from __future__ import annotations

import gymnasium as gym
import pytest

from lightning_rl import A2C, PPO, RolloutDataModule
from tests.conftest import quiet_trainer


def test_unknown_env_id_is_named():
    with pytest.raises(ValueError, match="unknown env id 'NoSuchEnv-v9'"):
        PPO(env="NoSuchEnv-v9")


def test_env_must_be_id_or_callable():
    with pytest.raises(TypeError, match="registered env id or a callable"):
        PPO(env=42)


def test_env_factory_must_return_env():
    with pytest.raises(TypeError, match=r"not a gymnasium\.Env"):
        PPO(env=lambda: "CartPole-v1")


class TupleObsEnv(gym.Env):  # Tuple is flattened, but a Text sub-space cannot be
    observation_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Text(3)))
    action_space = gym.spaces.Discrete(2)


class MultiBinaryActionEnv(gym.Env):  # 1-D MultiBinary actions are supported, 2-D ones not
    observation_space = gym.spaces.Box(-1, 1, (3,))
    action_space = gym.spaces.MultiBinary([2, 2])


@pytest.mark.parametrize("algo", [PPO, A2C])
def test_unsupported_observation_space_is_named(algo):
    with pytest.raises(ValueError, match=r"space Tuple\(Discrete\(2\), Text\(.*has sub-space \[1\] = Text\("):
        algo(env=TupleObsEnv)


@pytest.mark.parametrize("algo", [PPO, A2C])
def test_unsupported_action_space_is_named(algo):
    with pytest.raises(ValueError, match=r"unsupported action space MultiBinary\(\(2, 2\)\): use Discrete, 1-D Box"):
        algo(env=MultiBinaryActionEnv)


def test_minibatch_larger_than_train_batch():
    with pytest.raises(ValueError, match=r"sgd_minibatch_size \(512\) is larger than the train batch.*= 256"):
        PPO(num_envs=8, rollout_fragment_length=32, sgd_minibatch_size=512)


@pytest.mark.parametrize("lr", [0.0, -1e-3])
def test_non_positive_lr(lr):
    with pytest.raises(ValueError, match="lr must be positive"):
        PPO(lr=lr)


@pytest.mark.parametrize("gamma", [0.0, -0.5, 1.01])
def test_gamma_outside_unit_interval(gamma):
    with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\]"):
        A2C(gamma=gamma)


def test_gamma_one_is_allowed():
    assert PPO(gamma=1.0).hparams.gamma == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_envs=0), "num_envs must be >= 1"),
        (dict(lambda_=1.5), "lambda_ must be in"),
        (dict(clip_param=0.0), "clip_param and vf_clip_param must be positive"),
        (dict(kl_target=0.0), "kl_target > 0"),
        (dict(activation="gelu2"), "unknown activation 'gelu2'"),
        (dict(vectorization="threads"), "vectorization must be one of"),
        (dict(lr_schedule="cosine"), "lr_schedule must be 'constant', 'linear'"),
        (dict(lr_schedule="linear", total_env_steps=None), "decays to 0 over total_env_steps"),
        (dict(clip_param_schedule=[[10, 0.2], [5, 0.1]]), "increasing env steps"),
        (dict(total_env_steps=0), "total_env_steps must be >= 1"),
        (dict(grad_clip=-1.0), "grad_clip must be positive"),
    ],
)
def test_other_bad_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PPO(**kwargs)


def test_datamodule_with_other_env_is_rejected_before_training():
    model = PPO(env="CartPole-v1", total_env_steps=None)
    dm = RolloutDataModule("Pendulum-v1", num_envs=2)
    with pytest.raises(ValueError, match="module was built for"):
        quiet_trainer(max_steps=1).fit(model, datamodule=dm)
    assert model.counters["num_iterations"] == 0
