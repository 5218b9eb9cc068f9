"""The seed's benchmark entry point, kept as a thin wrapper over `rlk-core bench`.

    python benchmarks/profiler.py --smoke --workloads logp-native --no-summary

Every flag of `rlk-core bench` works here (see docs/benchmarks/index.md).
"""

from __future__ import annotations

import sys

from rlk.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
