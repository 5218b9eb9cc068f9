"""Which warm-ups let a training step with rlk ops be captured in a CUDA graph (issue #29).

Each variant runs in its own process (a failed capture can leave the process unusable):
    python tools/gpu/capture_warmups.py             # every variant, one line each
    python tools/gpu/capture_warmups.py VARIANT     # one of them
A variant is WARMUP:STEP. WARMUP: `side` (torch's recipe: warm up on a side stream), `default`
(on the default stream), `none`. STEP: `rlk` (linear_logp -> policy_loss), `fused`
(linear_policy_loss), `torch` (the same step in plain torch). Each step ends in
loss.backward() into the leaves' .grad, as trainers do.
"""

from __future__ import annotations

import subprocess
import sys
import traceback

WARMUPS, STEPS = ("side", "default", "none"), ("rlk", "fused", "torch")
B, T, H, V = 4, 24, 64, 1000


def step_fn(kind: str):
    import torch

    import rlk

    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(B * T, H, device="cuda", generator=gen).bfloat16().requires_grad_()
    weight = (torch.randn(V, H, device="cuda", generator=gen) / 4).bfloat16().requires_grad_()
    tokens = torch.randint(0, V, (B, T), device="cuda", generator=gen)
    old = -torch.rand(B, T, device="cuda", generator=gen) * 3
    adv = torch.randn(B, device="cuda", generator=gen)
    mask = torch.ones(B, T, device="cuda")

    def step() -> None:
        if kind == "rlk":
            logp = rlk.linear_logp(hidden, weight, tokens.view(-1)).view(B, T)
            loss, _ = rlk.policy_loss(logp, old, adv, mask)
        elif kind == "fused":
            loss, _ = rlk.linear_policy_loss(hidden, weight, tokens, old, adv, mask)
        else:
            logits = (hidden @ weight.t()).float().log_softmax(-1)
            logp = logits.gather(-1, tokens.view(-1, 1)).view(B, T)
            loss = -((logp - old).exp() * adv[:, None] * mask).mean()
        loss.backward()

    return step


def run(variant: str) -> str:
    import torch

    warmup, kind = variant.split(":")
    step = step_fn(kind)
    try:
        if warmup == "side":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()
                step()
            torch.cuda.current_stream().wait_stream(side)
        elif warmup == "default":
            step()
            step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()
        torch.cuda.synchronize()
        return "captured and replayed"
    except Exception as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if "/rlk" in f.filename or "capture_warmups" in f.filename]
        where = f" (last rlk frame: {frames[-1].filename.split('/')[-1]}:{frames[-1].lineno} " \
                f"{frames[-1].line})" if frames else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first[:160]}{where}"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(run(sys.argv[1]), flush=True)
        sys.exit(0)
    for warmup in WARMUPS:
        for kind in STEPS:
            variant = f"{warmup}:{kind}"
            done = subprocess.run([sys.executable, __file__, variant], capture_output=True,
                                  text=True, timeout=120, check=False)
            lines = (done.stdout.strip() or done.stderr.strip() or "no output").splitlines()
            print(f"{variant}: {lines[-1][:300]}", flush=True)
