"""The documentation covers every op in rlk.ops.SPECS, and tells users how to install."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlk._runtime.spec import specs
from rlk.op_table import OP_NAMES

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _headings(path: Path) -> str:
    return "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))


@pytest.mark.parametrize("name", OP_NAMES)
def test_every_op_has_its_kernel_signature_in_the_backend_guide(name):
    assert f"`{name}`" in _headings(DOCS / "backends/writing-a-backend.md")


@pytest.mark.parametrize("name", OP_NAMES)
def test_every_op_is_on_an_op_page(name):
    pages = " ".join(path.read_text() for path in sorted((DOCS / "ops").glob("*.md")))
    assert f"`{name}`" in pages or f"rlk.{name}(" in pages


@pytest.mark.parametrize("name", OP_NAMES)
def test_the_cli_page_gives_every_ops_explain_shape(name):
    text = " ".join((DOCS / "cli.md").read_text().split())
    assert f"`{name}`" in text or f"/`{name}`" in text
    shape = specs()[name].shape_help
    if not shape.startswith("("):
        assert re.search(rf"`{name}`[^;]*`{re.escape(shape)}`", text), (name, shape)


def test_install_gives_a_command_from_a_clone():
    text = (DOCS / "install.md").read_text()
    assert "pip install ./packages/rlk-core" in text
    assert (REPO / "packages/rlk-core/pyproject.toml").exists()


def test_adding_an_op_is_in_the_site():
    assert "adding-an-op.md" in (REPO / "mkdocs.yml").read_text()
