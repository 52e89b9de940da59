"""Move the long README's sections into the documentation site's pages (issue 27).

    python tools/split_readme.py LONG_README.md         # writes the pages listed in PAGES under docs/

The one-time move of the README's manual into docs/, kept re-runnable for merges: a branch that
edited a section of the long README is merged by taking its README, running this script on it,
and restoring the short README (``git checkout <short> -- README.md``). Each section's text is
moved as written; the script only
  * makes the section heading the page's title (pages of several sections keep ``##``),
  * points links to other sections at their pages, image paths at docs/, and links to files of
    the repository that the site does not hold (examples/, tests/) at their paths as code,
  * applies ``EDITS``: wording that named a place in the one long page ("below", "above") or
    spoke in the first person; an edit whose text is no longer there stops the script.
A section it does not know (a new ``##``) stops it too, naming the section: add it to PAGES.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Page:
    path: str  # under the repository root
    sections: list[str]  # README headings, by prefix
    title: str | None = None  # for a page of several sections, or a new title
    intro: str = ""
    optional: bool = False  # a section not in every README (written by hand until it is)
    extra: str = ""  # text the page adds after the moved sections


PAGES = [
    Page("docs/guides/from-sb3.md", ["Coming from Stable-Baselines3"]),
    Page("docs/algorithms.md", ["Algorithms"]),
    Page("docs/guides/spaces.md", ["Observation and action spaces"]),
    Page("docs/guides/pixels.md", ["Pixels and Atari"]),
    Page("docs/guides/how-a-run-works.md", ["How a run is organised"]),
    Page("docs/guides/evaluation-checkpoints.md", ["Evaluation, checkpoints, resume"]),
    Page("docs/guides/cli.md", ["Command line"], title="Command line and YAML configs", extra="""
## YAML configs

A config file is the command line written as YAML: `model` names the algorithm (`class_path`)
and its settings (`init_args`), `trainer` takes any `pl.Trainer` argument, and flags after
`-c` override the file. Every algorithm has one in `examples/configs/`; `--print_config` prints
the complete config of a command, every default included, to start a file of your own:

```yaml
# dqn.yaml
model:
  class_path: lightning_rl.DQN
  init_args:
    env: CartPole-v1
    total_env_steps: 60000
    evaluation_interval: 1
trainer:
  default_root_dir: runs/dqn
seed_everything: 0
```

```bash
lightning-rl fit -c dqn.yaml --model.init_args.lr 5e-4
lightning-rl fit --model DQN --model.env CartPole-v1 --print_config > dqn_full.yaml
```

A network of your own goes in the same way (`encoder: {class_path: ..., init_args: ...}`, see
[custom network](custom-network.md)), and `--model.help DQN` lists every setting with its
description (the [hyperparameter reference](../reference/hyperparameters.md)).
"""),
    Page("docs/guides/custom-env.md", ["Custom env"]),
    Page("docs/guides/custom-network.md", ["Custom network"]),
    Page("docs/guides/normalization.md", ["Normalization"]),
    Page("docs/guides/ddp.md", ["Distributed training"]),
    Page("docs/guides/async.md", ["Asynchronous sampling"]),
    Page("docs/guides/multi-agent.md", ["Multi-agent"]),
    Page("docs/guides/recurrent.md", ["Recurrent policies"]),
    Page("docs/guides/compile.md", ["Compiled updates", "Mixed precision"],
         title="Compiled updates and mixed precision"),
    Page("docs/guides/scaling-out.md", ["Scaling out"], optional=True),
    Page("docs/benchmarks.md", ["Learning over seeds", "Benchmarks against Stable-Baselines3"], title="Benchmarks",
         intro="Every figure on this page comes with the command that produced it; the date is when its\n"
               "numbers entered the repository (the commit that added them). What the tests assert is in\n"
               "the guides; these are measurements, on a 2-core CPU machine unless stated.\n"),
]
# sections the short README keeps (rewritten by hand), or that the site writes itself
NOT_MOVED = {
    "Set-up": "the short README's Install and Tests",
    "Hyperparameters": "docs/reference/hyperparameters.md, written from the signatures and docstrings",
}

# (page, old, new): wording that named a place in the one long page, or spoke in the first person;
# every occurrence is replaced, and one at least must be there
EDITS: list[tuple[str, str, str]] = [
    ("docs/algorithms.md", "its table is below under\n", "its table is under\n"),
    ("docs/guides/pixels.md", "flattened at the\nenv boundary (see above)",
     "flattened at the\nenv boundary (see [spaces](spaces.md))"),
    ("docs/guides/ddp.md", "our own per-iteration sums", "lightning_rl's own per-iteration sums"),
    ("docs/guides/async.md", "on this kind of\nmachine", "on the same\nmachine"),
    ("docs/guides/async.md", "DQN's eager update on this machine;", "DQN's eager update on that machine;"),
    ("docs/guides/multi-agent.md", "Times on this\n2-core machine", "Times on the\n2-core machine"),
    ("docs/guides/recurrent.md", "our default tanh MLP", "the default tanh MLP"),
    ("docs/guides/recurrent.md", "`--compile` on this machine", "`--compile` on the 2-core machine"),
    ("docs/guides/recurrent.md", "| vs our LSTM |", "| vs lightning_rl's LSTM |"),
    ("docs/guides/recurrent.md", "| our PPO,", "| lightning_rl's PPO,"),  # three rows
    ("docs/benchmarks.md", "every configuration of the learning table above over",
     "every configuration of the [learning table](algorithms.md) over"),
    ("docs/benchmarks.md", "our hooks and learner info", "lightning_rl's hooks and learner info"),
    ("docs/benchmarks.md", "Lightning's loop and our hooks", "Lightning's loop and lightning_rl's hooks"),
    ("docs/benchmarks.md", "| ours eager | ours `compile=True` |", "| eager | `compile=True` |"),
    ("docs/benchmarks.md", "s-to-solve ours compiled / SB3", "s-to-solve lightning_rl compiled / SB3"),
    ("docs/benchmarks.md", "runs ours and SB3 alternately", "runs lightning_rl and SB3 alternately"),
    # written after the move (the text the docs hold since)
    ("docs/algorithms.md", "averaged) ≥ 475 | CI |", "averaged) ≥ 475 | `slow` |"),
    ("docs/algorithms.md", "test_learning*.py` runs them)", "test_learning*.py tests/test_ddp.py` runs them)"),
    ("docs/benchmarks.md", "\nThe same with every update compiled (",
     "\nDD-PPO on 2 CPU ranks (`--algos ddppo_cartpole`, the settings of the DD-PPO learning test) has no\n"
     "row yet: the benchmark runs it since the test became `slow`.\n\nThe same with every update compiled ("),
    ("docs/guides/how-a-run-works.md", "you pass becomes the\n  env-step bar with its settings.",
     "you pass becomes the\n  env-step bar with its refresh rate and position, and so does a plain `RichProgressBar`\n"
     "  (Lightning's default when `rich` is installed), refreshed every iteration (`tests/test_logging.py`;\n"
     "  a bar's `leave` is no public attribute: the env-step bar keeps its own default)."),
]


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def split_sections(text: str) -> tuple[str, dict[str, str]]:
    """The text before the first ``## `` heading, and ``{heading: body}`` in order."""
    parts = re.split(r"^## (.+)\n", text, flags=re.MULTILINE)
    return parts[0], dict(zip(parts[1::2], parts[2::2], strict=True))


