"""linear_policy_loss: rlk-core's three-GEMM loop with this package's kernels between the GEMMs.

Per row chunk: one float32-output GEMM for the logits (rows padded to 8 elements), the logp
forward kernel for logp, entropy and log-sum-exp, the policy loss's token gradients, the logp
backward kernel writing d loss / d logits straight into the GEMM input dtype (no float32
copy), then grad_hidden = g @ W into the chunk's rows and grad_weight += g.T @ hidden.
grad_weight accumulates in the weight's dtype through cuBLAS (float32 arithmetic, one
rounding per chunk), so no float32 copy of the weight's shape exists: the extra memory is the
two chunk buffers, together within rlk_cuda.linear.chunk_bytes() (RLK_CUDA_CHUNK_MB).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from rlk.backend import linear_policy_loop as loop
from rlk.backend import lm_head, selected_kernel
from torch import Tensor

from . import logp as logp_kernels
from ._launch import device_of
from .linear import chunk_bytes, padded, rows_view, soft_cap

Temperature = float | Tensor
_ROW_MULTIPLE = 128  # rows per chunk inside sequences: whole GEMM tiles


class CudaChunkOps(loop.ChunkOps):
    """rlk-core's chunk steps on rlk_cuda's logp kernels and reused chunk buffers."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._logits: Tensor | None = None
        self._grads: Tensor | None = None

    def chunk_rows(self) -> int:
        per_row = padded(self.vocab) * (4 + self.operand.element_size())
        rows = chunk_bytes() // per_row
        return max(1, rows // _ROW_MULTIPLE * _ROW_MULTIPLE or rows)

    def _buffer(self, dtype: torch.dtype) -> Tensor:
        return torch.empty(self.chunk_rows() * padded(self.weight.shape[0]), dtype=dtype,
                           device=self.hidden.device)

    def logits(self, start: int, stop: int, pad: bool) -> Tensor:
        """Float32 (capped) logits; a vocabulary shard needs no -inf column here (the backward
        kernel takes vocab_total = shard + 1 instead)."""
        if self._logits is None:
            self._logits = self._buffer(torch.float32)
        vocab = self.weight.shape[0]
        out = rows_view(self._logits, stop - start, vocab)
        lm_head.float32_logits(self.hidden[start:stop], self.operand, self.bias, out=out)
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
            self._grads = self._buffer(self.operand.dtype)
        rows, vocab = logits.shape
        grad = rows_view(self._grads, rows, vocab)
        logp_kernels.launch_backward(grad, logits, tokens.contiguous(), grad_logp, grad_entropy,
                                     lse.contiguous(), entropy.contiguous(), temperature,
                                     ignore_index, 0, vocab + int(self.group is not None))
        soft_cap(logits, self.softcap, grad)
        return grad

    def new_weight_grad(self) -> Tensor:
        return torch.zeros_like(self.weight)

    def add_weight_grad(self, acc: Tensor, grad: Tensor, rows: Tensor) -> None:
        acc.addmm_(grad.t(), rows)

    def weight_grad(self, acc: Tensor) -> Tensor:
        return acc

    def loss_grads(self, policy: Mapping[str, Any], entropy_coef: float) -> loop.LossGrads:
        """The selected policy_loss kernel over the whole batch: two launches a chunk."""
        kernel = selected_kernel("policy_loss", dict(policy, logp=policy["old_logp"]))
        return loop.LossGrads(policy, entropy_coef, kernel=kernel, whole_batch=True)

    def hidden_grad(self, grad: Tensor, out: Tensor) -> None:
        if out.dtype == grad.dtype:
            torch.mm(grad, self.operand, out=out)
        else:
            out.copy_(torch.mm(grad, self.operand))


def forward(hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Tensor | None,
            temperature: Temperature, ignore_index: int, group: dist.ProcessGroup | None,
            softcap: float | None, entropy_coef: float, policy: dict[str, Any],
            needs_input_grad: tuple[bool, bool, bool]) -> tuple[Tensor, ...]:
    """The kernel contract of rlk-core's linear_policy_loss (see its native kernel)."""
    device_of("hidden", hidden)  # before any collective: a CPU call fails here, on every rank
    ops = CudaChunkOps(hidden, weight, bias, softcap, group)
    return loop.run(ops, tokens, lm_head.kernel_temperature(temperature, softcap),
                    ignore_index, entropy_coef, policy, needs_input_grad)


def plan(hidden: Tensor, weight: Tensor, policy: dict[str, Any], **_: Any) -> str:
    """Which path `forward` takes for these kernel arguments, in words (for rlk.explain)."""
    length = policy["mask"].shape[1]
    rows = CudaChunkOps(hidden, weight, None, None, None).chunk_rows()
    return loop.describe(loop.choose_path(hidden.shape[0], length, rows, policy), rows, length)


forward.plan = plan  # type: ignore[attr-defined]
