"""rlk backend `flashinfer`: `rlk.sample` through FlashInfer's sampling kernels.

Importing this package never imports FlashInfer; the kernel imports it on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"
