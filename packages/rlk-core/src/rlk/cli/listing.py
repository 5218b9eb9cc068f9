"""`rlk-core backends`: one line per known backend."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from rlk.introspect import backends


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("backends", help="list backends and their status")
    parser.add_argument("--device", default=None, help="device to probe (default: cuda if any)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    records = backends(args.device)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in records], indent=2))
        return 0
    for r in records:
        print(f"{r.name:15} {r.status:12} priority {r.priority!s:5} "
              f"{r.distribution} {r.version}  {r.reason}")
    return 0
