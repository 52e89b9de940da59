"""Each setting is declared once and inherited (docs/design.md, "Settings"): an algorithm's
``__init__`` lists only its own settings, ``declare_settings`` gives it the full signature."""

from __future__ import annotations

import inspect
from collections import Counter
from typing import ClassVar

import pytest

import lightning_rl
from lightning_rl import PPO
from lightning_rl.algorithms.base import Algorithm
from lightning_rl.checkpoint import algorithm_registry
from lightning_rl.settings import _declaring_classes, _own_settings

ALGORITHMS = ["A2C", "A3C", "APEX", "APPO", "DDPG", "DQN", "IMPALA", "PPO", "SAC", "TD3"]

# Declared in two classes on purpose: sibling bases own them with different meanings or types.
DECLARED_TWICE = {
    "sampling_device": "OnPolicyModule and OffPolicyModule (the async algorithms sample in their workers)",
    "num_sgd_iter": "OnPolicyModule (epochs over a rollout) and IMPALA (iterations a batch is reused)",
    "sgd_minibatch_size": "OnPolicyModule (rows) and IMPALA (whole env columns, None: one step)",
    "train_batch_size": "IMPALA (env steps per learner batch) and OffPolicyModule (replayed rows)",
    "rollout_fragment_length": "ActorCriticSettings and APEX (a worker fragment inserted into the replay)",
    "num_gradient_steps": "OffPolicyModule (an int) and APEX (None: from training_intensity)",
    "clip_param": "PPO (the ratio to the sampling policy) and APPO (to the target policy)",
    "kl_coeff": "PPO (adaptive, 0: off) and APPO (fixed, with use_kl_loss)",
    "target_network_update_freq": "OffPolicyModule (env steps, Q targets) and APPO (trained steps, target policy)",
    "optimizer": "A2C (Adam with PPO's eps, fused) and A3C (plain Adam): the same choice, two optimizers",
    "iterations_per_step": "OnPolicyModule and OffPolicyModule (the sampler-worker algorithms take none)",
}


def _declarations() -> Counter:
    classes = {klass for cls in algorithm_registry().values() if cls.__module__.startswith("lightning_rl.")
               for klass in _declaring_classes(cls, Algorithm)}
    return Counter(name for klass in classes for name in _own_settings(klass)[0])


def test_each_setting_is_declared_in_one_class_but_the_known_few():
    twice = {name for name, n in _declarations().items() if n > 1}
    assert twice == set(DECLARED_TWICE)
    assert max(_declarations().values()) == 2


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_signature_is_the_settings_and_the_hparams_follow_it(name):
    cls = getattr(lightning_rl, name)
    params = inspect.signature(cls).parameters
    assert next(iter(params)) == "env" and all(p.kind == p.KEYWORD_ONLY for p in list(params.values())[1:])
    assert all(p.default is not p.empty for p in params.values())  # every setting has a default
    model = cls(seed=0, **({"num_workers": 0} if "num_workers" in params else {}))
    assert list(model.hparams) == list(params)  # a checkpoint keeps exactly the class's settings
    assert all(model.hparams[k] == p.default for k, p in params.items() if k not in ("seed", "num_workers")
               and not callable(p.default))


def test_setting_defaults_change_a_default_and_fixed_settings_remove_a_setting():
    class Short(PPO):
        setting_defaults: ClassVar = {"num_envs": 2, "rollout_fragment_length": 4, "sgd_minibatch_size": 4}
        fixed_settings: ClassVar = {"num_sgd_iter": 1}

    params = inspect.signature(Short).parameters
    assert params["num_envs"].default == 2 and "num_sgd_iter" not in params
    model = Short(seed=0)
    assert (model.num_envs, model.rollout_fragment_length, model.num_sgd_iter) == (2, 4, 1)
    assert model.train_batch_size == 8
    with pytest.raises(TypeError, match="Short: got an unexpected keyword argument 'num_sgd_iter'"):
        Short(num_sgd_iter=3)


def test_a_misspelt_setting_names_the_class_and_a_bad_declaration_fails_at_class_definition():
    with pytest.raises(TypeError, match="PPO: got an unexpected keyword argument 'lrr'"):
        PPO(lrr=1e-3)
    with pytest.raises(TypeError, match="setting_defaults: 'lrr' is not a setting of Bad"):
        class Bad(PPO):
            setting_defaults: ClassVar = {"lrr": 1e-3}
    with pytest.raises(TypeError, match="fixed_settings: 'lrr' is not a setting of Worse"):
        class Worse(PPO):
            fixed_settings: ClassVar = {"lrr": 1e-3}


def test_a_subclass_listing_all_its_settings_itself_still_works():
    class Explicit(PPO):
        def __init__(self, env="CartPole-v1", lr: float = 1e-3, my_knob: int = 2) -> None:
            super().__init__(env=env, lr=lr, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8, seed=0)
            self.my_knob = my_knob
            self.save_hyperparameters()

    assert list(inspect.signature(Explicit).parameters) == ["env", "lr", "my_knob"]
    model = Explicit(my_knob=5)
    assert (model.lr, model.num_envs, model.my_knob) == (1e-3, 2, 5)
    assert dict(model.hparams) == {"env": "CartPole-v1", "lr": 1e-3, "my_knob": 5}


def test_a_checkpoint_reloads_through_the_declared_signature(tmp_path):
    import pytorch_lightning as pl

    model = lightning_rl.A2C(seed=0, num_envs=2, total_env_steps=20, lr=1e-3)
    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "a2c.ckpt")
    loaded = lightning_rl.A2C.load_from_checkpoint(tmp_path / "a2c.ckpt")
    assert (loaded.lr, loaded.num_envs, loaded.num_sgd_iter) == (1e-3, 2, 1)
    assert dict(loaded.hparams) == dict(model.hparams)
