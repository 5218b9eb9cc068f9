"""Writing a run: JSON (metadata, ceilings, rows), CSV (one line per row) and a Markdown table."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlk.bench import findings
from rlk.bench.ceilings import Ceilings
from rlk.bench.row import STATUSES, Row

SCHEMA_VERSION = 1
GIB = float(1 << 30)
LISTED = ("dims", "errors", "findings")  # written as text in the CSV's last columns
CSV_FIELDS = [f.name for f in dataclasses.fields(Row) if f.name not in LISTED]


@dataclass
class Report:
    metadata: dict[str, Any]
    ceilings: Ceilings
    rows: list[Row]
    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.rows) for s in STATUSES}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "metadata": self.metadata,
            "ceilings": dataclasses.asdict(self.ceilings),
            "counts": self.counts(),
            "findings": findings.lines(self.rows),
            "notes": self.notes,
            "files": self.files,
            "rows": [_clean(dataclasses.asdict(r)) for r in self.rows],
        }


def _clean(value: Any) -> Any:
    """JSON has no inf/NaN: write them as strings so the file stays standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n")


def write_csv(report: Report, path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*CSV_FIELDS, *LISTED])
        writer.writeheader()
        for row in report.rows:
            record = {name: getattr(row, name) for name in CSV_FIELDS}
            record["dims"] = " ".join(f"{k}={v}" for k, v in row.dims.items())
            record["errors"] = " ".join(f"{k}={v:.3g}" for k, v in row.errors.items())
            record["findings"] = "; ".join(row.findings)
            writer.writerow(record)


def _num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"


def _memory(row: Row) -> str:
    return "-" if row.extra_memory_bytes is None else f"{row.extra_memory_bytes / GIB:.3f}"


def _error(row: Row) -> str:
    parts = []
    if row.max_abs_error is not None:
        parts.append(f"{row.max_abs_error:.2g}")
    if row.grad_max_abs_error is not None:
        parts.append(f"grad {row.grad_max_abs_error:.2g}")
    return ", ".join(parts) or "-"


def markdown_table(rows: list[Row]) -> str:
    header = ("| workload | mode | shape | dtype | impl | status | median ms | extra GiB "
              "| % roofline | max abs err | note |")
    lines = [header, "|" + " --- |" * 11]
    for r in rows:
        pct = "-" if r.roofline_pct is None else f"{r.roofline_pct:.0f}% ({r.bound})"
        floor = [] if r.floor_ratio is None else [f"{r.floor_ratio:.3f}x the {r.floor} floor"]
        note = "; ".join([r.reason, *floor] if r.status != "pass" else
                         [*(f"finding: {f}" for f in r.findings), *floor,
                          *([r.note] if r.note else [])])
        lines.append(f"| {r.workload} | {r.mode} | {r.case} | {r.dtype} | {r.impl} | {r.status} "
                     f"| {_num(r.time_ms)} | {_memory(r)} | {pct} | {_error(r)} "
                     f"| {note.replace('|', '/')} |")
    return "\n".join(lines)


SMOKE_NOTE = ("a smoke run: tiny shapes and few repetitions on whatever else the machine runs, "
              "so these timing findings are not meaningful; they prove the tool runs")


def findings_section(rows: list[Row], smoke: bool = False) -> str:
    """The findings as a Markdown list under a heading (what the console summary prints);
    a smoke run's are labelled as what they are, noise."""
    found = findings.lines(rows)
    head = (f"## Findings: {len(found)} (rlk rows below {findings.ROOFLINE_FLOOR_PCT:.0f}% "
            "of their roofline or slower than a peer)")
    if not found:
        return head + "\n\nnone"
    lines = [head, ""]
    if smoke:
        lines += [f"Not meaningful: {SMOKE_NOTE}.", ""]
        found = [f"{line} (smoke: not meaningful)" for line in found]
    return "\n".join([*lines, *(f"- {line}" for line in found)])


def markdown(report: Report) -> str:
    meta, ceil = report.metadata, report.ceilings
    device = meta["device"]
    commit = meta["commit"]["sha"] or "unknown"
    lines = [
        "# rlk benchmark report", "",
        f"- command: `{' '.join(meta['command'])}`",
        f"- commit: {commit}" + (" (with uncommitted changes)" if meta["commit"]["dirty"] else ""),
        f"- device: {device.get('name')} ({device['type']}"
        + (f", capability {device['capability']}, driver {device.get('driver')}"
           if device["type"] == "cuda" else "") + ")",
        f"- python {meta['python']}, torch {meta['torch']}, CUDA {meta['cuda']}, rlk {meta['rlk']}",
        f"- dtypes: {', '.join(meta.get('dtypes', [meta['dtype']]))} (a shape naming its own "
        "dtype overrides them)",
        f"- ceilings measured in this run: copy {ceil.copy_gbps:.0f} GB/s (read + write), "
        "GEMM " + ", ".join(f"{d} {r:.1f}" for d, r in
                            (ceil.gemm_tflops_by_dtype or {ceil.gemm_dtype: ceil.gemm_tflops}
                             ).items())
        + f" TFLOP/s ({ceil.gemm_size}^3)",
        "- statuses: " + ", ".join(f"{k} {v}" for k, v in report.counts().items()),
        "",
    ]
    lines += [f"> {note}" for note in report.notes]
    lines += ["", findings_section(report.rows, bool(meta.get("smoke"))), "",
              markdown_table(report.rows), ""]
    return "\n".join(lines)


def write_all(report: Report, directory: Path) -> dict[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"json": directory / "report.json", "csv": directory / "report.csv",
             "markdown": directory / "report.md"}
    report.files.update({k: v.name for k, v in paths.items()})
    write_json(report, paths["json"])
    write_csv(report, paths["csv"])
    paths["markdown"].write_text(markdown(report))
    return {k: str(v) for k, v in paths.items()}
