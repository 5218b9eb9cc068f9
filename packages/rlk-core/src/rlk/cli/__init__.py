"""The `rlk-core` command line: doctor, backends, explain (and bench where installed)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from rlk.cli import bench, doctor, explain, listing
from rlk.errors import PluginError

COMMANDS = (doctor, listing, explain, bench)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Exit 2 for a usage error, with one line on stderr and no traceback:
    bad arguments or settings, and plugins that failed under RLK_STRICT_PLUGINS=1."""
    parser = argparse.ArgumentParser(prog="rlk-core", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        code = int(args.run(args))
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except (ValueError, TypeError, PluginError) as exc:
        message = "; ".join(line.strip() for line in str(exc).splitlines())
        print(f"rlk-core {args.command}: error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `rlk-core doctor --json | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
