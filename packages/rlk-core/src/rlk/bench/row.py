"""One line of a report: an implementation of one workload at one shape, mode and dtype."""

from __future__ import annotations

from dataclasses import dataclass, field

PASS, BLOCKED, OOM, FAILURE = "pass", "blocked", "oom", "failure"
STATUSES = (PASS, BLOCKED, OOM, FAILURE)


@dataclass
class Row:
    workload: str
    op: str
    mode: str
    case: str
    dims: dict[str, float]
    dtype: str
    device: str
    impl: str  # "rlk:<backend>" or a peer name
    kind: str  # "rlk", "peer" or "floor" (rlk.bench.floors)
    status: str = PASS
    reason: str = ""
    time_ms: float | None = None
    time_min_ms: float | None = None
    reps: int = 0
    first_call_ms: float | None = None
    extra_memory_bytes: int | None = None
    memory_method: str = ""
    bytes_moved: float = 0.0
    flops: float = 0.0
    bound: str = ""
    roofline_ms: float | None = None
    roofline_pct: float | None = None
    max_abs_error: float | None = None
    grad_max_abs_error: float | None = None
    errors: dict[str, float] = field(default_factory=dict)
    checked: str = ""
    note: str = ""
    findings: list[str] = field(default_factory=list)  # see rlk.bench.findings
    floor_ratio: float | None = None  # time over the group's floor row's (rlk.bench.floors)
    floor: str | None = None  # that floor row's impl (cublas, backbone)
