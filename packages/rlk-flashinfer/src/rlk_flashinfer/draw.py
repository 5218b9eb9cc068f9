"""The exact inverse-CDF pick inside the kernel, and the order keys of float32 values.

`pick` compares integer (fixed-point) cumulative sums, so the pick is exact: an entry of
weight zero is never drawn, whatever the rounding of the float sums, and every entry of
positive weight keeps its share to within 2**-40 of the total. The full-vocabulary draw
uses it twice (a chunk by the chunks' masses, then a token inside the chunk); the
shortlist once.

`key` maps float32 values to int32 keys in the same order (for non-NaN values, -0.0 made
+0.0 first), so that a threshold can be found by bisection on integers and a float and
an index can be packed into one sortable int64.
"""

from __future__ import annotations

import triton
import triton.language as tl

_UNITS = tl.constexpr(1099511627776.0)  # 2**40


@triton.jit
def pick(weights, u):
    """The position in the 1-D float64 block `weights` (non-negative, one entry positive)
    whose cumulative interval holds u * total, for a float64 u in [0, 1)."""
    total = tl.sum(weights, 0)
    share = tl.maximum(tl.ceil(weights / total * _UNITS), 1.0)
    units = tl.where(weights > 0, share, 0.0).to(tl.int64)
    cumulative = tl.cumsum(units, 0)
    last = tl.sum(units, 0)
    target = tl.minimum(tl.floor(u * last.to(tl.float64)).to(tl.int64), last - 1)
    position = tl.sum((cumulative <= target).to(tl.int32), 0)
    # never past the block, whatever the weights (NaN ones make the sums garbage)
    return tl.minimum(position, weights.shape[0] - 1)


@triton.jit
def key(x):
    """int32 keys ordered as the float32 values `x` are (-0.0 counts as +0.0)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def value(k):
    """The float32 value of an int32 key (the inverse of `key`)."""
    return (k ^ ((k >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
