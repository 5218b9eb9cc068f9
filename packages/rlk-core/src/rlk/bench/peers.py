"""Peers outside rlk: finding them, and the reason a row is blocked when one is missing.

A peer is imported only when a row needs it, so a broken or absent package costs
one `blocked` row, never the run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from rlk._runtime.probing import installed_version, module_found
from rlk.bench.workload import Blocked

PEERS = ("eager", "compile", "unfused", "liger", "cce", "flashinfer", "quack", "cublas")
DISTRIBUTIONS = {
    "liger": "liger-kernel",
    "cce": "cut-cross-entropy",
    "flashinfer": "flashinfer-python",
    "quack": "quack-kernels",
}
DESCRIPTIONS = {
    "eager": "PyTorch eager, the way RL trainers write it (upcast, log_softmax, gather)",
    "compile": "the same PyTorch code under torch.compile (default mode, static shapes)",
    "unfused": "rlk's own ops composed instead of fused (rlk.linear_logp + rlk.policy_loss)",
    "liger": "Liger-Kernel (cross entropy, fused linear cross entropy; reduction='none')",
    "cce": "Cut Cross-Entropy linear_cross_entropy (reduction='none', default filter_eps)",
    "flashinfer": "FlashInfer top_k_top_p_sampling_from_logits (tokens only)",
    "quack": "QuACK (CuTe DSL; tested with nvidia-cutlass-dsl 4.7.0): cross_entropy "
             "(reduction='none'); linear_logp's forward as one GEMM with its LSE and "
             "target-logit epilogue (lse_target_epi)",
    "cublas": "the floor of the LM-head ops: their GEMMs alone through torch.mm (cuBLAS)",
}


def version(peer: str) -> str | None:
    """The installed version of a package peer (None for torch-based peers or when absent)."""
    distribution = DISTRIBUTIONS.get(peer)
    return None if distribution is None else installed_version(distribution)


def load(peer: str, module: str, attr: str, device: torch.device) -> Any:
    """`module.attr` of a package peer, or Blocked: not installed, needs CUDA, fails to import."""
    distribution = DISTRIBUTIONS[peer]
    top = module.split(".")[0]
    if not module_found(top):
        raise Blocked(f"{distribution} is not installed (pip install {distribution})")
    if device.type != "cuda":
        raise Blocked(f"{distribution} runs on CUDA devices only; this run is on {device.type}")
    try:
        found = importlib.import_module(module)
    except Exception as exc:  # a broken install must cost one row, not the run
        raise Blocked(f"{distribution} fails to import {module}: "
                      f"{type(exc).__name__}: {exc}") from exc
    if not hasattr(found, attr):
        raise Blocked(f"{distribution} {version(peer)} has no {module}.{attr}")
    return getattr(found, attr)


def compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    """torch.compile of `function` with static shapes, from a clean dynamo cache.

    Resetting per case keeps every shape a fresh compilation: dynamo's per-function
    recompile limit would otherwise make later shapes run eagerly without saying so.
    """
    torch._dynamo.reset()
    return torch.compile(function, dynamic=False)
