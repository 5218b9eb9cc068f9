"""Plugin loading survives any plugin: re-entrant, transactional, isolated, never silent."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import fake_plugins
import pytest
import torch

import rlk
from rlk import api_versions, dispatch
from rlk.registry import Registry


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4, 32, generator=gen), torch.randint(0, 32, (4,), generator=gen)


def _records() -> dict[str, Any]:
    return {r.name: r for r in dispatch.get_dispatcher().loader.records}


def _in_thread(call: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Run `call` on a daemon thread; fail (instead of hanging) if it deadlocks."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the call did not return within {timeout} s (deadlock)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_plugin_calling_rlk_in_its_hook_does_not_deadlock(use_plugins):
    use_plugins(reentrant="fake_plugins:reentrant")
    logits, tokens = _inputs()
    result = _in_thread(lambda: rlk.logp(logits, tokens))
    assert torch.isfinite(result).all()
    assert _records()["reentrant"].status == "loaded"
    inner_logp, inner_backends = fake_plugins.Reentrant.seen[-2:]
    assert inner_logp.shape == (1,)  # served while loading, by what was loaded before it
    assert "native" in inner_backends


def test_plugin_calling_rlk_at_import_does_not_deadlock(use_plugins):
    use_plugins(calls_rlk="fake_plugin_calls_rlk")
    result = _in_thread(lambda: rlk.logp(*_inputs()))
    assert torch.isfinite(result).all()
    assert _records()["calls_rlk"].status == "loaded"


def test_decisions_made_while_loading_are_not_kept(use_plugins):
    """The reentrant plugin's call is decided before 'zz_fast' loads: it must not stick."""
    use_plugins(reentrant="fake_plugins:reentrant", zz_fast="fake_plugins:fast")
    before = fake_plugins.calls["fast"]
    _in_thread(lambda: rlk.logp(*_inputs()))
    assert fake_plugins.calls["fast"] == before + 1


def test_system_exit_from_a_plugin_is_a_failed_plugin(use_plugins):
    use_plugins(exits_at_import="fake_plugin_exits", exits_in_hook="fake_plugins:exiting")
    assert torch.isfinite(rlk.logp(*_inputs())).all()
    records = _records()
    for name in ("exits_at_import", "exits_in_hook"):
        assert records[name].status == "failed"
        assert "SystemExit: 3" in records[name].error


def test_strict_plugins_raise_for_every_caller_after_trying_every_plugin(use_plugins,
                                                                        fresh_rlk):
    fresh_rlk.setenv("RLK_STRICT_PLUGINS", "1")
    use_plugins(a_duplicate="fake_plugins:duplicate", z_fast="fake_plugins:fast")
    errors: list[BaseException] = []

    def call() -> None:
        try:
            rlk.logp(*_inputs())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(errors) == 8 and all(isinstance(e, rlk.PluginError) for e in errors), errors
    assert "RLK_DISABLE_PLUGINS=a_duplicate" in str(errors[0])
    with pytest.raises(rlk.PluginError):
        rlk.logp(*_inputs())  # and so does every later call
    assert _records()["z_fast"].status == "loaded"  # plugins after the failure still load


def test_interrupted_load_leaves_nothing_half_loaded(use_plugins):
    fake_plugins.Interrupting.interrupts = 1
    use_plugins(a_fast="fake_plugins:fast", m_interrupting="fake_plugins:interrupting",
                z_picky="fake_plugins:picky")
    with pytest.raises(KeyboardInterrupt):
        rlk.logp(*_inputs())
    loader = dispatch.get_dispatcher().loader
    assert loader.records == []
    assert dispatch.get_dispatcher().registry.backends == {}
    assert not loader.loaded
    before = fake_plugins.calls["fast"]
    rlk.logp(*_inputs())  # the next call loads everything again
    assert fake_plugins.calls["fast"] == before + 1
    assert {n: r.status for n, r in _records().items()} == {
        "rlk.native": "loaded", "a_fast": "loaded", "m_interrupting": "loaded",
        "z_picky": "loaded"}


def test_a_failing_hook_cannot_break_native(use_plugins):
    use_plugins(hijacker="fake_plugins:hijacker")
    assert torch.isfinite(rlk.logp(*_inputs())).all()
    assert _records()["hijacker"].status == "failed"
    assert rlk.explain("logp", *_inputs()).backend == "native"


def test_a_plugin_adds_kernels_only_to_its_own_backends(use_plugins):
    use_plugins(a_fast="fake_plugins:fast", b_annexer="fake_plugins:annexer")
    rlk.backends("cpu")
    record = _records()["b_annexer"]
    assert record.status == "failed"
    assert "belongs to plugin 'a_fast'" in record.error
    registry = dispatch.get_dispatcher().registry
    assert [k.backend for k in registry.kernels["sample"]] == ["native"]


