"""Choosing the logp forward (RLK_CUDA_LOGP_FORWARD) without a GPU: parsing, the reasons the
bulk-copy path cannot run, and the error when it is forced where it cannot."""

from __future__ import annotations

import types

import pytest

from rlk_cuda import _ext, logp_path


@pytest.mark.parametrize(("value", "expected"), [("", "generic"), ("generic", "generic"),
                                                 (" TMA ", "tma"), ("tma", "tma")])
def test_requested_parses_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    monkeypatch.setenv(logp_path.ENV, value)
    assert logp_path.requested() == expected


def test_unset_means_generic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(logp_path.ENV, raising=False)
    assert logp_path.requested() == "generic"


def test_unknown_value_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logp_path.ENV, "wgmma")
    with pytest.raises(ValueError, match=r"RLK_CUDA_LOGP_FORWARD must be one of generic, tma; "
                                         r"got 'wgmma'"):
        logp_path.requested()


@pytest.mark.parametrize(
    ("built", "capability", "reason"),
    [
        (True, (9, 0), None),
        (False, (9, 0), "no sm_90a code"),
        (True, (8, 0), "sm_90 devices only; this device is sm_80"),
        (True, (10, 0), "this device is sm_100"),
        (True, (9, 1), "this device is sm_91"),
    ],
)
def test_tma_unavailable(built: bool, capability: tuple[int, int], reason: str | None) -> None:
    found = logp_path.tma_unavailable(built, capability)
    assert found is None if reason is None else (found is not None and reason in found)


def _fake(monkeypatch: pytest.MonkeyPatch, built: bool, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(_ext, "load", lambda: types.SimpleNamespace(TMA_BUILT=built))
    monkeypatch.setattr(logp_path, "_capability", lambda device: capability)


def test_generic_never_looks_at_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logp_path.ENV, "generic")
    monkeypatch.setattr(_ext, "load", lambda: pytest.fail("generic must not need TMA_BUILT"))
    assert logp_path.use_tma(0) is False


def test_forced_tma_runs_where_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logp_path.ENV, "tma")
    _fake(monkeypatch, True, (9, 0))
    assert logp_path.use_tma(0) is True


@pytest.mark.parametrize(("built", "capability", "why"),
                         [(False, (9, 0), "no sm_90a code"), (True, (8, 0), "sm_80")])
def test_forced_tma_without_support_raises(
    monkeypatch: pytest.MonkeyPatch, built: bool, capability: tuple[int, int], why: str
) -> None:
    monkeypatch.setenv(logp_path.ENV, "tma")
    _fake(monkeypatch, built, capability)
    with pytest.raises(RuntimeError, match=rf"RLK_CUDA_LOGP_FORWARD=tma: .*{why}"):
        logp_path.use_tma(0)


def test_extension_says_whether_the_tma_path_was_built() -> None:
    ext = _ext.load()
    assert ext.TMA_BUILT == any(a.startswith("90a") for a in _ext.architectures())


@pytest.mark.parametrize(("vocab", "segments"),
                         [(0, 1), (1, 1), (32768, 1), (32769, 2), (151936, 5), (262144, 8)])
def test_tma_segments_depend_on_the_vocabulary_only(vocab: int, segments: int) -> None:
    assert _ext.load().logp_forward_tma_segments(vocab) == segments
