"""Backends import from rlk-core only the plugin API (`rlk.backend`) and the user API (`rlk`)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import rlk
import rlk.backend

REPO = Path(__file__).resolve().parents[1]
BACKEND_SOURCES = {
    "rlk-cuda": REPO / "packages/rlk-cuda/src",
    "rlk-rocm": REPO / "packages/rlk-rocm/src",
    "rlk-flashinfer": REPO / "packages/rlk-flashinfer/src",
    "rlk-vllm": REPO / "packages/rlk-vllm/src",
    "rlk-testbackend": REPO / "tests/plugins/rlk-testbackend/src",
}


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names
                      if alias.name.startswith("rlk.") and alias.name != "rlk.backend"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("rlk.") and node.module != "rlk.backend":
                found.append(node.module)
            elif node.module == "rlk":
                found += [f"rlk.{a.name}" for a in node.names if a.name not in rlk.__all__]
    return [f"{path.relative_to(REPO)}: {name}" for name in found]


@pytest.mark.parametrize("package", sorted(BACKEND_SOURCES))
def test_backends_import_only_the_plugin_api(package):
    violations = [v for path in sorted(BACKEND_SOURCES[package].rglob("*.py"))
                  for v in _private_imports(path)]
    assert not violations, "import rlk.backend instead of:\n" + "\n".join(violations)


def test_the_plugin_api_page_describes_every_name():
    """rlk.backend is read as a page: each name it exports is described on it."""
    source = inspect.getsource(rlk.backend)
    comments = "\n".join(line for line in source.splitlines() if line.startswith("#"))
    for name in rlk.backend.__all__:
        assert hasattr(rlk.backend, name), name
        assert f"# {name}" in comments or f", {name}" in comments or f" {name} " in comments, \
            f"rlk.backend exports {name} without describing it"
    assert rlk.backend.API_VERSION == rlk.PLUGIN_API_VERSION
