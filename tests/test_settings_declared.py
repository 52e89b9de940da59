"""Each setting is a typed dataclass field, declared once and inherited (docs/design.md,
"Settings"): a class's fields are its settings, the dataclass ``__init__`` takes them by keyword
(``env`` also by position), and the hyperparameters a checkpoint keeps are exactly them."""

from __future__ import annotations

import dataclasses
import inspect
from collections import Counter
from typing import ClassVar

import pytest

import lightning_rl
from lightning_rl import PPO
from lightning_rl.checkpoint import algorithm_registry
from lightning_rl.settings import resumable_settings, setting, settings

ALGORITHMS = ["A2C", "A3C", "APEX", "APPO", "DDPG", "DQN", "IMPALA", "PPO", "SAC", "TD3"]

# Introduced in two classes on purpose: sibling bases own them with different meanings or types.
DECLARED_TWICE = {
    "sampling_device": "OnPolicyModule and OffPolicyModule (the async algorithms sample in their workers)",
    "num_sgd_iter": "OnPolicyModule (epochs over a rollout) and IMPALA (iterations a batch is reused)",
    "sgd_minibatch_size": "OnPolicyModule (rows) and IMPALA (whole env columns, None: one step)",
    "train_batch_size": "IMPALA (env steps per learner batch) and OffPolicyModule (replayed rows)",
    "rollout_fragment_length": "ActorCriticSettings and APEX (a worker fragment inserted into the replay)",
    "clip_param": "PPO (the ratio to the sampling policy) and APPO (to the target policy)",
    "kl_coeff": "PPO (adaptive, 0: off) and APPO (fixed, with use_kl_loss)",
    "target_network_update_freq": "OffPolicyModule (env steps, Q targets) and APPO (trained steps, target policy)",
    "optimizer": "A2C (Adam with PPO's eps, fused) and A3C (plain Adam): the same choice, two optimizers",
    "iterations_per_step": "OnPolicyModule and OffPolicyModule (the sampler-worker algorithms take none)",
}


def _settings_classes() -> set[type]:
    return {klass for cls in algorithm_registry().values() if cls.__module__.startswith("lightning_rl.")
            for klass in cls.__mro__ if dataclasses.is_dataclass(klass)}


def _introductions() -> Counter:
    """How many classes introduce each setting: declare a field that none of their bases has (a
    re-declaration that changes an inherited default or fixes a setting introduces nothing)."""
    counts: Counter = Counter()
    for klass in _settings_classes():
        inherited = {f.name for base in klass.__mro__[1:] if dataclasses.is_dataclass(base)
                     for f in dataclasses.fields(base)}
        counts.update(name for name in inspect.get_annotations(klass) if name not in inherited)
    return counts


def test_each_setting_is_declared_in_one_class_but_the_known_few():
    twice = {name for name, n in _introductions().items() if n > 1}
    assert twice == set(DECLARED_TWICE)
    assert max(_introductions().values()) == 2


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_signature_is_the_settings_and_the_hparams_follow_it(name):
    cls = getattr(lightning_rl, name)
    params = inspect.signature(cls).parameters
    assert next(iter(params)) == "env" and params["env"].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.kind == p.KEYWORD_ONLY for p in list(params.values())[1:])
    assert all(p.default is not p.empty for p in params.values())  # every setting has a default
    assert all(not isinstance(p.annotation, str) for p in params.values())  # types resolved, not text
    assert list(params) == [f.name for f in dataclasses.fields(cls) if f.init]
    model = cls(seed=0, **({"num_workers": 0} if "num_workers" in params else {}))
    assert list(model.hparams) == list(params)  # a checkpoint keeps exactly the class's settings
    assert all(model.hparams[k] == p.default for k, p in params.items() if k not in ("seed", "num_workers")
               and not callable(p.default))
    assert not cls.__doc__.startswith(cls.__name__ + "(")  # its own docstring, not the dataclass's signature


def test_env_is_positional_and_the_module_keeps_its_identity_and_repr():
    model = PPO("CartPole-v1", num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8, seed=0)
    assert model.hparams["env"] == "CartPole-v1" and model.num_envs == 2
    assert model != PPO("CartPole-v1", num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8, seed=0)
    assert hash(model) == object.__hash__(model) and repr(model).startswith("PPO(\n  (policies): Policies(")
    assert isinstance(model.policies, lightning_rl.policies.Policies)  # the setting became the module
    assert model.hparams["policies"] is None


