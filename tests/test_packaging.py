"""The distributions move in lockstep (issue 28): one version in every package's metadata and
`__version__`, rlk-core's extras pin each backend at it, and each backend names the rlk-core range
it supports, which admits this version and no later minor one (0.x minors may break)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

import rlk

PACKAGES = Path(__file__).resolve().parents[1] / "packages"
NAMES = sorted(path.name for path in PACKAGES.iterdir() if (path / "pyproject.toml").is_file())
BACKENDS = [name for name in NAMES if name != "rlk-core"]


def project(name: str) -> dict:
    return tomllib.loads((PACKAGES / name / "pyproject.toml").read_text())["project"]


def init_version(name: str) -> str:
    """`__version__` as the package's source states it (version.py in rlk, else __init__.py)."""
    package = PACKAGES / name / "src" / ("rlk" if name == "rlk-core" else name.replace("-", "_"))
    source = package / ("version.py" if name == "rlk-core" else "__init__.py")
    match = re.search(r'^__version__ = "([^"]+)"$', source.read_text(), re.MULTILINE)
    assert match, f"{source} states no __version__"
    return match.group(1)


def test_the_backends_are_all_there() -> None:
    assert BACKENDS == ["rlk-cuda", "rlk-flashinfer", "rlk-quack", "rlk-rocm", "rlk-vllm"]


@pytest.mark.parametrize("name", NAMES)
def test_every_package_has_the_core_version(name: str) -> None:
    assert project(name)["version"] == rlk.__version__
    assert init_version(name) == rlk.__version__


@pytest.mark.parametrize("name", BACKENDS)
def test_core_extra_pins_the_backend_at_the_version(name: str) -> None:
    extra = name.removeprefix("rlk-")
    [requirement] = map(Requirement, project("rlk-core")["optional-dependencies"][extra])
    assert requirement.name == name
    assert str(requirement.specifier) == f"=={rlk.__version__}"


@pytest.mark.parametrize("name", BACKENDS)
def test_backend_declares_the_core_range_it_supports(name: str) -> None:
    [core] = [r for r in map(Requirement, project(name)["dependencies"]) if r.name == "rlk-core"]
    version = Version(rlk.__version__)
    assert core.specifier.contains(version)
    next_minor = Version(f"{version.major}.{version.minor + 1}.0")
    assert not core.specifier.contains(next_minor), f"{name} admits rlk-core {next_minor}"
