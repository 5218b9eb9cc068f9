"""Debug 2 of the segmented plain draw: for each fp32 row, which data and uniform reproduce
the kernel's position inside its segment (every row x every segment at u', and the right data
at other temperatures and at u)."""
import math

import torch

from rlk_cuda.sample import sample
from segdebug_common import row_uniform

V, T, NSEG, PER = 262144, 0.9, 8, 32768
gen = torch.Generator(device="cuda").manual_seed(21)
logits = (torch.randn(6, V, generator=gen, device="cuda") * 2.0)
seeds = torch.randint(-(2**62), 2**62, (6,), device="cuda", generator=gen)
tokens, logp, processed = sample(logits, T, 0, 1.0, 0.0, seeds)
x = logits.double().cpu()


def position(data, m, temp, uu):
    inner = torch.exp((data - m) / temp).cumsum(0)
    return int((inner <= uu * float(inner[-1])).sum())


for row in range(6):
    m = float(x[row].max())
    masses = [float(torch.exp((x[row, g * PER:(g + 1) * PER] - m) / T).sum()) for g in range(NSEG)]
    u = row_uniform(int(seeds[row]))
    target, c = u * sum(masses), 0.0
    for g, ms in enumerate(masses):
        if target < c + ms:
            break
        c += ms
    up = (target - c) / masses[g]
    kt = int(tokens[row]) - g * PER
    hits = [(r2, g2) for r2 in range(6) for g2 in range(NSEG)
            if abs(position(x[r2, g2 * PER:(g2 + 1) * PER], m, T, up) - kt) <= 2]
    other = {t: position(x[row, g * PER:(g + 1) * PER], m, t, up) for t in (0.5, 0.9, 1.0, 1.8)}
    print(f"row {row} seg {g} u {u:.5f} u' {up:.5f} kernel pos {kt}; data hits {hits}; "
          f"by temperature {other}; at u {position(x[row, g * PER:(g + 1) * PER], m, T, u)}; "
          f"processed-logp {float(processed[row] - logp[row]):.3g}")
