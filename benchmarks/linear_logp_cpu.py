"""linear_logp forward+backward on the CPU against `log_softmax(hidden @ W.T)`, each variant
in a fresh process (rlk.bench.studies.linear_logp_cpu).

    python benchmarks/linear_logp_cpu.py [--n 2048 --h 1024 --v 32768] [--json out.json]
"""

import sys

from rlk.bench.studies.linear_logp_cpu import main

if __name__ == "__main__":
    sys.exit(main())
