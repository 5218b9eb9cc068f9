"""Can the flashinfer backend serve a device? One cheap answer, never initialising CUDA.

The backend's own kernels are Triton (torch's CUDA wheels bring it); FlashInfer ships its
kernels as CUDA sources and compiles them with nvcc on first use
unless a prebuilt module exists (the flashinfer-jit-cache package, AOT modules inside
the wheel, or an earlier JIT build in its cache). The probe mirrors how FlashInfer
looks for nvcc so that a missing compiler shows up in `rlk-core doctor`, not as a
failed build in the middle of a rollout.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

from rlk.backend import module_found, nvidia_device_reason
from rlk_flashinfer import library

_DEFAULT_CUDA_HOME = Path("/usr/local/cuda")


def probe(device: torch.device) -> str | None:
    """None when FlashInfer can sample on `device`, else a one-line reason."""
    if not module_found(library.MODULE):
        return "flashinfer is not installed (pip install 'rlk-flashinfer[flashinfer]')"
    version = library.installed_version()
    return (
        library.version_reason(version)
        or triton_reason()
        or device_reason(device)
        or compiler_reason(os.environ, version or "")
    )


def triton_reason() -> str | None:
    """None when `import triton` can find a module (the backend's kernels are Triton)."""
    if module_found("triton"):
        return None
    return ("triton is not installed (the backend's kernels are Triton; torch's CUDA wheels "
            "bring it: pip install triton)")


def device_reason(device: torch.device) -> str | None:
    """None for a visible NVIDIA CUDA device; torch metadata answers without a CUDA context."""
    return nvidia_device_reason(device, "FlashInfer")


# FlashInfer's JIT modules the backend calls: the radix top-k.
MODULES = ("topk",)


def compiler_reason(env: Mapping[str, str], version: str) -> str | None:
    """None when FlashInfer's modules are prebuilt or nvcc is where FlashInfer looks."""
    missing = [name for name in MODULES if prebuilt_module(env, version, name) is None]
    if not missing:
        return None
    if env.get("FLASHINFER_DISABLE_JIT"):
        return (f"FLASHINFER_DISABLE_JIT is set and no prebuilt FlashInfer {missing[0]} module "
                "was found")
    nvcc, looked = find_nvcc(env)
    if nvcc is None:
        return (f"flashinfer would JIT-compile its {' and '.join(missing)} kernels but nvcc is "
                f"not found ({looked})")
    return None


def find_nvcc(env: Mapping[str, str]) -> tuple[Path | None, str]:
    """The nvcc FlashInfer would run, and where it looked, in FlashInfer's own order.

    FLASHINFER_NVCC wins; else CUDA_HOME (or CUDA_PATH) decides alone, so a CUDA_HOME
    without bin/nvcc fails even when PATH has one; else nvcc on PATH; else /usr/local/cuda.
    """
    override = env.get("FLASHINFER_NVCC")
    if override:
        found = shutil.which(override, path=env.get("PATH"))
        return (Path(found) if found else None), f"looked for FLASHINFER_NVCC={override}"
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        home = env.get(variable)
        if home:
            candidate = Path(home) / "bin" / "nvcc"
            found_here = candidate.is_file() and os.access(candidate, os.X_OK)
            return (candidate if found_here else None), f"looked in {variable}={home}/bin"
    on_path = shutil.which("nvcc", path=env.get("PATH", ""))
    if on_path:
        return Path(on_path), "found on PATH"
    default = _DEFAULT_CUDA_HOME / "bin" / "nvcc"
    if default.is_file():
        return default, f"found in {default.parent}"
    return None, f"looked in CUDA_HOME (unset), CUDA_PATH (unset), PATH, {default.parent}"


def prebuilt_module(env: Mapping[str, str], version: str, name: str) -> Path | None:
    """A compiled module `name` FlashInfer would load instead of compiling, if any.

    A JIT-cache hit is accepted for any GPU architecture: the cache directory is named
    by architecture, and reading the device's would initialise CUDA.
    """
    for root in _prebuilt_roots():
        hits = sorted(root.rglob(f"{name}/{name}.so"))
        if hits:
            return hits[0]
    base = Path(env.get("FLASHINFER_WORKSPACE_BASE") or Path.home())
    cache = base / ".cache" / "flashinfer" / version
    hits = sorted(cache.glob(f"*/cached_ops/{name}/{name}.so")) if version else []
    return hits[0] if hits else None


def _prebuilt_roots() -> list[Path]:
    """The flashinfer-jit-cache package and the wheel's own AOT folder, where present."""
    roots = []
    for name, below in (("flashinfer_jit_cache", ()), (library.MODULE, ("data", "aot"))):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec else []:
            root = Path(location).joinpath(*below)
            if root.is_dir():
                roots.append(root)
    return roots
