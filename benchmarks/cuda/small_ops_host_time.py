"""Host time against GPU time of the small cuda ops (rlk.bench.studies.cuda_small_ops).

    python benchmarks/cuda/small_ops_host_time.py [--profile]   (needs rlk-cuda and a CUDA device)
"""

import sys

from rlk.bench.studies.cuda_small_ops import main

if __name__ == "__main__":
    sys.exit(main())
