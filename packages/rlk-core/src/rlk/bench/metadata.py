"""What a report records about its run: enough to tell a kernel issue from an environment one."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from rlk.bench import peers


def _git(where: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                              check=False, cwd=where)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> dict[str, Any]:
    """The commit measured: the RLK_BENCH_COMMIT variable when set (a copied tree may carry a
    stale .git), else git in the working directory, else beside this file; dirty: uncommitted
    changes (unknown for the variable)."""
    named = os.environ.get("RLK_BENCH_COMMIT")
    if named:
        return {"sha": named, "dirty": None}
    for where in (Path.cwd(), Path(__file__).resolve().parent):
        sha = _git(where, "rev-parse", "HEAD")
        if sha:
            status = _git(where, "status", "--porcelain", "--untracked-files=no")
            return {"sha": sha, "dirty": bool(status) if status is not None else None}
    return {"sha": None, "dirty": None}


def device_info(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"type": "cpu", "name": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads()}
    from rlk.environment import gpus

    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    smi = next((g for g in gpus() if g.get("index") == index), {})
    return {"type": "cuda", "index": index, "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_bytes": props.total_memory, "multiprocessors": props.multi_processor_count,
            "driver": smi.get("driver")}


def backends(device: torch.device) -> list[dict[str, Any]]:
    import rlk

    return [dataclasses.asdict(b) for b in rlk.backends(device)]


def collect(command: list[str], device: torch.device, dtype: torch.dtype,
            smoke: bool) -> dict[str, Any]:
    import rlk

    return {
        "command": command,
        "argv": list(sys.argv),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "rlk": rlk.__version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "device": device_info(device),
        "dtype": str(dtype).replace("torch.", ""),
        "smoke": smoke,
        "backends": backends(device),
        "peers": {name: {"version": peers.version(name), "what": peers.DESCRIPTIONS[name]}
                  for name in peers.PEERS},
    }
