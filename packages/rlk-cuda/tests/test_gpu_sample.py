"""sample kernel: support of the filtered distribution, logp bit-equality, processed_logp,
determinism per seed, batch invariance and the empirical distribution."""

from __future__ import annotations

import math

import pytest
import torch
from rlk.testing.poison import poisoned_allocations
from tests_reference import truncated_log_probs

from rlk_cuda import _ext, logp_path
from rlk_cuda import logp as logp_kernels
from rlk_cuda.sample import sample

pytestmark = pytest.mark.gpu

SETTINGS = [
    (1.0, 50, 0.9, 0.0),  # the benchmark's setting
    (0.7, 0, 0.9, 0.0),  # top-p alone: large nuclei take the exact slow route
    (1.0, 0, 1.0, 0.05),  # min-p alone
    (1.3, 20, 1.0, 0.0),
    (1.0, 0, 1.0, 0.0),  # plain sampling
    (0.8, 3000, 0.95, 0.01),  # top-k beyond the shared-memory capacity
]


def _logits(batch: int, vocab: int, dtype: torch.dtype, seed: int, scale: float = 3.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(batch, vocab, generator=gen, device="cuda") * scale).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"), SETTINGS)
def test_sample_against_float64(
    dtype: torch.dtype, temperature: float, top_k: int, top_p: float, min_p: float
) -> None:
    batch, vocab = 24, 20000
    logits = _logits(batch, vocab, dtype, seed=top_k + 7)
    seeds = torch.randint(0, 2**62, (batch,), device="cuda")
    with poisoned_allocations():
        tokens, lp, plp = sample(logits, temperature, top_k, top_p, min_p, seeds)
    ref = truncated_log_probs(logits, temperature, top_k, top_p, min_p)
    picked = ref.gather(1, tokens.unsqueeze(1)).squeeze(1)
    assert torch.isfinite(picked).all(), "a token outside the filtered support was drawn"
    assert (plp.double() - picked).abs().max() < 1e-4
    same, _, _ = logp_kernels.forward(logits, tokens, temperature, -100, None, None, False)
    assert torch.equal(lp, same), "sample's logp must equal this backend's logp bit for bit"


# Large vocabularies where min-p and top-p are both on, each deciding in turn: (logit scale,
# top_p, min_p). Scale 2, min-p 0.05: min-p keeps a few hundred tokens, far less mass than
# top-p 0.95 would (the setting; one counting pass, then the shared-memory finish).
# Scale 1, min-p 0.01: min-p binds but keeps most of the vocabulary (the exact draw pass).
# Scale 2, min-p 1e-4, top-p 0.5: top-p keeps less than min-p, so top-p is narrowed as before.
MIN_P_AND_TOP_P = [(2.0, 0.95, 0.05), (1.0, 0.95, 0.01), (2.0, 0.5, 1e-4)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("scale", "top_p", "min_p"), MIN_P_AND_TOP_P)
def test_min_p_with_top_p_on_large_vocabularies(
    dtype: torch.dtype, scale: float, top_p: float, min_p: float
) -> None:
    batch, vocab = 6, 256000
    logits = _logits(batch, vocab, dtype, seed=int(100 * min_p) + 3, scale=scale)
    seeds = torch.randint(0, 2**62, (batch,), device="cuda")
    with poisoned_allocations():
        tokens, lp, plp = sample(logits, 1.0, 0, top_p, min_p, seeds)
    ref = truncated_log_probs(logits, 1.0, 0, top_p, min_p)
    picked = ref.gather(1, tokens.unsqueeze(1)).squeeze(1)
    assert torch.isfinite(picked).all(), "a token outside the filtered support was drawn"
    assert (plp.double() - picked).abs().max() < 1e-4
    same, _, _ = logp_kernels.forward(logits, tokens, 1.0, -100, None, None, False)
    assert torch.equal(lp, same)
    alone = sample(logits[2:3].clone(), 1.0, 0, top_p, min_p, seeds[2:3])
    for x, y in zip((tokens, lp, plp), alone, strict=True):
        assert torch.equal(x[2:3], y)


