"""The `rlk-core` command line: doctor, backends, explain (and bench where installed)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlk.cli import bench, doctor, explain, listing

COMMANDS = (doctor, listing, explain, bench)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlk-core", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (ValueError, TypeError) as exc:  # bad arguments reach us as these: a usage error
        print(f"rlk-core {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
