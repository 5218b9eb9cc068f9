"""A distribution made in a directory, without pip: its files plus the .dist-info an installer
would write (metadata and entry points), so that putting the directory on PYTHONPATH makes
importlib.metadata, and so rlk's plugin loader, find it."""

from __future__ import annotations

from pathlib import Path

import tomllib


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
