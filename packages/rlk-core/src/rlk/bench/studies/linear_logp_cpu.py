"""linear_logp forward+backward on CPU against the naive `log_softmax(hidden @ W.T)` path.

Each variant runs in a fresh process (so memory one variant freed cannot hide the
other's peak): one warm-up step, then the extra memory of one step above its inputs
(peak RSS growth, `rlk.bench.memory`), then the median wall time of `--reps` steps
and the CPU time per step (all threads; steadier than wall time on a shared machine).
A step is the forward, the backward to hidden and weight with a random upstream
gradient, and nothing else. Default shape: N=2048, H=1024, V=32768, float32.
Entry point: benchmarks/linear_logp_cpu.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import torch

import rlk
from rlk.bench import memory, timing

MIB = 1 << 20
VARIANTS = ("naive", "rlk")


def _inputs(n: int, h: int, v: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "hidden": torch.randn(n, h, generator=gen),
        "weight": torch.randn(v, h, generator=gen) / h**0.5,
        "tokens": torch.randint(0, v, (n,), generator=gen),
        "grad": torch.randn(n, generator=gen),
    }


def _naive(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    logits = hidden @ weight.t()
    return torch.log_softmax(logits, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)


def _rlk(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return rlk.linear_logp(hidden, weight, tokens)


Step = Callable[[int], torch.Tensor]


def _step(variant: str, data: dict[str, torch.Tensor]) -> tuple[Step, Callable[[], None]]:
    forward = _naive if variant == "naive" else _rlk
    hidden = data["hidden"].clone().requires_grad_(True)
    weight = data["weight"].clone().requires_grad_(True)

    def reset() -> None:
        hidden.grad = weight.grad = None

    def step(_: int) -> torch.Tensor:
        reset()
        logp = forward(hidden, weight, data["tokens"])
        logp.backward(data["grad"])
        return logp.detach()

    return step, reset


def child(variant: str, n: int, h: int, v: int, reps: int) -> dict[str, object]:
    data = _inputs(n, h, v)
    step, reset = _step(variant, data)
    logp = step(0)  # warm-up: thread pools, BLAS buffers, plugin loading
    reset()  # the baseline holds the inputs only, not the warm-up's gradients
    _, extra, method = memory.extra(lambda: step(0), torch.device("cpu"))
    budget = timing.Budget(warmup=0, seconds=0.0, min_reps=reps, max_reps=reps)
    cpu_before = time.process_time()
    timed = timing.measure(step, budget, torch.device("cpu"))
    cpu_ms = (time.process_time() - cpu_before) * 1e3 / (timed.reps + 1)
    return {"variant": variant, "median_ms": timed.median_ms, "min_ms": timed.min_ms,
            "cpu_ms": cpu_ms, "reps": timed.reps, "extra_mib": extra / MIB,
            "memory_method": method, "logp": logp.tolist()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--h", type=int, default=1024)
    parser.add_argument("--v", type=int, default=32768)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.n, args.h, args.v, args.reps)))
        return 0
    rows = []
    for variant in VARIANTS:
        command = [sys.executable, "-m", __name__, "--child", variant, "--n", str(args.n),
                   "--h", str(args.h), "--v", str(args.v), "--reps", str(args.reps)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    naive, fused = (torch.tensor(row.pop("logp")) for row in rows)
    inputs_mib = (args.n * args.h + args.v * args.h + args.n) * 4 / MIB
    grads_mib = (args.n * args.h + args.v * args.h) * 4 / MIB
    report = {
        "shape": {"N": args.n, "H": args.h, "V": args.v, "dtype": "float32"},
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "threads": torch.get_num_threads(), "torch": torch.__version__},
        "chunk_mb": os.environ.get("RLK_NATIVE_CHUNK_MB", "256 (default)"),
        "inputs_mib": inputs_mib, "gradients_mib": grads_mib,
        "max_abs_logp_difference": float((naive - fused).abs().max()),
        "rows": rows,
    }
    print(f"linear_logp fwd+bwd, N={args.n} H={args.h} V={args.v} float32, "
          f"{report['machine']['threads']} threads, chunk budget {report['chunk_mb']} MiB")
    print(f"inputs {inputs_mib:.0f} MiB; the gradients alone are {grads_mib:.0f} MiB")
    print(f"{'variant':8} {'median ms':>10} {'min ms':>10} {'CPU ms':>10} {'extra MiB':>10}")
    for row in rows:
        print(f"{row['variant']:8} {row['median_ms']:10.1f} {row['min_ms']:10.1f} "
              f"{row['cpu_ms']:10.1f} {row['extra_mib']:10.1f}")
    print(f"max |logp(rlk) - logp(naive)| = {report['max_abs_logp_difference']:.2e}; "
          f"memory: {rows[0]['memory_method']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":  # the process of one variant
    sys.exit(main())
