"""The device a command is about: parsed, and refused when this machine does not have it."""

from __future__ import annotations

import torch


def available(text: str | None) -> torch.device:
    """`text` as a torch.device that exists here (default: cuda if torch sees one, else cpu).

    Never initialises CUDA: torch answers from the driver's device count.
    """
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = parse(text)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"--device {text}: torch {torch.__version__} sees no CUDA device "
                             "on this machine")
        if device.index is not None and device.index >= count:
            raise ValueError(f"--device {text}: no such CUDA device ({count} visible)")
    elif device.type not in ("cpu", "meta") and not _has(device):
        raise ValueError(f"--device {text}: torch sees no {device.type} device here")
    return device


def parse(text: str) -> torch.device:
    """`text` as a torch.device, whether or not this machine has it (a probe may say why not)."""
    try:
        return torch.device(text)
    except RuntimeError:
        raise ValueError(f"--device must name a torch device (cpu, cuda, cuda:1, ...), "
                         f"got {text!r}") from None


def _has(device: torch.device) -> bool:
    module = getattr(torch, device.type, None)
    is_available = getattr(module, "is_available", None)
    return bool(is_available()) if callable(is_available) else False
