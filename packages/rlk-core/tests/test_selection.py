"""Selection edge cases: recorded causes, strict scopes per op, kernels without backward,
argument contracts of policies, probes and checks, unknown names."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import rlk
from rlk.registry import Registry


def _inputs(requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 32, generator=gen).requires_grad_(requires_grad)
    return logits, torch.randint(0, 32, (4,), generator=gen)


def test_strict_names_the_recorded_cause_of_a_missing_backend(use_plugins, fresh_rlk):
    use_plugins(mine="fake_plugins:no_such_plugin")
    with rlk.use_backends("mine", strict=True), pytest.raises(rlk.BackendUnavailableError) as err:
        rlk.logp(*_inputs())
    reason = err.value.reasons["mine"]
    assert "plugin 'mine'" in reason and "failed to load" in reason
    assert "no_such_plugin" in reason
    fresh_rlk.setenv("RLK_DISABLE_PLUGINS", "mine")
    use_plugins(mine="fake_plugins:fast")
    with rlk.use_backends("mine", strict=True), pytest.raises(rlk.BackendUnavailableError) as err:
        rlk.logp(*_inputs())
    assert "disabled by RLK_DISABLE_PLUGINS" in err.value.reasons["mine"]


def test_strict_binds_only_the_ops_a_named_backend_serves(use_plugins):
    use_plugins(fast="fake_plugins:fast")  # 'fast' serves logp only
    logits, tokens = _inputs()
    with rlk.use_backends("fast", strict=True):
        assert rlk.explain("logp", logits, tokens).backend == "fast"
        tokens_drawn = rlk.sample(logits, seed=1).tokens  # other ops keep their backends
        assert rlk.explain("sample", logits).backend == "native"
        with pytest.raises(rlk.BackendUnavailableError):
            rlk.logp(logits.bfloat16(), tokens)  # fast refuses bf16: no fallback for logp
    assert tokens_drawn.shape == (4,)
    with rlk.use_backends("ghost", strict=True), pytest.raises(rlk.BackendUnavailableError):
        rlk.sample(logits, seed=1)  # a named backend that is not there binds every op


def test_kernel_without_backward_is_declined_when_an_input_requires_grad(use_plugins):
    use_plugins(nobackward="fake_plugins:nobackward")
    logits, tokens = _inputs(requires_grad=True)
    selection = rlk.explain("logp", logits, tokens)
    assert selection.backend == "native"
    assert "registers no backward" in selection.rejected["nobackward"]
    rlk.logp(logits, tokens).sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert rlk.explain("logp", logits.detach(), tokens).backend == "nobackward"


def test_require_takes_one_property_name(use_plugins):
    use_plugins(fast="fake_plugins:fast")
    with rlk.use_backends(require="batch_invariant"):
        selection = rlk.explain("logp", *_inputs())
    assert selection.backend == "fast"
    assert selection.rejected["native"] == "lacks required property batch_invariant"


def test_policy_and_registration_arguments_are_checked(fresh_rlk):
    with pytest.raises(TypeError, match="strict must be True, False or None"), \
            rlk.use_backends("native", strict="no"):  # type: ignore[arg-type]
        pass
    registry = Registry(["logp"])
    with pytest.raises(TypeError, match="priority must be an int"):
        registry.add_backend("mine", priority=True)
    registry.add_backend("mine", priority=1)
    registry.add_kernel("logp", "mine", "a:b", devices="cpu", properties="batch_invariant")
    (kernel,) = registry.kernels["logp"]
    assert kernel.devices == ("cpu",)
    assert kernel.properties == frozenset({"batch_invariant"})


@pytest.mark.parametrize(("plugin", "answer"), [("falsecheck", "False"), ("emptycheck", "''")])
def test_checks_answering_neither_none_nor_a_reason_refuse_saying_so(use_plugins, plugin,
                                                                     answer):
    use_plugins(**{plugin: f"fake_plugins:{plugin}"})
    selection = rlk.explain("logp", *_inputs())
    assert selection.backend == "native"
    reason = selection.rejected[plugin]
    assert isinstance(reason, str) and f"check returned {answer}" in reason


def test_a_raising_probe_makes_the_backend_failed(use_plugins, capsys):
    from rlk.cli import main

    use_plugins(badprobe="fake_plugins:badprobe")
    record = {r.name: r for r in rlk.backends("cpu")}["badprobe"]
    assert record.status == "failed"
    assert "probe raised OSError: cannot read /dev/faraway" in record.reason
    assert main(["doctor", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any(f["id"] == "probe-failed" and "badprobe" in f["message"]
               for f in report["findings"])


def test_unknown_backend_names_are_warned_and_found(use_plugins, fresh_rlk, caplog, capsys):
    from rlk.cli import main

    fresh_rlk.setenv("RLK_BACKENDS", "Fast")
    use_plugins(fast="fake_plugins:fast")
    with caplog.at_level(logging.WARNING, logger="rlk"):
        rlk.logp(*_inputs())
    messages = [r.getMessage() for r in caplog.records]
    assert any("'Fast'" in m and "did you mean 'fast'" in m for m in messages), messages
    main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert any(f["id"] == "unknown-name" and "RLK_BACKENDS names 'Fast'" in f["message"]
               for f in report["findings"])


def test_under_compile_a_kernel_without_backward_fails_at_backward_naming_the_way_out(
        use_plugins):
    """Inside a compiled graph tensors do not say they require grad, so the kernel without
    backward is chosen; its backward must then say what to do, not just that it is missing."""
    use_plugins(nobackward="fake_plugins:nobackward")
    logits, tokens = _inputs(requires_grad=True)
    compiled = torch.compile(lambda x, t: rlk.logp(x * 1.0, t), backend="aot_eager",
                             fullgraph=True)
    loss = compiled(logits, tokens).sum()
    with pytest.raises(NotImplementedError, match=r"registered no backward.*use_backends"):
        loss.backward()
