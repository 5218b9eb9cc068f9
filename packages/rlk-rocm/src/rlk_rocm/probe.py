"""The backend's probe: can rlk-rocm serve a device, and if not, why (one line).

Everything up to the architecture check comes from torch metadata, the build facts and the
KFD topology in sysfs; only when sysfs cannot name the device does it ask torch for the
device's properties, which starts the HIP runtime (never a context on other devices).
"""

from __future__ import annotations

import torch

from rlk_rocm import _ext, gfx, topology


def _major(version: str) -> str:
    return version.split(".", 1)[0]


def hip_mismatch(built: str, runtime: str) -> str | None:
    """None when an extension built with HIP `built` can load beside torch's HIP `runtime`.

    The HIP runtime library changes its soname with the major version, and two HIP runtimes
    in one process do not share devices or memory: the majors must agree.
    """
    if built == "unknown" or _major(built) == _major(runtime):
        return None
    return (
        f"extension built with HIP {built}, torch uses HIP {runtime}: rebuild rlk-rocm "
        "against the ROCm of this torch"
    )


def device_arch(index: int) -> str:
    """Target ID of visible device `index`: from sysfs when it is sure, else from torch."""
    names = topology.device_names()
    if names is not None and len(names) == torch.cuda.device_count():
        return names[index]
    return str(torch.cuda.get_device_properties(index).gcnArchName)


def _index(device: torch.device) -> int:
    if device.index is not None:
        return device.index
    # Before torch starts HIP the current device is 0; asking would start it.
    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


def arch_reason(built: list[str], index: int) -> str | None:
    """None when a `built` target runs on device `index`, else the mismatch reason."""
    name = device_arch(index)
    if gfx.arch_mismatch(built, name) is not None and gfx.undecided(built, name):
        # sysfs gives the processor only; the build sets a feature mode: torch knows the mode.
        name = str(torch.cuda.get_device_properties(index).gcnArchName)
    return gfx.arch_mismatch(built, name)


def probe(device: torch.device) -> str | None:
    """None when rlk-rocm can serve `device`, else a one-line reason."""
    if device.type != "cuda":
        return f"no ROCm device (rlk-rocm serves cuda devices of a ROCm torch, got {device.type})"
    runtime = torch.version.hip
    if runtime is None:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
        return f"torch is not a ROCm build ({build} build {torch.__version__})"
    if not torch.cuda.is_available():
        return "no ROCm device"
    index = _index(device)
    count = torch.cuda.device_count()
    if index >= count:
        return f"no ROCm device with index {index} (found {count})"
    if not _ext.built():
        return "rlk-rocm has no compiled kernels here (a source tree, not an installed build)"
    reason = arch_reason(_ext.architectures(), index)
    if reason is None:
        reason = hip_mismatch(_ext.toolkit_version(), str(runtime))
    if reason is None and (error := _ext.import_error()) is not None:
        reason = f"extension failed to import: {error}"
    return reason
