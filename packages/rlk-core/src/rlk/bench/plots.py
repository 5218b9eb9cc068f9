"""PNG plots of a run: time, extra memory and roofline share per workload, peers side by side.

matplotlib is optional: without it the run still writes every other file and the
report says plots were skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlk.bench.row import PASS, Row

METRICS: dict[str, tuple[str, Callable[[Row], float | None]]] = {
    "time": ("median time (ms)", lambda r: r.time_ms),
    "memory": ("extra memory (GiB)",
               lambda r: None if r.extra_memory_bytes is None else r.extra_memory_bytes / 2**30),
    "roofline": ("% of roofline", lambda r: r.roofline_pct),
}


def _panels(rows: list[Row]) -> dict[str, list[Row]]:
    panels: dict[str, list[Row]] = {}
    for row in rows:
        if row.status == PASS:
            panels.setdefault(f"{row.workload} ({row.mode})", []).append(row)
    return panels


def _draw(path: Path, panels: dict[str, list[Row]], label: str,
          value: Callable[[Row], float | None]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one colour per implementation across every panel, so a bar reads the same everywhere
    every_impl = dict.fromkeys(r.impl for rows in panels.values() for r in rows)
    colour = {impl: f"C{i % 10}" for i, impl in enumerate(every_impl)}
    columns = min(2, len(panels))
    lines = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(lines, columns, figsize=(7 * columns, 3.6 * lines), squeeze=False)
    for ax, (title, rows) in zip(axes.flat, panels.items(), strict=False):
        cases = list(dict.fromkeys(r.case for r in rows))
        impls = list(dict.fromkeys(r.impl for r in rows))
        width = 0.8 / len(impls)
        drawn: list[float] = []
        for k, impl in enumerate(impls):
            heights = []
            for case in cases:
                found = [value(r) for r in rows if r.case == case and r.impl == impl]
                heights.append(found[0] if found and found[0] is not None else 0.0)
            bars = ax.bar([i + k * width for i in range(len(cases))], heights, width, label=impl,
                          color=colour[impl])
            ax.bar_label(bars, fmt="%.3g", fontsize=6)
            drawn += [h for h in heights if h > 0]
        if drawn and max(drawn) > 50 * min(drawn):  # peers an order apart: keep both readable
            ax.set_yscale("log")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], cases, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(label, fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(rows: list[Row], directory: Path) -> tuple[dict[str, str], str | None]:
    """Plot files written (name -> file), and a note when plotting was skipped."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return {}, "plots skipped: matplotlib is not installed (pip install 'rlk-core[bench]')"
    panels = _panels(rows)
    if not panels:
        return {}, "plots skipped: no row passed"
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, (label, value) in METRICS.items():
        path = directory / f"{name}.png"
        _draw(path, panels, label, value)
        written[f"plot_{name}"] = path.name
    return written, None
