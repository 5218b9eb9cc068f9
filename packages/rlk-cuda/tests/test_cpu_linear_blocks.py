"""linear_logp's chunk and row-block bookkeeping on a machine without a GPU.

The extension's kernels and CUDA's streams are replaced by torch stand-ins that agree with
each other (not with the kernels' internals), so what is checked is the orchestration alone:
which rows and columns each block reads and writes, its offsets into the statistics, the
temperature's and the tokens' slices. Random shapes, budgets and block sizes, against
float64 autograd. The real kernels go through the same paths in test_gpu_linear_logp.py.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import pytest
import torch
from torch import Tensor

from rlk_cuda import linear_logp as linear


class _Stream:
    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self) -> object:
        return object()


def _inverse_temperature(args: Any, rows: int) -> Tensor | float:
    if args.temp_rows is None:
        return 1.0 / args.temperature
    return 1.0 / args.temp_rows.double().view(rows, 1)


def _partial(device: int, stream: Any, args: Any) -> None:
    """A block's max, sum of exponentials and their x-weighted sum, per row, and the token's
    logit where the chunk holds it."""
    x = args.logits.double() * _inverse_temperature(args, args.N)
    top = x.max(1).values
    weights = torch.exp(x - top[:, None])
    out = args.partial.view(args.N, args.nchunks, 3)[:, args.chunk]
    out[:, 0], out[:, 1], out[:, 2] = top, weights.sum(1), (weights * x).sum(1)
    local = args.tokens - args.col_offset
    inside = (local >= 0) & (local < args.C)
    rows = inside.nonzero()[:, 0]
    args.tok_logit[rows] = args.logits[rows, local[rows]]


def _merge(device: int, stream: Any, args: Any) -> None:
    """The rows' statistics over every chunk: logp, entropy and the log-sum-exp of x / T."""
    parts = args.partial.view(args.N, args.nchunks, 3).double()
    top = parts[:, :, 0].max(1).values
    scale = torch.exp(parts[:, :, 0] - top[:, None])
    total = (parts[:, :, 1] * scale).sum(1)
    lse = top + torch.log(total)
    args.lse.copy_(lse)
    inv_t = _inverse_temperature(args, args.N)
    inv_t = inv_t.view(-1) if isinstance(inv_t, Tensor) else inv_t
    args.logp.copy_(torch.where(args.tokens == args.ignore_index, 0.0,
                                args.tok_logit.double() * inv_t - lse))
    if args.entropy is not None:
        args.entropy.copy_(lse - (parts[:, :, 2] * scale).sum(1) / total)


def _backward(grad: Tensor, logits: Tensor, tokens: Tensor, g_logp: Tensor,
              g_entropy: Tensor | None, lse: Tensor, entropy: Tensor | None,
              temperature: Tensor | float, ignore_index: int, col_offset: int,
              vocab_total: int) -> None:
    inv_t = (1.0 / temperature.double()[:, None] if isinstance(temperature, Tensor)
             else 1.0 / temperature)
    x = logits.double() * inv_t
    probs = torch.exp(x - lse[:, None])
    columns = torch.arange(col_offset, col_offset + logits.shape[1])
    d = g_logp.double()[:, None] * ((tokens[:, None] == columns).double() - probs)
    if g_entropy is not None and entropy is not None:
        d -= g_entropy.double()[:, None] * probs * (x - lse[:, None] + entropy.double()[:, None])
    d[tokens == ignore_index] = 0.0
    grad.copy_(d * inv_t)


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    ext = types.SimpleNamespace(LogpColsArgs=lambda **fields: types.SimpleNamespace(**fields),
                                logp_cols_partial=_partial, logp_cols_merge=_merge)
    monkeypatch.setattr(linear._ext, "load", lambda: ext)
    monkeypatch.setattr(linear, "ptr", lambda tensor: tensor)
    monkeypatch.setattr(linear, "dtype_codes", lambda: {torch.float32: 0})
    monkeypatch.setattr(linear, "launch_backward", _backward)
    monkeypatch.setattr(linear, "device_of", lambda name, tensor: 0)
    monkeypatch.setattr(linear, "stream", lambda index: None)
    monkeypatch.setattr(linear, "_side_stream", lambda device: _Stream())
    monkeypatch.setattr(linear, "f32_empty", lambda n, device: torch.full(
        (n,), float("nan"), device=device))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())