def test_greedy_and_special_rows() -> None:
    logits = _logits(5, 3000, torch.float32, seed=1)
    logits[1, 10] = logits[1, 20] = logits[1].max() + 1  # tie: first index wins
    logits[2] = float("-inf")
    logits[3, 5] = float("nan")
    seeds = torch.arange(5, device="cuda")
    tokens, lp, plp = sample(logits, 0.0, 0, 1.0, 0.0, seeds)
    assert tokens[0] == logits[0].argmax() and tokens[1] == 10 and tokens[4] == logits[4].argmax()
    assert tokens[2] == -1 and tokens[3] == -1
    assert lp[2].isnan() and plp[2].isnan() and lp[3].isnan()
    assert plp[0] == 0
    same, _, _ = logp_kernels.forward(
        logits[[0, 1, 4]], tokens[[0, 1, 4]], 1.0, -100, None, None, False
    )
    assert torch.equal(lp[[0, 1, 4]], same)


@pytest.mark.parametrize("temperature", [2.0**-126, 1e-30])
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (40, 0.9)])  # plain draw; filtered
def test_tied_maxima_at_a_tiny_temperature_share_the_mass(temperature: float, top_k: int,
                                                          top_p: float) -> None:
    """Issue #31 F3: any T > 0 splits the mass among the maxima (processed_logp -log n),
    down to rlk.sample's smallest temperature, 2^-126 (below it the op refuses the call; the
    library's flush-to-zero build reads a subnormal T as 0, greedy)."""
    logits = _logits(6, 3000, torch.float32, seed=7)
    top = logits.amax(dim=1)
    logits[:, 11] = top
    logits[:3, 2900] = top[:3]  # rows 0-2: two maxima; rows 3-5: one
    ties = (logits == logits.amax(dim=1, keepdim=True)).sum(dim=1)
    tokens, _, plp = sample(logits, temperature, top_k, top_p, 0.0, torch.arange(6, device="cuda"))
    assert (logits.gather(1, tokens.unsqueeze(1)).squeeze(1) == top).all()
    torch.testing.assert_close(plp, -ties.float().log(), rtol=0, atol=1e-6)


def test_seed_determinism_and_batch_invariance() -> None:
    logits = _logits(32, 151936, torch.bfloat16, seed=4)
    seeds = torch.randint(0, 2**62, (32,), device="cuda")
    a = sample(logits, 1.0, 50, 0.9, 0.0, seeds)
    b = sample(logits, 1.0, 50, 0.9, 0.0, seeds)
    part = sample(logits[9:12], 1.0, 50, 0.9, 0.0, seeds[9:12])
    for x, y, z in zip(a, b, part, strict=True):
        assert torch.equal(x, y)
        assert torch.equal(x[9:12], z)
    other = sample(logits, 1.0, 50, 0.9, 0.0, seeds + 1)
    assert not torch.equal(a[0], other[0])


def test_all_equal_row_keeps_every_tie() -> None:
    logits = torch.zeros(2, 5000, device="cuda") + 0.25  # ties everywhere: exact slow route
    seeds = torch.tensor([3, 4], device="cuda")
    tokens, _, plp = sample(logits, 1.0, 10, 1.0, 0.0, seeds)
    assert ((tokens >= 0) & (tokens < 5000)).all()
    torch.testing.assert_close(plp, torch.full_like(plp, -torch.log(torch.tensor(5000.0)).item()))


@pytest.mark.parametrize("temperature", [1.0, 2.0**-126])
@pytest.mark.parametrize("positive", [0, 8, 9])
def test_signed_zeros_are_one_tie(temperature: float, positive: int) -> None:
    """Rounded logits of a small row are -0.0 and +0.0, equal values: top_k = 1 keeps all of
    them (the GPU fuzz found a +0 among -0s dropped from the candidates, 1/9 for 1/10)."""
    logits = torch.full((256, 10), -0.0, device="cuda")
    logits[:, positive] = 0.0
    tokens, _, plp = sample(logits, temperature, 1, 1.0, 0.0, torch.arange(256, device="cuda"))
    torch.testing.assert_close(plp, torch.full_like(plp, -math.log(10.0)), rtol=0, atol=1e-6)
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 10
    assert bool((tokens == positive).any()), "the +0 is never drawn"


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p"), [(0, 1.0, 0.0), (4, 1.0, 0.0), (0, 0.8, 0.0), (6, 0.9, 0.1)]
)
def test_empirical_distribution(top_k: int, top_p: float, min_p: float) -> None:
    vocab, draws = 12, 40000
    base = torch.randn(1, vocab, device="cuda") * 1.5
    logits = base.expand(draws, vocab).contiguous()
    seeds = torch.randint(0, 2**62, (draws,), device="cuda")
    tokens, _, _ = sample(logits, 0.9, top_k, top_p, min_p, seeds)
    freq = torch.bincount(tokens, minlength=vocab).double() / draws
    want = truncated_log_probs(base, 0.9, top_k, top_p, min_p)[0].exp()
    assert (freq[want == 0] == 0).all()
    sigma = (want * (1 - want) / draws).sqrt()
    assert ((freq - want).abs() <= 5 * sigma + 1e-9).all(), (freq, want)


