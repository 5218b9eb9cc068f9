"""linear_policy_loss: rlk-core's three-GEMM loop with this package's kernels between the GEMMs.

One read of the logits (`one_read`: no vocabulary shards, no soft cap, no entropy term in the
loss). Rows go in blocks sized by the chunk budget (of whole sequences for a loss that needs
them); each block's float32 logits are computed a few rows at a time (one
float32-output GEMM) and read once by the relative_probs kernel, which writes the rows'
logp, entropy and log-sum-exp and, into a block buffer in the GEMM input dtype, each row's
logits gradient up to a factor known only once the loss's token gradient g is:
d loss / d logits = -(g / T) * scale * e (csrc/linear_policy_loss.cu). Then per block:
grad_hidden = factor * (e @ W) and grad_weight += e.T @ (factor * hidden), so the weight
gradient's GEMM runs over a whole block of rows (few passes over its output) and the
logits are never read a second time.

Otherwise, per block: the float32 logits, the logp forward kernel, the policy loss's token
gradients, the logp backward kernel writing d loss / d logits in the GEMM input dtype, then
the same two GEMMs. grad_weight accumulates in the weight's dtype through cuBLAS (float32
arithmetic, one rounding per block), so a reduced weight gets no float32 copy of its shape:
the extra memory is the two buffers, together within rlk_cuda.linear_logp.chunk_bytes()
(RLK_CUDA_CHUNK_MB, else 960 MiB). A float32 weight beside a reduced hidden (the
float32_weight property) takes this path, read through one reduced copy, and its gradient
accumulates in float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from rlk.backend import Temperature, lm_head, selected_kernel
from rlk.backend import linear_policy_loop as loop
from torch import Tensor

from . import _ext
from . import logp as logp_kernels
from ._launch import device_of, dtype_code, f32_empty, ptr, rows_major, stream
from .linear_logp import POLICY_LOSS_CHUNK_MB, chunk_bytes, mm_into, padded, rows_view, soft_cap

_ROW_MULTIPLE = 128  # rows per chunk: whole GEMM tiles
_LOGITS_ROWS = 512  # rows per float32 logits GEMM on the one-read path (256: 2% slower)


@dataclass
class CudaChunkOps(loop.ChunkOps):
    """rlk-core's chunk steps on rlk_cuda's kernels and reused buffers; with `one_read`, the
    relative_probs kernel and block GEMMs (the module docstring)."""

    one_read: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._logits: Tensor | None = None
        self._grads: Tensor | None = None
        self._block: _Block | None = None
        self._weight_written = False  # the weight gradient's first GEMM overwrites (beta 0)

    def _logits_rows(self) -> int:
        """Rows of one float32 logits GEMM: the whole block, or up to LOGITS_ROWS of it with
        one_read."""
        rows = self.chunk_rows()
        return min(_LOGITS_ROWS, rows) if self.one_read else rows

    def chunk_rows(self) -> int:
        """Rows per block: the budget holds the float32 logits buffer and the block's
        gradient rows in the GEMM input dtype (with one_read, a logits buffer of LOGITS_ROWS
        rows when the budget has room for a block of at least that many)."""
        width = padded(self.vocab)
        budget, grad_bytes = chunk_bytes(POLICY_LOSS_CHUNK_MB), self.operand.element_size()
        if self.one_read:
            rows = (budget - _LOGITS_ROWS * width * 4) // (width * grad_bytes)
            if rows >= _LOGITS_ROWS:
                return rows // _LOGITS_ROWS * _LOGITS_ROWS
        rows = budget // (width * (4 + grad_bytes))
        return max(1, rows // _ROW_MULTIPLE * _ROW_MULTIPLE or rows)

    def _buffer(self, rows: int, dtype: torch.dtype) -> Tensor:
        return torch.empty(rows * padded(self.weight.shape[0]), dtype=dtype,
                           device=self.hidden.device)

    def logits(self, start: int, stop: int, pad: bool) -> Tensor:
        """Float32 (capped) logits; a vocabulary shard needs no -inf column here (the backward
        kernel takes vocab_total = shard + 1 instead)."""
        if self._logits is None:
            self._logits = self._buffer(self._logits_rows(), torch.float32)
        vocab = self.weight.shape[0]
        out = rows_view(self._logits, stop - start, vocab)
        lm_head.float32_logits(self.hidden[start:stop], self.operand, self.operand_bias,
                               out=out)
        soft_cap(out, self.softcap)
        return out

    def stats(self, logits: Tensor, tokens: Tensor, temperature: Temperature,
              ignore_index: int) -> tuple[Tensor, Tensor, Tensor]:
        logp, entropy, lse = logp_kernels.forward(logits, tokens, temperature, ignore_index,
                                                  None, None, True)
        assert entropy is not None
        return logp, entropy, lse

    def logits_grad(self, logits: Tensor, tokens: Tensor, grad_logp: Tensor,
                    grad_entropy: Tensor | None, lse: Tensor, entropy: Tensor,
                    temperature: Temperature, ignore_index: int) -> Tensor:
        """d loss / d (raw logits) written by the backward kernel in the GEMM dtype."""
        if self._grads is None:
            self._grads = self._buffer(self.chunk_rows(), self.operand.dtype)
        rows, vocab = logits.shape
        grad = rows_view(self._grads, rows, vocab)
        logp_kernels.launch_backward(grad, logits, tokens.contiguous(), grad_logp, grad_entropy,
                                     lse.contiguous(), entropy.contiguous(), temperature,
                                     ignore_index, 0, vocab + int(self.group is not None))
        soft_cap(logits, self.softcap, grad)
        return grad

    def new_weight_grad(self) -> Tensor:
        return torch.empty_like(self.weight)

    def add_weight_grad(self, acc: Tensor, grad: Tensor, rows: Tensor) -> None:
        """acc += grad.T @ rows (acc = on the first block), accumulated in float32 and
        written in acc's dtype: the weight's, float32 for a float32 weight."""
        beta = 1.0 if self._weight_written else 0.0
        if acc.dtype == grad.dtype:
            acc.addmm_(grad.t(), rows, beta=beta)
        else:
            torch.addmm(acc, grad.t(), rows, out_dtype=torch.float32, beta=beta, out=acc)
        self._weight_written = True

    def weight_grad(self, acc: Tensor) -> Tensor:
        return acc if self._weight_written else acc.zero_()

    def loss_grads(self, policy: Mapping[str, Any], entropy_coef: float) -> loop.LossGrads:
        """The selected policy_loss kernel over the whole batch: two launches a block."""
        kernel = selected_kernel("policy_loss", dict(policy, logp=policy["old_logp"]))
        return loop.LossGrads(policy, entropy_coef, kernel=kernel, whole_batch=True)

    def forward_rows(self, start: int, stop: int, tokens: Tensor, temperature: Temperature,
                     ignore_index: int) -> tuple[Tensor, Tensor]:
        if not self.one_read:
            return super().forward_rows(start, stop, tokens, temperature, ignore_index)
        if self._grads is None:
            self._grads = self._buffer(self.chunk_rows(), self.operand.dtype)
        count, vocab = stop - start, self.weight.shape[0]
        block = _Block.empty(start, stop, tokens, temperature, self.hidden.device)
        step = self._logits_rows()
        for first in range(0, count, step):
            last = min(count, first + step)
            logits = self.logits(start + first, start + last, pad=False)
            out = rows_view(self._grads, count, vocab)[first:last]
            _relative_probs(logits, out, block, first, last, ignore_index)
        self._block = block
        return block.logp, block.entropy

    def backward_rows(self, grad_logp: Tensor, grad_entropy: Tensor | None,
                      grads: loop.Grads) -> None:
        if not self.one_read:
            super().backward_rows(grad_logp, grad_entropy, grads)
            return
        block, self._block = self._block, None
        assert block is not None and grad_entropy is None and self._grads is not None
        rows = slice(block.start, block.stop)
        e = rows_view(self._grads, block.stop - block.start, self.weight.shape[0])
        factor = block.factor(grad_logp)
        if grads.hidden is not None:
            scale_rows(_float32_mm(e, self.operand), factor, grads.hidden[rows])
        if grads.weight is not None:
            # rows with no gradient: zero, whatever their hidden state (it may be NaN)
            hidden = self.hidden[rows]
            scaled = scale_rows(hidden, factor, hidden.new_empty(hidden.shape, dtype=e.dtype))
            self.add_weight_grad(grads.weight, e, scaled)
        if grads.bias is not None:
            grads.bias += _float32_mm(factor.to(e.dtype)[None], e)[0]

    def hidden_grad(self, grad: Tensor, out: Tensor) -> None:
        mm_into(out, grad, self.operand)


def forward(hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None,
            temperature: Temperature, ignore_index: int, group: dist.ProcessGroup | None,
            softcap: float | None, entropy_coef: float, policy: dict[str, Any],
            needs_input_grad: tuple[bool, bool, bool]) -> tuple[Tensor, ...]:
    """The kernel contract of rlk-core's linear_policy_loss (see its native kernel)."""
    device_of("hidden", hidden)  # before any collective: a CPU call fails here, on every rank
    ops = CudaChunkOps(hidden, weight, bias, softcap, group,
                       one_read=_one_read(hidden, weight, softcap, group, entropy_coef))
    return loop.run(ops, tokens, temperature, ignore_index, entropy_coef, policy,
                    needs_input_grad)


