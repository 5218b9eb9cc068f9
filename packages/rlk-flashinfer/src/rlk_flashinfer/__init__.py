"""rlk backend `flashinfer`: `rlk.sample` on FlashInfer's radix top-k and rlk's Triton kernels.

Importing this package never imports FlashInfer or Triton; the kernel imports them on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"
