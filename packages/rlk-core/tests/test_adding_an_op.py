"""docs/adding-an-op.md is enough to add an op: its steps, taken from the page's own code
blocks, turn a copy of rlk-core into one with a working `masked_mean` op, which the
conformance kit, the op-table and import-structure tests and `rlk-core explain` accept."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rlk

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "adding-an-op.md"
TESTS = Path(__file__).resolve().parent
SOURCE = Path(rlk.__file__).resolve().parent


def _blocks() -> dict[str, str]:
    """The guide's titled code blocks, by title."""
    found = re.findall(r'```python title="([^"]+)"\n(.*?)```', GUIDE.read_text(), re.S)
    return dict(found)


def _apply_the_guide(root: Path) -> None:
    blocks = _blocks()
    package = root / "rlk"
    (package / "ops" / "masked_mean").mkdir()
    (package / "ops" / "masked_mean" / "__init__.py").write_text("")
    edits = {title: code for title, code in blocks.items() if ":" in title}
    for title, code in blocks.items():
        if ":" not in title:
            (root / title).write_text(code)
    table = package / "op_table.py"
    line = edits["rlk/op_table.py: one line in SPECS"]
    table.write_text(table.read_text().replace("SPECS = {\n", "SPECS = {\n" + line, 1))
    exports = package / "__init__.py"
    text = exports.read_text()
    text = text.replace("\n__all__ = [\n",
                        "\n" + edits["rlk/__init__.py: the import, and the name in __all__"]
                        + "\n__all__ = [\n    \"masked_mean\",\n", 1)
    exports.write_text(text)


def _run(root: Path, *command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *command], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("added-op")
    shutil.copytree(SOURCE, root / "src" / "rlk",
                    ignore=shutil.ignore_patterns("__pycache__"))
    _apply_the_guide(root / "src")
    (root / "tests").mkdir()
    for name in ("test_op_table.py", "test_imports.py"):
        shutil.copy(TESTS / name, root / "tests" / name)
    return root


def test_the_guide_gives_every_file_it_lists():
    titles = set(_blocks())
    assert {"rlk/ops/masked_mean/reference.py", "rlk/ops/masked_mean/native.py",
            "rlk/ops/masked_mean/op.py"} <= titles
    assert not (SOURCE / "ops" / "masked_mean").exists(), "the example op is not rlk's"


def test_the_added_op_passes_the_kit(copy: Path):
    done = _run(copy, "-m", "pytest", "--pyargs", "rlk.testing", "--rlk-backend", "native",
                "-q", "-p", "no:cacheprovider", "-k", "masked_mean")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) >= 9, done.stdout[-2000:]  # 3 dtypes x 3 samples


def test_the_added_op_keeps_the_table_and_the_layers(copy: Path):
    done = _run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "tests/test_op_table.py", "tests/test_imports.py")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "masked_mean" in done.stdout or "passed" in done.stdout


def test_the_added_op_is_public_differentiable_compiled_and_explained(copy: Path):
    script = """
import torch, rlk
from rlk.cli import main
values = torch.randn(3, 5, dtype=torch.float64).float().requires_grad_(True)
mask = torch.tensor([[1, 1, 0, 0, 1], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]], dtype=torch.bool)
mean = rlk.masked_mean(values, mask)
want = torch.stack([values[0, [0, 1, 4]].mean(), values.new_zeros(()), values[2, ::2].mean()])
torch.testing.assert_close(mean, want)
mean.sum().backward()
torch.testing.assert_close(values.grad, mask / mask.sum(1, keepdim=True).clamp(min=1))
compiled = torch.compile(rlk.masked_mean, fullgraph=True)
torch.testing.assert_close(compiled(values.detach(), mask), mean.detach())
assert rlk.explain("masked_mean", values, mask).backend == "native"
raise SystemExit(main(["explain", "masked_mean", "--shape", "4,16"]))
"""
    done = _run(copy, "-c", script)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "masked_mean on cpu" in done.stdout and "native" in done.stdout, done.stdout
