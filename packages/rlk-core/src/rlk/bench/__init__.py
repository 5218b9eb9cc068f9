"""rlk.bench: the benchmark suite behind `rlk-core bench`.

Every op's workloads at realistic RL shapes (tiny ones under smoke), rlk backends and
peers side by side in one process, each row timed, checked against the float64
reference, placed on the machine's own roofline, and written as JSON, CSV, Markdown
and PNG plots under the output directory.
"""

from __future__ import annotations

from rlk.bench.options import Options
from rlk.bench.report import Report
from rlk.bench.row import Row

__all__ = ["Options", "Report", "Row", "run"]


def run(options: Options) -> Report:
    """Run the suite and write its files; never raises for one bad row."""
    from rlk.bench import ceilings, findings, metadata, plots, progress, report, runner, workloads

    chosen = workloads.select(options.workloads)
    groups = runner.plan(chosen, options)
    dtype = options.run_dtype
    meta = metadata.collect(options.command, options.device, dtype, options.smoke)
    shapes: dict[str, list[str]] = {}
    for group in groups:
        labels = shapes.setdefault(group.workload.name, [])
        if group.case.label not in labels:
            labels.append(group.case.label)
    meta["shapes"] = shapes
    meta["dtypes"] = [str(d).replace("torch.", "") for d in options.sweep_dtypes]
    gemm_dtypes = list(dict.fromkeys([dtype, *options.sweep_dtypes]))  # the run's first
    limits = ceilings.measure(options.device, gemm_dtypes, options.smoke)
    bar = progress.Progress(sum(len(g.impls) for g in groups))
    try:
        rows = list(runner.Runner(options, limits, bar).run(groups))
    finally:
        bar.close()
    findings.flag(rows)
    result = report.Report(meta, limits, rows)
    written, note = plots.write(rows, options.output_dir)
    result.files.update(written)
    if note:
        result.notes.append(note)
    report.write_all(result, options.output_dir)
    return result