def test_registered_records_are_frozen():
    registry = Registry(["logp"])
    registry.add_backend("mine", priority=1)
    registry.add_kernel("logp", "mine", "a:b", devices="cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        registry.backends["mine"].probe = lambda device: "hijacked"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        registry.kernels["logp"][0].target = "x:y"  # type: ignore[misc]


def test_a_slow_plugin_is_named_in_a_warning(use_plugins, monkeypatch, caplog):
    from rlk import watchdog

    monkeypatch.setattr(watchdog, "SLOW_SECONDS", 0.05)
    monkeypatch.setattr(fake_plugins.Slow, "delay", 0.5)
    use_plugins(slow="fake_plugins:slow")
    with caplog.at_level(logging.WARNING, logger="rlk"):
        rlk.logp(*_inputs())
    messages = [r.getMessage() for r in caplog.records]
    assert any("plugin 'slow'" in m and "RLK_DISABLE_PLUGINS=slow" in m for m in messages), \
        messages


def test_malformed_entry_point_names_its_value(use_plugins):
    use_plugins(bad="fake_plugins:")
    rlk.backends("cpu")
    error = _records()["bad"].error
    assert "malformed entry point value 'fake_plugins:'" in error
    assert "NoneType" not in error


def test_two_entry_points_to_one_plugin_load_it_once(use_plugins):
    use_plugins(fast="fake_plugins:fast", fast_again="fake_plugins:fast")
    names = [r.name for r in rlk.backends("cpu")]
    assert names.count("fast") == 1
    assert "fast_again" not in names
    record = _records()["fast_again"]
    assert record.status == "duplicate"
    assert "entry point 'fast'" in record.error


def test_plugin_api_versions_core_does_not_speak_are_refused(use_plugins):
    use_plugins(future="fake_plugins:future")
    rlk.backends("cpu")
    record = _records()["future"]
    assert record.status == "failed"
    assert "newer than rlk-core's" in record.error
    assert record.api == "2.7"
    assert "not a 'major.minor' string" in str(api_versions.mismatch("one"))
    assert f"rlk-core speaks {rlk.PLUGIN_API_VERSION}" in str(api_versions.mismatch("0.9"))
    assert api_versions.mismatch("2.0") is None and api_versions.mismatch("2.1") is None
    assert "upgrade rlk-core" in str(api_versions.mismatch("2.2"))


def test_plugin_api_1_0_is_refused_with_what_changed_and_1_1_is_served_as_2_0():
    """1.1 changed 1.0's kernel contract (float64 lse, [M, K] tokens, option objects): 1.0
    plugins are refused saying so; 1.1 named the contract that 2.0 now numbers honestly."""
    refused = str(api_versions.mismatch("1.0"))
    assert "no longer serves" in refused and "lse in float64" in refused
    assert 'declare RLK_PLUGIN_API = "2.1"' in refused
    assert api_versions.mismatch("1.1") is None
    assert api_versions.served_as("1.1") == "2.0"
    assert "rlk-core speaks 2.1" in str(api_versions.mismatch("3.0"))


def test_plugin_without_a_hook_is_failed_not_silently_empty(use_plugins):
    use_plugins(hookless="fake_plugins:hookless")
    rlk.backends("cpu")
    record = _records()["hookless"]
    assert record.status == "failed"
    assert "implements no rlk_register hook" in record.error


def test_unknown_plugin_filter_names_are_warned(use_plugins, fresh_rlk, caplog):
    fresh_rlk.setenv("RLK_DISABLE_PLUGINS", "fsat")
    use_plugins(fast="fake_plugins:fast")
    with caplog.at_level(logging.WARNING, logger="rlk"):
        rlk.backends("cpu")
    messages = [r.getMessage() for r in caplog.records]
    assert any("RLK_DISABLE_PLUGINS names 'fsat'" in m and "did you mean 'fast'" in m
               for m in messages), messages


def _exit_status(pid: int, timeout: float) -> int | None:
    """The child's exit code, or None (after killing it) if it has not ended by `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _fork_during_a_stalled_load(release_after: float | None,
                                expected: set[str]) -> tuple[int | None, float]:
    """Fork while another thread's plugin load is stalled (released after `release_after`
    seconds, or once the fork returns); the child loads and exits 0 if the `expected`
    backends are there. The child's status (None: it hung) and how long the fork took."""
    stalling = fake_plugins.Stalling
    stalling.started.clear()
    stalling.release.clear()
    loading = threading.Thread(target=rlk.backends, args=("cpu",))
    loading.start()
    try:
        assert stalling.started.wait(30)
        if release_after is not None:
            threading.Timer(release_after, stalling.release.set).start()
        began = time.monotonic()
        with warnings.catch_warnings():  # "this process is multi-threaded": the point here
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: load, and say whether the stalled plugins are there
            code = 3
            try:
                names = [b.name for b in rlk.backends("cpu")]
                code = 0 if expected <= set(names) else 4
            finally:
                os._exit(code)
        took = time.monotonic() - began
        return _exit_status(pid, timeout=60), took
    finally:
        stalling.release.set()
        loading.join()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.parametrize("stalled_in", ["hook", "import"])
def test_a_fork_waits_for_another_threads_plugin_load(use_plugins, monkeypatch, stalled_in):
    """Forked mid-load, the child would inherit locks held by a thread it lacks: the loader's
    and, mid-import, Python's lock on that module (the child then hung at its import)."""
    if stalled_in == "hook":
        use_plugins(stalling="fake_plugins:stalling")
        expected = {"stalling"}
    else:
        monkeypatch.delitem(sys.modules, "fake_plugin_stalling_import", raising=False)
        use_plugins(stalling_import="fake_plugin_stalling_import:plugin")
        expected = {"stalling_import"}
    status, took = _fork_during_a_stalled_load(release_after=0.5, expected=expected)
    assert took >= 0.4, f"the fork did not wait for the load ({took:.2f} s)"
    assert status == 0, "the forked child hung" if status is None else status


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_child_forked_after_the_wait_ran_out_loads_plugins_itself(use_plugins, monkeypatch):
    """Past FORK_WAIT_S the fork goes ahead: the child gets a free loader lock and loads."""
    monkeypatch.setattr(rlk.plugins, "FORK_WAIT_S", 0.2)
    use_plugins(stalling="fake_plugins:stalling")
    status, took = _fork_during_a_stalled_load(release_after=None, expected={"stalling"})
    assert took < 10, f"the fork waited {took:.1f} s, past FORK_WAIT_S"
    assert status == 0, "the forked child hung on the loader's lock" if status is None else status
