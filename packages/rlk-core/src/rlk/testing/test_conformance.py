"""The conformance suite: every op a backend registers, against the float64 reference."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import rlk
from rlk.dispatch import get_dispatcher
from rlk.testing.cases import Case
from rlk.testing.compare import assert_bitwise_equal, assert_matches
from rlk.testing.poison import poisoned_allocations


def _usable(case: Case) -> None:
    backend = get_dispatcher().registry.backends[case.kernel.backend]
    verdict = backend.probe_device(case.device)
    if verdict is not None:
        pytest.skip(f"backend '{backend.name}' cannot serve {case.device}: {verdict}")
    if case.device.type not in case.kernel.devices:
        pytest.skip(f"kernel serves {case.kernel.devices}, not {case.device.type}")
    if case.kernel.check is not None:
        reason = case.kernel.check(**case.sample.args)
        if reason is not None:
            pytest.skip(f"kernel check refuses this case: {reason}")


def _clone(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _poison_outs(args: dict[str, Any]) -> None:
    for key, value in args.items():
        if key.startswith("out") and isinstance(value, torch.Tensor):
            value.fill_(float("nan"))


def test_forward_matches_reference(rlk_case: Case) -> None:
    _usable(rlk_case)
    spec, args = rlk_case.spec, _clone(rlk_case.sample.args)
    _poison_outs(args)
    pristine = _clone(args)
    with poisoned_allocations():
        result = rlk_case.kernel.forward(**args)
    expected = spec.reference(pristine)
    actual = spec.outputs(result, args)
    assert len(actual) == len(expected), f"{len(actual)} outputs, reference has {len(expected)}"
    tolerance = spec.tolerances[rlk_case.dtype]
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        assert_matches(f"{spec.name} output {index}", got, want, tolerance)
    for key, value in pristine.items():
        if isinstance(value, torch.Tensor) and not key.startswith("out"):
            assert_bitwise_equal(f"input '{key}' after the call", args[key], value)


def test_backward_matches_reference(rlk_case: Case) -> None:
    spec = rlk_case.spec
    if spec.grad_check is None or not rlk_case.sample.check_backward:
        pytest.skip("no backward for this op or this case")
    _usable(rlk_case)
    assert spec.grad_tolerances is not None
    gen = torch.Generator().manual_seed(99)
    with poisoned_allocations():
        checks = list(spec.grad_check(rlk_case.kernel, _clone(rlk_case.sample.args), gen))
    assert checks, "grad_check produced no comparison"
    for name, got, want in checks:
        assert got.dtype == rlk_case.dtype or got.dtype == torch.float32, name
        assert_matches(f"{spec.name} {name}", got, want, spec.grad_tolerances[rlk_case.dtype])


def test_opcheck(rlk_case: Case) -> None:
    if rlk_case.dtype != torch.float32:
        pytest.skip("opcheck checks registration, not numerics: float32 is enough")
    _usable(rlk_case)
    if any(bool(t.isnan().any()) for t in rlk_case.spec.reference(rlk_case.sample.args)):
        pytest.skip("opcheck compares outputs without NaN equality")
    op, op_args = rlk_case.spec.opcheck_case(_clone(rlk_case.sample.args))
    with rlk.use_backends(rlk_case.kernel.backend, strict=True):
        torch.library.opcheck(op, op_args)


def test_batch_invariance(rlk_case: Case) -> None:
    spec = rlk_case.spec
    if "batch_invariant" not in rlk_case.kernel.properties or spec.batch_slice is None:
        pytest.skip("the kernel does not claim batch invariance")
    _usable(rlk_case)
    args = rlk_case.sample.args
    rows = args[spec.main_input].shape[0]
    if rows < 2 or spec.batch_slice(args, 0, rows) is None:
        pytest.skip("needs a batch of at least two rows without row selection")
    full = spec.outputs(rlk_case.kernel.forward(**_clone(args)), args)
    for start, stop in ((0, 1), (1, rows), (rows // 2, rows)):
        part_args = spec.batch_slice(_clone(args), start, stop)
        assert part_args is not None
        part = spec.outputs(rlk_case.kernel.forward(**part_args), part_args)
        for index, (whole, piece) in enumerate(zip(full, part, strict=True)):
            assert_bitwise_equal(f"output {index} rows [{start}, {stop})", piece,
                                 whole[start:stop])
