"""Test set-up for rlk-cuda. The `gpu` marker and its skip without a CUDA device come from
rlk-core's pytest plugin (rlk.testing), which the repository's pytest settings opt in to."""

from __future__ import annotations

import sys
from pathlib import Path

# The helpers beside this file (tests_reference) import under any pytest import mode.
sys.path.insert(0, str(Path(__file__).parent))