def scale_rows(src: Tensor, factor: Tensor, out: Tensor) -> Tensor:
    """out[r] = src[r] * factor[r] in out's dtype, zeros where factor[r] is 0 (one pass; the
    broadcast multiply, where() and cast it replaces took four). factor: float32 [rows]."""
    if out.shape != src.shape or factor.shape != src.shape[:1]:
        raise ValueError(f"scale_rows takes src and out of one shape [rows, cols] and factor "
                         f"[rows]; got {tuple(src.shape)}, {tuple(out.shape)}, "
                         f"{tuple(factor.shape)}")
    if out.shape[1] > 1 and out.stride(1) != 1:
        raise ValueError(f"scale_rows writes rows of unit column stride; got {out.stride()}")
    src = rows_major(src)
    device = device_of("src", src)
    ext = _ext.load()
    args = ext.ScaleRowsArgs(
        src=ptr(src), src_dtype=dtype_code("src", src), src_row_stride=src.stride(0),
        out=ptr(out), out_dtype=dtype_code("out", out), out_row_stride=out.stride(0),
        rows=src.shape[0], cols=src.shape[1], factor=ptr(factor.to(torch.float32).contiguous()))
    ext.scale_rows(device=device, stream=stream(device), args=args)
    return out


def scale_grads(grads: list[Tensor], grad_loss: Tensor) -> None:
    """The forward's gradients (at upstream 1) times the loss's upstream gradient, in place,
    with no work when it is 1 (checked on the device: the host never waits). A 0-d CUDA factor
    sends torch's mul_ down its strided path: 2.5 ms per step for a 128256 x 4096 weight."""
    ext = _ext.load()
    for grad in grads:
        usable = (grad_loss.dtype == torch.float32 and grad_loss.device == grad.device
                  and grad.is_contiguous() and grad.data_ptr() % 16 == 0)
        if not usable:
            grad.mul_(grad_loss)
            continue
        device = device_of("grad", grad)
        args = ext.ScaleArgs(data=ptr(grad), dtype=dtype_code("grad", grad), n=grad.numel(),
                             factor=ptr(grad_loss))
        ext.scale_by_device_factor(device=device, stream=stream(device), args=args)


