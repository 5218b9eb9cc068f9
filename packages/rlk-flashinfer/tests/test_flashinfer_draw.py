"""The exact inverse-CDF pick and the order keys, run by small test kernels."""

from __future__ import annotations

import pytest
import torch
from flashinfer_stats import chi_square, chi_square_critical

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from rlk_flashinfer.draw import key, pick, value  # noqa: E402  (needs triton)


@triton.jit
def _pick_rows(weights, u, out, N: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, N)
    w = tl.load(weights + row * N + offs)
    tl.store(out + row, pick(w, tl.load(u + row)))


@triton.jit
def _keys(x, keys, back, N: tl.constexpr):
    offs = tl.arange(0, N)
    k = key(tl.load(x + offs))
    tl.store(keys + offs, k)
    tl.store(back + offs, value(k))


def _pick(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    out = torch.empty(weights.shape[0], dtype=torch.int32)
    _pick_rows[(weights.shape[0],)](weights.double().contiguous(), u, out, weights.shape[1])
    return out.long()


def test_the_pick_follows_the_cumulative_weights():
    weights = torch.zeros(4, 16)
    weights[:, [3, 9, 14]] = torch.tensor([1.0, 2.0, 1.0])
    u = torch.tensor([0.0, 0.3, 0.6, 0.999], dtype=torch.float64)
    assert _pick(weights, u).tolist() == [3, 9, 9, 14]


def test_entries_of_weight_zero_are_never_drawn():
    # tiny weights beside zeros: float cumulative sums could step over a zero entry
    weights = torch.zeros(1, 64, dtype=torch.float64)
    weights[0, ::7] = 1e-30
    weights[0, 5] = 1.0
    u = torch.rand(300, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    tokens = _pick(weights.expand(300, -1), u)
    assert bool((weights[0, tokens] > 0).all())
    edge = torch.tensor([0.0, 1.0 - 2.0**-53], dtype=torch.float64)
    assert bool((weights[0, _pick(weights.expand(2, -1), edge)] > 0).all())


def test_frequencies_follow_the_weights():
    gen = torch.Generator().manual_seed(5)
    probs = torch.rand(1, 32, generator=gen, dtype=torch.float64) ** 3
    probs[0, 10:14] = 0.0
    draws = 2000
    tokens = _pick(probs.expand(draws, -1), torch.rand(draws, dtype=torch.float64, generator=gen))
    statistic, dof = chi_square(tokens, probs[0] / probs.sum())
    assert statistic < chi_square_critical(dof)
    assert bool((probs[0, tokens] > 0).all())


def test_keys_order_floats_and_invert():
    x = torch.tensor([-float("inf"), -3e38, -1.5, -1e-40, -0.0, 0.0, 1e-40, 2.0, 3e38,
                      float("inf"), 7.0, 7.0, -2.0, 0.5, 1.0, -1.0])
    keys, back = torch.empty(16, dtype=torch.int32), torch.empty(16)
    _keys[(1,)](x, keys, back, 16)
    assert torch.equal(back, x + 0.0)  # -0.0 comes back as +0.0
    assert keys[4] == keys[5]  # -0.0 and +0.0 are one value
    order = x.argsort(stable=True)
    assert bool((keys[order][1:] >= keys[order][:-1]).all())
    assert torch.equal(torch.sign(keys[order][1:] - keys[order][:-1]),
                       torch.sign(x[order][1:] - x[order][:-1]).int())
