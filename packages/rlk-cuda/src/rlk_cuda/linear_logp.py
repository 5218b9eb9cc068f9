"""linear_logp / linear_logp_entropy: cuBLAS GEMMs through torch, rlk kernels between them.

Logits chunks are float32 (rlk.backend.lm_head: a float32-output GEMM of the inputs' dtype).
Both passes compute a chunk's float32 logits a block of rows at a time (_BLOCK_ROWS), so that the
budget buys wide chunks rather than tall ones.
Forward: vocabulary chunks of `hidden @ weight.T`, each block reduced to partial softmax
statistics by a kernel that overlaps the next block's GEMM, then merged in order.
Backward: vocabulary chunks. Each block's logits are recomputed and the logp backward kernel turns
them into their gradient in the GEMM input dtype, into a buffer of the chunk's width for all rows
(2 bytes an element where the float32 logits take 4); two GEMMs over all rows consume it:
grad_hidden accumulates in float32 across chunks, and grad_weight[chunk] comes from one GEMM over
all rows (float32 accumulation inside cuBLAS), written in the weight's dtype: a reduced weight
gets no float32 copy, a float32 weight beside a reduced hidden (the float32_weight property) is
read a chunk at a time through reduced copies, one alive at a time (no reduced copy of the whole
weight), and gets its gradient in float32 unrounded.
Soft-capping (rlk.backend.lm_head's contract) adds one in-place pass over each chunk, and one more
for its chain rule in the backward.

Vocabulary parallelism (group=): `weight` and `bias` are this rank's slice of the vocabulary.
Both passes run on the shard with the shard-local token codes of rlk.backend.shards, whose helpers
merge the forward statistics across ranks; the backward sums grad_hidden (float32) over ranks.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.distributed as dist
from rlk.backend import Temperature, lm_head, shards
from torch import Tensor

from . import _ext
from ._launch import device_of, dtype_code, dtype_codes, f32_empty, ptr, stream
from .logp import launch_backward

POLICY_LOSS_CHUNK_MB = 960  # linear_policy_loss's default budget (see chunk_bytes)
LOGP_CHUNK_MB = 256  # linear_logp's: TRL 1.16's LM head tile (4096 x 32768 bf16), see chunk_bytes
_BLOCK_ROWS = 2048  # rows of one float32 logits block (one GEMM, one reduction)
_ROW_ALIGN = 8  # buffer rows start on 32-byte boundaries: the kernels' 16-byte vectors fit


def chunk_bytes(default_mb: float) -> int:
    """Budget of a linear op's logits buffers: RLK_CUDA_CHUNK_MB, else the op's default.

    linear_policy_loss: each block of rows costs one pass over the weight's gradient, so its
    default is as large as its 1 GiB extra-memory target allows: at V=151936 it holds 2048
    rows (four blocks at N=8192: 47.9 ms a step against 49.5 with 768 MiB's six, H200 bf16,
    0.90 GiB beyond the gradients). linear_logp: blocks of _BLOCK_ROWS rows keep its chunks
    wide at any N, so TRL's own footprint costs it little (docs/backends/cuda.md)."""
    raw = os.environ.get("RLK_CUDA_CHUNK_MB", str(default_mb))
    value = float(raw)
    if value <= 0:
        raise ValueError(f"RLK_CUDA_CHUNK_MB must be > 0, got {raw!r}")
    return int(value * 2**20)


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """A second stream per device for the logp kernels that overlap the GEMMs."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def padded(width: int) -> int:
    """A buffer row stride for `width` columns: the next multiple of 8 elements."""
    return (width + _ROW_ALIGN - 1) // _ROW_ALIGN * _ROW_ALIGN


def rows_view(buffer: Tensor, rows: int, width: int) -> Tensor:
    """[rows, width] of a flat buffer, rows `padded(width)` apart."""
    return buffer[: rows * padded(width)].view(rows, padded(width))[:, :width]


def soft_cap(logits: Tensor, softcap: float | None, grad: Tensor | None = None) -> None:
    """In place on float32 logits: tanh(x / softcap); with `grad`, its chain rule into grad."""
    if softcap is None:
        return
    device = device_of("logits", logits)
    ext = _ext.load()
    args = ext.SoftCapArgs(
        logits=ptr(logits),
        N=logits.shape[0],
        C=logits.shape[1],
        row_stride=logits.stride(0),
        softcap=float(softcap),
        grad=ptr(grad),
        grad_dtype=0 if grad is None else dtype_code("grad", grad),
        grad_row_stride=0 if grad is None else grad.stride(0),
    )
    ext.soft_cap(device=device, stream=stream(device), args=args)


def forward(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    bias: Tensor | None,
    temperature: Temperature,
    ignore_index: int,
    with_entropy: bool,
    group: dist.ProcessGroup | None,
    softcap: float | None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """logp (and entropy) of tokens under softmax(capped(hidden @ weight.T + bias) / T).

    With `group`, the softmax spans every rank's shard: the shard's statistics (at local token
    codes, never ignored: the merge applies ignore_index to the global tokens) are merged.
    """
    device_of("hidden", hidden)  # before any collective: a CPU call fails here, on every rank
    temperature = lm_head.kernel_temperature(temperature, softcap)
    if group is None:
        return _shard_forward(hidden, weight, tokens, bias, temperature, ignore_index,
                              with_entropy, softcap)
    shard = shards.layout(weight.shape[0], group, hidden.device)
    codes, owned = shards.forward_tokens(tokens.to(torch.int64), shard)
    picked, entropy, lse = _shard_forward(
        hidden, weight, codes, bias, temperature, shards.KERNEL_IGNORE, with_entropy, softcap
    )
    return shards.merge(lse, entropy, picked, owned, tokens, shard, ignore_index, group)


def _shard_forward(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    bias: Tensor | None,
    temperature: Temperature,
    ignore_index: int,
    with_entropy: bool,
    softcap: float | None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """(logp, entropy, lse) over the vocabulary `weight` holds; tokens index that vocabulary.

    `temperature` is the kernels' (rlk.backend.lm_head.kernel_temperature).
    """
    num, vocab = hidden.shape[0], weight.shape[0]
    device = hidden.device
    logp = f32_empty(num, device=device)
    entropy = f32_empty(num, device=device) if with_entropy else None
    lse = torch.empty(num, dtype=torch.float64, device=device)  # what the backward kernel reads
    if num == 0:
        return logp, entropy, lse
    index = device_of("hidden", hidden)
    gemm = lm_head.gemm_dtype(hidden.dtype, hidden.device)
    # Vocabulary chunks, each in blocks of rows. Two half-budget buffers: the reduction of one
    # block (memory-bound, side stream) runs under the GEMM of the next (caller's stream).
    rows = min(num, _BLOCK_ROWS)
    width = _chunk_width(vocab, 2 * rows * 4)
    nchunks = (vocab + width - 1) // width
    buffers = [f32_empty(rows * padded(width), device=device) for _ in range(2)]
    partial = f32_empty(num * nchunks * 3, device=device).view(num, nchunks * 3)
    tok_logit = f32_empty(num, device=device)
    tokens = tokens.to(torch.int64).contiguous()
    temp, temp_value = (
        (temperature.to(torch.float32).contiguous(), 1.0)
        if isinstance(temperature, Tensor)
        else (None, float(temperature))
    )
    ext = _ext.load()
    main = torch.cuda.current_stream(device)
    side = _side_stream(device)
    side.wait_stream(main)
    free: list[torch.cuda.Event | None] = [None, None]

    def cols(block: slice, logits: Tensor | None, start: int, chunk: int) -> None:
        """One block's partial statistics of a chunk, or with logits None the merge of all
        chunks."""
        width_here = 0 if logits is None else logits.shape[1]
        args = ext.LogpColsArgs(
            logits=ptr(logits),
            dtype=dtype_codes()[torch.float32],  # the chunks are float32 logits
            N=block.stop - block.start,
            C=width_here,
            row_stride=0 if logits is None else logits.stride(0),
            col_offset=start,
            vocab_total=vocab,
            tokens=ptr(tokens[block]),
            temperature=temp_value,
            temp_rows=ptr(None if temp is None else temp[block]),
            ignore_index=int(ignore_index),
            chunk=chunk,
            nchunks=nchunks,
            partial=ptr(partial[block]),
            tok_logit=ptr(tok_logit[block]),
            logp=ptr(logp[block]),
            entropy=ptr(None if entropy is None else entropy[block]),
            lse=ptr(lse[block]),
        )
        launch = ext.logp_cols_merge if logits is None else ext.logp_cols_partial
        launch(device=index, stream=stream(index), args=args)

    step = 0
    for chunk, start in enumerate(range(0, vocab, width)):
        stop = min(vocab, start + width)
        w = weight[start:stop].to(gemm)  # a float32 weight's: a chunk-sized copy
        b = None if bias is None else bias[start:stop].to(gemm)  # rounded as the cast path's
        for block in _blocks(num, rows):
            slot = step % 2
            step += 1
            event = free[slot]
            if event is not None:
                main.wait_event(event)
            out = rows_view(buffers[slot], block.stop - block.start, stop - start)
            logits = lm_head.float32_logits(hidden[block], w, b, out=out)
            soft_cap(logits, softcap)
            side.wait_event(main.record_event())
            with torch.cuda.stream(side):
                cols(block, logits, start, chunk)
            free[slot] = side.record_event()
        del w, b  # a float32 weight's chunk copy goes before the next one is made
    with torch.cuda.stream(side):
        cols(slice(0, num), None, 0, 0)
    main.wait_stream(side)
    return logp, entropy, lse


def _blocks(num: int, rows: int) -> list[slice]:
    """[0, num) in blocks of `rows` rows."""
    return [slice(start, min(num, start + rows)) for start in range(0, num, rows)]


def _chunk_width(vocab: int, column_bytes: int) -> int:
    """Columns per vocabulary chunk when each column costs `column_bytes` across the buffers:
    as many as linear_logp's budget holds, a multiple of 128, at least 128, at most the
    vocabulary."""
    columns = chunk_bytes(LOGP_CHUNK_MB) // column_bytes
    return max(128, min(vocab, columns // 128 * 128))


@functools.cache
def _accumulating_float32_gemm() -> bool:
    """Whether torch has baddbmm with float32 output for reduced inputs (beta=1 accumulates)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("aten::baddbmm.dtype_out", "CUDA")