@pytest.mark.parametrize(("top_k", "top_p"), [(40, 0.9), (0, 1.0)])  # filtered; plain
def test_bits_do_not_depend_on_row_alignment(top_k: int, top_p: float) -> None:
    logits = _logits(7, 30001, torch.float16, seed=12)  # rows start at every alignment
    seeds = torch.randint(0, 2**62, (7,), device="cuda")
    full = sample(logits, 0.8, top_k, top_p, 0.0, seeds)
    for r in range(7):
        alone = sample(logits[r : r + 1].clone(), 0.8, top_k, top_p, 0.0, seeds[r : r + 1])
        for x, y in zip(full, alone, strict=True):
            assert torch.equal(x[r : r + 1], y)


def _philox4x32_10(counter: tuple[int, int, int, int], key: tuple[int, int]) -> list[int]:
    """Philox4x32-10 on the host, as csrc/philox.cuh computes it."""
    mask = 0xFFFFFFFF
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & mask, p1 & mask, ((p0 >> 32) ^ c3 ^ k1) & mask, \
            p0 & mask
        k0, k1 = (k0 + 0x9E3779B9) & mask, (k1 + 0xBB67AE85) & mask
    return [c0, c1, c2, c3]


def _gumbel(seed: int, idx: int) -> float:
    """Token idx's Gumbel noise in the row seeded with `seed` (philox.cuh's gumbel_noise)."""
    pattern = seed % 2**64
    bits = _philox4x32_10((idx >> 2, 0, 0x726C6B73, 0), (pattern & 0xFFFFFFFF, pattern >> 32))
    u = ((bits[idx & 3] >> 8) + 0.5) * 2.0**-24
    return -math.log(-math.log(u))


def test_filtered_sampling_is_gumbel_max_with_each_tokens_own_philox_bits() -> None:
    """Regression for the Philox block shared by four neighbouring tokens in the full pass (a
    top-k set larger than the 2048 candidates shared memory holds): every token still gets
    the bits of its own counter, so the draw is argmax(logit + noise(token)) over the set."""
    vocab, k = 5000, 4000
    logits = _logits(3, vocab, torch.float32, seed=21, scale=1.0)
    seeds = torch.randint(-(2**62), 2**62, (3,), device="cuda")
    tokens, _, _ = sample(logits, 1.0, k, 1.0, 0.0, seeds)
    for row in range(3):
        kept = logits[row].topk(k).indices.tolist()
        scores = {j: float(logits[row, j]) + _gumbel(int(seeds[row]), j) for j in kept}
        ranked = sorted(kept, key=lambda j: -scores[j])
        near_tie = scores[ranked[0]] - scores[ranked[1]] < 1e-4  # float32 rounding may decide
        assert int(tokens[row]) == ranked[0] or (near_tie and int(tokens[row]) == ranked[1])


def _row_uniform(seed: int) -> float:
    """The plain draw's uniform of a row seeded with `seed` (philox.cuh's row_uniform)."""
    pattern = seed % 2**64
    bits = _philox4x32_10((0, 1, 0x726C6B73, 0), (pattern & 0xFFFFFFFF, pattern >> 32))
    return ((bits[0] >> 11) * 2**32 + bits[1]) * 2.0**-53


def _use_forward(monkeypatch: pytest.MonkeyPatch, forward: str) -> None:
    """Run the statistics pass on `forward` ('generic' or 'tma'; skip where tma cannot run)."""
    if forward == "tma":
        reason = logp_path.tma_unavailable(bool(_ext.load().TMA_BUILT),
                                           torch.cuda.get_device_capability())
        if reason is not None:
            pytest.skip(reason)
    monkeypatch.setenv(logp_path.ENV, forward)


