"""The code blocks of README.md and the pages of docs/: what tests/test_docs.py runs and
checks, and where the tests that run a tagged block (``<!-- test: tag -->``) find it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", flags=re.MULTILINE | re.DOTALL)
TAG = re.compile(r"<!-- test: [\w-]+ -->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    tagged: bool  # run by a test of its own (a "<!-- test: tag -->" line above it)

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    return [Block(path, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                  bool(TAG.search(text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1] + "\n")))
            for m in FENCE.finditer(text)]


def doc_block(tag: str) -> str:
    """The code block after ``<!-- test: tag -->`` in README.md or a page of docs/."""
    for path in DOC_FILES:
        lines = path.read_text(encoding="utf-8").splitlines()
        if f"<!-- test: {tag} -->" in lines:
            start = lines.index(f"<!-- test: {tag} -->") + 2  # past the marker and the opening fence
            return "\n".join(lines[start:lines.index("```", start)])
    raise LookupError(f"no block tagged {tag!r} in README.md or docs/")
