"""The optional dependencies and the extra of ``setup.cfg`` that installs each, so that a missing
one is reported as one line naming the extra (``pip install -e ".[box2d]"``), not as a
traceback ending in another package's advice (gymnasium's ``pip install "gymnasium[box2d]"``,
or plain ``pygame``, which clashes with the pygame-ce every extra installs). Imports nothing
heavy (the command line's error path uses it before torch is imported)."""

from __future__ import annotations

import re

# The top-level module -> (the name users know it by, the extra that installs it).
EXTRAS: dict[str, tuple[str, str]] = {
    "Box2D": ("Box2D", "box2d"),
    "ale_py": ("ale-py", "atari"),
    "cv2": ("OpenCV", "atari"),
    "envpool": ("envpool", "envpool"),
    "mujoco": ("MuJoCo", "mujoco"),
    "optuna": ("Optuna", "optuna"),
    "pettingzoo": ("PettingZoo", "multiagent"),
    "ray": ("Ray", "ray"),
    "matplotlib": ("matplotlib", "plot"),
    "PIL": ("Pillow", "plot"),
    "pygame": ("pygame-ce", "plot"),
    "tensorboard": ("TensorBoard", "tensorboard"),
}


def install_command(extra: str) -> str:
    """How to install an extra of this package, from its checkout (as the README installs it)."""
    return f'pip install -e ".[{extra}]"'


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from or while handling, outermost first."""
    seen: list[BaseException] = []
    todo: list[BaseException] = [err]
    while todo:
        current = todo.pop(0)
        if any(current is s for s in seen):
            continue
        seen.append(current)
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
    return seen


def missing_module(err: BaseException) -> str | None:
    """The optional module (a key of ``EXTRAS``) whose failed import ``err`` comes from, if any:
    an ``ImportError`` naming it anywhere in ``err``'s chain (gymnasium's
    ``DependencyNotInstalled`` is raised from one)."""
    for current in _chain(err):
        name = getattr(current, "name", None) if isinstance(current, ImportError) else None
        top = name.split(".")[0] if isinstance(name, str) else None
        if top in EXTRAS:
            return top
    return None


# How lightning_rl's own messages named an extra before install_command: restated as it.
_OLD_HINT = re.compile(r"""pip install ['"]?lightning-rl\[(\w+)\]['"]?""")


def missing_dependency(err: BaseException) -> str | None:
    """One line saying which optional dependency ``err`` lacks and how to install it, else ``None``.
    A message of lightning_rl's own that names an extra (``env 'LunarLander-v3' needs Box2D``,
    ``sampler_backend='ray' needs Ray``) is kept, with ``install_command``'s wording."""
    for current in reversed(_chain(err)):  # the innermost: jsonargparse's wrappers quote it among others
        text = " ".join(str(current).split())
        if any(install_command(extra) in text for _, extra in EXTRAS.values()):
            return text
        if _OLD_HINT.search(text):
            return _OLD_HINT.sub(lambda match: install_command(match.group(1)), text)
    module = missing_module(err)
    if module is None:
        return None
    what, extra = EXTRAS[module]
    return f"{what} is not installed (the {extra} extra): {install_command(extra)}"


def missing_dependency_error(err: BaseException, needed_by: str) -> ImportError | None:
    """An ``ImportError`` saying that ``needed_by`` (``"env 'LunarLander-v3'"``) needs the optional
    dependency ``err`` lacks, with the install command; ``None`` when ``err`` is no such failure."""
    module = missing_module(err)
    if module is None:
        return None
    what, extra = EXTRAS[module]
    return ImportError(f"{needed_by} needs {what}, which is not installed: {install_command(extra)}", name=module)