def plan(hidden: Tensor, weight: Tensor, policy: dict[str, Any], softcap: float | None = None,
         group: dist.ProcessGroup | None = None, entropy_coef: float = 0.0, **_: Any) -> str:
    """Which path `forward` takes for these kernel arguments, in words (for rlk.explain)."""
    length = policy["mask"].shape[1]
    one_read = _one_read(hidden, weight, softcap, group, entropy_coef)
    rows = CudaChunkOps(hidden, weight, None, softcap, group, one_read=one_read).chunk_rows()
    path = loop.choose_path(hidden.shape[0], length, rows, policy)
    words = loop.describe(path, rows, length)
    if path == loop.TWO_PASS:
        return words
    how = ("the logits read once (relative_probs)" if one_read else
           "the logits read twice (logp forward and backward kernels)")
    return f"{words}; {how}"


def _float32_mm(a: Tensor, b: Tensor) -> Tensor:
    """a @ b accumulated and written in float32 (cuBLAS's float32 output of reduced inputs)."""
    if a.dtype == torch.float32:
        return torch.mm(a, b)
    return torch.mm(a, b, out_dtype=torch.float32)


def _one_read(hidden: Tensor, weight: Tensor, softcap: float | None,
              group: dist.ProcessGroup | None, entropy_coef: float) -> bool:
    """Whether the relative_probs path serves: its gradient factor covers logp's term only,
    float16 operands would round the scaled hidden rows (factors ~1e-7) to nothing, and a
    float32 weight beside a reduced hidden (mixed precision) takes the two-read path, whose
    gradients pass through the GEMM dtype once (as TRL's head's) where this one's pass
    twice (the relative probabilities and the scaled hidden rows)."""
    return (softcap is None and group is None and entropy_coef == 0.0
            and weight.dtype == hidden.dtype
            and lm_head.gemm_dtype(hidden.dtype, hidden.device) != torch.float16)


