"""Findings: the rows a run must not bury in its table.

An rlk row is a finding when it passes but reaches less than ROOFLINE_FLOOR_PCT of its
roofline, or when a peer that passed in the same group (workload, mode, shape, dtype) took
less time (a floor row, rlk.bench.floors, is a bound and never counts). Each finding is
written on its row and listed in every report and the console summary, so a slow path
shows up however large the sweep.
"""

from __future__ import annotations

from collections.abc import Iterable

from rlk.bench.row import PASS, Row

ROOFLINE_FLOOR_PCT = 80.0


def _key(row: Row) -> tuple[str, str, str, str]:
    return (row.workload, row.mode, row.case, row.dtype)


def flag(rows: Iterable[Row]) -> None:
    """Write each rlk row's findings into `row.findings` (replacing what was there), and its
    time as a multiple of its group's floor row (rlk.bench.floors) into `row.floor_ratio`,
    that row's impl into `row.floor`."""
    rows = list(rows)
    fastest_peers: dict[tuple[str, str, str, str], list[Row]] = {}
    floors: dict[tuple[str, str, str, str], Row] = {}
    for row in rows:
        if row.status != PASS or row.time_ms is None:
            continue
        if row.kind == "peer":
            fastest_peers.setdefault(_key(row), []).append(row)
        elif row.kind == "floor" and row.time_ms > 0:
            floors[_key(row)] = row
    for row in rows:
        row.findings, row.floor_ratio, row.floor = [], None, None
        if row.kind != "rlk" or row.time_ms is None:
            continue
        floor = floors.get(_key(row))
        if floor is not None and floor.time_ms:  # a row that failed its check was still timed
            row.floor_ratio, row.floor = row.time_ms / floor.time_ms, floor.impl
        if row.status != PASS:
            continue
        if row.roofline_pct is not None and row.roofline_pct < ROOFLINE_FLOOR_PCT:
            row.findings.append(f"{row.roofline_pct:.0f}% of its {row.bound} roofline "
                                f"(below {ROOFLINE_FLOOR_PCT:.0f}%)")
        for peer in sorted(fastest_peers.get(_key(row), []), key=lambda p: p.time_ms or 0.0):
            if peer.time_ms is not None and peer.time_ms < row.time_ms:
                note = f"; {peer.note}" if peer.note else ""
                row.findings.append(f"slower than {peer.impl}: {row.time_ms:.3g} ms against "
                                    f"{peer.time_ms:.3g} ms ({row.time_ms / peer.time_ms:.2f}x"
                                    f"{note})")


def lines(rows: Iterable[Row]) -> list[str]:
    """One line per finding: the row's identity, then what was found."""
    return [f"{row.workload} {row.mode} {row.case} {row.dtype} {row.impl}: {finding}"
            for row in rows for finding in row.findings]
