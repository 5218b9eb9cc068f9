"""`rlk-core explain OP --shape ...`: which backend would serve a call of that shape, and why."""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from rlk import config
from rlk._runtime.spec import specs
from rlk.cli.devices import available
from rlk.dispatch import current_policy, get_dispatcher
from rlk.introspect import op_spec


def explain_shape(op: str, shape: list[int], dtype: torch.dtype,
                  device: torch.device) -> dict[str, Any]:
    """Selection for a call of this shape, built on the meta device (nothing is allocated)."""
    spec = op_spec(op)
    if spec.shape_call is None:
        raise ValueError(f"{op} cannot be explained from a shape")
    previous = config.checking_inputs()
    config.check_inputs(False)  # range checks would read the (absent) data
    try:
        args, kwargs = spec.shape_call(shape, dtype)
        call = spec.prepare(*args, **kwargs)
    except ValueError as exc:
        raise ValueError(f"{op} {exc}") from None
    except RuntimeError as exc:  # torch refusing the sizes (their product overflows int64)
        raise ValueError(f"{op} --shape {shape}: {str(exc).splitlines()[0]}") from None
    finally:
        config.check_inputs(previous)
    dispatcher = get_dispatcher()
    main = call[spec.main_input]
    selection = dispatcher.decide(op, device, main.dtype, call, current_policy(dispatcher))
    return {"op": op, "doc": spec.doc, "device": str(device),
            "dtype": str(dtype).replace("torch.", ""),
            "shape": shape, "backend": selection.backend, "kernel": selection.kernel_name,
            "uses": list(selection.uses), "rejected": dict(selection.rejected)}


def add_parser(subparsers: Any) -> None:
    shapes = "; ".join(f"{name} {spec.shape_help}" for name, spec in specs().items())
    parser = subparsers.add_parser("explain", help="which backend would serve a call, and why")
    parser.add_argument("op", help="op name, e.g. logp")
    parser.add_argument("--shape", required=True, help=f"comma-separated sizes: {shapes}")
    dtypes = sorted({str(d).replace("torch.", "") for spec in specs().values()
                     for d in spec.dtypes})
    parser.add_argument("--dtype", default="float32", choices=dtypes,
                        help=f"the main input's dtype: {', '.join(dtypes)} (default float32)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        shape = [int(part) for part in args.shape.replace("x", ",").split(",") if part]
    except ValueError:
        raise ValueError(f"--shape must be comma-separated integers, got {args.shape!r}") from None
    if any(not 0 <= size < 2**63 for size in shape):
        raise ValueError(f"--shape sizes must be >= 0 and < 2**63, got {args.shape!r}")
    dtype = getattr(torch, args.dtype)
    result = explain_shape(args.op, shape, dtype, available(args.device))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0 if result["backend"] else 1
    print(f"{result['op']}: {result['doc']}")
    kernel = f" ({result['kernel']})" if result["kernel"] else ""
    print(f"{result['op']} on {result['device']} [{result['dtype']}, shape {shape}]: "
          f"{result['backend'] or 'NO BACKEND'}{kernel}")
    for used in result["uses"]:
        print(f"  it dispatches '{used}' itself: `rlk-core explain {used} ...` says which "
              "backend runs that")
    for name, why in result["rejected"].items():
        print(f"  {name}: {why}")
    return 0 if result["backend"] else 1
