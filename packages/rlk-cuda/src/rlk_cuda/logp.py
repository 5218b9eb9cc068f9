"""logp / logp_entropy / entropy kernels: the kernel-level functions rlk's dispatcher calls.

Signatures follow docs/backends/writing-a-backend.md. Logits with a non-unit column stride are
copied to a contiguous tensor first (any row stride is read in place). The kernels gather one
token per row: the plugin's check declines `[M, K]` tokens, which another backend serves.
"""

from __future__ import annotations

import torch
from rlk.backend import Temperature
from torch import Tensor

from . import _ext, logp_path
from ._launch import device_of, dtype_code, f32_empty, ptr, rows_major, same_device, stream


def _split(temperature: Temperature, device: int) -> tuple[Tensor | None, float]:
    if isinstance(temperature, Tensor):
        same_device("temperature", temperature, device)
        return temperature.to(torch.float32).contiguous(), 1.0
    return None, float(temperature)


def forward_segments(device: int, vocab: int) -> tuple[bool, int]:
    """Whether the forward on `device` takes the bulk-copy path (logp_path), and its row
    segments for `vocab` (scratch of 3 floats per row and segment when there is more than one,
    or on the bulk-copy path)."""
    ext = _ext.load()
    tma = logp_path.use_tma(device)
    return tma, int(ext.logp_forward_tma_segments(vocab) if tma
                    else ext.logp_forward_segments(vocab))


def launch_forward(
    logits: Tensor,
    tokens: Tensor | None,
    temperature: Temperature,
    ignore_index: int,
    rows: Tensor | None,
    logp: Tensor | None,
    entropy: Tensor | None,
    lse: Tensor | None,
) -> None:
    """Run the forward kernel into caller-provided outputs (None skips an output): float32,
    but the float64 lse. `tokens` None: no token is gathered (the entropy of every row).

    RLK_CUDA_LOGP_FORWARD picks the kernel (forward_segments); the sampler's statistics pass
    takes the same choice (rlk_cuda.sample), so its logp keeps matching this forward bit for
    bit.
    """
    device = device_of("logits", logits)
    code = dtype_code("logits", logits)
    logits = rows_major(logits)
    num_rows, vocab = logits.shape
    temp, temp_value = _split(temperature, device)
    count = num_rows if rows is None else rows.shape[0]
    if tokens is not None:
        same_device("tokens", tokens, device)
        tokens = tokens.to(torch.int64).contiguous()
    if rows is not None:
        same_device("rows", rows, device)
        rows = rows.to(torch.int64).contiguous()
    tma, segments = forward_segments(device, vocab)
    partial = None
    if tma or segments > 1:  # scratch for the rows' partial statistics, from torch's allocator
        partial = torch.empty(count * segments * 3, dtype=torch.float32, device=logits.device)
    ext = _ext.load()
    args = ext.LogpFwdArgs(
        logits=ptr(logits),
        dtype=code,
        M=num_rows,
        V=vocab,
        row_stride=logits.stride(0),
        tokens=ptr(tokens),
        rows=ptr(rows),
        R=count,
        temperature=temp_value,
        temp_rows=ptr(temp),
        ignore_index=int(ignore_index),
        logp=ptr(logp),
        logp_stride=1 if logp is None else logp.stride(0),
        entropy=ptr(entropy),
        lse=ptr(lse),
        nseg=segments,
        partial=ptr(partial),
    )
    launch = ext.logp_forward_tma if tma else ext.logp_forward
    launch(device=device, stream=stream(device), args=args)


