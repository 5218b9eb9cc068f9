"""rlk-rocm: rlk-cuda's kernels compiled as HIP for AMD GPUs, registered as the ``rocm`` backend.

Importing this package never starts the HIP runtime and never fails on a machine without an
AMD GPU; the compiled extension is loaded on first kernel use (see :mod:`rlk_rocm._ext`).
"""

__version__ = "0.1.0"
BACKEND = "rocm"  # the name rlk knows this package's backend by

__all__ = ["BACKEND", "__version__"]
