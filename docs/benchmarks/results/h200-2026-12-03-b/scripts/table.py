"""Compact table of an rlk-core bench report: rlk:cuda ms/% of roofline per dtype, liger bf16."""

import json
import sys

with open(sys.argv[1]) as f:
    rows = json.load(f)["rows"]
table: dict = {}
for r in rows:
    wanted = r["impl"] in ("rlk:cuda", "liger") and r["workload"] in ("logp", "logp-bwd")
    if r.get("time_ms") and wanted:
        cell = (r["time_ms"], r.get("roofline_pct") or 0)
        table.setdefault((r["case"], r["mode"]), {})[(r["impl"], r["dtype"])] = cell
timed = sum(1 for r in rows if r.get("time_ms"))
print(f"{timed} of {len(rows)} rows timed; rlk:cuda ms/% per dtype, liger bf16 ms")
for (case, mode), cells in table.items():
    parts = []
    for d, label in (("bfloat16", "bf16"), ("float16", "fp16"), ("float32", "fp32")):
        got = cells.get(("rlk:cuda", d))
        parts.append(f"{label} {got[0]:.3f}/{got[1]:.0f}%" if got else f"{label} -")
    liger = cells.get(("liger", "bfloat16"))
    tail = f"  liger {liger[0]:.3f}" if liger else ""
    print(f"{case[:24]:24} {mode:7} " + "  ".join(parts) + tail)
