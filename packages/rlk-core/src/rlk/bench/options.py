"""What a benchmark run was asked to do, validated before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlk.bench.peers import PEERS

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
          "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}


# The default sweep on a GPU: every dtype users feed rlk's ops.
SWEEP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


def parse_dtypes(text: str) -> list[torch.dtype]:
    """'bf16,fp16' -> [torch.bfloat16, torch.float16], each name checked."""
    names = parse_list(text)
    if not names:
        raise ValueError(f"--dtype needs at least one of {', '.join(DTYPES)}; got {text!r}")
    return list(dict.fromkeys(parse_dtype(name) for name in names))


def parse_list(text: str | None) -> list[str] | None:
    """'a,b' -> ['a', 'b']; None or '' -> None (meaning: the default set)."""
    if not text:
        return None
    return [part.strip() for part in text.split(",") if part.strip()]


@dataclass
class Options:
    """One run. None for workloads/backends/peers means all of them. dtypes None: the sweep
    (float32, bfloat16, float16) on a GPU, float32 on CPU and under --smoke; a workload's
    case may pin its own (e.g. float32 inputs of the small ops)."""

    workloads: list[str] | None = None
    backends: list[str] | None = None
    peers: list[str] | None = None
    dtypes: list[torch.dtype] | None = None
    device: torch.device = field(default_factory=lambda: torch.device(
        "cuda" if torch.cuda.is_available() else "cpu"))
    output_dir: Path = Path("bench-results")
    smoke: bool = False
    summary: bool = True
    time_limit: float | None = None
    command: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        unknown = [p for p in self.peers or () if p not in PEERS]
        if unknown:
            raise ValueError(f"unknown peer(s) {', '.join(unknown)}; "
                             f"expected any of {', '.join(PEERS)}")
        if self.time_limit is not None and not self.time_limit > 0:
            raise ValueError(f"--time-limit must be a positive number of seconds; "
                             f"got {self.time_limit}")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for but torch sees no CUDA device")

    @property
    def run_dtype(self) -> torch.dtype:
        """The dtype of the run's GEMM ceiling: the first asked for, else bf16 on GPU."""
        if self.dtypes:
            return self.dtypes[0]
        return torch.bfloat16 if self.device.type == "cuda" else torch.float32

    @property
    def sweep_dtypes(self) -> list[torch.dtype]:
        """The dtypes each case without its own runs in."""
        if self.dtypes:
            return list(self.dtypes)
        if self.device.type == "cuda" and not self.smoke:
            return list(SWEEP_DTYPES)
        return [self.run_dtype]
