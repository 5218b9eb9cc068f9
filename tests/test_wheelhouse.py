"""tools/wheelhouse.py, the wheels session's check, on made-up wheelhouses: it names what is
missing, extra, mixed in version or too large. (Its auditwheel and loading checks need real
native wheels: the wheels session runs them.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("wheelhouse", REPO / "tools" / "wheelhouse.py")
assert spec is not None and spec.loader is not None
wheelhouse = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheelhouse)

PYTHONS = [(3, 10), (3, 11), (3, 12), (3, 13)]


def fill(dist: Path, version: str = "0.1.0", skip: str = "", size: int = 10) -> None:
    """Every file the wheelhouse should hold for PYTHONS, but `skip`."""
    names = [f"{p}-{version}.tar.gz" for p in (*wheelhouse.PURE, *wheelhouse.NATIVE)]
    names += [f"{p}-{version}-py3-none-any.whl" for p in wheelhouse.PURE]
    names += [f"{p}-{version}-{tag}-manylinux_2_34_x86_64.whl" for p in wheelhouse.NATIVE
              for tag in ("cp310-cp310", "cp311-cp311", "cp312-abi3")]
    for name in names:
        if name != skip:
            (dist / name).write_bytes(b"x" * size)


def test_a_complete_wheelhouse_passes(tmp_path: Path) -> None:
    fill(tmp_path)
    assert wheelhouse.check_inventory(tmp_path, 1, PYTHONS) == []


def test_the_abi3_wheel_is_required(tmp_path: Path) -> None:
    fill(tmp_path, skip="rlk_cuda-0.1.0-cp312-abi3-manylinux_2_34_x86_64.whl")
    [problem] = wheelhouse.check_inventory(tmp_path, 1, PYTHONS)
    assert problem.startswith("rlk_cuda: wheels") and "cp312-abi3-manylinux" in problem


def test_a_missing_sdist_is_named(tmp_path: Path) -> None:
    fill(tmp_path, skip="rlk_vllm-0.1.0.tar.gz")
    assert wheelhouse.check_inventory(tmp_path, 1, PYTHONS) == ["rlk_vllm: 0 sdists"]


def test_an_unrepaired_wheel_is_refused(tmp_path: Path) -> None:
    fill(tmp_path)
    name = "rlk_rocm-0.1.0-cp311-cp311-{}.whl"
    (tmp_path / name.format("manylinux_2_34_x86_64")).rename(tmp_path / name.format("linux_x86_64"))
    [problem] = wheelhouse.check_inventory(tmp_path, 1, PYTHONS)
    assert "cp311-cp311-linux" in problem


def test_versions_must_agree(tmp_path: Path) -> None:
    fill(tmp_path)
    old = tmp_path / "rlk_vllm-0.1.0-py3-none-any.whl"
    old.rename(tmp_path / "rlk_vllm-0.2.0-py3-none-any.whl")
    assert "versions differ: ['0.1.0', '0.2.0']" in wheelhouse.check_inventory(tmp_path, 1, PYTHONS)


def test_a_wheel_over_the_limit_is_named(tmp_path: Path) -> None:
    fill(tmp_path, size=3 * 2**20)
    problems = wheelhouse.check_inventory(tmp_path, 2, PYTHONS)
    wheels = len(wheelhouse.PURE) + 3 * len(wheelhouse.NATIVE)  # 3 Python tags a native one
    assert len(problems) == wheels  # every wheel; sdists have none
    assert problems[0].endswith("3.0 MB, over the 2 MB limit")


@pytest.mark.parametrize(("versions", "tags"), [
    ([(3, 10), (3, 11), (3, 12), (3, 13)], ["cp310-cp310", "cp311-cp311", "cp312-abi3"]),
    ([(3, 13)], ["cp312-abi3"]),
    ([(3, 11)], ["cp311-cp311"]),
])
def test_native_tags(versions: list[tuple[int, int]], tags: list[str]) -> None:
    assert wheelhouse.native_tags(versions) == tags


@pytest.mark.parametrize(("tag", "version", "installs"), [
    ("cp312-abi3", (3, 12), True), ("cp312-abi3", (3, 14), True), ("cp312-abi3", (3, 11), False),
    ("cp311-cp311", (3, 11), True), ("cp311-cp311", (3, 12), False),
])
def test_admits(tag: str, version: tuple[int, int], installs: bool) -> None:
    assert wheelhouse.admits(tag, version) is installs
