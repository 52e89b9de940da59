"""MkDocs hook: the site's home page is the README (``docs/index.md`` holds only the line
``<!-- readme -->``), so the two never differ. Links into ``docs/`` become site links; links to
other files of the repository, which the site does not hold, become their path as code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MARKER = "<!-- readme -->"
LINK = re.compile(r"(!?)\[([^\]]+)\]\(([^)\s]+)\)")


def site_link(match: re.Match[str]) -> str:
    bang, text, target = match.groups()
    if re.match(r"^[a-z]+:|^#", target):  # a URL or an anchor of the page
        return match.group(0)
    if target.startswith("docs/"):
        return f"{bang}[{text}]({target.removeprefix('docs/')})"
    return f"{text} (`{target}`)" if text.strip("`") != target else f"`{target}`"


def readme_page(readme: str) -> str:
    return LINK.sub(site_link, readme)


def on_page_markdown(markdown: str, config: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    readme = (Path(config["config_file_path"]).parent / "README.md").read_text(encoding="utf-8")
    return markdown.replace(MARKER, readme_page(readme))
