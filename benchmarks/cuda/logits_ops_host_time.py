"""Host time against wall time of rlk.logp and rlk.sample on a CUDA device
(rlk.bench.studies.cuda_logits_ops).

    python benchmarks/cuda/logits_ops_host_time.py [--profile]   (needs rlk-cuda and a GPU)
"""

import sys

from rlk.bench.studies.cuda_logits_ops import main

if __name__ == "__main__":
    sys.exit(main())
