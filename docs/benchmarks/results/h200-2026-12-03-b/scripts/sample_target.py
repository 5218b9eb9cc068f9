"""rlk:cuda sample vs FlashInfer's sampler at B=1024 V=256000 bf16 top-p 0.95 min-p 0.05."""
import torch
import flashinfer.sampling as fs
import rlk

dev = "cuda"
for (b, v, dt) in [(1024, 256000, torch.bfloat16), (1024, 128256, torch.bfloat16), (256, 256000, torch.bfloat16)]:
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(b, v, generator=g, device=dev, dtype=dt).mul_(3.0)
    seeds = torch.randint(-(2**62), 2**62, (b,), generator=g, device=dev)

    def fi():
        probs = fs.softmax(logits, 1.0)
        probs = fs.top_p_renorm_probs(probs, 0.95)
        return fs.min_p_sampling_from_probs(probs, 0.05)

    def ours(backend):
        with rlk.use_backends(backend):
            return rlk.sample(logits, temperature=1.0, top_p=0.95, min_p=0.05, seed=seeds)

    def t(fn, reps=20):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / reps
    tf = t(fi)
    tc = t(lambda: ours("cuda"))
    tfl = t(lambda: ours("flashinfer"))
    print(f"B={b} V={v} {dt}: flashinfer {tf:.3f} ms  rlk:cuda {tc:.3f} ({tc/tf:.2f}x)  rlk:flashinfer {tfl:.3f} ({tfl/tf:.2f}x)")
