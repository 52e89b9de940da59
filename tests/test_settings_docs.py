"""Each setting is described once, by the docstring under its field (docs/design.md,
"Settings"): ``--model.help``, the hyperparameter reference and editors read that text, a
re-declaration that only changes a default inherits it, and ``resumable`` on the field is what
the CLI's resume rule reads."""

from __future__ import annotations

import dataclasses
import inspect
import pydoc

import pytest

import lightning_rl
from lightning_rl.settings import resumable_settings, setting_docs, settings

ALGORITHMS = ["A2C", "A3C", "APEX", "APPO", "DDPG", "DQN", "IMPALA", "PPO", "SAC", "TD3"]


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_setting_has_a_type_and_a_one_line_description(name):
    cls = getattr(lightning_rl, name)
    docs = setting_docs(cls)
    for param in inspect.signature(cls).parameters.values():
        assert param.annotation is not inspect.Parameter.empty, param.name
        assert docs.get(param.name), f"{name}.{param.name} has no docstring under its field"
        assert "\n" not in docs[param.name] and docs[param.name].endswith("."), param.name


def test_a_redeclaration_describes_only_what_differs():
    """A field re-declared with the docstring of the one it overrides would say the same twice:
    a class re-declares a setting without a docstring (its default only) or with a new text."""
    from lightning_rl.settings import _attribute_docstrings

    classes = {klass for name in ALGORITHMS for klass in getattr(lightning_rl, name).__mro__
               if dataclasses.is_dataclass(klass)}
    repeated = []
    for cls in classes:
        inherited: dict[str, str] = {}
        for base in reversed(cls.__mro__[1:]):
            if dataclasses.is_dataclass(base):
                inherited.update(setting_docs(base))
        repeated += [f"{cls.__name__}.{name}" for name, text in _attribute_docstrings(cls).items()
                     if inherited.get(name) == text]
    assert repeated == []


def test_a_subclass_gets_its_own_lines_and_the_inherited_ones():
    @settings
    class Mine(lightning_rl.PPO):
        """My PPO."""

        gamma: float = 0.9
        my_knob: int = 1
        """what only this subclass takes."""

    docs = setting_docs(Mine)
    assert docs == {**setting_docs(lightning_rl.PPO), "my_knob": "what only this subclass takes."}
    assert list(inspect.signature(Mine).parameters)[-1] == "my_knob"  # its own settings after the inherited ones
    assert inspect.signature(Mine).parameters["gamma"].default == 0.9
    assert Mine.__doc__ == "My PPO."


def test_help_shows_every_setting_with_its_default():
    """``help(PPO)`` shows the signature the dataclass writes: each setting with its type and
    default (no ``**settings``), and the methods lightning_rl defines."""
    text = pydoc.render_doc(lightning_rl.PPO, renderer=pydoc.plaintext)
    signature = str(inspect.signature(lightning_rl.PPO))
    assert "**" not in signature and "normalize_observations: bool = False" in signature
    assert "normalize_observations: bool = False" in text and "clip_param: float = 0.2" in text
    assert "compute_actions" in text and "load_from_checkpoint" in text
    model = lightning_rl.PPO(num_envs=2)
    assert {"log", "trainer", "parameters", "load_from_checkpoint", "compute_actions", "policies"} <= set(dir(model))


def test_resumable_fields_are_the_cli_resume_rule():
    from lightning_rl.cli import RESUMABLE_SETTINGS

    declared = list(dict.fromkeys(name for algorithm in ALGORITHMS
                                  for name in resumable_settings(getattr(lightning_rl, algorithm))))
    assert sorted(RESUMABLE_SETTINGS) == sorted(declared)
    assert "total_env_steps" in RESUMABLE_SETTINGS and "lr" not in RESUMABLE_SETTINGS
