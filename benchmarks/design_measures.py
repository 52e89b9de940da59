"""The code's shape, read from the source: the measures docs/design.md points to instead of
writing numbers that drift (issue 37).

Prints, for the ``lightning_rl`` package of this checkout:

* ``files_over_400_lines``: the modules longer than 400 lines, with their line counts;
* ``num_envs_parameters``: functions and methods with a parameter named ``num_envs`` (each one a
  place that declares that setting again);
* ``algorithm_reads_from_data``: attribute reads of the algorithm in ``data/``: ``self.module.X``
  and ``module.X`` outside ``data/samplers/`` (whose engine takes a plain ``nn.Module``), per
  attribute;
* ``import_cycles``: strongly connected components of the import graph (``tests/test_layers.py``
  builds it), once as the code runs and once with ``if TYPE_CHECKING:`` imports included;
* ``algorithm_files``: the line count of each file in ``algorithms/``;
* ``paths``: for each table of docs/design.md's "The path of one env step to its gradient step"
  (PPO, IMPALA with workers): its hops, distinct files (a folder such as ``data/envs/`` named in
  a row counts once), the files that hold two or more separate stretches of it, and its crossings
  between ``algorithms/`` and ``data/``.

    python benchmarks/design_measures.py            # a readable summary, then one JSON line
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
sys.path.insert(0, str(ROOT))

from tests.test_layers import PACKAGE, cycles, import_graph  # noqa: E402


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def num_envs_parameters() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                if any(a.arg == "num_envs" for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    return found


def _reads_module(node: ast.Attribute) -> bool:
    value = node.value
    if isinstance(value, ast.Name):
        return value.id == "module"
    return isinstance(value, ast.Attribute) and value.attr == "module" and \
        isinstance(value.value, ast.Name) and value.value.id == "self"


def algorithm_reads_from_data() -> Counter[str]:
    reads: Counter[str] = Counter()
    data = PACKAGE / "data"
    for path in sorted(data.rglob("*.py")):
        if path.is_relative_to(data / "samplers"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _reads_module(node):
                reads[node.attr] += 1
    return reads


def path_tables(text: str | None = None) -> dict[str, list[tuple[list[str], str]]]:
    """Each path table of docs/design.md by its heading: per hop, the files of its file column
    (``a.py, b.py`` is two) and its function column."""
    text = DESIGN.read_text() if text is None else text
    section = text.split("## The path of one env step to its gradient step", 1)[1].split("\n## ", 1)[0]
    tables: dict[str, list[tuple[list[str], str]]] = {}
    heading = ""
    for line in section.splitlines():
        if line.startswith("### "):
            heading = line[4:].split(" (")[0].strip()
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 3 and cells[0].isdigit():
            tables.setdefault(heading, []).append(([f.strip() for f in cells[1].split(",")], cells[2]))
    return tables


def _crosses(a: str, b: str) -> bool:
    return {a.split("/")[0], b.split("/")[0]} == {"algorithms", "data"}


def path_counts(rows: list[tuple[list[str], str]]) -> dict:
    """Hops, distinct files, files entered in two or more separate stretches, and crossings between
    ``algorithms/`` and ``data/`` (consecutive hops in those layers, other files in between
    ignored) of one path table."""
    files = [f for row_files, _ in rows for f in row_files]
    stretches: Counter[str] = Counter()
    previous: set[str] = set()
    for row_files, _ in rows:
        stretches.update(f for f in row_files if f not in previous)
        previous = set(row_files)
    layered = [f for row_files, _ in rows for f in row_files[:1] if f.split("/")[0] in ("algorithms", "data")]
    crossings = sum(_crosses(a, b) for a, b in itertools.pairwise(layered))
    return {"hops": len(rows), "files": len(set(files)), "crossings": crossings,
            "files_in_separate_stretches": sorted(f for f, n in stretches.items() if n > 1)}


def measures() -> dict:
    paths = sorted(PACKAGE.rglob("*.py"))
    lines = {str(p.relative_to(PACKAGE)): line_count(p) for p in paths}
    reads = algorithm_reads_from_data()
    return {
        "modules": len(paths),
        "files_over_400_lines": {k: v for k, v in sorted(lines.items(), key=lambda kv: -kv[1]) if v > 400},
        "num_envs_parameters": num_envs_parameters(),
        "algorithm_reads_from_data": {"total": sum(reads.values()), **dict(reads.most_common())},
        "import_cycles": cycles(import_graph()),
        "import_cycles_type_only_included": cycles(import_graph(type_checking=True)),
        "algorithm_files": {k.removeprefix("algorithms/"): v for k, v in lines.items()
                            if k.startswith("algorithms/") and not k.endswith("__init__.py")},
        "paths": {name: path_counts(rows) for name, rows in path_tables().items()},
    }


def main(argv: list[str] | None = None) -> dict:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    found = measures()
    print(f"{found['modules']} modules")
    print(f"files over 400 lines: {len(found['files_over_400_lines'])}",
          ", ".join(f"{k} {v}" for k, v in found["files_over_400_lines"].items()))
    print(f"parameters named num_envs: {len(found['num_envs_parameters'])}")
    reads = found["algorithm_reads_from_data"]
    print(f"reads of the algorithm from data/: {reads['total']}",
          ", ".join(f"{k} {v}" for k, v in reads.items() if k != "total"))
    print(f"import cycles: {len(found['import_cycles'])} as the code runs, "
          f"{len(found['import_cycles_type_only_included'])} with type-only imports",
          "; ".join(f"{len(c)} modules ({', '.join(c)})" for c in found["import_cycles_type_only_included"]))
    print("algorithm files:", ", ".join(f"{k} {v}" for k, v in found["algorithm_files"].items()))
    for name, path in found["paths"].items():
        print(f"path of {name}: {path['hops']} hops, {path['files']} files, {path['crossings']} crossings between "
              f"algorithms/ and data/, {len(path['files_in_separate_stretches'])} files in separate stretches "
              f"({', '.join(path['files_in_separate_stretches'])})")
    print(json.dumps(found))
    return found


if __name__ == "__main__":
    main()
