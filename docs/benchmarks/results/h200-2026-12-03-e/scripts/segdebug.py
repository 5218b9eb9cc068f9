"""Debug of call 3's failing inverse-CDF test on the segmented plain draw: per row, the
kernel's token beside the segment algorithm recomputed in float64 from the kernel's own
partial statistics and from the logits, and the exact inverse-CDF token."""
import math

import torch

from rlk_cuda import _ext
from rlk_cuda.sample import sample


def row_uniform(seed):
    mask = 0xFFFFFFFF
    pattern = seed % 2**64
    c0, c1, c2, c3 = 0, 1, 0x726C6B73, 0
    k0, k1 = pattern & mask, pattern >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & mask, p1 & mask, ((p0 >> 32) ^ c3 ^ k1) & mask, p0 & mask
        k0, k1 = (k0 + 0x9E3779B9) & mask, (k1 + 0xBB67AE85) & mask
    return ((c0 >> 11) * 2**32 + c1) * 2.0**-53


ext = _ext.load()
for vocab, dtype in ((262144, torch.float32), (70001, torch.bfloat16)):
    gen = torch.Generator(device="cuda").manual_seed(21)
    logits = (torch.randn(6, vocab, generator=gen, device="cuda") * 2.0).to(dtype)
    seeds = torch.randint(-(2**62), 2**62, (6,), device="cuda", generator=gen)
    T = 0.9
    tokens, _, _ = sample(logits, T, 0, 1.0, 0.0, seeds)
    nseg = int(ext.logp_forward_segments(vocab))
    W = 16 // logits.element_size()
    stats = torch.empty(2 * 6, device="cuda")
    partial = torch.empty(6 * nseg * 3, device="cuda")
    ext.logp_forward(device=0, stream=torch._C._cuda_getCurrentRawStream(0), logits=logits.data_ptr(),
                     dtype={torch.float32: 0, torch.bfloat16: 1}[dtype], M=6, V=vocab,
                     row_stride=vocab, tokens=0, rows=0, R=6, temperature=T, temp_rows=0,
                     ignore_index=-100, logp=0, logp_stride=1, entropy=0, lse=0,
                     stats=stats.data_ptr(), nseg=nseg, partial=partial.data_ptr(), tma=False)
    part = partial.view(6, nseg, 3).double().cpu()
    nv = vocab // W
    step = 1024
    per = ((nv + nseg - 1) // nseg + step - 1) // step * step
    sc = (1 / T) * math.log2(math.e)
    for row in range(6):
        x = logits[row].double().cpu()
        m = float(stats[row])
        bounds = [(min(g * per, nv) * W, vocab if g == nseg - 1 else min((g + 1) * per, nv) * W)
                  for g in range(nseg)]
        kmass = [(float(part[row, g, 1]) + 1) * 2 ** ((float(part[row, g, 0]) - m) * sc) for g in range(nseg)]
        tmass = [float(torch.exp((x[b:e] - m) / T).sum()) for b, e in bounds]
        u = row_uniform(int(seeds[row]))
        cum = torch.exp((x - x.max()) / T).cumsum(0)
        true_tok = int((cum <= u * float(cum[-1])).sum())
        tot = sum(kmass)
        target = u * tot
        c = 0.0
        for g, ms in enumerate(kmass):
            if target < c + ms:
                break
            c += ms
        b, e = bounds[g]
        inner = torch.exp((x[b:e] - m) / T).cumsum(0)
        seg_tok = b + int((inner <= (target - c) / kmass[g] * float(inner[-1])).sum())
        kt = int(tokens[row])
        within = float(inner[kt - b - 1]) / float(inner[-1]) if kt > b else 0.0
        print(f"   u' {(target - c) / kmass[g]:.6f}; kernel token's within-segment fraction {within:.6f}"
              f"; index fraction {(kt - b) / (e - b):.4f}")
        print(f"V={vocab} row {row}: kernel {int(tokens[row])} segment-alg {seg_tok} exact {true_tok} "
              f"seg {g} u {u:.6f} m {m:.4f} xmax {float(x.max()):.4f}")
        print("   kernel masses", [round(v, 4) for v in kmass])
        print("   torch masses ", [round(v, 4) for v in tmass])
        print("   partial m   ", [round(float(part[row, g, 0]), 4) for g in range(nseg)],
              "seg max", [round(float(x[b:e].max()), 4) for b, e in bounds])

# a flat row: the inverse CDF at u is token floor(u * V)
flat = torch.zeros(8, 262144, device="cuda")
seeds = torch.randint(-(2**62), 2**62, (8,), device="cuda")
tokens, _, _ = sample(flat, 1.0, 0, 1.0, 0.0, seeds)
for row in range(8):
    u = row_uniform(int(seeds[row]))
    print(f"flat row {row}: u {u:.6f} kernel {int(tokens[row])} expected {int(u * 262144)}")
