"""What the installed build must hold, checked on a machine without an AMD GPU.

The extension loads here whenever the HIP runtime library is installed (debian-hip.sh installs
it with hipcc); its code objects are read straight from the shared library's offload bundles.
"""

from __future__ import annotations

import importlib
import os
import struct
from pathlib import Path

import pytest
import torch

from rlk_rocm import _ext, gfx

pytestmark = pytest.mark.build
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"


def offload_targets(library: Path) -> dict[str, int]:
    """Target ID -> total code-object bytes over every clang offload bundle in `library`."""
    data = library.read_bytes()
    sizes: dict[str, int] = {}
    start = data.find(BUNDLE_MAGIC)
    while start >= 0:
        pos = start + len(BUNDLE_MAGIC)
        (count,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        for _ in range(count):
            _offset, size, length = struct.unpack_from("<QQQ", data, pos)
            pos += 24
            entry = data[pos : pos + length].decode()
            pos += length
            prefix = "hipv4-amdgcn-amd-amdhsa-"
            if entry.startswith(prefix):
                target = entry[len(prefix) :].lstrip("-")
                sizes[target] = sizes.get(target, 0) + size
        start = data.find(BUNDLE_MAGIC, pos)
    return sizes


def extension_path() -> Path:
    return Path(str(_ext.load().__file__))


def test_build_facts() -> None:
    archs = _ext.architectures()
    assert archs, "the build must record its targets"
    for arch in archs:
        gfx.parse(arch)
    version = _ext.toolkit_version()
    assert version == "unknown" or version.split(".")[0].isdigit()
    requested = os.environ.get("RLK_ROCM_ARCHITECTURES")
    if requested:
        assert archs == requested.split(";")


def test_extension_loads_and_agrees_with_the_build_facts() -> None:
    assert _ext.import_error() is None
    assert str(_ext.load().ARCHITECTURES).split(",") == _ext.architectures()


def test_every_target_has_code_objects() -> None:
    sizes = offload_targets(extension_path())
    for arch in _ext.architectures():
        assert sizes.get(arch, 0) > 0, f"no code object for {arch}; bundles hold {sorted(sizes)}"
    assert set(sizes) == set(_ext.architectures())


@pytest.mark.parametrize("module", ["_launch", "logp", "sample", "linear_logp", "plugin"])
def test_host_modules_are_rlk_cudas_bound_to_this_package(module: str) -> None:
    """The installed host modules are rlk-cuda's files, unchanged, and run as rlk_rocm's."""
    mod = importlib.import_module(f"rlk_rocm.{module}")
    assert mod.__package__ == "rlk_rocm"
    if hasattr(mod, "_ext"):
        assert mod._ext is _ext


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-device path")
def test_kernels_without_a_device_raise_a_clean_error() -> None:
    logp = importlib.import_module("rlk_rocm.logp")  # written by the build
    sample = importlib.import_module("rlk_rocm.sample")
    logits = torch.randn(4, 10)
    tokens = torch.randint(0, 10, (4,))
    with pytest.raises(RuntimeError, match="rlk_rocm kernels need a CUDA device"):
        logp.forward(logits, tokens, 1.0, -100, None, None, False)
    with pytest.raises(RuntimeError, match="rlk_rocm kernels need a CUDA device"):
        sample.sample(logits, 1.0, 0, 1.0, 0.0, torch.zeros(4, dtype=torch.int64))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-device path")
def test_extension_raises_instead_of_crashing_without_a_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the Python checks, the extension itself turns HIP's error into an exception."""
    logp = importlib.import_module("rlk_rocm.logp")
    monkeypatch.setattr(logp, "device_of", lambda name, tensor: 0)
    monkeypatch.setattr(logp, "same_device", lambda name, tensor, device: None)
    monkeypatch.setattr(logp, "stream", lambda device: 0)
    logits = torch.randn(4, 10)
    tokens = torch.randint(0, 10, (4,))
    with pytest.raises(RuntimeError, match="cannot select device 0"):
        logp.forward(logits, tokens, 1.0, -100, None, None, False)
