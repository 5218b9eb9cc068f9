"""linear_policy_loss on the cuda backend: every path against float64, precision and memory."""

from __future__ import annotations

import pytest
import rlk
import torch
from rlk.ops.linear_logp import reference as linear_logp_reference
from rlk.ops.linear_policy_loss import reference
from rlk.testing.compare import assert_within_one_ulp

pytestmark = pytest.mark.gpu

OPTIONS = {
    "grpo-k3": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.04, "use_ref": True},
    "gspo": {"ratio_level": "sequence", "clip_low": 3e-4, "clip_high": 4e-4,
             "agg": "seq-mean-token-mean"},
    "tis-seq-sum": {"tis_cap": 2.0, "use_rollout": True, "agg": "seq-mean-token-sum"},
}


def _data(batch: int, length: int, width: int, vocab: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def noise(scale: float) -> torch.Tensor:
        return torch.randn(batch, length, generator=gen, device="cuda") * scale

    hidden = torch.randn(batch, length, width, generator=gen, device="cuda").to(dtype)
    weight = (torch.randn(vocab, width, generator=gen, device="cuda") * 2 / width**0.5).to(dtype)
    tokens = torch.randint(0, vocab, (batch, length), generator=gen, device="cuda")
    logp = torch.cat([
        linear_logp_reference.linear_logp_entropy(hidden.reshape(-1, width)[i:i + 512], weight,
                                      tokens.reshape(-1)[i:i + 512])[0]
        for i in range(0, batch * length, 512)]).view(batch, length).float()
    lengths = torch.randint(length // 2, length + 1, (batch, 1), generator=gen, device="cuda")
    return {
        "hidden": hidden, "weight": weight, "tokens": tokens, "old_logp": logp + noise(0.1),
        "ref_logp": logp + noise(0.3), "rollout_logp": logp + noise(0.3),
        "advantages": torch.randn(batch, generator=gen, device="cuda"),
        "mask": (torch.arange(length, device="cuda") < lengths).float(),
    }


def _options(name: str, data: dict) -> dict:
    options = dict(OPTIONS[name])
    if options.pop("use_ref", False):
        options["ref_logp"] = data["ref_logp"]
    if options.pop("use_rollout", False):
        options["rollout_logp"] = data["rollout_logp"]
    return options


def _reference_options(options: dict) -> dict:
    """Reference keywords: the policy tensors as given, the settings as PolicyLossOptions."""
    tensors = {k: v for k, v in options.items() if isinstance(v, torch.Tensor)}
    settings = {k: v for k, v in options.items() if k not in tensors}
    return dict(tensors, options=rlk.PolicyLossOptions(**settings))


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """Norm-wise relative error."""
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])  # one read of the logits; two
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("chunk_mb", "length", "name", "path"), [
    (None, 64, "grpo-k3", "tokens"),  # token-level: chunks across sequences
    ("1", 64, "gspo", "sequences"),  # 128-row chunks: two 64-token sequences each
    ("1", 300, "grpo-k3", "tokens"),  # 128-row chunks inside 300-token sequences
    ("1", 300, "gspo", "two-pass"),
    ("1", 64, "tis-seq-sum", "tokens"),
])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_paths_against_float64(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                               chunk_mb: str | None, length: int, name: str, path: str,
                               entropy_coef: float, softcap: float | None) -> None:
    """Every path with and without a soft cap, trained and under no_grad (issue #31 S1: the
    two-pass and no-grad forwards applied the cap twice)."""
    if chunk_mb is not None:
        monkeypatch.setenv("RLK_CUDA_CHUNK_MB", chunk_mb)
    data = _data(4, length, 64, 1300, dtype)
    data["mask"][1, 5] = 0.0
    data["hidden"][1, 5] = float("nan")  # masked: no trace in the loss or the gradients
    options = _options(name, data)
    args = (data["tokens"], data["old_logp"], data["advantages"], data["mask"])
    leaves = [t.clone().requires_grad_(True) for t in (data["hidden"], data["weight"])]
    with rlk.use_backends("cuda", strict=True):
        plan = rlk.explain("linear_policy_loss", *leaves, *args, entropy_coef=entropy_coef,
                           temperature=0.9, softcap=softcap, **options).plan
        loss, metrics = rlk.linear_policy_loss(*leaves, *args, entropy_coef=entropy_coef,
                                               temperature=0.9, softcap=softcap, **options)
        loss.backward()
        with torch.no_grad():
            no_grad = rlk.linear_policy_loss(*leaves, *args, entropy_coef=entropy_coef,
                                             temperature=0.9, softcap=softcap, **options)
    assert plan.startswith(f"{path}:")
    read_once = entropy_coef == 0.0 and path != "two-pass" and softcap is None
    assert ("read once" in plan) == read_once
    clean = data["hidden"].clone()
    clean[1, 5] = 0.0
    f64 = [t.detach().double().requires_grad_(True) for t in (clean, data["weight"])]
    want = reference.linear_policy_loss(
        f64[0].reshape(-1, 64), f64[1], data["tokens"].reshape(-1), old_logp=data["old_logp"],
        advantages=data["advantages"], mask=data["mask"], temperature=0.9, softcap=softcap,
        entropy_coef=entropy_coef, **_reference_options(options))
    want[0].backward()
    for got_loss, got in ((loss, metrics), no_grad):
        assert abs(float(got_loss) - float(want[0])) <= 1e-5 * max(1.0, abs(float(want[0])))
        assert (got["logp"].reshape(-1).double() - want[2]).abs().max() < 1e-4
    limit = 1e-4 if dtype == torch.float32 else 2e-2  # bf16 gradients: a few roundings
    assert _relative(leaves[0].grad, f64[0].grad) < limit
    assert _relative(leaves[1].grad, f64[1].grad) < limit


