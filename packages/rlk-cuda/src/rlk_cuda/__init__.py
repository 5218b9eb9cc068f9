"""rlk-cuda: CUDA kernels for rlk, registered as the ``cuda`` backend.

Importing this package never initialises CUDA and never fails on a machine without a GPU;
the compiled extension is loaded on first kernel use (see :mod:`rlk_cuda._ext`).
"""

__version__ = "0.1.0"
BACKEND = "cuda"  # the name rlk knows this package's backend by (rlk-rocm: "rocm")

__all__ = ["BACKEND", "__version__"]
