"""The documentation covers every op in rlk.op_table, each on a page named after its folder,
and tells users how to install."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlk._runtime.spec import specs
from rlk.op_table import OP_NAMES

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _headings(path: Path) -> str:
    return "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))


def _page(name: str) -> Path:
    """An op's page is named after its folder (an `_entropy` variant shares it)."""
    return DOCS / "ops" / f"{name.removesuffix('_entropy')}.md"


@pytest.mark.parametrize("name", OP_NAMES)
def test_every_op_has_a_page_named_after_it_in_the_site(name):
    assert _page(name).exists(), _page(name)
    assert f"ops/{_page(name).name}" in (REPO / "mkdocs.yml").read_text()
    text = _page(name).read_text()
    assert f"`{name}`" in text or f"rlk.{name}(" in text


@pytest.mark.parametrize("name", OP_NAMES)
def test_every_op_page_gives_its_kernel_signature(name):
    headings = _headings(_page(name))
    assert "## Kernel signature" in headings
    assert f"`{name}`" in headings.partition("## Kernel signature")[2]


@pytest.mark.parametrize("name", OP_NAMES)
def test_every_op_page_gives_its_explain_shape(name):
    shape = specs()[name].shape_help
    if not shape.startswith("("):
        text = " ".join(_page(name).read_text().split())
        assert f"`rlk-core explain {name} --shape {shape}`" in text, (name, shape)


def test_install_gives_a_command_from_a_clone():
    text = (DOCS / "install.md").read_text()
    assert "pip install ./packages/rlk-core" in text
    assert (REPO / "packages/rlk-core/pyproject.toml").exists()


def test_adding_an_op_is_in_the_site():
    assert "adding-an-op.md" in (REPO / "mkdocs.yml").read_text()
