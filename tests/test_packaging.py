"""The release: ``python -m build`` makes an sdist and a wheel that ``twine check`` accepts, both
carry the license, and the wheel installed in a fresh venv gives a working ``lightning-rl`` and
``import lightning_rl`` (the installed copy, not this checkout)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import lightning_rl

ROOT = Path(__file__).resolve().parents[1]
# what a source tree holds that is not the project's (a developer's runs, caches, builds)
NOT_SOURCE = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "dist", "site", "runs",
                                   "lightning_logs", "wandb", ".venv", "venv", ".pytest_cache", ".ruff_cache", "*.ckpt")


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_sdist_and_wheel_pass_twine_and_the_wheel_runs_in_a_fresh_venv(tmp_path):
    source = tmp_path / "source"  # a copy: building writes lightning_rl.egg-info into the tree it builds
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    dist = tmp_path / "dist"
    # --no-isolation: the build backend (setuptools) of this environment, nothing downloaded;
    # the wheel is built from the sdist, so the sdist is proven complete
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, source, cwd=tmp_path)
    version = lightning_rl.__version__
    assert version == "0.1.0"
    wheel, sdist = dist / f"lightning_rl-{version}-py3-none-any.whl", dist / f"lightning_rl-{version}.tar.gz"
    assert sorted(dist.iterdir()) == [wheel, sdist]
    out = run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist, cwd=tmp_path)
    assert out.count("PASSED") == 2

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(f"lightning_rl-{version}.dist-info/METADATA").decode()
        entry_points = z.read(f"lightning_rl-{version}.dist-info/entry_points.txt").decode()
    assert f"lightning_rl-{version}.dist-info/licenses/LICENSE" in names
    assert "lightning_rl/py.typed" in names and "lightning_rl/algorithms/ppo.py" in names
    assert not [n for n in names if n.startswith(("tests/", "docs/", "examples/", "benchmarks/"))]
    assert "License-Expression: Apache-2.0" in metadata or "License: Apache-2.0" in metadata
    assert "lightning-rl = lightning_rl.cli:main" in entry_points
    with tarfile.open(sdist) as t:
        members = {m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name}
    assert {"LICENSE", "README.md", "CHANGELOG.md", "setup.cfg", "pyproject.toml"} <= members

    # A fresh venv that sees this environment's packages (torch, Lightning, ...) through a .pth
    # line, after its own site-packages, so nothing is downloaded; the .pth files there (this
    # checkout's editable install) are not read, so lightning_rl can come only from the wheel.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip()
    (Path(site) / "test_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel, cwd=tmp_path, env=clean)
    out = run(python, "-c", "import lightning_rl; print(lightning_rl.__file__); print(lightning_rl.__version__); "
              "print(lightning_rl.PPO.__name__)", cwd=tmp_path, env=clean).split()
    assert Path(out[0]).is_relative_to(Path(site)) and out[1:] == [version, "PPO"]
    help_text = run(env_dir / "bin" / "lightning-rl", "--help", cwd=tmp_path, env=clean)
    assert all(command in help_text for command in ("fit", "validate", "test", "plot", "record"))
