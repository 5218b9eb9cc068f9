"""patch() and unpatch() as process-wide state: threads, and the context manager."""

from __future__ import annotations

import threading

from rlk.integrations import trl as rlk_trl

from .conftest import require

trl_utils = require("trl.trainer.utils")

TRL_SELECTIVE_LOG_SOFTMAX = trl_utils.selective_log_softmax
TRIALS = 200


def in_threads(action, count: int = 2) -> None:
    """Run `action` in `count` threads released together."""
    start = threading.Barrier(count)

    def run() -> None:
        start.wait()
        action()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_patch_from_two_threads_installs_once() -> None:
    """Two threads patching at once: one set of swaps, and unpatch() restores TRL."""
    for trial in range(TRIALS):
        in_threads(rlk_trl.patch)
        assert rlk_trl.is_patched(), trial
        assert trl_utils.selective_log_softmax is rlk_trl.selective_log_softmax, trial
        rlk_trl.unpatch()
        assert not rlk_trl.is_patched(), trial
        assert trl_utils.selective_log_softmax is TRL_SELECTIVE_LOG_SOFTMAX, trial


def test_patched_blocks_in_two_threads_leave_trl_restored() -> None:
    """Each thread's `patched()` block: TRL is routed inside, restored once both are out."""
    seen: list[bool] = []

    def block() -> None:
        with rlk_trl.patched():
            seen.append(trl_utils.selective_log_softmax is rlk_trl.selective_log_softmax)

    for trial in range(TRIALS // 4):
        in_threads(block)
        assert not rlk_trl.is_patched(), trial
        assert trl_utils.selective_log_softmax is TRL_SELECTIVE_LOG_SOFTMAX, trial
    assert seen and all(seen)
