"""The package's layers (docs/design.md): no import cycle, and the data layer imports no algorithm.

The import graph is read from the source with ``ast``: every ``import`` / ``from ... import`` of a
``lightning_rl`` module, at module level and inside functions, ``if TYPE_CHECKING:`` blocks left
out (they never run), an imported name resolved to its module when it is one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_rl"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_nodes(path: Path, type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``path`` that runs: module level and inside functions,
    ``if TYPE_CHECKING:`` blocks left out (their ``else`` kept) unless ``type_checking``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if not type_checking and isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def imports(path: Path, modules: set[str], type_checking: bool = False) -> set[str]:
    """The ``lightning_rl`` modules ``path`` imports when it runs (and for type checkers alone,
    with ``type_checking``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in import_nodes(path, type_checking):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("lightning_rl"))
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, *([base] if base else [])])
        if base.startswith("lightning_rl"):
            named = [f"{base}.{a.name}" for a in node.names]
            found.update(m for m in named if m in modules)
            if any(m not in modules for m in named):  # a name defined in ``base`` itself
                found.add(base)
    return {m for m in found if m in modules and m != name}


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules, type_checking) for p in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            connect(v)
    return found


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert len(graph) > 40
    assert "lightning_rl.functional" in graph["lightning_rl.algorithms.on_policy"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_function_level_imports_included():
    assert cycles(import_graph()) == []


def test_no_import_cycle_type_only_imports_included():
    """What the checkpoint registry, acting outside Lightning, the Trainer wiring and an
    algorithm's checkpoint state read of an algorithm are protocols of their own
    (``checkpoint.AlgorithmClass``, ``inference.Actor``, ``trainer_wiring.Wired``,
    ``algorithms/state.Stateful``), not type-only imports of ``Algorithm``."""
    assert cycles(import_graph(type_checking=True)) == []


def _protocol_members(protocol: type) -> set[str]:
    members = {name for name in dir(protocol) if not name.startswith("_")}
    return members | set(getattr(protocol, "__annotations__", {}))


def test_every_algorithm_has_what_the_protocols_read():
    import lightning_rl
    from lightning_rl.algorithms.state import Stateful
    from lightning_rl.callbacks.trainer_wiring import Wired
    from lightning_rl.inference import Actor

    for module in (lightning_rl.PPO(env="CartPole-v1"), lightning_rl.SAC(env="Pendulum-v1")):
        for protocol in (Actor, Wired, Stateful):
            members = _protocol_members(protocol)
            assert len(members) >= 5
            missing = sorted(m for m in members if not hasattr(module, m))
            assert missing == [], (type(module).__name__, protocol.__name__)


def test_the_data_layer_imports_no_algorithm():
    graph = import_graph()
    leaks = {m: sorted(d for d in deps if d.startswith("lightning_rl.algorithms"))
             for m, deps in graph.items() if m.startswith("lightning_rl.data")}
    assert {m: d for m, d in leaks.items() if d} == {}


def _third_party(path: Path) -> set[str]:
    """Top-level names of the non-``lightning_rl`` modules ``path`` imports when it runs."""
    found: set[str] = set()
    for node in import_nodes(path):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"lightning_rl"}


@pytest.mark.parametrize("engine", ["lightning_rl.data.samplers.engine", "lightning_rl.data.samplers.multi_agent"])
def test_the_sampling_engine_knows_no_lightning(engine):
    """The sampling engines (``data/samplers/engine.py``, and ``multi_agent.py`` for PettingZoo) and
    every ``lightning_rl`` module they reach import neither Lightning nor an algorithm (the package
    ``__init__`` files Python runs first aside): sampler worker processes build no DataModule."""
    graph = import_graph()
    reached, todo = set(), [engine]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph[module])
    assert "lightning_rl.data.envs" in reached  # the graph was followed
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    lightning = {m: sorted(_third_party(paths[m]) & {"pytorch_lightning", "lightning", "lightning_fabric"})
                 for m in reached}
    assert {m: d for m, d in lightning.items() if d} == {}
    assert not any(m.startswith("lightning_rl.algorithms") for m in reached)


def test_the_data_layer_imports_no_algorithm_even_for_type_hints():
    """A DataModule is given a ``Learner`` (data/learner.py), not typed against ``Algorithm``."""
    graph = import_graph(type_checking=True)
    leaks = {m: sorted(d for d in deps if d.startswith("lightning_rl.algorithms"))
             for m, deps in graph.items() if m.startswith("lightning_rl.data")}
    assert {m: d for m, d in leaks.items() if d} == {}


def test_every_algorithm_is_the_learner_a_datamodule_is_given():
    import lightning_rl
    from lightning_rl.checkpoint import algorithm_registry
    from lightning_rl.data.learner import Learner

    assert lightning_rl.PPO
    classes = [cls for cls in algorithm_registry().values() if cls.__module__.startswith("lightning_rl.algorithms")]
    assert len(classes) >= 9
    members = [name for name in dir(Learner) if not name.startswith("_")]
    assert {"policies", "counters", "sampling_policy", "exploration_kwargs", "check_spaces"} <= set(members)
    assert all(hasattr(cls, name) or name in ("policies", "counters") for cls in classes for name in members)
    assert isinstance(lightning_rl.PPO(env="CartPole-v1"), Learner)
    assert isinstance(lightning_rl.DQN(env="CartPole-v1"), Learner)


def test_type_only_imports_are_read_when_asked():
    """``benchmarks/design_measures.py`` counts cycles with ``if TYPE_CHECKING:`` imports too:
    inference.py's type-only import of the policies is an edge of that graph alone."""
    assert "lightning_rl.policies" not in import_graph()["lightning_rl.inference"]
    assert "lightning_rl.policies" in import_graph(type_checking=True)["lightning_rl.inference"]



def _defined_names(paths: list[Path]) -> set[str]:
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
    return names


def test_design_paths_name_files_and_functions_that_exist():
    """docs/design.md's path tables (the PPO and IMPALA paths of one env step) cannot rot silently:
    every file of a hop exists in the package, and every function a hop names (``Class.method``
    or ``function`` in backticks, calls of library objects such as ``optimizer.step()`` aside) is
    defined in one of that hop's files; ``benchmarks/design_measures.py`` counts them."""
    import re
    import sys

    sys.path.insert(0, str(PACKAGE.parent))
    from benchmarks.design_measures import path_counts, path_tables

    tables = path_tables()
    assert {"PPO", "IMPALA with sampler workers"} <= set(tables)
    for name, rows in tables.items():
        for number, (files, functions) in enumerate(rows, 1):
            paths: list[Path] = []
            for file in files:
                where = PACKAGE / file
                assert where.exists(), f"{name} hop {number}: {file} is not in the package"
                paths += sorted(where.rglob("*.py")) if where.is_dir() else [where]
            defined = _defined_names(paths)
            for named in re.findall(r"`([\w.]+)`", functions):
                parts = named.split(".")
                assert all(p in defined for p in parts if p[:1].isupper() or p is parts[-1]), \
                    f"{name} hop {number}: {named} is not defined in {', '.join(files)}"
        counts = path_counts(rows)
        assert counts["hops"] == len(rows) and counts["files"] <= counts["hops"]
    assert path_counts([(["data/a.py"], ""), (["algorithms/b.py"], ""), (["update.py"], ""),
                        (["data/a.py"], "")]) == {"hops": 4, "files": 3, "crossings": 2,
                                                  "files_in_separate_stretches": ["data/a.py"]}
