"""The conformance kit: a pytest plugin that checks any backend against the op specs.

Run it on a backend with ``pytest --pyargs rlk.testing --rlk-backend NAME``
(``--rlk-device`` picks the device; the default is CUDA when torch sees one).
"""

from rlk.testing.compare import assert_matches
from rlk.testing.poison import poisoned_allocations

__all__ = ["assert_matches", "poisoned_allocations"]
