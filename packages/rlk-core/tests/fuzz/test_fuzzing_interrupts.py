"""The long run's interrupt stops a fuzz process even where Python drops it (issue #31)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# An interrupt raised inside a gc callback, as Hypothesis's collector timing has one: Python
# prints "Exception ignored in" and drops it; the next example must still stop.
_DROPPED_IN_A_GC_CALLBACK = """
import gc, os, signal
import fuzzing
fuzzing.stop_at_the_next_example_on_interrupt()
fuzzing.tally("before")
sent = []
def callback(phase, info):
    if not sent:
        sent.append(phase)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at a bytecode boundary in here
            pass
gc.callbacks.append(callback)
gc.collect()
gc.callbacks.remove(callback)
assert sent, "the callback never ran"
print("dropped and carried on", flush=True)
try:
    fuzzing.tally("after")
except KeyboardInterrupt:
    print("stopped at the next example", dict(fuzzing.COUNTS))
"""


def test_an_interrupt_dropped_in_a_gc_callback_stops_the_next_example():
    done = subprocess.run([sys.executable, "-c", _DROPPED_IN_A_GC_CALLBACK],
                          cwd=Path(__file__).parent, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" in done.stderr and "KeyboardInterrupt" in done.stderr, (
        "the interrupt was not dropped in the callback, so this test shows nothing: "
        + done.stderr)
    assert done.stdout.splitlines() == ["dropped and carried on",
                                        "stopped at the next example {'before': 1}"]
