"""linear_logp / linear_logp_entropy: cuBLAS GEMMs through torch, rlk kernels between them.

Forward: vocabulary chunks of `hidden @ weight.T` over all rows, each reduced to partial
softmax statistics by a kernel that overlaps the next chunk's GEMM, then merged in order.
Backward: vocabulary chunks over all rows. Each chunk's logits are recomputed, the logp backward
kernel overwrites them with their gradient, and two GEMMs consume it: grad_hidden accumulates in
float32 across chunks, and grad_weight[chunk] comes from one GEMM over all rows (float32
accumulation inside cuBLAS), so no float32 copy of the weight ever exists.

Vocabulary parallelism (group=): `weight` and `bias` are this rank's slice of the vocabulary.
Both passes run on the shard with the shard-local token codes of rlk.backend.shards, whose helpers
merge the forward statistics across ranks; the backward sums grad_hidden (float32) over ranks.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from rlk.backend import shards
from torch import Tensor

from . import _ext
from ._launch import device_of, dtype_code, f32_empty, ptr, stream
from .logp import launch_backward

Temperature = float | Tensor
_DEFAULT_CHUNK_MB = 256


def chunk_bytes() -> int:
    """Budget of the one logits buffer (RLK_CUDA_CHUNK_MB overrides the 256 MiB default)."""
    raw = os.environ.get("RLK_CUDA_CHUNK_MB", str(_DEFAULT_CHUNK_MB))
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


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> Tensor:
    if bias is None:
        return torch.mm(hidden, weight.t(), out=out)
    return torch.addmm(bias, hidden, weight.t(), out=out)


def forward(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    bias: Tensor | None,
    temperature: Temperature,
    ignore_index: int,
    with_entropy: bool,
    group: dist.ProcessGroup | None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """logp (and entropy) of tokens under softmax((hidden @ weight.T + bias) / T).

    With `group`, the softmax spans every rank's shard: the shard's statistics (at local token
    codes, never ignored: the merge applies ignore_index to the global tokens) are merged.
    """
    device_of("hidden", hidden)  # before any collective: a CPU call fails here, on every rank
    if group is None:
        return _shard_forward(hidden, weight, tokens, bias, temperature, ignore_index, with_entropy)
    shard = shards.layout(weight.shape[0], group, hidden.device)
    codes, owned = shards.forward_tokens(tokens.to(torch.int64), shard)
    picked, entropy, lse = _shard_forward(
        hidden, weight, codes, bias, temperature, shards.KERNEL_IGNORE, with_entropy
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
) -> tuple[Tensor, Tensor | None, Tensor]:
    """(logp, entropy, lse) over the vocabulary `weight` holds; tokens index that vocabulary."""
    num, vocab = hidden.shape[0], weight.shape[0]
    device = hidden.device
    logp = f32_empty(num, device=device)
    entropy = f32_empty(num, device=device) if with_entropy else None
    lse = f32_empty(num, device=device)
    if num == 0:
        return logp, entropy, lse
    index = device_of("hidden", hidden)
    code = dtype_code("hidden", hidden)
    # Vocabulary chunks over all rows (large GEMMs). Two half-budget buffers: the reduction of
    # one chunk (memory-bound, side stream) runs under the GEMM of the next (caller's stream).
    width = _chunk_width(num, vocab, hidden.element_size(), 2)
    nchunks = (vocab + width - 1) // width
    buffers = [torch.empty(num * width, dtype=hidden.dtype, device=device) for _ in range(2)]
    partial = f32_empty(num * nchunks * 3, device=device)
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

    def cols(phase: int, logits: Tensor | None, start: int, chunk: int) -> None:
        width_here = 0 if logits is None else logits.shape[1]
        ext.logp_cols(
            phase,
            index,
            stream(index),
            ptr(logits),
            code,
            num,
            width_here,
            width_here,
            start,
            vocab,
            ptr(tokens),
            temp_value,
            ptr(temp),
            int(ignore_index),
            chunk,
            nchunks,
            ptr(partial),
            ptr(tok_logit),
            ptr(logp),
            ptr(entropy),
            ptr(lse),
        )

    for chunk, start in enumerate(range(0, vocab, width)):
        stop = min(vocab, start + width)
        slot = chunk % 2
        event = free[slot]
        if event is not None:
            main.wait_event(event)
        view = buffers[slot][: num * (stop - start)].view(num, stop - start)
        b = None if bias is None else bias[start:stop]
        logits = _logits(hidden, weight[start:stop], b, view)
        side.wait_event(main.record_event())
        with torch.cuda.stream(side):
            cols(0, logits, start, chunk)
        free[slot] = side.record_event()
    with torch.cuda.stream(side):
        cols(1, None, 0, 0)
    main.wait_stream(side)
    return logp, entropy, lse


def _chunk_width(num: int, vocab: int, element_size: int, buffers: int) -> int:
    """Vocabulary columns per chunk so that `buffers` [num, width] buffers fit the budget."""
    width = chunk_bytes() // buffers // (max(num, 1) * element_size)
    return max(128, min(vocab, (width // 128) * 128 or 128))


def _accumulate_grad_hidden(acc: Tensor, grad_logits: Tensor, weight: Tensor) -> None:
    """acc += grad_logits @ weight in float32 (a float32-output GEMM when torch has one)."""
    try:
        torch.addmm(acc, grad_logits, weight, out_dtype=torch.float32, out=acc)
    except (TypeError, RuntimeError, NotImplementedError):
        acc.add_(torch.mm(grad_logits, weight))


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
    grad_h, grad_w, grad_b = _shard_backward(
        grad_logp,
        grad_entropy,
        hidden,
        weight,
        codes,
        bias,
        temperature,
        kernel_ignore,
        vocab_total,
        lse,
        entropy,
        needs_input_grad,
    )
    if grad_h is not None and group is not None:
        dist.all_reduce(grad_h, op=dist.ReduceOp.SUM, group=group)
    return (None if grad_h is None else grad_h.to(hidden.dtype)), grad_w, grad_b


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
    width = _chunk_width(num, vocab, hidden.element_size(), 1)
    buffer = torch.empty(num * width, dtype=hidden.dtype, device=dev)
    tokens = tokens.to(torch.int64).contiguous()
    g_logp = grad_logp.to(torch.float32).contiguous()
    g_ent = None if grad_entropy is None else grad_entropy.to(torch.float32).contiguous()
    lse = lse.to(torch.float32).contiguous()
    entropy = None if entropy is None else entropy.to(torch.float32).contiguous()
    for start in range(0, vocab, width):
        stop = min(vocab, start + width)
        w = weight[start:stop]
        b = None if bias is None else bias[start:stop]
        logits = _logits(hidden, w, b, buffer[: num * (stop - start)].view(num, stop - start))
        launch_backward(
            logits,
            logits,
            tokens,
            g_logp,
            g_ent,
            lse,
            entropy,
            temperature,
            ignore_index,
            start,
            vocab_total,
        )
        if grad_h is not None:
            _accumulate_grad_hidden(grad_h, logits, w)
        if grad_w is not None:
            torch.mm(logits.t(), hidden, out=grad_w[start:stop])
        if grad_b is not None:
            grad_b[start:stop] = logits.sum(0, dtype=torch.float32)
    return grad_h, grad_w, grad_b
