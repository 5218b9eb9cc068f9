"""Timing table for rlk-cuda's kernels on the GPU machine, peers measured in the same run.

CUDA events, warm-up, median of repetitions, rotating input buffers; the device's copy
bandwidth and bf16 GEMM rate are measured first so every row carries its roofline share.
Writes JSON and Markdown to the directory given as the first argument.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlk_cuda import linear_logp as linear
from rlk_cuda import logp, sample

GIB = 2**30
QUICK = "--quick" in sys.argv  # our kernels only (peers were measured in a full run)
ROWS: list[dict[str, Any]] = []


def timed(
    fn: Callable[[int], object], reps: int = 20, warmup: int = 3, sync_each: bool = False
) -> float:
    """Median GPU milliseconds of fn(i) (i picks the rotating input).

    Events bracket each call but the host does not wait between calls, so Python overhead
    overlaps the previous call's GPU work (as in a training step) and is not counted.
    """
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(i)
        stops[i].record()
        if sync_each:  # also count host gaps inside a call (many launches, allocations)
            stops[i].synchronize()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, stops, strict=True))


def extra_memory(fn: Callable[[], object]) -> float:
    """GiB allocated above what was live before the call (peak minus baseline)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del result
    return (peak - base) / GIB


def record(
    op: str, impl: str, shape: str, ms: float | None, status: str = "pass", **extra: Any
) -> None:
    row = {"op": op, "impl": impl, "shape": shape, "ms": ms, "status": status, **extra}
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def attempt(op: str, impl: str, shape: str, body: Callable[[], dict[str, Any]]) -> None:
    try:
        record(op, impl, shape, status="pass", **body())
    except torch.OutOfMemoryError as exc:
        record(op, impl, shape, None, status="oom", error=str(exc).splitlines()[0])
    except Exception as exc:
        record(op, impl, shape, None, status="failure", error=f"{type(exc).__name__}: {exc}"[:300])
    torch.cuda.empty_cache()


def ceilings() -> tuple[float, float]:
    src = torch.randn(GIB // 4 * 2, device="cuda")
    dst = torch.empty_like(src)
    ms = timed(lambda i: dst.copy_(src), reps=20)
    copy_gbs = 2 * src.numel() * 4 / ms / 1e6
    record("ceiling", "copy", "2 GiB fp32", ms=ms, gb_per_s=copy_gbs)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda i: a @ b, reps=10)
    tflops = 2 * 8192**3 / ms / 1e9
    record("ceiling", "gemm", "8192^3 bf16", ms=ms, tflops=tflops)
    return copy_gbs, tflops


def eager_logp(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x.float(), -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)


def bench_logp(n: int, vocab: int, copy_gbs: float, with_backward: bool) -> None:
    dtype = torch.bfloat16
    nbuf = 2 if n * vocab * 2 > 8 * GIB else 3
    xs = [torch.randn(n, vocab, device="cuda").mul_(3).to(dtype) for _ in range(nbuf)]
    toks = [torch.randint(0, vocab, (n,), device="cuda") for _ in range(nbuf)]
    shape = f"N={n} V={vocab} bf16"
    read = n * vocab * 2
    op = "logp fwd+bwd" if with_backward else "logp fwd"

    def ours(i: int) -> torch.Tensor:
        j = i % nbuf
        lp, _, lse = logp.forward(xs[j], toks[j], 1.0, -100, None, None, False)
        if not with_backward:
            return lp
        g = torch.ones_like(lp)
        return logp.backward(g, None, xs[j], toks[j], 1.0, -100, None, lse, None, False)

    def body() -> dict[str, Any]:
        ms = timed(ours)
        moved = read * (3 if with_backward else 1)
        out: dict[str, Any] = {"ms": ms, "pct_of_copy_bw": 100 * moved / ms / 1e6 / copy_gbs}
        out["extra_gib"] = extra_memory(lambda: ours(0))
        if not with_backward:
            rows = slice(0, 256)
            want = (
                torch.log_softmax(xs[0][rows].double(), -1)
                .gather(-1, toks[0][rows].unsqueeze(-1))
                .squeeze(-1)
            )
            got = ours(0)[rows]
            out["max_abs_err_vs_f64"] = float((got.double() - want).abs().max())
        return out

    attempt(op, "rlk_cuda", shape, body)

    def peer(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[int], Any]:
        def run(i: int) -> Any:
            j = i % nbuf
            if not with_backward:
                with torch.no_grad():
                    return fn(xs[j], toks[j])
            x = xs[j].detach().requires_grad_(True)
            fn(x, toks[j]).sum().backward()
            return x.grad

        return run

    peers = (
        () if QUICK else (("torch eager", eager_logp), ("torch.compile", torch.compile(eager_logp)))
    )
    for name, fn in peers:

        def peer_body(fn: Callable[..., Any] = fn) -> dict[str, Any]:
            run = peer(fn)
            ms = timed(run, reps=10)
            return {"ms": ms, "extra_gib": extra_memory(lambda: run(0))}

        attempt(op, name, shape, peer_body)


