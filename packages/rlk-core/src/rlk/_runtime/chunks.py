"""Row chunking that keeps the native backend's extra memory bounded whatever N is."""

from __future__ import annotations

import math
import os

DEFAULT_CHUNK_BYTES = 256 * 2**20


def chunk_bytes() -> int:
    """The float32 working-set budget of one chunk (RLK_NATIVE_CHUNK_MB overrides it)."""
    raw = os.environ.get("RLK_NATIVE_CHUNK_MB")
    if raw is None:
        return DEFAULT_CHUNK_BYTES
    try:
        megabytes = float(raw)
    except ValueError:
        megabytes = math.nan
    if not 0 < megabytes < math.inf:
        raise ValueError(f"RLK_NATIVE_CHUNK_MB must be a finite number of MiB > 0, got {raw!r}")
    return max(1, int(megabytes * 2**20))


def rows_per_chunk(width: int, live_copies: int) -> int:
    """Rows such that `live_copies` float32 temporaries of `width` columns fit the budget."""
    return max(1, chunk_bytes() // (max(width, 1) * 4 * live_copies))