@pytest.mark.parametrize(("dtype", "temperature"), [
    (torch.bfloat16, 1.0),
    (torch.bfloat16, 0.05),  # most tokens' p < 2^-100: rows rewritten with the max offset
    (torch.float32, 0.02),  # float32 e: rows rewritten beyond 2^-100
    (torch.float32, "rows"),  # a temperature per row
])
def test_one_read_edges_against_float64(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                        temperature: float | str) -> None:
    """Ignored tokens and masked positions with NaN hidden states, a bias, improbable tokens,
    several blocks of logits chunks (the relative_probs path)."""
    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", "4")
    batch, length, width, vocab = 6, 200, 64, 3001
    data = _data(batch, length, width, vocab, dtype, seed=7)
    tokens, mask, hidden = data["tokens"].clone(), data["mask"], data["hidden"].clone()
    tokens[0, :7] = -100
    tokens[2, 50] = vocab - 1
    dead = (tokens == -100) | (mask == 0)
    hidden[dead] = torch.nan
    gen = torch.Generator(device="cuda").manual_seed(8)
    temp = (torch.rand(batch, length, generator=gen, device="cuda") + 0.5
            if temperature == "rows" else temperature)
    bias = (torch.randn(vocab, generator=gen, device="cuda") * 0.5).to(dtype)
    # old logp near the live tokens' own: ratios near 1, so no gradient underflows float32
    # (old logp at T = 1 left ratios below 1e-38 at T = 0.02, a zero gradient in float32)
    exact = linear_logp_reference.linear_logp_entropy(
        hidden.masked_fill(dead[..., None], 0.0).reshape(-1, width).double(),
        data["weight"].double(), tokens.reshape(-1), bias=bias.double(),
        temperature=temp.reshape(-1) if isinstance(temp, torch.Tensor) else temp)[0]
    old_logp = exact.view(batch, length).float().nan_to_num() + 0.1 * torch.randn(
        batch, length, generator=gen, device="cuda")
    leaves = [t.clone().requires_grad_(True) for t in (hidden, data["weight"], bias)]
    args = (tokens, old_logp, data["advantages"], mask)
    with rlk.use_backends("cuda", strict=True):
        plan = rlk.explain("linear_policy_loss", leaves[0], leaves[1], *args, bias=leaves[2],
                           temperature=temp).plan
        loss, metrics = rlk.linear_policy_loss(leaves[0], leaves[1], *args, bias=leaves[2],
                                               temperature=temp)
        loss.backward()
    assert "read once" in plan
    f64 = [t.detach().double().requires_grad_(True)
           for t in (hidden.masked_fill(dead[..., None], 0.0), data["weight"], bias)]
    want = reference.linear_policy_loss(
        f64[0].reshape(-1, width), f64[1], tokens.reshape(-1), old_logp=old_logp,
        advantages=data["advantages"], mask=mask, bias=f64[2],
        temperature=temp.reshape(-1) if isinstance(temp, torch.Tensor) else temp)
    want[0].backward()
    assert abs(float(loss) - float(want[0])) <= 1e-5 * max(1.0, abs(float(want[0])))
    live = ~dead.reshape(-1)
    got_logp = metrics["logp"].reshape(-1).double()
    # the float32 GEMM's rounding of the logits (~4e-6), amplified by 1 / T
    coldest = float(temp.min()) if isinstance(temp, torch.Tensor) else temp
    assert (got_logp[live] - want[2][live]).abs().max() < max(1e-4, 1e-5 / coldest)
    assert torch.isfinite(leaves[0].grad).all() and (leaves[0].grad[dead] == 0).all()
    limit = 1e-4 if dtype == torch.float32 else 2e-2
    for leaf, truth in zip(leaves, f64, strict=True):
        assert _relative(leaf.grad, truth.grad) < limit


