"""What the kernel value checks (RLK_CHECK_INPUTS=1) cost per call on the CPU
(rlk.bench.studies.overhead).

    python benchmarks/cpu/kernel_checks_overhead.py [--reps N]
"""

import sys

from rlk.bench.studies.overhead import checks

if __name__ == "__main__":
    sys.exit(checks())