@dataclass
class _Block:
    """One block's per-row results of the relative_probs kernel."""

    start: int
    stop: int
    tokens: Tensor
    temperature: Temperature
    logp: Tensor
    entropy: Tensor
    lse: Tensor
    scale: Tensor

    @classmethod
    def empty(cls, start: int, stop: int, tokens: Tensor, temperature: Temperature,
              device: torch.device) -> _Block:
        count = stop - start
        return cls(start, stop, tokens.to(torch.int64).contiguous(), temperature,
                   f32_empty(count, device=device), f32_empty(count, device=device),
                   torch.empty(count, dtype=torch.float64, device=device),
                   f32_empty(count, device=device))

    def factor(self, grad_logp: Tensor) -> Tensor:
        """-(g / T) * scale per row: 0 where g is 0 (ignored or masked rows, NaN scale)."""
        inv_t = (1.0 / self.temperature.to(torch.float32) if isinstance(self.temperature, Tensor)
                 else 1.0 / float(self.temperature))
        factor = grad_logp.to(torch.float32) * inv_t * self.scale
        return torch.where(grad_logp == 0, 0.0, factor.neg_())


def _relative_probs(logits: Tensor, out: Tensor, block: _Block, first: int, last: int,
                    ignore_index: int) -> None:
    """Rows [first, last) of `block`: their statistics, and e into `out`."""
    device = device_of("logits", logits)
    ext = _ext.load()
    num, vocab = logits.shape
    nseg = ext.relative_probs_segments(V=vocab)
    partial = f32_empty(num * nseg * 3, device=logits.device)
    temperature = block.temperature
    temp_rows = (temperature[first:last].to(torch.float32).contiguous()
                 if isinstance(temperature, Tensor) else None)
    args = ext.RelProbArgs(
        logits=ptr(logits), N=num, V=vocab,
        row_stride=logits.stride(0), out=ptr(out), out_dtype=dtype_code("out", out),
        out_row_stride=out.stride(0), tokens=ptr(block.tokens[first:last]),
        temperature=1.0 if temp_rows is not None else float(temperature),
        temp_rows=ptr(temp_rows), ignore_index=int(ignore_index), nseg=nseg,
        partial=ptr(partial), logp=ptr(block.logp[first:last]),
        entropy=ptr(block.entropy[first:last]), lse=ptr(block.lse[first:last]),
        scale=ptr(block.scale[first:last]))
    ext.relative_probs(device=device, stream=stream(device), args=args)


forward.plan = plan  # type: ignore[attr-defined]
forward.scale_grads = scale_grads  # type: ignore[attr-defined]
