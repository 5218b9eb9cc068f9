"""CUDA graph capture (rlk.bench.studies.capture): eager against replayed wall time per call,
and which warm-ups let a training step be captured. Needs rlk-cuda and a GPU.

    python benchmarks/cuda/capture.py times
    python benchmarks/cuda/capture.py warmups [WARMUP:STEP]
"""

import sys

from rlk.bench.studies.capture import main

if __name__ == "__main__":
    sys.exit(main())
