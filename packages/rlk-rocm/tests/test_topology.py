"""Device names from a fake KFD topology: node order, CPU nodes, visibility variables."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from rlk_rocm import topology


def make_kfd(root: Path, versions: Sequence[int | None]) -> Path:
    """One node per entry; None writes a node from a kernel without gfx_target_version."""
    for index, version in enumerate(versions):
        node = root / str(index)
        node.mkdir(parents=True)
        lines = ["cpu_cores_count 0", "simd_count 104"]
        if version is not None:
            lines.insert(1, f"gfx_target_version {version}")
        node.joinpath("properties").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def kfd(tmp_path: Path) -> Path:
    # CPU node 0, then a gfx942, a gfx90a and a gfx1100; numeric order beyond 9 nodes.
    return make_kfd(tmp_path / "nodes", [0, 90402, 90010, 110000])


def test_gpu_nodes_skip_cpus_in_node_order(kfd: Path) -> None:
    assert topology.gpu_nodes(kfd) == ["gfx942", "gfx90a", "gfx1100"]


def test_node_order_is_numeric(tmp_path: Path) -> None:
    root = make_kfd(tmp_path / "nodes", [0] + [90010] * 10 + [110000])
    names = topology.gpu_nodes(root)
    assert names is not None and names[-1] == "gfx1100" and len(names) == 11


def test_no_kfd_or_old_kernel_is_unknown(tmp_path: Path) -> None:
    assert topology.gpu_nodes(tmp_path / "missing") is None
    assert topology.gpu_nodes(make_kfd(tmp_path / "old", [0, None])) is None


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ["gfx942", "gfx90a", "gfx1100"]),
        ({"HIP_VISIBLE_DEVICES": "2,0"}, ["gfx1100", "gfx942"]),
        ({"CUDA_VISIBLE_DEVICES": "1"}, ["gfx90a"]),
        ({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "1"}, ["gfx90a"]),
        ({"ROCR_VISIBLE_DEVICES": "1,2", "HIP_VISIBLE_DEVICES": "1"}, ["gfx1100"]),
        ({"ROCR_VISIBLE_DEVICES": "GPU-4f2c7a"}, None),  # UUIDs: ask torch instead
        ({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}, None),  # conflicting
        ({"HIP_VISIBLE_DEVICES": "3"}, None),  # beyond the list: HIP's rules get subtle
        ({"HIP_VISIBLE_DEVICES": ""}, None),
        ({"GPU_DEVICE_ORDINAL": "0"}, None),
    ],
)
def test_visibility(kfd: Path, env: dict[str, str], expected: list[str] | None) -> None:
    assert topology.device_names(kfd, env) == expected
