"""`rlk-core explain OP --shape ...`: which backend would serve a call of that shape, and why."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch

from rlk import config
from rlk.dispatch import current_policy, get_dispatcher
from rlk.ops import specs

Builder = Callable[[list[int], torch.dtype], tuple[tuple[Any, ...], dict[str, Any]]]
META = torch.device("meta")


def _logits_tokens(shape: list[int], dtype: torch.dtype):
    logits = torch.empty(shape, dtype=dtype, device=META)
    return (logits, torch.empty(shape[:-1], dtype=torch.int64, device=META)), {}


def _linear(shape: list[int], dtype: torch.dtype):
    if len(shape) != 3:
        raise ValueError(f"linear_logp takes --shape N,H,V; got {shape}")
    n, h, v = shape
    hidden = torch.empty(n, h, dtype=dtype, device=META)
    weight = torch.empty(v, h, dtype=dtype, device=META)
    return (hidden, weight, torch.empty(n, dtype=torch.int64, device=META)), {}


def _policy(shape: list[int], dtype: torch.dtype):
    if len(shape) != 2:
        raise ValueError(f"policy_loss takes --shape B,T; got {shape}")
    logp = torch.empty(shape, dtype=dtype, device=META)
    return (logp, logp, torch.empty(shape[0], device=META), logp), {}


def _rewards(shape: list[int], dtype: torch.dtype):
    if len(shape) != 1:
        raise ValueError(f"group_advantages takes --shape N; got {shape}")
    return (torch.empty(shape, dtype=dtype, device=META),), {"group_size": 1}


BUILDERS: dict[str, Builder] = {
    "logp": _logits_tokens,
    "logp_entropy": _logits_tokens,
    "entropy": lambda shape, dtype: ((torch.empty(shape, dtype=dtype, device=META),), {}),
    "linear_logp": _linear,
    "linear_logp_entropy": _linear,
    "policy_loss": _policy,
    "group_advantages": _rewards,
    "sample": lambda shape, dtype: ((torch.empty(shape, dtype=dtype, device=META),), {}),
}


def explain_shape(op: str, shape: list[int], dtype: torch.dtype,
                  device: torch.device) -> dict[str, Any]:
    """Selection for a call of this shape, built on the meta device (nothing is allocated)."""
    known = specs()
    if op not in known:
        raise ValueError(f"unknown op {op!r}; rlk defines {sorted(known)}")
    spec = known[op]
    args, kwargs = BUILDERS[op](shape, dtype)
    previous = config.checking_inputs()
    config.check_inputs(False)  # range checks would read the (absent) data
    try:
        call = spec.prepare(*args, **kwargs)
    finally:
        config.check_inputs(previous)
    dispatcher = get_dispatcher()
    main = call[spec.main_input]
    selection = dispatcher.decide(op, device, main.dtype, call, current_policy(dispatcher))
    return {"op": op, "doc": spec.doc, "device": str(device),
            "dtype": str(dtype).replace("torch.", ""),
            "shape": shape, "backend": selection.backend, "kernel": selection.kernel_name,
            "rejected": dict(selection.rejected)}


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("explain", help="which backend would serve a call, and why")
    parser.add_argument("op", help="op name, e.g. logp")
    parser.add_argument("--shape", required=True,
                        help="comma-separated sizes: logits N,V; linear_logp N,H,V; "
                             "policy_loss B,T; group_advantages N; sample B,V")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        shape = [int(part) for part in args.shape.replace("x", ",").split(",") if part]
    except ValueError:
        raise ValueError(f"--shape must be comma-separated integers, got {args.shape!r}") from None
    dtype = getattr(torch, args.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"--dtype must name a torch dtype, got {args.dtype!r}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    result = explain_shape(args.op, shape, dtype, device)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['op']}: {result['doc']}")
    kernel = f" ({result['kernel']})" if result["kernel"] else ""
    print(f"{result['op']} on {result['device']} [{result['dtype']}, shape {shape}]: "
          f"{result['backend'] or 'NO BACKEND'}{kernel}")
    for name, why in result["rejected"].items():
        print(f"  {name}: {why}")
    return 0 if result["backend"] else 1
