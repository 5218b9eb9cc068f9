"""Host overhead of the small public ops on the CPU (rlk.bench.studies.overhead).

    python benchmarks/cpu/small_ops_overhead.py [--reps N] [--profile {policy_loss,logp,sample}]
"""

import sys

from rlk.bench.studies.overhead import small_ops

if __name__ == "__main__":
    sys.exit(small_ops())
