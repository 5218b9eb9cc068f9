"""The kernel boundary: results are checked by metadata, errors name the backend that raised."""

from __future__ import annotations

import json

import pytest
import torch

import rlk


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return torch.randn(5, 24, generator=gen), torch.randint(0, 24, (5,), generator=gen)


def test_a_float64_result_is_refused_naming_the_backend(use_plugins):
    use_plugins(float64="fake_plugins:float64")
    with pytest.raises(rlk.KernelError, match=r"backend 'float64'.*float64 \[5\]") as err:
        rlk.logp(*_inputs())
    assert "float32 [5]" in str(err.value)
    assert "RLK_DISABLE_PLUGINS=float64" in str(err.value)


def test_a_float64_result_is_refused_under_torch_compile(use_plugins):
    """Compiled code trusts the op's fake (float32): a float64 result was silently misread."""
    use_plugins(float64="fake_plugins:float64")
    compiled = torch.compile(lambda x, t: rlk.logp(x, t) * 2, backend="aot_eager",
                             fullgraph=True)
    with pytest.raises(rlk.KernelError, match="backend 'float64'"):
        compiled(*_inputs())


@pytest.mark.parametrize(("plugin", "problem"), [("short", r"float32 \[4\] on cpu; the contract "
                                                           r"is float32 \[5\]"),
                                                  ("noneresult", "1 output")])
def test_wrong_shape_or_none_results_are_refused(use_plugins, plugin, problem):
    use_plugins(**{plugin: f"fake_plugins:{plugin}"})
    with pytest.raises(rlk.KernelError, match=problem):
        rlk.logp(*_inputs())


def test_a_nested_failure_names_the_backend_that_raised(use_plugins, capsys):
    """native linear_logp runs its chunks through the selected logp kernel: a broken
    third-party logp must be named (with the way around), not blamed on native."""
    from rlk.cli import main

    use_plugins(exploding="fake_plugins:exploding")
    gen = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(4, 8, generator=gen), torch.randn(16, 8, generator=gen)
    tokens = torch.randint(0, 16, (4,), generator=gen)
    selection = rlk.explain("linear_logp", hidden, weight, tokens)
    assert selection.backend == "native" and selection.uses == ("logp",)
    with pytest.raises(RuntimeError, match="illegal memory access") as err:
        rlk.linear_logp(hidden, weight, tokens)
    notes = "\n".join(getattr(err.value, "__notes__", []))
    assert "raised by backend 'exploding'" in notes
    assert "RLK_DISABLE_PLUGINS=exploding" in notes
    assert "inside backend 'native'" in notes
    assert main(["doctor", "--smoke", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    smoke = [f for f in report["findings"] if f["id"] == "smoke-failed"
             and "'linear_logp'" in f["message"]]
    assert smoke and "raised by backend 'exploding'" in smoke[0]["message"]
    assert "RLK_DISABLE_PLUGINS=exploding" in smoke[0]["hint"]
    assert report["matrix"]["cpu"]["linear_logp"]["uses"] == ["logp"]


@pytest.mark.parametrize(("plugin", "problem"), [
    ("scribbling", "wrote its input 'logits'"),
    ("nanresult", r"returned NaN in output 0 at \[0\], where the op's inputs give a number"),
    ("aliasing", "returned output 0 sharing memory with its input 'logits'"),
])
def test_value_faults_are_refused_under_value_checks_in_both_paths(use_plugins, fresh_rlk,
                                                                   plugin, problem):
    """Faults metadata cannot see: by default they pass (the checks cost a device sync), under
    RLK_CHECK_INPUTS=1 they raise naming the backend, eagerly and through the torch op."""
    use_plugins(**{plugin: f"fake_plugins:{plugin}"})
    logits, tokens = _inputs()
    rlk.logp(logits.clone(), tokens.clone())
    fresh_rlk.setenv("RLK_CHECK_INPUTS", "1")
    expected = rf"backend '{plugin}' broke the 'logp' contract: .*{problem}"
    with pytest.raises(rlk.KernelError, match=expected):
        rlk.logp(logits.clone(), tokens.clone())
    with pytest.raises(rlk.KernelError, match=expected):
        torch.ops.rlk.logp(logits.clone(), tokens.clone(), None, 1.0, -100, None)


def test_value_checks_allow_nan_where_the_contract_gives_it(fresh_rlk):
    fresh_rlk.setenv("RLK_CHECK_INPUTS", "1")
    logits, tokens = _inputs()
    logits[1, 3] = float("nan")
    logits[2] = float("-inf")
    logp = rlk.logp(logits, tokens, ignore_index=tokens[4].item())
    assert logp[1:3].isnan().all() and logp[[0, 3, 4]].isfinite().all()
