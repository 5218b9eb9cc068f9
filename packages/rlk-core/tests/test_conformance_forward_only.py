"""The conformance kit on a forward-only kernel: its backward tests skip, naming why.

A backend may register a forward alone (rlk-quack's linear_logp); under --rlk-backend the
kit pins it, so a backward test that ran would reach the missing backward and fail.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlk.dispatch import get_dispatcher
from rlk.introspect import op_spec
from rlk.testing import test_conformance as kit
from rlk.testing.cases import Case


def _forward_only_case(op: str, dtype: torch.dtype) -> Case:
    dispatcher = get_dispatcher()
    dispatcher.loader.ensure_loaded()
    native = next(k for k in dispatcher.registry.kernels[op] if k.backend == "native")
    kernel = dataclasses.replace(native, backward_target=None)
    spec = op_spec(op)
    device = torch.device("cpu")
    sample = next(s for s in spec.samples(device, dtype) if s.check_backward)
    return Case(spec, kernel, dtype, sample, device)


@pytest.mark.parametrize("op", ["linear_logp", "logp"])
def test_backward_test_skips_a_kernel_without_a_backward(op: str):
    case = _forward_only_case(op, torch.bfloat16)
    with pytest.raises(pytest.skip.Exception, match="registered no backward"):
        kit.test_backward_matches_reference(case)


def test_opcheck_leaves_out_the_backward_for_a_kernel_without_one():
    """opcheck's AOT dispatch test backpropagates through the pinned kernel."""
    case = _forward_only_case("linear_logp", torch.float32)
    assert "test_aot_dispatch_dynamic" not in kit._opcheck_utils(case)


def test_a_kernel_with_a_backward_keeps_its_backward_tests():
    dispatcher = get_dispatcher()
    dispatcher.loader.ensure_loaded()
    case = dataclasses.replace(_forward_only_case("linear_logp", torch.float32),
                               kernel=next(k for k in dispatcher.registry.kernels["linear_logp"]
                                           if k.backend == "native"))
    assert "test_aot_dispatch_dynamic" in kit._opcheck_utils(case)
    kit.test_backward_matches_reference(case)