def forward(
    logits: Tensor,
    tokens: Tensor,
    temperature: Temperature,
    ignore_index: int,
    rows: Tensor | None,
    out: Tensor | None,
    with_entropy: bool,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """log-softmax(logits / T) at tokens (and the entropy), one pass over each row."""
    count = logits.shape[0] if rows is None else rows.shape[0]
    device = logits.device
    logp = f32_empty(count, device=device) if out is None else out
    entropy = f32_empty(count, device=device) if with_entropy else None
    lse = torch.empty(count, dtype=torch.float64, device=device)
    if count > 0:
        launch_forward(logits, tokens, temperature, ignore_index, rows, logp, entropy, lse)
    return logp, entropy, lse


def launch_backward(
    grad: Tensor,
    logits: Tensor,
    tokens: Tensor,
    g_logp: Tensor,
    g_entropy: Tensor | None,
    lse: Tensor,
    entropy: Tensor | None,
    temperature: Temperature,
    ignore_index: int,
    col_offset: int,
    vocab_total: int,
) -> None:
    """Write the gradient of every row of `logits` into `grad` (which may be `logits`).

    `grad` has the logits' dtype, or for float32 logits bfloat16/float16 (the linear ops'
    GEMM input dtype).
    """
    device = device_of("logits", logits)
    code = dtype_code("logits", logits)
    narrower = logits.dtype == torch.float32 and grad.dtype in (torch.bfloat16, torch.float16)
    if (grad.dtype != logits.dtype and not narrower) or grad.shape != logits.shape:
        raise ValueError(
            f"grad must match logits ({logits.dtype}, {tuple(logits.shape)}; bfloat16 or "
            f"float16 for float32 logits); got {grad.dtype}, {tuple(grad.shape)}"
        )
    temp, temp_value = _split(temperature, device)
    num_rows, vocab = logits.shape
    lse = lse.to(torch.float64).contiguous()  # callers holding a float32 lse lose nothing more
    ext = _ext.load()
    args = ext.LogpBwdArgs(
        logits=ptr(logits),
        dtype=code,
        M=num_rows,
        V=vocab,
        row_stride=logits.stride(0),
        grad=ptr(grad),
        grad_dtype=dtype_code("grad", grad),
        grad_row_stride=grad.stride(0),
        tokens=ptr(tokens),
        g_logp=ptr(g_logp),
        g_ent=ptr(g_entropy),
        lse=ptr(lse),
        entropy=ptr(entropy),
        temperature=temp_value,
        temp_rows=ptr(temp),
        ignore_index=int(ignore_index),
        col_offset=int(col_offset),
        vocab_total=int(vocab_total),
    )
    ext.logp_backward(device=device, stream=stream(device), args=args)


def _per_row(values: Tensor | None, rows: Tensor, num_rows: int, accumulate: bool) -> Tensor | None:
    """Scatter per-selected-row values to all rows (zeros elsewhere; repeats add up)."""
    return None if values is None else _scatter(values, rows, num_rows, accumulate)


def _scatter(values: Tensor, rows: Tensor, num_rows: int, accumulate: bool) -> Tensor:
    """Per-selected-row values as per-logits-row ones (zeros elsewhere). With `accumulate`
    a repeated row gets the sum; without, repeats carry equal values (one forward row).
    Rows outside [0, num_rows) land in a sink past the end and are dropped."""
    sink = torch.where((rows >= 0) & (rows < num_rows), rows, num_rows)
    dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
    full = torch.zeros(num_rows + 1, dtype=dtype, device=values.device)
    values = values.to(dtype)
    full = full.index_add_(0, sink, values) if accumulate else full.index_copy_(0, sink, values)
    return full[:num_rows]


def backward(
    grad_logp: Tensor,
    grad_entropy: Tensor | None,
    logits: Tensor,
    tokens: Tensor,
    temperature: Temperature,
    ignore_index: int,
    rows: Tensor | None,
    lse: Tensor,
    entropy: Tensor | None,
    inplace: bool,
) -> Tensor:
    """Gradient w.r.t. logits in one pass; with inplace=True it overwrites the logits buffer."""
    device = device_of("logits", logits)
    num_rows, vocab = logits.shape
    unit = rows_major(logits)
    copied = unit is not logits
    tokens = tokens.to(torch.int64).contiguous()
    g_logp = grad_logp.to(torch.float32).contiguous()
    g_ent = None if grad_entropy is None else grad_entropy.to(torch.float32).contiguous()
    if rows is not None:
        same_device("rows", rows, device)
        rows = rows.to(torch.int64)
        g_logp = _scatter(g_logp, rows, num_rows, True)
        g_ent = _per_row(g_ent, rows, num_rows, True)
        lse = _scatter(lse, rows, num_rows, False)
        entropy = _per_row(entropy, rows, num_rows, False)
    if entropy is not None:
        entropy = entropy.to(torch.float32).contiguous()
    if g_ent is not None and entropy is None:
        raise ValueError("grad_entropy needs the entropy saved by the forward")
    grad = unit if (inplace or copied) else torch.empty_like(unit)
    if num_rows > 0:
        launch_backward(
            grad, unit, tokens, g_logp, g_ent, lse, entropy, temperature, ignore_index, 0, vocab
        )
    return grad