@pytest.mark.parametrize("chunk_mb", [None, "64"])  # one row chunk; eight (bf16 accumulation)
def test_issue_16_precision_at_a_realistic_shape(monkeypatch: pytest.MonkeyPatch,
                                                 chunk_mb: str | None) -> None:
    """Loss within 1e-5 of float64; the gradients' norm-wise error against float64."""
    if chunk_mb is not None:
        monkeypatch.setenv("RLK_CUDA_CHUNK_MB", chunk_mb)
    data = _data(4, 512, 1024, 32768, torch.bfloat16, seed=3)
    options = _options("grpo-k3", data)
    args = (data["tokens"], data["old_logp"], data["advantages"], data["mask"])
    leaves = [t.clone().requires_grad_(True) for t in (data["hidden"], data["weight"])]
    with rlk.use_backends("cuda", strict=True):
        loss, _ = rlk.linear_policy_loss(*leaves, *args, **options)
        loss.backward()
    f64 = [t.detach().double().requires_grad_(True) for t in (data["hidden"], data["weight"])]
    want = reference.linear_policy_loss(
        f64[0].reshape(-1, 1024), f64[1], data["tokens"].reshape(-1),
        old_logp=data["old_logp"], advantages=data["advantages"], mask=data["mask"],
        **_reference_options(options))
    want[0].backward()
    loss_error = abs(float(loss) - float(want[0])) / abs(float(want[0]))
    hidden_error = _relative(leaves[0].grad, f64[0].grad)
    weight_error = _relative(leaves[1].grad, f64[1].grad)
    print(f"\nchunk budget {chunk_mb or 'default'} MiB: loss rel {loss_error:.2e}, "
          f"grad_hidden rel {hidden_error:.2e}, grad_weight rel {weight_error:.2e}")
    assert loss_error < 1e-5
    # one bf16 rounding of a gradient is 1.1e-3 (norm-wise); the weight gradient adds one
    # rounding per chunk of its bf16 accumulation
    assert hidden_error < 3e-3 and weight_error < 6e-3


