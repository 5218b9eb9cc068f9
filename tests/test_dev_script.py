"""tools/dev.sh as a new user meets it: help names its commands, a bare call runs nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "tools/dev.sh"), *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_help_names_the_two_commands():
    done = _run("--help")
    assert done.returncode == 0
    assert "main " in done.stdout and "test " in done.stdout and "-s SESSION" in done.stdout


def test_a_bare_call_prints_usage_and_runs_no_session():
    done = _run()
    assert done.returncode == 2
    assert "usage: bash tools/dev.sh COMMAND" in done.stderr
    assert "nox" not in done.stdout


def test_an_unknown_command_is_refused():
    done = _run("tset")
    assert done.returncode == 2
    assert "unknown command 'tset'" in done.stderr
