"""Processor names of the visible AMD GPUs, read from the KFD topology in sysfs.

This answers "which gfx target is device N" without starting the HIP runtime. It returns None
whenever the answer could be wrong (no KFD, an old kernel without gfx_target_version, device
selection by UUID or GPU_DEVICE_ORDINAL, conflicting HIP/CUDA lists): the caller then asks
torch instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from rlk_rocm import gfx

KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")


def _node_version(node: Path) -> int | None:
    try:
        text = node.joinpath("properties").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "gfx_target_version":
            return int(value) if value.strip().isdigit() else None
    return None


def gpu_nodes(root: Path = KFD_NODES) -> list[str] | None:
    """Processor names of every GPU node, in node order (the HIP runtime's order)."""
    if not root.is_dir():
        return None
    nodes = sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    names: list[str] = []
    for node in nodes:
        version = _node_version(node)
        if version is None:
            return None
        if version != 0:  # CPU nodes report 0
            names.append(gfx.name_from_version(version))
    return names


def _select(names: list[str], spec: str) -> list[str] | None:
    picked: list[str] = []
    for item in spec.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= len(names):
            return None
        picked.append(names[int(item)])
    return picked


def visible(names: list[str], env: Mapping[str, str]) -> list[str] | None:
    """`names` after ROCR_VISIBLE_DEVICES, then HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES."""
    if "GPU_DEVICE_ORDINAL" in env:
        return None
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    result: list[str] | None = names
    if rocr is not None:
        result = _select(names, rocr)
    hip, cuda = env.get("HIP_VISIBLE_DEVICES"), env.get("CUDA_VISIBLE_DEVICES")
    if hip is not None and cuda is not None and hip != cuda:
        return None
    spec = hip if hip is not None else cuda
    if spec is not None and result is not None:
        result = _select(result, spec)
    return result


def device_names(root: Path = KFD_NODES, env: Mapping[str, str] | None = None) -> list[str] | None:
    """Processor names of the devices HIP would show, by index; None when unsure."""
    names = gpu_nodes(root)
    if names is None:
        return None
    return visible(names, os.environ if env is None else env)