def page_of(heading: str) -> Page | None:
    return next((p for p in PAGES if any(heading.startswith(s) for s in p.sections)), None)


def rewrite_links(body: str, page: str, anchors: dict[str, str]) -> str:
    """Links as the page at ``page`` needs them (see the module's docstring)."""
    here = Path(page).parent

    def link(match: re.Match[str]) -> str:
        bang, text, target = match.groups()
        if re.match(r"^[a-z]+:", target):
            return match.group(0)
        if target.startswith("#"):
            if target[1:] not in anchors:
                raise SystemExit(f"{page}: a link to #{target[1:]}, which is no section of the README")
            dest, _, anchor = anchors[target[1:]].partition("#")
            if dest == page:
                return f"{bang}[{text}](#{anchor})" if anchor else text
            return f"{bang}[{text}]({os.path.relpath(dest, here)}{'#' + anchor if anchor else ''})"
        path = target.split("#", 1)[0]
        if path.startswith("docs/"):
            return f"{bang}[{text}]({os.path.relpath(target, here)})"
        # a file of the repository that the site does not hold: its path, as code
        return f"`{path}`" if text.strip("`") == path else f"{text} (`{path}`)"

    return re.sub(r"(!?)\[([^\]]+)\]\(([^)\s]+)\)", link, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("readme", type=Path, help="the long README")
    parser.add_argument("--root", type=Path, default=ROOT, help="where the pages are written (the repository)")
    args = parser.parse_args(argv)
    _, sections = split_sections(args.readme.read_text(encoding="utf-8"))

    unknown = [h for h in sections if page_of(h) is None and not any(h.startswith(k) for k in NOT_MOVED)]
    if unknown:
        raise SystemExit(f"sections with no page in PAGES: {unknown}")
    # a link to a section: to its page, and to the section's heading where the page has several
    anchors = {github_slug(h): page.path + (f"#{github_slug(h)}" if len(page.sections) > 1 else "")
               for h in sections if (page := page_of(h))}
    anchors.update({github_slug(h): "docs/reference/hyperparameters.md" for h in sections
                    if h.startswith("Hyperparameters")})

    written = {}
    for page in PAGES:
        mine = [(h, b) for h, b in sections.items() if any(h.startswith(s) for s in page.sections)]
        if not mine:
            if page.optional:
                continue
            raise SystemExit(f"{page.path}: no README section starts with {page.sections}")
        if len(mine) == 1 and page.title is None:
            text = f"# {mine[0][0]}\n{mine[0][1]}"
        elif len(mine) == 1:
            text = f"# {page.title}\n{mine[0][1]}"
        else:
            text = f"# {page.title}\n\n{page.intro}\n" + "".join(f"## {h}\n{b}" for h, b in mine)
        text = rewrite_links(text, page.path, anchors).rstrip("\n") + "\n"
        written[page.path] = text + page.extra if page.extra else text

    for page, old, new in EDITS:
        if page not in written or old not in written[page]:
            raise SystemExit(f"{page}: the text to edit is not there: {old!r}")
        written[page] = written[page].replace(old, new)

    for path, text in written.items():
        out = args.root / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        print(f"wrote {path} ({text.count(chr(10))} lines)")
    for heading in sections:
        if any(heading.startswith(k) for k in NOT_MOVED):
            print(f"not moved: {heading!r} ({NOT_MOVED[next(k for k in NOT_MOVED if heading.startswith(k))]})",
                  file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
