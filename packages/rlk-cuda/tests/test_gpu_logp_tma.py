"""The bulk-copy (TMA) logp forward on Hopper against float64 and against the generic kernel,
on random data with every output poisoned before the kernels write it."""

from __future__ import annotations

import pytest
import torch
from rlk.testing.poison import poisoned_allocations
from tests_reference import logp_entropy

from rlk_cuda import _ext, logp_path
from rlk_cuda import logp as kernels


def _tma_ready() -> bool:
    return (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and bool(_ext.load().TMA_BUILT))


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _tma_ready(), reason="needs an sm_90 device and a build with 90a"),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
VOCABS = [1000, 4097, 151936, 262144]
TOL = 1e-5


def _inputs(rows: int, vocab: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=gen, device="cuda") * 4.0).to(dtype)
    tokens = torch.randint(0, vocab, (rows,), generator=gen, device="cuda")
    return logits, tokens


def _close(got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    assert got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan()), "NaN pattern differs"
    err = (got.double() - want.double()).abs().nan_to_num(0.0).max().item()
    assert err <= atol, f"max abs error {err:.3g} > {atol:.3g}"


@pytest.fixture
def forward(monkeypatch: pytest.MonkeyPatch):
    """kernels.forward through the path named first: 'tma' or 'generic'."""

    def run(path: str, *args):
        monkeypatch.setenv(logp_path.ENV, path)
        with poisoned_allocations():
            return kernels.forward(*args)

    return run


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("with_entropy", [False, True])
def test_matches_float64_and_generic(forward, dtype: torch.dtype, vocab: int,
                                     with_entropy: bool) -> None:
    rows = 64 if vocab < 100000 else 16
    logits, tokens = _inputs(rows, vocab, dtype, seed=vocab)
    tokens[3] = -100
    lp, ent, lse = forward("tma", logits, tokens, 1.0, -100, None, None, with_entropy)
    want_lp, want_ent = logp_entropy(logits, tokens, 1.0, -100)
    _close(lp, want_lp, TOL)
    gen_lp, gen_ent, gen_lse = forward("generic", logits, tokens, 1.0, -100, None, None,
                                       with_entropy)
    _close(lp, gen_lp, TOL)
    _close(lse, gen_lse, TOL * max(1.0, float(gen_lse.abs().max())))
    live = tokens != -100
    _close(lse[live], torch.logsumexp(logits.double(), 1)[live],
           5e-5 * max(1.0, float(gen_lse.abs().max())))
    assert lse[3] == 0
    if with_entropy:
        assert ent is not None and gen_ent is not None
        _close(ent, want_ent, 5e-5 * max(1.0, float(want_ent.abs().max())))
        _close(ent, gen_ent, 5e-5 * max(1.0, float(want_ent.abs().max())))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [4097, 151936])
def test_rows_temperature_out_and_unaligned_rows(forward, dtype: torch.dtype, vocab: int) -> None:
    logits, tokens = _inputs(24, vocab, dtype, seed=7)
    temp = torch.rand(24, device="cuda") * 1.5 + 0.25
    rows = torch.tensor([5, 0, 23, 5, 11], device="cuda")
    out = torch.full((10,), float("nan"), device="cuda")[::2]  # logp written with a stride
    lp, ent, _ = forward("tma", logits, tokens, temp, -100, rows, out, True)
    assert lp.data_ptr() == out.data_ptr()
    want_lp, want_ent = logp_entropy(logits, tokens, temp, -100)
    _close(lp, want_lp[rows], TOL)
    assert ent is not None
    _close(ent, want_ent[rows], 1e-4)
    # Rows that start off a 16-byte boundary cannot be bulk-copied; they are read directly in
    # the same order, so their bits match the aligned rows'.
    wide = torch.randn(24, vocab + 9, device="cuda").to(dtype)
    wide[:, 3 : vocab + 3] = logits
    lp2, ent2, _ = forward("tma", wide[:, 3 : vocab + 3], tokens, temp, -100, rows, None, True)
    assert torch.equal(lp2, lp) and ent2 is not None and torch.equal(ent2, ent)


def test_ignored_and_special_rows(forward) -> None:
    logits, tokens = _inputs(7, 40001, torch.float32, seed=3)
    logits[0, 17] = float("nan")
    logits[1] = float("-inf")
    logits[2, :40000] = float("-inf")  # one finite value only
    tokens[2] = 40000
    tokens[3] = 40001  # out of range: NaN, no read out of bounds
    tokens[4] = -7
    tokens[5] = -100
    lp, ent, lse = forward("tma", logits, tokens, 1.0, -100, None, None, True)
    assert ent is not None
    assert lp[0].isnan() and ent[0].isnan()
    assert lp[1].isnan() and ent[1].isnan() and lse[1] == float("-inf")
    assert lp[2] == 0 and ent[2] == 0
    assert lp[3].isnan() and lp[4].isnan()
    assert lp[5] == 0 and ent[5] == 0 and lse[5] == 0
    want_lp, want_ent = logp_entropy(logits[6:], tokens[6:], 1.0, -100)
    _close(lp[6:], want_lp, TOL)
    _close(ent[6:], want_ent, 1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1001, 151936])
def test_batch_invariant(forward, dtype: torch.dtype, vocab: int) -> None:
    logits, tokens = _inputs(40, vocab, dtype, seed=5)
    full, ent, _ = forward("tma", logits, tokens, 1.3, -100, None, None, True)
    assert ent is not None
    for r in (0, 17, 39):
        one, ent1, _ = forward("tma", logits[r : r + 1].clone(), tokens[r : r + 1], 1.3, -100,
                               None, None, True)
        assert ent1 is not None
        assert torch.equal(one, full[r : r + 1]) and torch.equal(ent1, ent[r : r + 1])


def test_the_bulk_copy_kernel_is_what_runs(forward) -> None:
    logits, tokens = _inputs(8, 151936, torch.bfloat16, seed=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        forward("tma", logits, tokens, 1.0, -100, None, None, False)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert any("logp_fwd_tma_kernel" in n for n in names), names


def test_sample_logp_still_equals_logp(monkeypatch: pytest.MonkeyPatch) -> None:
    """sample's statistics pass takes the bulk-copy path too, so its logp stays logp's bits."""
    from rlk_cuda.sample import sample

    monkeypatch.setenv(logp_path.ENV, "tma")
    logits, _ = _inputs(24, 151936, torch.bfloat16, seed=9)
    seeds = torch.randint(0, 2**62, (24,), device="cuda")
    with poisoned_allocations():
        tokens, lp, _ = sample(logits, 0.8, 50, 0.9, 0.0, seeds)
    same, _, _ = kernels.forward(logits, tokens, 0.8, -100, None, None, False)
    assert torch.equal(lp, same)