def accumulate_mm(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc += a @ b, accumulated in float32 (`acc`) whatever the operands' dtype."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif _accumulating_float32_gemm():
        acc3 = acc.unsqueeze(0)
        torch.baddbmm(acc3, a.unsqueeze(0), b.unsqueeze(0), out_dtype=torch.float32, out=acc3)
    else:
        acc.add_(torch.mm(a, b))


def mm_into(out: Tensor, a: Tensor, b: Tensor) -> None:
    """out = a @ b in place, accumulated in float32 and rounded once to out's dtype (the
    operands', or float32: a float32 weight's gradient from reduced operands)."""
    if out.dtype == a.dtype:
        torch.mm(a, b, out=out)
    else:
        torch.mm(a, b, out_dtype=torch.float32, out=out)


def backward(
    grad_logp: Tensor,
    grad_entropy: Tensor | None,
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    bias: Tensor | None,
    temperature: Temperature,
    ignore_index: int,
    group: dist.ProcessGroup | None,
    lse: Tensor,
    entropy: Tensor | None,
    needs_input_grad: tuple[bool, bool, bool],
    softcap: float | None,
) -> tuple[Tensor | None, ...]:
    """Gradients to (hidden, weight, bias), vocabulary chunk by vocabulary chunk.

    With `group`, `lse` and `entropy` are the merged (global) ones, so each shard's logits
    gradient is exact on its own. Tokens become rlk.backend.shards.backward_tokens codes: a token
    another rank owns points at the column just past the shard (core pads the logits with a
    -inf column there), so such rows get the softmax term and no one-hot term; the kernel needs
    no padding, only vocab_total = shard + 1 so that this code counts as in range.
    """
    device_of("hidden", hidden)  # before any collective: a CPU call fails here, on every rank
    codes, kernel_ignore, vocab_total = tokens, ignore_index, weight.shape[0]
    if group is not None:
        shard = shards.layout(weight.shape[0], group, hidden.device)
        codes = shards.backward_tokens(tokens.to(torch.int64), shard, ignore_index)
        kernel_ignore, vocab_total = shards.KERNEL_IGNORE, shard.local + 1
    # ignored rows have a zero logits gradient; their hidden state may be NaN (0 * NaN)
    ignored = (tokens == ignore_index).unsqueeze(1)
    grad_h, grad_w, grad_b = _shard_backward(
        grad_logp,
        grad_entropy,
        hidden,
        weight,
        codes,
        bias,
        lm_head.kernel_temperature(temperature, softcap),
        kernel_ignore,
        vocab_total,
        lse,
        entropy,
        needs_input_grad,
        softcap,
        ignored,
    )
    if grad_h is not None and group is not None:
        dist.all_reduce(grad_h, op=dist.ReduceOp.SUM, group=group)
    # float32: the op rounds it once, to its caller's dtype (float32 stays unrounded)
    return grad_h, grad_w, grad_b


def _shard_backward(
    grad_logp: Tensor,
    grad_entropy: Tensor | None,
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    bias: Tensor | None,
    temperature: Temperature,
    ignore_index: int,
    vocab_total: int,
    lse: Tensor,
    entropy: Tensor | None,
    needs_input_grad: tuple[bool, bool, bool],
    softcap: float | None,
    ignored: Tensor,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(float32 grad_hidden, grad_weight, grad_bias) of the vocabulary `weight` holds."""
    want_h, want_w, want_b = needs_input_grad
    want_b = want_b and bias is not None
    num, vocab = hidden.shape[0], weight.shape[0]
    dev = hidden.device
    grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=dev) if want_h else None
    grad_w = torch.empty_like(weight) if want_w else None
    grad_b = torch.empty_like(bias) if want_b and bias is not None else None
    if num == 0:
        if grad_w is not None:
            grad_w.zero_()
        if grad_b is not None:
            grad_b.zero_()
        return grad_h, grad_w, grad_b
    gemm = lm_head.gemm_dtype(hidden.dtype, hidden.device)
    # float32 logits a block of rows at a time, and their gradient in the GEMM input dtype for
    # all rows; in place (whole chunks) when that is float32, unless the soft cap's chain rule
    # needs the capped logits after the gradient is written
    separate = gemm != torch.float32 or softcap is not None
    if separate:
        rows = min(num, _BLOCK_ROWS)
        width = _chunk_width(vocab, rows * 4 + num * gemm.itemsize)
        buffer = f32_empty(rows * padded(width), device=dev)
        grad_buffer = torch.empty(num * padded(width), dtype=gemm, device=dev)
    else:
        rows = num
        width = _chunk_width(vocab, num * 4)
        buffer = grad_buffer = f32_empty(num * padded(width), device=dev)
    operand = hidden.masked_fill(ignored, 0.0).to(gemm) if grad_w is not None else None
    tokens = tokens.to(torch.int64).contiguous()
    g_logp = grad_logp.to(torch.float32).contiguous()
    g_ent = None if grad_entropy is None else grad_entropy.to(torch.float32).contiguous()
    lse = lse.to(torch.float64).contiguous()
    entropy = None if entropy is None else entropy.to(torch.float32).contiguous()
    for start in range(0, vocab, width):
        stop = min(vocab, start + width)
        w = weight[start:stop].to(gemm)  # a float32 weight's: a chunk-sized copy
        b = None if bias is None else bias[start:stop].to(gemm)  # rounded as the cast path's
        grad = rows_view(grad_buffer, num, stop - start)
        for block in _blocks(num, rows):
            out = rows_view(buffer, block.stop - block.start, stop - start)
            logits = lm_head.float32_logits(hidden[block], w, b, out=out)
            soft_cap(logits, softcap)
            launch_backward(
                grad[block],
                logits,
                tokens[block],
                g_logp[block],
                None if g_ent is None else g_ent[block],
                lse[block],
                None if entropy is None else entropy[block],
                temperature[block] if isinstance(temperature, Tensor) else temperature,
                ignore_index,
                start,
                vocab_total,
            )
            soft_cap(logits, softcap, grad[block])
        if grad_h is not None:
            accumulate_mm(grad_h, grad, w)
        if grad_w is not None and operand is not None:
            mm_into(grad_w[start:stop], grad.t(), operand)
        if grad_b is not None:
            grad_b[start:stop] = grad.sum(0, dtype=torch.float32)
        del w, b  # as in the forward: one chunk copy of a float32 weight at a time
    return grad_h, grad_w, grad_b
