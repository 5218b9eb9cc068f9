"""Probe reasons, one line each, for every way the backend can be unavailable."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import torch
from fake_flashinfer import FakeFlashInfer

from rlk_flashinfer import library, probe

CUDA = torch.device("cuda", 0)


def _nvcc(folder: Path) -> Path:
    """An executable file named nvcc (the probe looks for it; nothing runs it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nvcc"
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def gpu_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "triton_reason", lambda: None)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No CUDA_HOME, an empty PATH, no default toolkit, no JIT cache, no prebuilt modules."""
    for name in ("CUDA_HOME", "CUDA_PATH", "FLASHINFER_NVCC", "FLASHINFER_DISABLE_JIT"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "home"))
    monkeypatch.setattr(probe, "_DEFAULT_CUDA_HOME", tmp_path / "no-cuda")
    monkeypatch.setattr(probe, "_prebuilt_roots", lambda: [])
    return tmp_path


def test_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    assert probe.probe(CUDA) == (
        "flashinfer is not installed (pip install 'rlk-flashinfer[flashinfer]')"
    )


@pytest.mark.parametrize("version", ["0.5.3", "0.8.0", "1.0.0", "nightly"])
def test_version_outside_the_range(fake: FakeFlashInfer, monkeypatch, version):
    monkeypatch.setattr(library, "installed_version", lambda: version)
    assert probe.probe(CUDA) == (
        f"flashinfer-python {version} is outside the supported range 0.6.x-0.7.x"
    )


@pytest.mark.parametrize("version", ["0.6.0", "0.6.8", "0.6.18.post1", "0.7.4", "0.7.0rc1"])
def test_supported_versions(version):
    assert library.version_reason(version) is None


def test_unknown_version(fake: FakeFlashInfer, monkeypatch):
    monkeypatch.setattr(library, "installed_version", lambda: None)
    assert "version is unknown" in str(probe.probe(CUDA))


def test_triton_missing(fake: FakeFlashInfer, monkeypatch):
    monkeypatch.setattr(library, "installed_version", lambda: "0.6.8")
    monkeypatch.setitem(sys.modules, "triton", None)
    assert probe.probe(CUDA) == ("triton is not installed (the backend's kernels are Triton; "
                                 "torch's CUDA wheels bring it: pip install triton)")


def test_no_cuda_device(fake: FakeFlashInfer, monkeypatch, clean_env):
    monkeypatch.setattr(library, "installed_version", lambda: "0.6.8")
    monkeypatch.setattr(probe, "triton_reason", lambda: None)
    assert probe.probe(torch.device("cpu")) == (
        "no CUDA device (FlashInfer runs on NVIDIA GPUs; asked for cpu)"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None)
    assert probe.probe(CUDA) == "no CUDA device (torch.cuda.is_available() is False)"
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert "ROCm build" in str(probe.probe(CUDA))


def test_device_index_beyond_the_count(gpu_visible):
    assert probe.device_reason(torch.device("cuda", 3)) == "no CUDA device cuda:3 (torch sees 1)"
    assert probe.device_reason(torch.device("cuda", 0)) is None


def test_nvcc_missing_names_where_it_looked(fake, monkeypatch, gpu_visible, clean_env):
    monkeypatch.setattr(library, "installed_version", lambda: "0.6.8")
    reason = probe.probe(CUDA)
    assert reason is not None and "\n" not in reason
    assert reason.startswith("flashinfer would JIT-compile its topk kernels but nvcc")
    assert "CUDA_HOME (unset)" in reason and "PATH" in reason
    toolkit = clean_env / "toolkit"
    toolkit.mkdir()
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    _nvcc(clean_env / "bin")  # on PATH, but CUDA_HOME decides, as in FlashInfer
    assert f"looked in CUDA_HOME={toolkit}/bin" in str(probe.probe(CUDA))


def test_nvcc_found_in_each_place(fake, monkeypatch, gpu_visible, clean_env):
    monkeypatch.setattr(library, "installed_version", lambda: "0.6.8")
    _nvcc(clean_env / "bin")
    assert probe.probe(CUDA) is None  # on PATH
    os.remove(clean_env / "bin" / "nvcc")
    _nvcc(clean_env / "toolkit" / "bin")
    monkeypatch.setenv("CUDA_HOME", str(clean_env / "toolkit"))
    assert probe.probe(CUDA) is None
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.setenv("FLASHINFER_NVCC", str(clean_env / "toolkit" / "bin" / "nvcc"))
    assert probe.probe(CUDA) is None


def test_a_prebuilt_module_needs_no_nvcc(fake, monkeypatch, gpu_visible, clean_env):
    monkeypatch.setattr(library, "installed_version", lambda: "0.6.8")
    built = clean_env / "home" / ".cache" / "flashinfer" / "0.6.8" / "90" / "cached_ops"
    (built / "sampling").mkdir(parents=True)  # a module the backend does not use
    (built / "sampling" / "sampling.so").write_bytes(b"")
    assert probe.probe(CUDA) == ("flashinfer would JIT-compile its topk kernels but nvcc is not "
                                 f"found (looked in CUDA_HOME (unset), CUDA_PATH (unset), PATH, "
                                 f"{probe._DEFAULT_CUDA_HOME / 'bin'})")
    (built / "topk").mkdir(parents=True)
    (built / "topk" / "topk.so").write_bytes(b"")
    assert probe.probe(CUDA) is None
    monkeypatch.setattr(library, "installed_version", lambda: "0.6.9")  # other version's cache
    assert "topk kernels but nvcc is not found" in str(probe.probe(CUDA))


def test_jit_disabled_without_prebuilt(fake, monkeypatch, gpu_visible, clean_env):
    monkeypatch.setattr(library, "installed_version", lambda: "0.6.8")
    _nvcc(clean_env / "bin")
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", "1")
    assert probe.probe(CUDA) == (
        "FLASHINFER_DISABLE_JIT is set and no prebuilt FlashInfer topk module was found"
    )
    built = clean_env / "home" / ".cache" / "flashinfer" / "0.6.8" / "90" / "cached_ops"
    (built / "topk").mkdir(parents=True)
    (built / "topk" / "topk.so").write_bytes(b"")
    assert probe.probe(CUDA) is None


def test_probe_imports_nothing_heavy(monkeypatch):
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    probe.probe(torch.device("cpu"))
    assert "flashinfer" not in sys.modules
