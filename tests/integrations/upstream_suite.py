"""A framework's own unit tests of the functions rlk replaces, run with `patch()`.

The tests come from the framework's sdist on PyPI at the pinned version (CI reaches PyPI
only, and no framework code is committed here). `patch()` runs before collection, since
the tests import the functions by name. Each test is counted as routed when it reached an
rlk op; the run fails unless at least `min_routed` tests did, so a suite that silently
stops reaching rlk fails too.

    python tests/integrations/upstream_suite.py verl

verl 0.9.1 ships its tests in its sdist; TRL 1.16.0's sdist ships none (its half-precision
differences are pinned in test_trl_half_precision.py instead).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import rlk

# the rlk ops the adapters call
ROUTED_OPS = ("logp", "entropy", "logp_entropy", "linear_logp", "linear_logp_entropy",
              "policy_loss", "linear_policy_loss", "token_kl", "group_advantages")


@dataclass(frozen=True)
class Suite:
    distribution: str  # name==version, as pip takes it
    adapter: str  # rlk.integrations.<adapter>
    tests: tuple[str, ...]  # paths inside the sdist's top folder
    min_routed: int


SUITES = {
    # the files that test what rlk replaces (losses, KL penalties, GRPO/RLOO estimators);
    # 17 of their tests reach rlk, the others test verl's registries and GAE
    "verl": Suite("verl==0.9.1", "verl", (
        "tests/trainer/ppo/test_core_algos_on_cpu.py",
        "tests/trainer/ppo/test_dynamic_policy_losses_on_cpu.py",
        "tests/trainer/ppo/test_rollout_corr_integration.py",
    ), min_routed=17),
}


class RoutedCounter:
    """A pytest plugin: patch() before collection; which tests reached an rlk op."""

    def __init__(self, adapter: str, min_routed: int) -> None:
        self.adapter = importlib.import_module(f"rlk.integrations.{adapter}")
        self.min_routed = min_routed
        self.calls = 0
        self.routed: list[str] = []
        self.ran = 0
        self._saved: dict[str, Callable[..., Any]] = {}

    def _counting(self, op: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(op)
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return op(*args, **kwargs)
        return counted

    def pytest_configure(self, config: pytest.Config) -> None:
        for name in ROUTED_OPS:
            self._saved[name] = getattr(rlk, name)
            setattr(rlk, name, self._counting(self._saved[name]))
        self.adapter.patch()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.adapter.unpatch()
        for name, op in self._saved.items():
            setattr(rlk, name, op)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        before = self.calls
        try:
            return (yield)
        finally:
            self.ran += 1
            if self.calls > before:
                self.routed.append(item.nodeid)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_line(
            f"rlk served {len(self.routed)} of the {self.ran} tests run "
            f"(at least {self.min_routed} expected)")


def fetch_tests(suite: Suite, workdir: Path) -> Path:
    """The suite's test files, extracted from the framework's sdist; their root folder."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-binary", ":all:", "--dest", str(workdir), suite.distribution],
                   check=True)
    (sdist,) = workdir.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        wanted = {f"{top}/{path}" for path in suite.tests}
        packages = {f"{top}/{'/'.join(parts[:i])}/__init__.py"
                    for parts in (path.split("/") for path in suite.tests)
                    for i in range(1, len(parts))}
        members = [m for m in archive.getmembers() if m.name in wanted | packages]
        missing = wanted - {m.name for m in members}
        if missing:
            raise FileNotFoundError(f"{sdist.name} lacks {sorted(missing)}")
        archive.extractall(workdir, members=members, filter="data")
    return workdir / top


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("framework", choices=sorted(SUITES))
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest")
    args = parser.parse_args(argv)
    suite = SUITES[args.framework]
    counter = RoutedCounter(suite.adapter, suite.min_routed)
    with tempfile.TemporaryDirectory() as workdir:
        root = fetch_tests(suite, Path(workdir))
        status = pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", str(root),
                              *[str(root / path) for path in suite.tests], *args.pytest_args],
                             plugins=[counter])
    if status == 0 and len(counter.routed) < suite.min_routed:
        print(f"only {len(counter.routed)} tests reached rlk", file=sys.stderr)
        return 1
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
