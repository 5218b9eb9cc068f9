"""Adapters that route a training framework's log-prob and loss functions to rlk.

`rlk.integrations.trl` and `rlk.integrations.verl` each offer `patch()`, `unpatch()`
and the context manager `patched()`. Importing an adapter imports no framework: the
framework is imported inside `patch()`, which checks its version against the range
the adapter was tested with and refuses any configuration rlk cannot express
(`UnsupportedOptionError`) instead of computing something else.
"""

from __future__ import annotations

from rlk.integrations._patching import UnsupportedOptionError, UnsupportedVersionError

__all__ = ["UnsupportedOptionError", "UnsupportedVersionError"]
