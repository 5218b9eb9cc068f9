"""`rlk-core backends`: one line per known backend."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from rlk.cli.devices import parse
from rlk.introspect import backends
from rlk.registry import FAILED


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("backends", help="list backends and their status")
    parser.add_argument("--device", default=None, help="device to probe (default: cuda if any)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every listed backend is ready, unavailable or blocked; 1 when one failed
    (its plugin failed to load, a kernel fails to import, or its probe fails)."""
    records = backends(None if args.device is None else parse(args.device))
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in records], indent=2))
    else:
        for r in records:
            print(f"{r.name:15} {r.status:12} priority {r.priority!s:5} "
                  f"{r.distribution} {r.version}  {r.reason}")
    return 1 if any(r.status == FAILED for r in records) else 0