def _assert_inverse_cdf(logits: torch.Tensor, seeds: torch.Tensor, temperature: float,
                        tokens: torch.Tensor) -> None:
    """Each row's token is where u * total falls in its cumulative masses (index order)."""
    for row in range(logits.shape[0]):
        x = logits[row].double()
        cumulative = ((x - x.max()) / temperature).exp().cumsum(0)
        total = float(cumulative[-1])
        target = _row_uniform(int(seeds[row])) * total
        tok = int(tokens[row])
        below = float(cumulative[tok - 1]) if tok > 0 else 0.0
        slack = 1e-5 * total  # the kernel's float32 sums
        assert below - slack <= target <= float(cumulative[tok]) + slack, (row, tok)


@pytest.mark.parametrize("forward", ["generic", "tma"])
@pytest.mark.parametrize(("vocab", "dtype"), [
    (37, torch.float32),  # one group of vectors and a scalar tail
    (65535, torch.float32),  # the longest row the generic statistics leave whole: 512 groups
    (70001, torch.bfloat16),  # generic: 3 segments (the last with the tail); tma: whole, 274 groups
    (262144, torch.float32),  # generic: 8 segments; tma: 2048 groups, the most shared memory holds
    (262148, torch.float32),  # generic: 9 segments, the last holding the tail alone
])
def test_plain_sampling_is_the_inverse_cdf_at_the_rows_uniform(
        monkeypatch: pytest.MonkeyPatch, forward: str, vocab: int, dtype: torch.dtype) -> None:
    """With no filter a row's token is where u * total falls in its cumulative masses (index
    order), u from its seed alone, whether the draw reads the whole row or, after a split
    statistics pass, the segment holding the draw (its remainder rescaled)."""
    if forward == "tma" and vocab == 262148:
        pytest.skip("past the groups shared memory holds: Gumbel-max (the next test)")
    _use_forward(monkeypatch, forward)
    logits = _logits(6, vocab, dtype, seed=21, scale=2.0)
    seeds = torch.randint(-(2**62), 2**62, (6,), device="cuda")
    tokens, logp, processed = sample(logits, 0.9, 0, 1.0, 0.0, seeds)
    _assert_inverse_cdf(logits, seeds, 0.9, tokens)
    torch.testing.assert_close(processed, logp, rtol=0, atol=1e-5)  # no filter: the same law


def test_segments_without_mass_are_never_drawn() -> None:
    """The segment pick reads the split statistics pass's partials: a segment of -inf logits,
    or one whose mass is below 2^-100 of the largest logit's (though each of its masses is a
    normal float), is never drawn, whatever the seed; where the mass lies in the last
    segment's last elements the draw still lands on them."""
    vocab = 100000  # float32: 4 segments of 7168 vectors, [0, 28672), ... [86016, 100000)
    logits = torch.full((64, vocab), -math.inf, device="cuda")
    live = torch.randn(64, vocab - 98300, device="cuda").clamp(max=3.9)
    live[:, 7] = 4.0  # every row's largest logit
    logits[:, 98300:] = live
    logits[:, 28672:57344] = 4.0 - 82.0  # e^-82 each: 2^-103.5 of the largest per segment
    seeds = torch.randint(-(2**62), 2**62, (64,), device="cuda")
    tokens, logp, _ = sample(logits, 1.0, 0, 1.0, 0.0, seeds)
    assert (tokens >= 98300).all() and (tokens < vocab).all()
    _assert_inverse_cdf(logits, seeds, 1.0, tokens)
    same, _, _ = logp_kernels.forward(logits, tokens, 1.0, -100, None, None, False)
    assert torch.equal(logp, same)


def test_plain_sampling_beyond_the_groups_shared_memory_holds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole row of V = 262148 in float32 (the bulk-copy statistics do not split it) is one
    group past the inverse CDF's 2048: Gumbel-max draws, from the support, with the same logp."""
    _use_forward(monkeypatch, "tma")
    logits = _logits(4, 262148, torch.float32, seed=5)
    seeds = torch.randint(0, 2**62, (4,), device="cuda")
    tokens, lp, plp = sample(logits, 1.0, 0, 1.0, 0.0, seeds)
    assert ((tokens >= 0) & (tokens < 262148)).all()
    same, _, _ = logp_kernels.forward(logits, tokens, 1.0, -100, None, None, False)
    assert torch.equal(lp, same)
    torch.testing.assert_close(plp, lp, rtol=0, atol=1e-5)
