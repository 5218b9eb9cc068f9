"""pytest hooks of the conformance kit, loaded through the `pytest11` entry point.

pytest loads it into every run where rlk-core is installed, so on its own it only adds its
options and parametrises the kit's own tests (those asking for `rlk_case` / `rlk_op`). The
`gpu` marker (tests carrying it skip without a CUDA device) acts only when asked for:
`--rlk-backend` given, or `-p rlk.testing` (rlk's own test runs pass it): a project that
merely has rlk installed keeps its own `gpu` tests as it wrote them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch

RLK_VARIABLES = ("RLK_BACKENDS", "RLK_STRICT", "RLK_PLUGINS", "RLK_DISABLE_PLUGINS",
                 "RLK_STRICT_PLUGINS", "RLK_CHECK_INPUTS", "RLK_NATIVE_CHUNK_MB")


@pytest.fixture
def fresh_rlk(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """rlk with no RLK_* variables and a dispatcher rebuilt on first use; the monkeypatch
    it yields sets what a test needs (call rlk.dispatch.reset() after changing plugins)."""
    from rlk import config, dispatch

    for name in RLK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    dispatch.reset()
    config.reset_check_inputs()
    yield monkeypatch
    dispatch.reset()
    config.reset_check_inputs()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rlk", "rlk conformance kit")
    group.addoption("--rlk-backend", default=None,
                    help="backend whose kernels the conformance kit checks (default: native)")
    group.addoption("--rlk-device", default=None,
                    help="device to run the kit on (default: cuda if available, else cpu)")


def asked_for(config: pytest.Config) -> bool:
    """Whether this run opted in to more than the kit's options (see the module docstring)."""
    return (config.getoption("--rlk-backend") is not None
            or config.pluginmanager.has_plugin("rlk.testing"))


def kit_backend(config: pytest.Config) -> str:
    return config.getoption("--rlk-backend") or "native"


def pytest_configure(config: pytest.Config) -> None:
    if asked_for(config):
        config.addinivalue_line("markers",
                                "gpu: needs a CUDA (or ROCm) device; skipped without one")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.option.tbstyle == "auto" and any(_KIT_MODULE in i.nodeid for i in items):
        config.option.tbstyle = "short"  # one fault fails hundreds of cases: keep each short
    if not asked_for(config) or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def kit_device(config: pytest.Config) -> torch.device:
    chosen = config.getoption("--rlk-device")
    if chosen is None:
        chosen = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(chosen)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    from rlk.testing.cases import backend_kernels, conformance_cases

    backend = kit_backend(metafunc.config)
    if "rlk_case" in metafunc.fixturenames:
        cases: list[Any] = conformance_cases(backend, kit_device(metafunc.config))
        metafunc.parametrize("rlk_case", cases, ids=[case.id for case in cases])
    if "rlk_op" in metafunc.fixturenames:
        ops = sorted(backend_kernels(backend))
        metafunc.parametrize("rlk_op", ops, ids=ops)


_KIT_MODULE = "test_conformance.py"
_NUMBER = re.compile(r"-?\b\d+(\.\d+)?(e[-+]?\d+)?\b")


def cause(report: pytest.TestReport) -> str:
    """A failure's cause without its case's numbers: the exception's first line with every
    number written '#', so one fault seen by many cases reads as one cause."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    first = text.strip().splitlines()[0] if text.strip() else "unknown"
    return _NUMBER.sub("#", first)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    """After a kit run, each distinct cause of its failures once, with a count and a case."""
    failed = [r for r in terminalreporter.stats.get("failed", [])
              if _KIT_MODULE in r.nodeid and r.when == "call"]
    if not failed:
        return
    counts = Counter(cause(r) for r in failed)
    example: dict[str, str] = {}
    for report in failed:
        example.setdefault(cause(report), report.nodeid.rsplit("::", 1)[-1])
    terminalreporter.section(f"rlk conformance kit: {len(failed)} failed, "
                             f"{len(counts)} distinct cause(s)")
    for text, count in counts.most_common():
        terminalreporter.line(f"{count:6} x {text}")
        terminalreporter.line(f"         e.g. {example[text]}")