def _reduced_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path of a bfloat16/float16 GEMM (separate gradient buffer, logits in row blocks),
    its GEMMs in float64 on CPU and its gradient buffer in float16."""
    head = types.SimpleNamespace(
        gemm_dtype=lambda dtype, device: torch.float16,
        float32_logits=lambda hidden, weight, bias, out: out.copy_(
            hidden.double() @ weight.double().t()),
        kernel_temperature=linear.lm_head.kernel_temperature)
    monkeypatch.setattr(linear, "lm_head", head)
    monkeypatch.setattr(linear, "accumulate_mm", lambda acc, a, b: acc.add_(
        (a.double() @ b.double()).to(acc.dtype)))
    monkeypatch.setattr(linear, "mm_into", lambda out, a, b: out.copy_(a.double() @ b.double()))


@pytest.mark.parametrize("seed", range(24))
@pytest.mark.parametrize("gemm", ["float32", "reduced"])
def test_blocks_and_chunks_cover_every_row_and_column(
        stand_ins: None, monkeypatch: pytest.MonkeyPatch, seed: int, gemm: str) -> None:
    gen = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (), generator=gen))

    num, width, vocab = draw(1, 300), 8, draw(1, 700)
    monkeypatch.setattr(linear, "_BLOCK_ROWS", draw(1, 120))
    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", str(draw(1, 160) * 1024 / 2**20))
    if gemm == "reduced":
        _reduced_gemm(monkeypatch)
    # float16 values: the reduced path's chunk copies of the weight are exact
    hidden = torch.randn(num, width, generator=gen).half().double()
    weight = torch.randn(vocab, width, generator=gen).half().double()
    tokens = torch.randint(0, vocab, (num,), generator=gen)
    tokens[torch.rand(num, generator=gen) < 0.2] = -100
    temperature: Tensor | float = (torch.rand(num, dtype=torch.float64, generator=gen) + 0.5
                                   if seed % 2 else 0.7)
    with_entropy = seed % 3 == 0

    leaves = [hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)]
    divisor = temperature[:, None] if isinstance(temperature, Tensor) else temperature
    log_probs = torch.log_softmax(leaves[0] @ leaves[1].t() / divisor, -1)
    kept = tokens != -100
    want_logp = torch.where(kept, log_probs.gather(1, tokens.clamp(min=0)[:, None])[:, 0], 0.0)
    want_entropy = -(log_probs.exp() * log_probs).sum(-1)
    g_logp = torch.randn(num, dtype=torch.float64, generator=gen)
    g_entropy = torch.randn(num, dtype=torch.float64, generator=gen) * kept
    total = (want_logp * g_logp).sum() + ((want_entropy * g_entropy).sum() if with_entropy else 0)
    want_grads = torch.autograd.grad(total, leaves)

    temp = temperature.float() if isinstance(temperature, Tensor) else temperature
    logp, entropy, lse = linear._shard_forward(hidden.float(), weight.float(), tokens, None, temp,
                                               -100, with_entropy, None)
    assert (logp.double() - want_logp).abs().max() < 1e-5
    if with_entropy:
        assert entropy is not None
        assert ((entropy.double() - want_entropy) * kept).abs().max() < 1e-4
    grads = linear._shard_backward(
        g_logp.float(), g_entropy.float() if with_entropy else None, hidden.float(),
        weight.float(), tokens, None, temp, -100, vocab, lse, entropy, (True, True, False), None,
        (~kept)[:, None])
    tol = 1e-4 if gemm == "float32" else 2e-3  # the reduced path's float16 gradient buffer
    for got, want in zip(grads[:2], want_grads, strict=True):
        assert got is not None
        assert (got.double() - want).abs().max() < tol * (1 + want.abs().max())


@pytest.mark.parametrize("seed", range(8))
def test_chunk_width_is_the_widest_that_fits_the_budget(monkeypatch: pytest.MonkeyPatch,
                                                        seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    budget = int(torch.randint(1, 2**30, (), generator=gen))
    vocab = int(torch.randint(1, 300_000, (), generator=gen))
    column_bytes = int(torch.randint(1, 2**20, (), generator=gen))
    monkeypatch.setenv("RLK_CUDA_CHUNK_MB", str(budget / 2**20))
    width = linear._chunk_width(vocab, column_bytes)
    assert width % 128 == 0 or width == vocab
    assert width * column_bytes <= budget or width == 128
    assert width == vocab or (width + 128) * column_bytes > budget


def test_default_budget_holds_trl_head_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, linear_logp's buffers fit TRL 1.16's own LM-head tile (4096 x 32768 bf16) at a
    GRPO micro-batch of 16k rows and Qwen2.5's vocabulary, and its chunks stay wide; the
    policy loss keeps its larger budget."""
    monkeypatch.delenv("RLK_CUDA_CHUNK_MB", raising=False)
    num, vocab, tile = 16384, 151936, 4096 * 32768 * 2
    rows = min(num, linear._BLOCK_ROWS)
    forward = linear._chunk_width(vocab, 2 * rows * 4)
    backward = linear._chunk_width(vocab, rows * 4 + num * 2)  # bf16 gradient buffer
    assert 2 * rows * forward * 4 <= tile and forward >= 16384
    assert (rows * 4 + num * 2) * backward <= tile and backward >= 6144
    assert linear.chunk_bytes(linear.POLICY_LOSS_CHUNK_MB) == 960 * 2**20
