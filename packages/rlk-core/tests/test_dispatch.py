"""Selection, preferences, strict mode, caching and plugin isolation, with in-test plugins."""

from __future__ import annotations

import asyncio
import logging
from importlib import metadata

import fake_plugins
import pytest
import torch

import rlk
from rlk import dispatch, plugins


def _use(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    group = plugins.ENTRY_POINT_GROUP
    points = [metadata.EntryPoint(name=n, value=f"fake_plugins:{n}", group=group) for n in names]
    monkeypatch.setattr(plugins, "_entry_points", lambda: points)
    dispatch.reset()


def _inputs(rows: int = 4, vocab: int = 32):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(rows, vocab, generator=gen), torch.randint(0, vocab, (rows,), generator=gen)


def test_highest_priority_backend_serves(fresh_rlk):
    _use(fresh_rlk, "fast")
    logits, tokens = _inputs()
    before = fake_plugins.calls["fast"]
    rlk.logp(logits, tokens)
    assert fake_plugins.calls["fast"] == before + 1
    assert rlk.explain("logp", logits, tokens).backend == "fast"


def test_dtype_and_check_rejections_fall_back_with_reasons(fresh_rlk):
    _use(fresh_rlk, "fast")
    logits, tokens = _inputs()
    selection = rlk.explain("logp", logits.bfloat16(), tokens)
    assert selection.backend == "native"
    assert "does not take bfloat16" in selection.rejected["fast"]
    per_row = rlk.explain("logp", logits, tokens, temperature=torch.ones(4))
    assert per_row.rejected["fast"] == "per-row temperature is not supported"


def test_probe_refusal_is_reported(fresh_rlk):
    _use(fresh_rlk, "picky", "fast")
    selection = rlk.explain("logp", *_inputs())
    assert selection.backend == "fast"
    assert selection.rejected["picky"] == "needs a picky device"


def test_preference_order_from_environment_and_scope(fresh_rlk):
    fresh_rlk.setenv("RLK_BACKENDS", "native")
    _use(fresh_rlk, "fast")
    logits, tokens = _inputs()
    assert rlk.explain("logp", logits, tokens).backend == "native"
    with rlk.use_backends("fast"):
        assert rlk.explain("logp", logits, tokens).backend == "fast"
        with rlk.use_backends("native"):
            assert rlk.explain("logp", logits, tokens).backend == "native"
        assert rlk.explain("logp", logits, tokens).backend == "fast"


def test_strict_mode_raises_with_every_reason(fresh_rlk):
    _use(fresh_rlk, "fast", "picky")
    logits, tokens = _inputs()
    with rlk.use_backends("picky", strict=True), pytest.raises(rlk.BackendUnavailableError) as err:
        rlk.logp(logits, tokens)
    assert err.value.reasons["picky"] == "needs a picky device"
    assert "strict mode allows only picky" in err.value.reasons["native"]
    assert "needs a picky device" in str(err.value)


def test_strict_from_environment_without_order_forbids_any_fallback(fresh_rlk):
    fresh_rlk.setenv("RLK_STRICT", "1")
    _use(fresh_rlk, "fast")
    logits, tokens = _inputs()
    rlk.logp(logits, tokens)  # fast is the top backend: allowed
    with pytest.raises(rlk.BackendUnavailableError):
        rlk.logp(logits.double().float().bfloat16(), tokens)  # fast refuses bf16


def test_require_property_filters_kernels(fresh_rlk):
    _use(fresh_rlk, "fast")
    logits, tokens = _inputs()
    with rlk.use_backends("native", require=("batch_invariant",)):
        selection = rlk.explain("logp", logits, tokens)
    assert selection.backend == "fast"
    assert "lacks required property batch_invariant" in selection.rejected["native"]


def test_decision_is_cached(fresh_rlk):
    _use(fresh_rlk, "fast")
    logits, tokens = _inputs()
    rlk.logp(logits, tokens)
    checks = fake_plugins.calls["check"]
    for _ in range(5):
        rlk.logp(logits, tokens)
    assert fake_plugins.calls["check"] == checks


def test_fallback_is_logged_once(fresh_rlk, caplog):
    _use(fresh_rlk, "fast")
    logits, tokens = _inputs()
    with caplog.at_level(logging.WARNING, logger="rlk"):
        for _ in range(3):
            rlk.logp(logits.bfloat16(), tokens)
            rlk.logp(logits.half(), tokens)
    messages = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    assert len(messages) == 2, messages
    assert "from backend 'fast' to 'native'" in messages[0]


def test_kernel_errors_reach_the_caller(fresh_rlk):
    _use(fresh_rlk, "exploding")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        rlk.logp(*_inputs())


def test_plugin_filters(fresh_rlk):
    fresh_rlk.setenv("RLK_DISABLE_PLUGINS", "fast")
    _use(fresh_rlk, "fast", "picky")
    records = {r.name: r for r in rlk.backends("cpu")}
    assert records["fast"].status == "blocked"
    assert "RLK_DISABLE_PLUGINS" in records["fast"].reason
    fresh_rlk.delenv("RLK_DISABLE_PLUGINS")
    fresh_rlk.setenv("RLK_PLUGINS", "picky")
    dispatch.reset()
    records = {r.name: r for r in rlk.backends("cpu")}
    assert records["fast"].status == "blocked"
    assert records["picky"].status == "unavailable"


def test_duplicate_backend_is_isolated(fresh_rlk, caplog):
    _use(fresh_rlk, "duplicate", "fast")
    with caplog.at_level(logging.WARNING, logger="rlk"):
        records = {r.name: r for r in rlk.backends("cpu")}
    assert records["duplicate"].status == "failed"
    assert "already registered" in records["duplicate"].reason
    assert records["native"].priority == 0
    assert records["fast"].status == "ready"
    assert any("duplicate" in r.getMessage() for r in caplog.records)


def test_strict_plugins_turns_failures_into_errors(fresh_rlk):
    fresh_rlk.setenv("RLK_STRICT_PLUGINS", "1")
    _use(fresh_rlk, "duplicate")
    with pytest.raises(rlk.PluginError, match="already registered"):
        rlk.backends("cpu")


def test_use_backends_rejects_bad_names():
    with pytest.raises(TypeError), rlk.use_backends(""):
        pass


def test_registry_rejects_malformed_registrations(fresh_rlk):
    from rlk.registry import Registry

    registry = Registry(["logp"])
    with pytest.raises(ValueError, match="before its kernels"):
        registry.add_kernel("logp", "ghost", "a:b")
    registry.add_backend("mine", priority=1)
    with pytest.raises(ValueError, match="unknown op"):
        registry.add_kernel("softmax", "mine", "a:b")
    with pytest.raises(ValueError, match=r"package\.module:function"):
        registry.add_kernel("logp", "mine", "no_colon")
    with pytest.raises(ValueError, match="identifier"):
        registry.add_backend("has space")


def test_strict_exclusions_are_not_logged_as_fallbacks(fresh_rlk, caplog):
    _use(fresh_rlk, "fast")
    with caplog.at_level(logging.WARNING, logger="rlk"), rlk.use_backends("native", strict=True):
        rlk.logp(*_inputs())
    assert not [r for r in caplog.records if "falls back" in r.getMessage()]


def test_backward_runs_under_the_forward_scope(fresh_rlk):
    """Regression: a strict scope around the forward must also choose the backward's kernel,
    even when .backward() runs outside it (or inside a scope the forward never saw)."""
    _use(fresh_rlk, "picky")
    logits, tokens = _inputs()
    leaf = logits.clone().requires_grad_(True)
    with rlk.use_backends("native", strict=True):
        logp = rlk.logp(leaf, tokens)
    with rlk.use_backends("picky", strict=True):
        logp.sum().backward()  # picky refuses every device: only the forward's scope works
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()


def test_a_scope_inside_a_suspended_generator_does_not_bind_the_caller(fresh_rlk):
    """Generators run in their caller's context: without care, a scope entered inside one
    stays in force for the caller while the generator waits at a `yield`."""
    _use(fresh_rlk, "fast")
    logits, tokens = _inputs()

    def batches():
        with rlk.use_backends("native"):
            yield rlk.explain("logp", logits, tokens).backend
            yield rlk.explain("logp", logits, tokens).backend

    stream = batches()
    assert next(stream) == "native"
    assert rlk.explain("logp", logits, tokens).backend == "fast"  # suspended: not its scope
    assert next(stream) == "native"  # resumed: its own scope again
    stream.close()
    assert rlk.explain("logp", logits, tokens).backend == "fast"


def test_interleaved_generators_keep_their_own_scopes(fresh_rlk):
    """Two generators suspended inside their scopes: the first leaving its scope must not
    take the second's with it (a context variable's reset restores the value from before
    the first one entered, which the fuzz suite's scope programs found)."""
    _use(fresh_rlk, "fast")
    logits, tokens = _inputs()

    def batches():
        with rlk.use_backends("native"):
            yield rlk.explain("logp", logits, tokens).backend
            yield rlk.explain("logp", logits, tokens).backend
        yield rlk.explain("logp", logits, tokens).backend

    first, second = batches(), batches()
    assert (next(first), next(second)) == ("native", "native")
    assert next(first) == "native"
    assert next(first) == "fast"  # the first left its scope
    assert next(second) == "native"  # the second is still inside its own
    assert rlk.explain("logp", logits, tokens).backend == "fast"
    assert next(second) == "fast"
    assert rlk.explain("logp", logits, tokens).backend == "fast"


def test_a_generator_scope_still_chooses_its_forwards_backward(fresh_rlk):
    _use(fresh_rlk, "picky")
    logits, tokens = _inputs()
    leaf = logits.clone().requires_grad_(True)

    def forwards():
        with rlk.use_backends("native", strict=True):
            yield rlk.logp(leaf, tokens)

    stream = forwards()
    logp = next(stream)
    with rlk.use_backends("picky", strict=True):
        logp.sum().backward()  # picky refuses every device: only the generator's scope works
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()
    stream.close()


def test_a_scope_inside_a_suspended_async_generator_does_not_bind_the_caller(fresh_rlk):
    _use(fresh_rlk, "fast")
    logits, tokens = _inputs()
    seen = []

    async def batches():
        with rlk.use_backends("native"):
            yield rlk.explain("logp", logits, tokens).backend

    async def consume():
        async for backend in batches():
            seen.append(backend)
            seen.append(rlk.explain("logp", logits, tokens).backend)

    asyncio.run(consume())
    assert seen == ["native", "fast"]


def test_a_preferred_lower_priority_backend_is_no_fallback(fresh_rlk, caplog):
    """fast (priority 50) could serve, but the user put native first: explain says so, and
    nothing is logged as a fallback."""
    _use(fresh_rlk, "fast")
    logits, tokens = _inputs()
    with caplog.at_level(logging.WARNING, logger="rlk"), rlk.use_backends("native"):
        selection = rlk.explain("logp", logits, tokens)
        rlk.logp(logits, tokens)
    assert selection.backend == "native" and selection.outranked == ("fast",)
    assert selection.rejected["fast"] == ("could serve this call, but 'native' comes first in "
                                          "the backend preference")
    assert not [r for r in caplog.records if "falls back" in r.getMessage()]
