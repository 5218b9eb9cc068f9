"""rlk backend `quack`: linear_logp's no-grad forward as one GEMM with QuACK's epilogue.

The GEMM's epilogue folds each row's log-sum-exp and picks its target logit as the tiles
leave the tensor cores, so the [N, V] logits are never written. Importing this package
never imports QuACK or the CuTe DSL; the kernel imports them on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"
