"""Probe reasons, each from the cheapest source that answers; no HIP runtime where sysfs knows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlk_rocm import _ext, probe, topology

CUDA0 = torch.device("cuda", 0)


@pytest.fixture
def amd(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A ROCm torch with two visible devices (gfx942, gfx90a) and a gfx90a;gfx942 build."""
    monkeypatch.setattr(torch.version, "hip", "6.2.41133-dd7f95766")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(topology, "device_names", lambda: ["gfx942", "gfx90a"])

    def no_runtime(index: int) -> None:
        raise AssertionError("the probe started the HIP runtime although sysfs answered")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_runtime)
    monkeypatch.setattr(_ext, "built", lambda: True)
    monkeypatch.setattr(_ext, "architectures", lambda: ["gfx90a", "gfx942"])
    monkeypatch.setattr(_ext, "toolkit_version", lambda: "6.2.41133")
    monkeypatch.setattr(_ext, "import_error", lambda: None)
    return monkeypatch


def _properties(monkeypatch: pytest.MonkeyPatch, arch: str) -> list[int]:
    asked: list[int] = []

    def props(index: int) -> SimpleNamespace:
        asked.append(index)
        return SimpleNamespace(gcnArchName=arch)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    return asked


def test_cpu_device() -> None:
    reason = probe.probe(torch.device("cpu"))
    assert reason is not None and reason.startswith("no ROCm device (")
    assert "got cpu" in reason


def test_torch_not_a_rocm_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    reason = probe.probe(CUDA0)
    assert reason is not None and reason.startswith("torch is not a ROCm build (CUDA 12.8 build")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert str(probe.probe(CUDA0)).startswith("torch is not a ROCm build (CPU-only build")


def test_no_rocm_device(amd: pytest.MonkeyPatch) -> None:
    amd.setattr(torch.cuda, "is_available", lambda: False)
    assert probe.probe(CUDA0) == "no ROCm device"


def test_index_beyond_the_devices(amd: pytest.MonkeyPatch) -> None:
    assert probe.probe(torch.device("cuda", 2)) == "no ROCm device with index 2 (found 2)"


def test_source_tree_without_a_build(amd: pytest.MonkeyPatch) -> None:
    amd.setattr(_ext, "built", lambda: False)
    reason = probe.probe(CUDA0)
    assert reason is not None and reason.startswith("rlk-rocm has no compiled kernels here")


def test_ready_from_sysfs_alone(amd: pytest.MonkeyPatch) -> None:
    assert probe.probe(CUDA0) is None
    assert probe.probe(torch.device("cuda", 1)) is None
    assert probe.probe(torch.device("cuda")) is None  # no index, HIP not started: device 0


def test_arch_mismatch_from_sysfs(amd: pytest.MonkeyPatch) -> None:
    amd.setattr(topology, "device_names", lambda: ["gfx1100", "gfx90a"])
    amd.setattr(_ext, "architectures", lambda: ["gfx90a", "gfx940"])
    assert probe.probe(CUDA0) == "built for gfx90a;gfx940, device is gfx1100"
    assert probe.probe(torch.device("cuda", 1)) is None


def test_torch_answers_when_sysfs_cannot(amd: pytest.MonkeyPatch) -> None:
    amd.setattr(topology, "device_names", lambda: None)
    asked = _properties(amd, "gfx1100")
    assert probe.probe(torch.device("cuda", 1)) == "built for gfx90a;gfx942, device is gfx1100"
    assert asked == [1]


def test_torch_answers_when_sysfs_counts_differently(amd: pytest.MonkeyPatch) -> None:
    amd.setattr(topology, "device_names", lambda: ["gfx942"])  # e.g. a partitioned GPU
    asked = _properties(amd, "gfx942:sramecc+:xnack-")
    assert probe.probe(torch.device("cuda", 1)) is None
    assert asked == [1]


def test_feature_modes_come_from_torch(amd: pytest.MonkeyPatch) -> None:
    amd.setattr(_ext, "architectures", lambda: ["gfx942:xnack-"])
    asked = _properties(amd, "gfx942:sramecc+:xnack+")
    assert probe.probe(CUDA0) == "built for gfx942:xnack-, device is gfx942:sramecc+:xnack+"
    assert asked == [0]


def test_current_device_is_used_once_hip_started(amd: pytest.MonkeyPatch) -> None:
    amd.setattr(torch.cuda, "is_initialized", lambda: True)
    amd.setattr(torch.cuda, "current_device", lambda: 1)
    amd.setattr(topology, "device_names", lambda: ["gfx1100", "gfx90a"])
    assert probe.probe(torch.device("cuda")) is None


def test_hip_major_mismatch(amd: pytest.MonkeyPatch) -> None:
    amd.setattr(_ext, "toolkit_version", lambda: "5.2.21153")
    assert probe.probe(CUDA0) == (
        "extension built with HIP 5.2.21153, torch uses HIP 6.2.41133-dd7f95766: rebuild "
        "rlk-rocm against the ROCm of this torch"
    )


def test_hip_minor_difference_is_fine() -> None:
    assert probe.hip_mismatch("6.4.43482", "6.2.41133-dd7f95766") is None
    assert probe.hip_mismatch("unknown", "6.2.41133") is None


def test_extension_import_failure(amd: pytest.MonkeyPatch) -> None:
    amd.setattr(_ext, "import_error", lambda: "ImportError: libamdhip64.so.6: cannot open")
    assert probe.probe(CUDA0) == (
        "extension failed to import: ImportError: libamdhip64.so.6: cannot open"
    )


def test_arch_is_reported_before_the_extension_is_loaded(amd: pytest.MonkeyPatch) -> None:
    amd.setattr(topology, "device_names", lambda: ["gfx1100", "gfx1100"])

    def must_not_load() -> str:
        raise AssertionError("loaded the extension for a device it cannot serve")

    amd.setattr(_ext, "import_error", must_not_load)
    assert probe.probe(CUDA0) == "built for gfx90a;gfx942, device is gfx1100"
