"""A third-party backend distribution (tests/plugins/rlk-testbackend), found by entry points."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import rlk
from rlk import dispatch
from rlk_testbackend import FAILING_PLUGINS


def _inputs():
    gen = torch.Generator().manual_seed(3)
    return torch.randn(5, 40, generator=gen), torch.randint(0, 40, (5,), generator=gen)


def _records() -> dict[str, rlk.BackendInfo]:
    return {r.name: r for r in rlk.backends("cpu")}


def test_discovered_through_entry_points(fresh_rlk):
    records = _records()
    assert records["testbackend"].distribution == "rlk-testbackend"
    assert records["testbackend"].status == "unavailable"
    assert "RLK_TESTBACKEND=1" in records["testbackend"].reason
    assert records["faraway"].status == "unavailable"
    assert records["faraway"].reason == "needs a Faraway accelerator (none found)"
    assert records["broken"].status == "blocked"


def test_third_party_backend_takes_priority_over_native(fresh_rlk):
    fresh_rlk.setenv("RLK_TESTBACKEND", "1")
    logits, tokens = _inputs()
    selection = rlk.explain("logp", logits, tokens)
    assert selection.backend == "testbackend"
    assert selection.rejected["faraway"] == "needs a Faraway accelerator (none found)"
    with rlk.use_backends("native"):
        native = rlk.logp(logits, tokens)
    torch.testing.assert_close(rlk.logp(logits, tokens), native, atol=2e-5, rtol=1e-5)
    assert rlk.explain("logp", logits.bfloat16(), tokens).backend == "native"


def test_failing_plugins_leave_the_host_working(fresh_rlk):
    fresh_rlk.delenv("RLK_DISABLE_PLUGINS")
    dispatch.reset()
    records = _records()
    assert records["broken"].status == "failed"
    assert "librlk_broken.so" in records["broken"].reason
    assert "plugin API 0.9" in records["oldapi"].reason
    assert "could not read the device table" in records["badhook"].reason
    assert "halfway" not in records  # a failed hook leaves nothing behind
    assert records["lazyfail"].status == "failed"
    assert "undefined symbol" in records["lazyfail"].reason
    logits, tokens = _inputs()
    selection = rlk.explain("logp", logits, tokens)
    assert selection.backend == "native"
    assert "failed to import" in selection.rejected["lazyfail"]
    assert torch.isfinite(rlk.logp(logits, tokens)).all()


def test_strict_mode_refuses_the_fallback(fresh_rlk):
    logits, tokens = _inputs()
    with rlk.use_backends("testbackend", strict=True), pytest.raises(
        rlk.BackendUnavailableError
    ) as err:
        rlk.logp(logits, tokens)
    assert "RLK_TESTBACKEND=1" in err.value.reasons["testbackend"]


def test_conformance_kit_runs_on_the_third_party_backend(tmp_path):
    env = dict(os.environ, RLK_TESTBACKEND="1", RLK_DISABLE_PLUGINS=FAILING_PLUGINS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "rlk.testing", "--rlk-backend", "testbackend",
         "-q", "-p", "no:cacheprovider", "-k", "small or ignore or rows or temperature or inf"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
    assert "test_batch_invariance" in done.stdout or "passed" in done.stdout
