"""A warning when plugin code that rlk calls must wait for takes too long (a hang, usually).

Loading a plugin, its hook and its probe run under a lock or on the selection path, so a
plugin that sleeps stalls every thread that calls rlk. rlk cannot interrupt it safely;
it says, after SLOW_SECONDS, which plugin is holding everything up and how to block it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

SLOW_SECONDS = 5.0
log = logging.getLogger("rlk")


@contextlib.contextmanager
def warn_if_slow(what: str, hint: str) -> Iterator[None]:
    """Log a WARNING naming `what` if the block is still running after SLOW_SECONDS."""
    seconds = SLOW_SECONDS
    timer = threading.Timer(
        seconds, log.warning,
        args=("rlk: %s has been running for %.0f s; rlk calls wait for it. %s",
              what, seconds, hint),
    )
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
