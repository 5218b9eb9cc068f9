"""Comparison against float64 references, NaN-aware and with readable failures."""

from __future__ import annotations

import torch

from rlk._runtime.spec import Tolerance


def assert_matches(name: str, actual: torch.Tensor, expected: torch.Tensor,
                   tolerance: Tolerance, *, allowance: torch.Tensor | None = None) -> None:
    """Shapes equal, NaN exactly where the reference has NaN, the rest within tolerance
    (plus `allowance`, elementwise, where a result's own conditioning bounds its error)."""
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(
            f"{name}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        )
    got = actual.detach().to("cpu", torch.float64)
    want = expected.detach().to("cpu", torch.float64)
    got_nan, want_nan = torch.isnan(got), torch.isnan(want)
    if not torch.equal(got_nan, want_nan):
        first = torch.nonzero(got_nan != want_nan)[0].tolist()
        raise AssertionError(
            f"{name}: NaN pattern differs first at {first}: got {got[tuple(first)].item()}, "
            f"expected {want[tuple(first)].item()}"
        )
    mask = ~want_nan
    same_inf = (got == want) & torch.isinf(want)
    error = (got - want).abs().masked_fill(~mask | same_inf, 0.0)
    bound = tolerance.atol + tolerance.rtol * want.abs().masked_fill(~mask, 0.0)
    if allowance is not None:
        bound = bound + allowance.detach().to("cpu", torch.float64)
    excess = error - bound
    if bool((excess > 0).any()):
        worst = torch.nonzero(excess == excess.max())[0].tolist()
        raise AssertionError(
            f"{name}: max abs error {error.max().item():.3e} (at {worst}: got "
            f"{got[tuple(worst)].item()!r}, expected {want[tuple(worst)].item()!r}); "
            f"allowed atol={tolerance.atol} rtol={tolerance.rtol}"
        )


def assert_bitwise_equal(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equality bit for bit (NaN equal to NaN), as batch invariance promises."""
    if not torch.equal(actual.isnan(), expected.isnan()) or not torch.equal(
        actual.nan_to_num(), expected.nan_to_num()
    ):
        diff = (actual.double() - expected.double()).abs().nan_to_num().max().item()
        raise AssertionError(f"{name}: not bitwise equal (max difference {diff:.3e})")


def ulp(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype` at each float64 value (subnormal spacing below the smallest
    normal): the unit in which results rounded to a half dtype are judged."""
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(value.double().abs().clamp(min=info.tiny))
    return torch.ldexp(torch.ones_like(value, dtype=torch.float64), exponent - 1) * info.eps


def assert_within_one_ulp(name: str, actual: torch.Tensor, truth: torch.Tensor,
                          atol: float = 0.0) -> None:
    """`actual` (in a half dtype) at most one ulp of that dtype from the float64 truth
    rounded to it: what a float32 result rounded once more can promise, since its own
    float32 error may straddle a rounding boundary of the dtype. Near zero the float32
    computation's absolute error (`atol`) can exceed the dtype's spacing and is allowed
    instead. NaN where the rounded truth is NaN, infinities equal."""
    rounded = truth.detach().to("cpu", actual.dtype).double()
    got = actual.detach().to("cpu", torch.float64)
    same = (got == rounded) | (got.isnan() & rounded.isnan())
    error = (got - rounded).abs().nan_to_num(nan=float("inf")).masked_fill(same, 0.0)
    allowed = ulp(rounded, actual.dtype).clamp(min=atol).masked_fill(~rounded.isfinite(), 0.0)
    excess = error - allowed
    if bool((excess > 0).any()):
        worst = int(excess.reshape(-1).argmax())
        raise AssertionError(
            f"{name}: {got.reshape(-1)[worst].item()!r} is more than one {actual.dtype} ulp "
            f"from {rounded.reshape(-1)[worst].item()!r} (the float64 truth rounded)")
