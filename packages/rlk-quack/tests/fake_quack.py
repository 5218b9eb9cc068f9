"""A CPU stand-in for QuACK 0.6.x: the one call the backend makes (`lse_target_epi`), same
arguments, float32 arithmetic, a call log. Like the real epilogue it leaves an out-of-range
target's logit unwritten: here that slot holds a finite decoy, which the backend must not
return as a log-probability. It refuses operands a TMA load could not read.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch

DECOY = 12345.0


@dataclass
class FakeQuack:
    calls: list[dict[str, Any]] = field(default_factory=list)

    def modules(self) -> dict[str, types.ModuleType]:
        """The package and its submodules, by the names `sys.modules` knows them."""
        package = types.ModuleType("quack")
        epilogue = types.ModuleType("quack.epilogue")
        library = types.ModuleType("quack.epilogue.library")
        library.lse_target_epi = self.lse_target_epi  # type: ignore[attr-defined]
        package.epilogue, epilogue.library = epilogue, library  # type: ignore[attr-defined]
        return {"quack": package, "quack.epilogue": epilogue, "quack.epilogue.library": library}

    def lse_target_epi(self, A: torch.Tensor, B: torch.Tensor, C: Any = None, *,
                       store_d: bool = True, tuned: bool = True,
                       target: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls.append({"A": A, "B": B, "store_d": store_d, "tuned": tuned})
        for name, operand, inner in (("A", A, -1), ("B", B, 0)):
            outer = operand.stride(0 if inner == -1 else 1)
            if operand.stride(inner) != 1 or outer * operand.element_size() % 16:
                raise ValueError(f"fake quack: {name} is not TMA-ready ({operand.stride()})")
        logits = A.float() @ B.float()
        lse = torch.logsumexp(logits, dim=-1)
        vocab = logits.shape[1]
        inside = (target >= 0) & (target < vocab)
        picked = logits.gather(1, target.clamp(0, vocab - 1).unsqueeze(1)).squeeze(1)
        found = {"lse": lse, "target_logit": torch.where(inside, picked, DECOY)}
        return found if not store_d else {**found, "D": logits.to(A.dtype)}
