"""`rlk-core bench`: the benchmark suite (see rlk.bench and docs/benchmarks)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rlk.cli.devices import available


def add_parser(subparsers: Any) -> None:
    from rlk.bench.peers import PEERS
    from rlk.bench.workloads import WORKLOADS

    parser = subparsers.add_parser(
        "bench", help="time every op against peers, checked and on the roofline",
        description="Time rlk's ops on each backend beside peers in one process; write "
                    "report.json, report.csv, report.md and plots to --output-dir.")
    parser.add_argument("--workloads", default=None,
                        help=f"comma-separated, default all: {','.join(WORKLOADS)}")
    parser.add_argument("--backends", default=None,
                        help="comma-separated rlk backends, default every one serving the op; "
                             "'' for none")
    parser.add_argument("--peers", default=None,
                        help=f"comma-separated, default all: {','.join(PEERS)}; '' for none")
    parser.add_argument("--dtype", default=None,
                        help="comma-separated bfloat16, float16, float32 (default: all three "
                             "on GPU, float32 on CPU and under --smoke)")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda or cuda:N (default: cuda when torch sees one)")
    parser.add_argument("--output-dir", type=Path, default=Path("bench-results"),
                        help="where the report files go (default ./bench-results)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="start no row after this many seconds; later rows are reported "
                             "blocked, so the reports are always written")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, few repetitions")
    parser.add_argument("--no-summary", action="store_true",
                        help="do not print the result table at the end")
    parser.set_defaults(run=run)


def command_line(args: argparse.Namespace) -> list[str]:
    """The run as an `rlk-core bench` command (the same whichever entry point started it)."""
    words = ["rlk-core", "bench"]
    for flag in ("workloads", "backends", "peers", "dtype", "device", "time_limit"):
        value = getattr(args, flag)
        if value is not None:
            words += [f"--{flag.replace('_', '-')}", str(value)]
    words += ["--output-dir", str(args.output_dir)]
    words += ["--smoke"] * args.smoke + ["--no-summary"] * args.no_summary
    return words


def writable(directory: Path) -> None:
    """Refuse, before any row runs, an --output-dir the reports could not be written to."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".rlk-write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--output-dir {directory}: {exc.strerror or exc}") from None


def options_from(args: argparse.Namespace) -> Any:
    from rlk.bench.options import Options, parse_dtypes, parse_list

    extra = {}
    if args.device is not None:
        extra["device"] = available(args.device)
    writable(args.output_dir)

    def listed(text: str | None) -> list[str] | None:
        """None when the flag is absent (all); [] when given empty (none)."""
        names = parse_list(text)
        return [] if text is not None and names is None else names

    return Options(
        workloads=parse_list(args.workloads),
        backends=listed(args.backends),
        peers=listed(args.peers),
        dtypes=None if args.dtype is None else parse_dtypes(args.dtype),
        output_dir=args.output_dir,
        smoke=args.smoke,
        summary=not args.no_summary,
        time_limit=args.time_limit,
        command=command_line(args),
        **extra,
    )


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every row ran (pass or blocked), 1 when a row failed or ran out of memory."""
    from rlk.bench import run as run_suite
    from rlk.bench.report import findings_section, markdown_table

    options = options_from(args)
    result = run_suite(options)
    if options.summary:
        print(markdown_table(result.rows))
        print()
        print(findings_section(result.rows, options.smoke))
    counts = ", ".join(f"{k} {v}" for k, v in result.counts().items())
    print(f"rlk-core bench: {counts}; reports in {options.output_dir}", file=sys.stderr)
    for note in result.notes:
        print(f"rlk-core bench: {note}", file=sys.stderr)
    return 1 if result.counts()["failure"] or result.counts()["oom"] else 0
