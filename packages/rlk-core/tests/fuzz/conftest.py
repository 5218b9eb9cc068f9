"""The fuzz suite's run summary: its mode and seed, and the examples each op ran."""

from __future__ import annotations

import faulthandler
import importlib.util
import os
from typing import Any

if importlib.util.find_spec("hypothesis") is None:  # rlk-core[dev] brings it
    collect_ignore_glob = ["test_*.py"]
else:
    import fuzzing

    fuzzing.stop_at_the_next_example_on_interrupt()

    def _mode() -> str:
        if fuzzing.SEED is None:
            return f"replay (derandomized), {fuzzing.EXAMPLES} examples a test"
        return (f"random pass, seed {fuzzing.SEED} (reproduce: RLK_FUZZ_SEED={fuzzing.SEED} "
                f"RLK_FUZZ_EXAMPLES={fuzzing.EXAMPLES}), device {fuzzing.DEVICE}")

    def pytest_collection_finish(session: Any) -> None:
        """The seed first, so that a run killed before its summary still told it; and with
        RLK_FUZZ_STACKS=SECONDS:PATH, every thread's stack written to PATH after SECONDS,
        so that a run that ignores its interrupt (and is killed) still says where it was."""
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and fuzzing.SEED is not None:
            reporter.write_line(f"rlk fuzz: {_mode()}")
        seconds, _, path = os.environ.get("RLK_FUZZ_STACKS", "").partition(":")
        if path:
            stacks = open(path, "w")  # noqa: SIM115 -- written by faulthandler's thread
            faulthandler.dump_traceback_later(float(seconds), file=stacks)

    def pytest_terminal_summary(terminalreporter: Any) -> None:
        if not fuzzing.COUNTS:
            return
        terminalreporter.write_sep("-", f"rlk fuzz: {_mode()}")
        for op, count in sorted(fuzzing.COUNTS.items()):
            terminalreporter.write_line(f"  {op:<28} {count:>8} examples")