def test_extra_memory_is_the_chunk_buffers_and_the_gradients(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", "64")
    data = _data(8, 512, 1024, 50000, torch.bfloat16, seed=4)
    leaves = [t.clone().requires_grad_(True) for t in (data["hidden"], data["weight"])]
    args = (data["tokens"], data["old_logp"], data["advantages"], data["mask"])
    grads_bytes = sum(t.numel() * t.element_size() for t in leaves)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with rlk.use_backends("cuda", strict=True):
        loss, _ = rlk.linear_policy_loss(*leaves, *args)
        grads = torch.autograd.grad(loss, leaves)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    del grads
    # buffers (64 MiB), the gradients, their scaled copies in the backward, O(N) vectors
    assert extra < 64 * 2**20 + 2 * grads_bytes + 32 * 2**20, extra


def test_no_grad_forward_equals_the_training_forward() -> None:
    data = _data(2, 128, 64, 5000, torch.bfloat16, seed=5)
    args = (data["hidden"], data["weight"], data["tokens"], data["old_logp"],
            data["advantages"], data["mask"])
    with rlk.use_backends("cuda", strict=True):
        with torch.no_grad():
            loss, metrics = rlk.linear_policy_loss(*args)
        leaves = [t.clone().requires_grad_(True) for t in args[:2]]
        train_loss, train_metrics = rlk.linear_policy_loss(*leaves, *args[2:])
    # different kernels (linear_logp's vocabulary chunks, the loop's row chunks), one truth
    assert abs(float(loss) - float(train_loss)) < 1e-5
    torch.testing.assert_close(metrics["logp"], train_metrics["logp"], atol=2e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("factor", [1.0, 0.37, -2.5, 0.0, float("nan")])
def test_scale_grads_equals_torch_mul(dtype: torch.dtype, factor: float) -> None:
    from rlk_cuda.linear_policy_loss import scale_grads

    gen = torch.Generator(device="cuda").manual_seed(3)
    # sizes off the 16-byte vector, one element, a multi-block tail; a NaN and an inf inside
    sizes = (1, 7, 1000003, 3 * 2048 * 256 * 8 + 5)
    grads = [torch.randn(n, generator=gen, device="cuda").to(dtype) for n in sizes]
    grads[2][17], grads[2][-1] = float("nan"), float("inf")
    grads[2][5] = 2e-38  # times 0.37: a float32 subnormal, kept as torch keeps it
    upstream = torch.tensor(factor, device="cuda")
    expected = [(g.float() * upstream).to(dtype) for g in grads]  # one rounding, factor exact
    before = [g.clone() for g in grads]
    scale_grads(grads, upstream)
    for got, want, old in zip(grads, expected, before, strict=True):
        if factor == 1.0:  # untouched, bit for bit (NaN payloads included)
            assert torch.equal(got.view(torch.uint8), old.view(torch.uint8))
        else:
            torch.testing.assert_close(got, want, atol=0, rtol=0, equal_nan=True)


def test_scale_grads_falls_back_where_the_kernel_cannot_go() -> None:
    from rlk_cuda.linear_policy_loss import scale_grads

    base = torch.randn(1001, device="cuda", dtype=torch.bfloat16)
    shifted = base[1:]  # 2 bytes past a 16-byte boundary
    strided = torch.randn(64, 32, device="cuda").t()
    upstream64 = torch.tensor(0.5, device="cuda", dtype=torch.float64)
    for grad, upstream in ((shifted, torch.tensor(3.0, device="cuda")),
                           (strided, torch.tensor(3.0, device="cuda")),
                           (torch.randn(100, device="cuda"), upstream64)):
        want = grad * upstream
        scale_grads([grad], upstream)
        torch.testing.assert_close(grad, want.to(grad.dtype), atol=0, rtol=0)


@pytest.mark.parametrize("upstream", [1.0, 2.5])
def test_upstream_gradient_scales_the_cuda_gradients(upstream: float) -> None:
    data = _data(2, 96, 64, 3000, torch.bfloat16, seed=9)
    args = (data["tokens"], data["old_logp"], data["advantages"], data["mask"])

    def grads(scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = data["hidden"].clone().requires_grad_(True)
        weight = data["weight"].clone().requires_grad_(True)
        with rlk.use_backends("cuda", strict=True):
            loss, _ = rlk.linear_policy_loss(hidden, weight, *args, ref_logp=data["ref_logp"],
                                             kl_coef=0.04)
        (loss * scale).backward()
        assert hidden.grad is not None and weight.grad is not None
        return hidden.grad, weight.grad

    base_hidden, base_weight = grads(1.0)
    got_hidden, got_weight = grads(upstream)
    # the weight gradient is kept in its dtype: scaling it is torch's mul_ by the upstream, bit
    # for bit. The hidden gradient is kept in float32 and rounded once after the scaling, so it
    # may sit one bf16 step from 2.5 times the rounded unscaled one (19% of its elements on an
    # H100: never further)
    torch.testing.assert_close(got_weight, base_weight * torch.tensor(upstream, device="cuda"),
                               atol=0, rtol=0)
    assert_within_one_ulp("grad_hidden", got_hidden, base_hidden.double() * upstream)


@pytest.mark.parametrize("src_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [4096, 13])  # the vector path, and the element path
def test_scale_rows_against_float32(src_dtype: torch.dtype, out_dtype: torch.dtype,
                                    cols: int) -> None:
    from rlk_cuda.linear_policy_loss import scale_rows

    gen = torch.Generator(device="cuda").manual_seed(4)
    rows = 300
    src = torch.randn(rows, cols, generator=gen, device="cuda").to(src_dtype)
    src[7] = float("nan")  # a masked row's hidden state: its factor is 0, its output 0
    factor = torch.randn(rows, generator=gen, device="cuda") * 1e-3
    factor[7] = factor[20] = 0.0
    src[3], factor[3] = 1e-10, 1e-30  # products below float32's normal range are kept
    out = torch.full((rows, cols), float("nan"), device="cuda", dtype=out_dtype)
    scale_rows(src, factor, out)
    want = torch.where(factor[:, None] != 0, src.float() * factor[:, None], 0.0).to(out_dtype)
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    # rows off 16-byte boundaries on both sides (column slices of wider matrices)
    wide = torch.randn(rows, cols + 1, generator=gen, device="cuda").to(src_dtype)
    into = torch.full((rows, cols + 3), float("nan"), device="cuda", dtype=out_dtype)
    scale_rows(wide[:, 1:], factor, into[:, 3:])
    want = torch.where(factor[:, None] != 0, wide[:, 1:].float() * factor[:, None], 0.0)
    torch.testing.assert_close(into[:, 3:], want.to(out_dtype), atol=0, rtol=0)
    assert into[:, :3].isnan().all()  # nothing written outside the rows


def test_relative_probs_segments_change_the_schedule_not_the_result(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rlk_cuda import _ext

    ext = _ext.load()
    data = _data(2, 100, 64, 20000, torch.bfloat16, seed=11)
    args = (data["tokens"], data["old_logp"], data["advantages"], data["mask"])

    def run() -> list[torch.Tensor]:
        leaves = [data["hidden"].clone().requires_grad_(True),
                  data["weight"].clone().requires_grad_(True)]
        with rlk.use_backends("cuda", strict=True):
            loss, metrics = rlk.linear_policy_loss(*leaves, *args)
        loss.backward()
        return [loss.detach(), metrics["logp"], leaves[0].grad, leaves[1].grad]

    default = run()
    for nseg in (1, 7, 64):  # the row's blocks merge in another order: float32 sums differ
        monkeypatch.setattr(ext, "relative_probs_segments", lambda V, n=nseg: n)
        loss, logp, grad_hidden, grad_weight = run()
        torch.testing.assert_close(loss, default[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(logp, default[1], atol=2e-6, rtol=0)
        # bfloat16 gradients: a factor a few float32 ulps away may flip one rounding
        for got, want in ((grad_hidden, default[2]), (grad_weight, default[3])):
            torch.testing.assert_close(got.float(), want.float(), atol=1e-7, rtol=8e-3)
    monkeypatch.setattr(ext, "relative_probs_segments", lambda V: 65)
    with pytest.raises(RuntimeError, match="nseg must be within"):
        run()


@pytest.mark.parametrize("backend", ["cuda", "native"])
def test_float16_overflow_is_signalled_wherever_float64_overflows(backend: str) -> None:
    """Issue #31 F4 on a GPU: float16 GEMM operands round the logits gradient to float16, so
    an overflow may spread along its row (docs/ops/linear_policy_loss.md); every entry whose
    float64 gradient is past float16's range is non-finite, and the finite ones are right."""
    data = _data(2, 64, 64, 1300, torch.float16, seed=3)
    ref = data["old_logp"].clone()
    ref[0, 5] += 17.0  # a k3 KL gradient of e^17 / ~100 tokens at one token
    options = {"ref_logp": ref, "kl_coef": 1.0, "kl_estimator": "k3"}
    args = (data["tokens"], data["old_logp"], data["advantages"], data["mask"])
    leaves = [t.clone().requires_grad_(True) for t in (data["hidden"], data["weight"])]
    with rlk.use_backends(backend, strict=True):
        rlk.linear_policy_loss(*leaves, *args, **options)[0].backward()
    f64 = [t.detach().double().requires_grad_(True) for t in (data["hidden"], data["weight"])]
    want = reference.linear_policy_loss(
        f64[0].reshape(-1, 64), f64[1], data["tokens"].reshape(-1), old_logp=data["old_logp"],
        advantages=data["advantages"], mask=data["mask"], **_reference_options(options))
    want[0].backward()
    for got, expected in ((leaves[0].grad.reshape(-1, 64), f64[0].grad.reshape(-1, 64)),
                          (leaves[1].grad, f64[1].grad)):
        over = expected.half().isinf()
        assert over.any() and not got.isfinite()[over].any()
        fine = got.isfinite()
        torch.testing.assert_close(got[fine].double(), expected[fine], atol=3e-4, rtol=5e-3)



@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])  # the policy term alone; with an entropy term
def test_a_float32_weight_under_autocast_accumulates_its_gradient_in_float32(
        monkeypatch: pytest.MonkeyPatch, entropy_coef: float) -> None:
    """The float32 master weight of mixed precision (TRL's default): the GEMMs run in
    bfloat16 and its gradient accumulates over the row blocks in float32, so it is closer to
    float64 over the same bfloat16 operands than a bfloat16 weight's, which is rounded once
    per block (issue #26's GPU parity)."""
    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", "16")  # several row blocks
    data = _data(4, 512, 512, 16384, torch.float32, seed=6)
    options = _options("grpo-k3", data)
    args = (data["tokens"], data["old_logp"], data["advantages"], data["mask"])
    hidden = data["hidden"].bfloat16()

    def weight_grad(weight: torch.Tensor) -> torch.Tensor:
        leaf = weight.clone().requires_grad_(True)
        with rlk.use_backends("cuda", strict=True), torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = rlk.linear_policy_loss(hidden, leaf, *args, entropy_coef=entropy_coef,
                                             **options)
        loss.backward()
        return leaf.grad

    kept, rounded = weight_grad(data["weight"]), weight_grad(data["weight"].bfloat16())
    w64 = data["weight"].bfloat16().double().requires_grad_(True)
    want = reference.linear_policy_loss(
        hidden.double().reshape(-1, 512), w64, data["tokens"].reshape(-1),
        old_logp=data["old_logp"], advantages=data["advantages"], mask=data["mask"],
        entropy_coef=entropy_coef, **_reference_options(options))
    want[0].backward()
    assert kept.dtype == torch.float32 and rounded.dtype == torch.bfloat16
    kept_error, rounded_error = _relative(kept, w64.grad), _relative(rounded, w64.grad)
    print(f"\ngrad_weight rel: float32 weight {kept_error:.2e}, bfloat16 weight "
          f"{rounded_error:.2e}")
    assert kept_error < 0.8 * rounded_error
