"""What every kernel wrapper needs before a launch: device checks, dtype codes, the stream.

Shared by rlk-cuda and rlk-rocm (which installs these same host modules): messages name
the package they run in.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from . import _ext

LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def dtype_codes() -> dict[torch.dtype, int]:
    """The extension's element type codes (_C.DType, named as torch's dtypes); bool is
    stored as uint8."""
    members = _ext.load().DType.__members__
    codes = {getattr(torch, name): int(code) for name, code in members.items()}
    codes[torch.bool] = codes[torch.uint8]
    return codes


def dtype_code(name: str, tensor: Tensor) -> int:
    """The extension's code for a float32, bfloat16 or float16 tensor; TypeError for others."""
    if tensor.dtype not in LOGITS_DTYPES:
        raise TypeError(
            f"{name} must be float32, bfloat16 or float16 for {__package__}; got {tensor.dtype}"
        )
    return dtype_codes()[tensor.dtype]


def device_of(name: str, tensor: Tensor) -> int:
    """The CUDA device index of `tensor`; a clean error when there is no CUDA device."""
    if tensor.device.type != "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{__package__} kernels need a CUDA device and none is available ({name} is on "
                f"{tensor.device}); use another rlk backend on this machine"
            )
        raise ValueError(f"{name} must be a CUDA tensor for {__package__}; "
                         f"got device {tensor.device}")
    index = tensor.device.index
    return torch.cuda.current_device() if index is None else index


def same_device(name: str, tensor: Tensor, device: int) -> None:
    """ValueError unless `tensor` lives on CUDA device `device`."""
    if tensor.device.type != "cuda" or tensor.device.index != device:
        raise ValueError(f"{name} must be on cuda:{device}; got {tensor.device}")


def stream(device: int) -> int:
    """The caller's current stream on `device`, as the raw handle the extension expects.

    Read without building a torch.cuda.Stream object (what inductor's launchers do): on
    every launch of a small op, that object costs more host time than the kernel takes.
    """
    return torch._C._cuda_getCurrentRawStream(device)


def f32_empty(*shape: int, device: torch.device) -> Tensor:
    """An uninitialised float32 output on `device`."""
    return torch.empty(shape, dtype=torch.float32, device=device)


def ptr(tensor: Tensor | None) -> int:
    """Data pointer, or 0 for an absent optional tensor."""
    return 0 if tensor is None else int(tensor.data_ptr())


def rows_major(tensor: Tensor) -> Tensor:
    """`tensor` with unit column stride (copied only if needed); rows may keep any stride."""
    if tensor.shape[1] > 1 and tensor.stride(1) != 1:
        return tensor.contiguous()
    if tensor.shape[0] > 1 and tensor.stride(0) < tensor.shape[1]:
        return tensor.contiguous()
    return tensor