def test_a_redeclared_field_changes_a_default_and_init_false_fixes_a_setting():
    @settings
    class Short(PPO):
        num_envs: int = 2
        rollout_fragment_length: int = 4
        sgd_minibatch_size: int | None = 4
        num_sgd_iter: int = setting(default=1, init=False)
        my_constant: ClassVar[int] = 3  # not a setting

    params = inspect.signature(Short).parameters
    assert params["num_envs"].default == 2 and "num_sgd_iter" not in params and "my_constant" not in params
    assert list(params) == [p for p in inspect.signature(PPO).parameters if p != "num_sgd_iter"]  # same places
    model = Short(seed=0)
    assert (model.num_envs, model.rollout_fragment_length, model.num_sgd_iter) == (2, 4, 1)
    assert model.train_batch_size == 8 and "num_sgd_iter" not in model.hparams
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument 'num_sgd_iter'"):
        Short(num_sgd_iter=3)
    # a plain new default keeps the inherited check and resumability
    with pytest.raises(ValueError, match=r"^lr must be positive, got -1$"):
        Short(lr=-1)
    assert resumable_settings(Short) == resumable_settings(PPO)


def test_a_misspelt_setting_and_a_bad_value_are_one_line_errors():
    with pytest.raises(TypeError, match=r"^PPO\.__init__\(\) got an unexpected keyword argument 'lrr'$"):
        PPO(lrr=1e-3)
    with pytest.raises(ValueError, match=r"^gamma must be in \(0, 1\], got 1.5$"):
        PPO(gamma=1.5)
    with pytest.raises(ValueError, match=r"^total_env_steps must be >= 1 or None, got 0$"):
        PPO(total_env_steps=0)
    with pytest.raises(ValueError, match=r"^optimizer must be one of 'rmsprop', 'adam', got 'sgd'$"):
        lightning_rl.A2C(optimizer="sgd")


def test_a_subclass_without_the_decorator_takes_its_bases_settings():
    class MyPPO(PPO):
        def my_method(self) -> int:
            return self.num_envs

    assert inspect.signature(MyPPO) == inspect.signature(PPO)
    model = MyPPO(num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8, seed=0)
    assert model.my_method() == 2 and list(model.hparams) == list(inspect.signature(PPO).parameters)


def test_a_subclass_listing_its_settings_in_its_own_init_still_works():
    """An ``__init__`` of its own (no ``@settings``) passes PPO's settings on; the hyperparameters
    are PPO's settings as it passed them: its own parameters are no longer saved unless declared
    as fields (CHANGELOG)."""
    class Explicit(PPO):
        def __init__(self, env="CartPole-v1", lr: float = 1e-3, my_knob: int = 2) -> None:
            super().__init__(env=env, lr=lr, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8, seed=0)
            self.my_knob = my_knob
            self.save_hyperparameters()

    assert list(inspect.signature(Explicit).parameters) == ["env", "lr", "my_knob"]
    model = Explicit(my_knob=5)
    assert (model.lr, model.num_envs, model.my_knob) == (1e-3, 2, 5)
    defaults = {p.name: p.default for p in inspect.signature(PPO).parameters.values()}
    assert dict(model.hparams) == {**defaults, "lr": 1e-3, "num_envs": 2, "rollout_fragment_length": 8,
                                   "sgd_minibatch_size": 8, "seed": 0}


def _fit_and_save(model, path):
    import pytorch_lightning as pl

    trainer = pl.Trainer(max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model)
    trainer.save_checkpoint(path)


def test_a_checkpoint_reloads_through_the_declared_signature(tmp_path):
    model = lightning_rl.A2C(seed=0, num_envs=2, total_env_steps=20, lr=1e-3)
    _fit_and_save(model, tmp_path / "a2c.ckpt")
    loaded = lightning_rl.A2C.load_from_checkpoint(tmp_path / "a2c.ckpt")
    assert (loaded.lr, loaded.num_envs, loaded.num_sgd_iter) == (1e-3, 2, 1)
    assert dict(loaded.hparams) == dict(model.hparams)


@settings
class FlaggedPPO(PPO):
    """PPO with a setting of its own (module level: a checkpoint names the class it reloads)."""

    my_flag: int = 1
    """a setting only this subclass takes."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.flag_squared = self.my_flag ** 2


def test_a_decorated_subclass_adds_a_setting_that_checkpoints_keep(tmp_path):
    from lightning_rl.settings import setting_docs

    params = inspect.signature(FlaggedPPO).parameters
    assert list(params)[-1] == "my_flag" and params["my_flag"].default == 1
    assert setting_docs(FlaggedPPO)["my_flag"] == "a setting only this subclass takes."
    model = FlaggedPPO(my_flag=3, seed=0, num_envs=2, rollout_fragment_length=8, sgd_minibatch_size=8,
                       total_env_steps=16)
    assert model.hparams["my_flag"] == 3 and model.flag_squared == 9
    _fit_and_save(model, tmp_path / "flagged.ckpt")
    loaded = FlaggedPPO.load_from_checkpoint(tmp_path / "flagged.ckpt")
    assert (loaded.my_flag, loaded.flag_squared, loaded.num_envs) == (3, 9, 2)
    assert dict(loaded.hparams) == dict(model.hparams)
