"""Each shared setting is described once (``lightning_rl.settings.SETTINGS``) and every algorithm's
``Args:`` is written from its signature (docs/design.md, issue 24's "declared once")."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import docstring_parser
import pytest

import lightning_rl
from lightning_rl.algorithms.base import Algorithm
from lightning_rl.settings import SETTINGS, SettingsGroup, document_settings

ALGORITHMS = ["A2C", "A3C", "APEX", "APPO", "DDPG", "DQN", "IMPALA", "PPO", "SAC", "TD3"]


def _source_args(cls: type) -> dict[str, str]:
    """The settings ``cls``'s docstring describes in its source file, with their descriptions."""
    tree = ast.parse(Path(inspect.getsourcefile(cls)).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    return {p.arg_name: p.description for p in docstring_parser.parse(ast.get_docstring(node) or "").params}


def _inherited_description(cls: type, name: str) -> str:
    """What an algorithm that does not describe ``name`` itself shows: the line of the nearest
    class it inherits (an algorithm or a settings group) that describes it, else the shared one."""
    for klass in cls.__mro__[1:]:
        if issubclass(klass, (Algorithm, SettingsGroup)) and klass not in (Algorithm, SettingsGroup):
            own = _source_args(klass)
            if name in own:
                return own[name]
    return SETTINGS.get(name, "")


@pytest.mark.parametrize("name", ALGORITHMS)
def test_args_follow_the_signature_with_the_shared_descriptions(name):
    cls = getattr(lightning_rl, name)
    settings = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    described = docstring_parser.parse(cls.__doc__).params
    assert [p.arg_name for p in described][: len(settings)] == settings  # in signature order
    own = _source_args(cls)
    for param in described:
        if param.arg_name not in own:
            assert param.description == _inherited_description(cls, param.arg_name), param.arg_name
    # no source docstring repeats a line it would inherit word for word: it lives in one place
    repeated = [p.arg_name for p in docstring_parser.parse(inspect.cleandoc(cls.__doc__)).params
                if p.arg_name in own and _inherited_description(cls, p.arg_name) == p.description]
    assert repeated == []


def test_a_subclass_gets_its_own_lines_and_the_inherited_ones():
    class Mine(lightning_rl.PPO):
        """My PPO.

        Args:
            my_knob: what only this subclass takes.
        """

        def __init__(self, my_knob: int = 1, gamma: float = 0.9, **kwargs):
            super().__init__(gamma=gamma, **kwargs)

    params = {p.arg_name: p.description for p in docstring_parser.parse(Mine.__doc__).params}
    ppo = {p.arg_name: p.description for p in docstring_parser.parse(lightning_rl.PPO.__doc__).params}
    assert params == {**ppo, "my_knob": "what only this subclass takes.", "gamma": SETTINGS["gamma"]}
    assert list(params)[-1] == "my_knob"  # its own settings after the inherited ones
    assert inspect.signature(Mine).parameters["gamma"].default == 0.9
    assert Mine.__doc__.splitlines()[0] == "My PPO."


def test_a_class_without_args_gets_a_section():
    class Bare:
        """Bare."""

        def __init__(self, gamma: float, unknown: int) -> None: ...

    document_settings(Bare)
    params = {p.arg_name: p.description for p in docstring_parser.parse(Bare.__doc__).params}
    assert params == {"gamma": SETTINGS["gamma"]}


def test_help_lists_lightning_rl_not_the_inherited_lightning_text():
    """``help(PPO)`` is the settings and what lightning_rl defines (about 670 lines, not the 2,600
    of LightningModule's and nn.Module's methods); ``dir`` of an instance still lists those, so
    completion and ``hasattr`` see them, and ``load_from_checkpoint`` stays in ``help``."""
    import pydoc

    import pytorch_lightning as pl

    text = pydoc.render_doc(lightning_rl.PPO, renderer=pydoc.plaintext)
    assert len(text.splitlines()) < 1000
    assert "normalize_observations" in text and "compute_actions" in text and "load_from_checkpoint" in text
    inherited = [line for line in text.splitlines() if "inherited from" in line]
    assert inherited and all("lightning_rl." in line for line in inherited if "Class methods" not in line)
    assert "Methods inherited from torch" not in text and "register_buffer(" not in text
    assert "log" not in dir(lightning_rl.PPO) and lightning_rl.PPO.log is pl.LightningModule.log
    model = lightning_rl.PPO(num_envs=2)
    assert {"log", "trainer", "parameters", "load_from_checkpoint", "compute_actions"} <= set(dir(model))
    assert "policies" in dir(model)  # its instance attributes (nn.Module.__dir__'s part)

    class Mine(lightning_rl.PPO):
        def my_method(self) -> None:
            """Only in this subclass."""

    assert "my_method" in dir(Mine) and "my_method" in pydoc.render_doc(Mine, renderer=pydoc.plaintext)