def bench_logp_backward(n: int, vocab: int, copy_gbs: float) -> None:
    """The backward alone, writing the gradient in place of the logits (read + write once)."""
    xs = [torch.randn(n, vocab, device="cuda").mul_(3).to(torch.bfloat16) for _ in range(3)]
    toks = [torch.randint(0, vocab, (n,), device="cuda") for _ in range(3)]
    stats = [
        logp.forward(x, t, 1.0, -100, None, None, False) for x, t in zip(xs, toks, strict=False)
    ]
    g = torch.randn(n, device="cuda")

    def body() -> dict[str, Any]:
        def run(i: int) -> Any:
            j = i % 3
            return logp.backward(g, None, xs[j], toks[j], 1.0, -100, None, stats[j][2], None, True)

        ms = timed(run)
        return {
            "ms": ms,
            "pct_of_copy_bw": 100 * 2 * n * vocab * 2 / ms / 1e6 / copy_gbs,
            "extra_gib": extra_memory(lambda: run(0)),
        }

    attempt("logp bwd inplace", "rlk_cuda", f"N={n} V={vocab} bf16", body)


def bench_sample(copy_gbs: float) -> None:
    batch, vocab = 256, 151936
    shape = f"B={batch} V={vocab} fp32 top_k=50 top_p=0.9"
    xs = [torch.randn(batch, vocab, device="cuda") * 3 for _ in range(4)]
    seeds = torch.randint(0, 2**62, (batch,), device="cuda")

    def body() -> dict[str, Any]:
        ms = timed(lambda i: sample.sample(xs[i % 4], 1.0, 50, 0.9, 0.0, seeds), reps=50)
        return {"ms": ms, "pct_of_copy_bw_one_pass": 100 * batch * vocab * 4 / ms / 1e6 / copy_gbs}

    attempt("sample", "rlk_cuda", shape, body)

    if QUICK:
        return

    def torch_sort(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        vals, idx = torch.topk(x, 50, dim=-1)
        probs = torch.softmax(vals, -1)
        cum = probs.cumsum(-1)
        vals = vals.masked_fill(cum - probs > 0.9, float("-inf"))
        pick = torch.multinomial(torch.softmax(vals, -1), 1).squeeze(-1)
        tok = idx.gather(-1, pick.unsqueeze(-1)).squeeze(-1)
        return tok, torch.log_softmax(x, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)

    attempt(
        "sample",
        "torch topk+multinomial",
        shape,
        lambda: {"ms": timed(lambda i: torch_sort(xs[i % 4]), reps=20)},
    )

    def torch_full_sort(x: torch.Tensor) -> torch.Tensor:
        vals, idx = torch.sort(x, descending=True)
        vals[:, 50:] = float("-inf")
        probs = torch.softmax(vals, -1)
        cum = probs.cumsum(-1)
        vals = vals.masked_fill(cum - probs > 0.9, float("-inf"))
        pick = torch.multinomial(torch.softmax(vals, -1), 1)
        return idx.gather(-1, pick)

    attempt(
        "sample",
        "torch sort-based",
        shape,
        lambda: {"ms": timed(lambda i: torch_full_sort(xs[i % 4]), reps=10)},
    )


def bench_group_advantages() -> None:
    from rlk.ops.group_advantages.options import GroupAdvantagesOptions
    from rlk_cuda import group_advantages as advantages

    grpo = GroupAdvantagesOptions()
    n, groups = 8192, 1024
    shape = f"N={n} groups={groups} std/mean"
    rewards = torch.randn(n, device="cuda")
    ids = torch.arange(n, device="cuda") // (n // groups)
    attempt(
        "group_advantages",
        "rlk_cuda",
        shape,
        lambda: {
            "ms": timed(
                lambda i: advantages.forward(rewards, ids, 0, groups, grpo), reps=50
            )
        },
    )
    try:
        from rlk.ops.group_advantages import native
    except ImportError as exc:
        record("group_advantages", "rlk native", shape, None, status="blocked", error=str(exc))
        return
    attempt(
        "group_advantages",
        "rlk native (torch ops)",
        shape,
        lambda: {
            "ms": timed(
                lambda i: native.forward(rewards, ids, 0, groups, grpo), reps=50
            )
        },
    )


def bench_linear(tflops: float) -> None:
    n, h, vocab = 8192, 4096, 151936
    dtype = torch.bfloat16
    shape = f"N={n} H={h} V={vocab} bf16"
    hidden = torch.randn(n, h, device="cuda", dtype=dtype) / 8
    weight = torch.randn(vocab, h, device="cuda", dtype=dtype) / 8
    tokens = torch.randint(0, vocab, (n,), device="cuda")
    g = torch.randn(n, device="cuda")

    def gemms() -> dict[str, Any]:
        logits = hidden @ weight.t()
        t1 = timed(lambda i: torch.mm(hidden, weight.t(), out=logits), reps=5)
        t2 = timed(lambda i: logits @ weight, reps=5)
        t3 = timed(lambda i: logits.t() @ hidden, reps=5)
        return {
            "ms": 2 * t1 + t2 + t3,
            "one_gemm_ms": t1,
            "tflops_one_gemm": 2 * n * h * vocab / t1 / 1e9,
        }

    attempt("linear_logp 4 GEMMs", "torch mm", shape, gemms)
    gemm = next((r for r in ROWS if r["op"] == "linear_logp 4 GEMMs" and r["ms"]), None)

    def fwd() -> dict[str, Any]:
        run = lambda i: linear.forward(hidden, weight, tokens, None, 1.0, -100, False, None)  # noqa: E731
        ms = timed(run, reps=5, warmup=2)
        out = {"ms": ms, "extra_gib": extra_memory(lambda: run(0))}
        if gemm:
            out["x_one_gemm"] = ms / gemm["one_gemm_ms"]
        return out

    attempt("linear_logp fwd", "rlk_cuda", shape, fwd)

    # Where the forward's time goes: the vocabulary-chunked GEMMs alone.
    for cols in () if QUICK else (8192, 16384):

        def chunked(cols: int = cols) -> dict[str, Any]:
            buf = torch.empty(n, cols, device="cuda", dtype=dtype)

            def run(i: int) -> None:
                for start in range(0, vocab, cols):
                    stop = min(vocab, start + cols)
                    out = (
                        buf[:, : stop - start]
                        if stop - start == cols
                        else torch.empty(n, stop - start, device="cuda", dtype=dtype)
                    )
                    torch.mm(hidden, weight[start:stop].t(), out=out)

            ms = timed(run, reps=5, warmup=1)
            return {"ms": ms, "x_one_gemm": ms / gemm["one_gemm_ms"] if gemm else None}

        attempt("GEMM in vocabulary chunks", f"torch mm {cols} columns", shape, chunked)

    def fwd_bwd() -> dict[str, Any]:
        def run(i: int) -> Any:
            _lp, _ent, lse = linear.forward(hidden, weight, tokens, None, 1.0, -100, False, None)
            return linear.backward(
                g,
                None,
                hidden,
                weight,
                tokens,
                None,
                1.0,
                -100,
                None,
                lse,
                None,
                (True, True, False),
            )

        ms = timed(run, reps=3, warmup=1)
        out = {
            "ms": ms,
            "ms_host_waits_between_calls": timed(run, reps=3, warmup=0, sync_each=True),
            "extra_gib_beyond_grads": extra_memory(lambda: run(0))
            - ((n * h + vocab * h) * 2) / GIB,
        }
        if gemm:
            out["x_four_gemms"] = ms / gemm["ms"]
        return out

    attempt("linear_logp fwd+bwd", "rlk_cuda", shape, fwd_bwd)


def main() -> None:
    out_dir = Path(next(a for a in sys.argv[1:] if not a.startswith("--")))
    out_dir.mkdir(parents=True, exist_ok=True)
    began = time.time()
    copy_gbs, tflops = ceilings()
    for n in (8192, 32768):
        bench_logp(n, 151936, copy_gbs, with_backward=False)
    bench_logp(8192, 151936, copy_gbs, with_backward=True)
    bench_logp_backward(8192, 151936, copy_gbs)
    bench_sample(copy_gbs)
    if not QUICK:
        bench_group_advantages()
    bench_linear(tflops)
    meta = {
        "device": torch.cuda.get_device_name(),
        "capability": torch.cuda.get_device_capability(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "commit": os.environ.get("RLK_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "command": "tools/gpu/check.sh",
        "seconds": round(time.time() - began, 1),
    }
    name = "cuda-h200-quick" if QUICK else "cuda-h200"
    (out_dir / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": ROWS}, indent=1))
    lines = ["| op | impl | shape | ms | notes |", "| --- | --- | --- | --- | --- |"]
    for r in ROWS:
        notes = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in r.items()
            if k not in ("op", "impl", "shape", "ms")
        )
        ms = "-" if r["ms"] is None else f"{r['ms']:.3f}"
        lines.append(f"| {r['op']} | {r['impl']} | {r['shape']} | {ms} | {notes} |")
    table = "\n".join(lines)
    (out_dir / f"{name}.md").write_text(f"{json.dumps(meta)}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
