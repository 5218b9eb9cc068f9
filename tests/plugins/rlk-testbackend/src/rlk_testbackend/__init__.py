"""Test-only plugins for rlk: a working third-party backend and every way a plugin can fail.

They stay harmless in a shared environment: the working backend serves only when
RLK_TESTBACKEND=1, and CI disables the failing ones (RLK_DISABLE_PLUGINS) except in
the tests that load them on purpose.
"""

# The entry points of this distribution that fail on purpose: CI blocks them by default.
FAILING_PLUGINS = "broken,oldapi,badhook,lazyfail"
