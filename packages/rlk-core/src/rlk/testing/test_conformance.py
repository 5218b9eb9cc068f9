"""The conformance suite: every op a backend registers, against the float64 reference.

A backend that serves nothing it should fails here, with the reason: its probe refuses
(or raises on) the kit's device, or its checks refuse every sample of an op. Per-case
refusals by `check` are skipped with their reason.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

import rlk
from rlk._runtime.spec import specs
from rlk.dispatch import get_dispatcher
from rlk.registry import verdict
from rlk.testing.cases import Case, backend_kernels
from rlk.testing.compare import assert_bitwise_equal, assert_matches
from rlk.testing.plugin import kit_backend, kit_device
from rlk.testing.poison import poisoned_allocations


def test_backend_serves_the_kit_device(request: pytest.FixtureRequest) -> None:
    """The backend under test must accept the device the kit runs on (--rlk-device)."""
    name = kit_backend(request.config)
    device = kit_device(request.config)
    kernels = backend_kernels(name)
    assert kernels, f"backend '{name}' registers no kernel for any rlk op"
    result = get_dispatcher().registry.probe(name, device)
    what = "probe fails" if result.failed else "probe refuses"
    assert result.reason is None, f"backend '{name}' {what} {device}: {result.reason}"
    served = sorted(op for op, kernel in kernels.items() if device.type in kernel.devices)
    assert served, (f"backend '{name}' registers no kernel for {device.type} devices; "
                    f"run the kit with --rlk-device set to a device it serves")


def test_check_accepts_some_samples(request: pytest.FixtureRequest, rlk_op: str) -> None:
    """A kernel whose `check` refuses every conformance sample of its op serves nothing."""
    name = kit_backend(request.config)
    device = kit_device(request.config)
    kernel = backend_kernels(name)[rlk_op]
    if kernel.check is None or device.type not in kernel.devices:
        pytest.skip("no check to consult on this device")
    spec = specs()[rlk_op]
    reasons = []
    for dtype in [d for d in spec.dtypes if kernel.dtypes is None or d in kernel.dtypes]:
        for sample in spec.samples(device, dtype):
            reason = _check(kernel.check, sample.args)
            if reason is None:
                return
            reasons.append(reason)
    if not reasons:
        pytest.skip("no conformance samples on this device")
    pytest.fail(f"backend '{name}' check refuses every '{rlk_op}' sample, e.g.: {reasons[0]}")


def _check(check: Any, args: dict[str, Any]) -> str | None:
    try:
        return verdict("check", check(**args))
    except Exception as exc:
        return f"check raised {type(exc).__name__}: {exc}"


def _usable(case: Case) -> None:
    result = get_dispatcher().registry.probe(case.kernel.backend, case.device)
    if result.reason is not None:
        pytest.skip(f"backend '{case.kernel.backend}' cannot serve {case.device} "
                    f"(test_backend_serves_the_kit_device fails): {result.reason}")
    if case.device.type not in case.kernel.devices:
        pytest.skip(f"kernel serves {case.kernel.devices}, not {case.device.type}")
    if case.kernel.check is not None:
        reason = _check(case.kernel.check, case.sample.args)
        if reason is not None:
            pytest.skip(f"kernel check refuses this case: {reason}")


def _clone(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _poison_outs(args: dict[str, Any]) -> None:
    for key, value in args.items():
        if key.startswith("out") and isinstance(value, torch.Tensor):
            value.fill_(float("nan"))


def _assert_untouched(when: str, args: dict[str, Any], pristine: dict[str, Any]) -> None:
    """Kernels must not write their inputs (out= buffers aside)."""
    for key, value in pristine.items():
        if isinstance(value, torch.Tensor) and not key.startswith("out"):
            assert_bitwise_equal(f"input '{key}' {when}", args[key], value)


def test_forward_matches_reference(rlk_case: Case) -> None:
    _usable(rlk_case)
    spec, args = rlk_case.spec, _clone(rlk_case.sample.args)
    _poison_outs(args)
    pristine = _clone(args)
    with poisoned_allocations():
        result = rlk_case.bound.forward(**args)
    expected = spec.reference(pristine)
    actual = spec.outputs(result, args)
    assert len(actual) == len(expected), f"{len(actual)} outputs, reference has {len(expected)}"
    tolerance = spec.tolerances[rlk_case.dtype]
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        assert_matches(f"{spec.name} output {index}", got, want, tolerance)
    _assert_untouched("after the forward", args, pristine)


def _without_backward(case: Case) -> bool:
    """Whether the op's backward runs a kernel's backward and this kernel registered none
    (a forward-only kernel: rlk passes it over when an input requires grad)."""
    return case.spec.backward_kernel and case.kernel.backward_target is None


def test_backward_matches_reference(rlk_case: Case) -> None:
    spec = rlk_case.spec
    if spec.grad_check is None or not rlk_case.sample.check_backward:
        pytest.skip("no backward for this op or this case")
    if _without_backward(rlk_case):
        pytest.skip(f"backend '{rlk_case.kernel.backend}' registered no backward for "
                    f"'{spec.name}' (forward only)")
    _usable(rlk_case)
    assert spec.grad_tolerances is not None
    gen = torch.Generator().manual_seed(99)
    args = _clone(rlk_case.sample.args)
    pristine = _clone(args)
    with poisoned_allocations():
        checks = list(spec.grad_check(rlk_case.bound, args, gen))
    assert checks, "grad_check produced no comparison"
    _assert_untouched("after the backward", args, pristine)
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
        torch.library.opcheck(op, op_args, test_utils=_opcheck_utils(rlk_case))


def _opcheck_utils(case: Case) -> tuple[str, ...]:
    """opcheck's tests for the op. An operator that returns its own gradients (its forward
    computes them: linear_policy_loss) leaves out the AOT dispatch test: it backpropagates
    a cotangent into every output, and a cotangent on a gradient output asks for a second
    derivative, which rlk's kernels refuse by name (tests/test_autograd_modes.py). So does
    a kernel without a backward: the test backpropagates through the pinned kernel."""
    spec = case.spec
    utils = tuple(inspect.signature(torch.library.opcheck).parameters["test_utils"].default)
    if (spec.operator is not None and spec.operator.grad_outputs) or _without_backward(case):
        return tuple(name for name in utils if name != "test_aot_dispatch_dynamic")
    return utils


def test_batch_invariance(rlk_case: Case) -> None:
    spec = rlk_case.spec
    if "batch_invariant" not in rlk_case.kernel.properties or spec.batch_slice is None:
        pytest.skip("the kernel does not claim batch invariance")
    _usable(rlk_case)
    args = rlk_case.sample.args
    rows = args[spec.main_input].shape[0]
    if rows < 2 or spec.batch_slice(args, 0, rows) is None:
        pytest.skip("needs a batch of at least two rows without row selection")
    full = spec.outputs(rlk_case.bound.forward(**_clone(args)), args)
    for start, stop in ((0, 1), (1, rows), (rows // 2, rows)):
        part_args = spec.batch_slice(_clone(args), start, stop)
        assert part_args is not None
        part = spec.outputs(rlk_case.bound.forward(**part_args), part_args)
        for index, (whole, piece) in enumerate(zip(full, part, strict=True)):
            assert_bitwise_equal(f"output {index} rows [{start}, {stop})", piece,
                                 whole[start:stop])
