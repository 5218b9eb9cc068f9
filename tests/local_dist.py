"""A distribution made in a directory, without pip: its files plus the .dist-info an installer
would write (metadata and entry points), so that putting the directory on PYTHONPATH makes
importlib.metadata, and so rlk's plugin loader, find it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib

from rlk_testbackend import FAILING_PLUGINS


def install(root: Path, pyproject: str, files: dict[str, str]) -> None:
    """Lay out the project described by `pyproject` (its [project] table) under `root`."""
    project = tomllib.loads(pyproject)["project"]
    name, version = project["name"], project["version"]
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, points in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{point} = {target}" for point, target in points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run_kit(root: Path, backend: str, *args: str,
            disabled: str = FAILING_PLUGINS) -> subprocess.CompletedProcess[str]:
    """The conformance kit on `backend` in a fresh process that sees the distributions laid
    out under `root`, as CI runs it (RLK_STRICT_PLUGINS=1)."""
    env = {**os.environ, "RLK_DISABLE_PLUGINS": disabled, "RLK_STRICT_PLUGINS": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "rlk.testing", "--rlk-backend", backend,
         "--rlk-device", "cpu", "-q", "-p", "no:cacheprovider", *args],
        cwd=root, env=env, capture_output=True, text=True, check=False,
    )


def passed(output: str) -> int:
    """How many tests pytest's summary line says passed."""
    found = re.search(r"(\d+) passed", output)
    return int(found.group(1)) if found else 0
