"""Bad input is a clear error at construction, before any training."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
import pytest

from lightning_rl import A2C, PPO, RolloutDataModule
from lightning_rl.data.envs import close_vector_env, make_vector_env, reset_vector_env, step_vector_env
from lightning_rl.data.settings import EnvSettings
from tests.conftest import quiet_trainer, sample_once


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
    dm = RolloutDataModule(EnvSettings("Pendulum-v1", num_envs=2), rollout_fragment_length=32)
    with pytest.raises(ValueError, match="module was built for"):
        quiet_trainer(max_steps=1).fit(model, datamodule=dm)
    assert model.counters["num_iterations"] == 0


# ----------------------------------------------------------------------------- observations that do not fit the space
class BadObsEnv(gym.Env):
    """Declares a float32 Box (4,); returns ``obs`` at reset and at each step (``step_obs``)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, obs=None, step_obs=None):
        self.obs = np.zeros(4, dtype=np.float32) if obs is None else obs
        self.step_obs = self.obs if step_obs is None else step_obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.obs, {}

    def step(self, action):
        return self.step_obs, 0.0, False, False, {}


class FloatForIntEnv(BadObsEnv):
    observation_space = gym.spaces.Box(0, 9, (4,), dtype=np.int64)


WRONG_SHAPE = np.zeros(3, dtype=np.float32)
SPACE = r"observation_space is Box\(-1\.0, 1\.0, \(4,\), float32\) \(shape \(4,\), dtype float32\)"


def test_wrong_observation_shape_at_reset_names_env_space_and_what_it_returned():
    model = PPO(env=partial(BadObsEnv, WRONG_SHAPE), num_envs=2, rollout_fragment_length=4,
                sgd_minibatch_size=8, total_env_steps=None)
    with pytest.raises(ValueError, match=rf"env 0 of 2 \(functools\.partial\(<class '.*BadObsEnv'>.*\)\) returned an "
                                         rf"observation of shape \(3,\) and dtype float32 at reset, but its {SPACE}"):
        sample_once(model)


def test_wrong_observation_shape_at_a_step_is_named():
    envs = make_vector_env(partial(BadObsEnv, step_obs=WRONG_SHAPE), 2, "sync")
    try:
        reset_vector_env(envs, seed=0)
        with pytest.raises(ValueError, match=rf"returned an observation of shape \(3,\) and dtype float32 at a step, "
                                             rf"but its {SPACE}") as info:
            step_vector_env(envs, np.zeros(2, dtype=np.int64))
        assert isinstance(info.value.__cause__, ValueError)  # numpy's own error stays as the cause
    finally:
        close_vector_env(envs)


def test_float_observation_for_an_integer_space_is_an_error():
    envs = make_vector_env(partial(FloatForIntEnv, np.full(4, 1.5)), 1, "sync")
    try:
        with pytest.raises(ValueError, match=r"returned an observation of shape \(4,\) and dtype float64 at reset, "
                                             r"but its observation_space is Box\(0, 9, \(4,\), int64\)"):
            reset_vector_env(envs)
    finally:
        close_vector_env(envs)


def test_async_worker_reports_a_bad_observation_it_would_write_silently():
    # Shared memory takes a float for an int space (truncating it) and any array of the right size.
    for env, returned in [(partial(FloatForIntEnv, np.full(4, 1.5)), r"shape \(4,\) and dtype float64"),
                          (partial(BadObsEnv, np.zeros((2, 2), np.float32)), r"shape \(2, 2\) and dtype float32")]:
        envs = make_vector_env(env, 2, "async")
        try:
            with pytest.raises(RuntimeError, match=rf"(?s)env 0 \(worker pid \d+\).* raised ValueError: env "
                                                   rf"functools.partial.* returned an observation of {returned} at "
                                                   "reset, but its observation_space is Box"):
                reset_vector_env(envs)
        finally:
            close_vector_env(envs, terminate=True)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_float64_observation_for_a_float32_space_is_cast(vectorization):
    envs = make_vector_env(partial(BadObsEnv, np.full(4, 0.5)), 2, vectorization)
    try:
        obs, _ = reset_vector_env(envs, seed=0)
        obs, *_ = step_vector_env(envs, np.zeros(2, dtype=np.int64))
        assert obs.dtype == np.float32 and np.all(obs == 0.5)
    finally:
        close_vector_env(envs)
