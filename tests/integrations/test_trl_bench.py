"""The `trl-grpo` bench workload at smoke size on CPU: both modes, TRL as is and patched,
and the backbone floor under both."""

from __future__ import annotations

from pathlib import Path

import torch

import rlk.bench
from rlk.bench import Options

from .conftest import require

require("trl")


def test_trl_grpo_workload_runs_as_is_and_patched(tmp_path: Path) -> None:
    report = rlk.bench.run(Options(workloads=["trl-grpo"], backends=["native"], smoke=True,
                                   device=torch.device("cpu"), output_dir=tmp_path,
                                   summary=False))
    rows = {(row.mode, row.impl): row for row in report.rows}
    assert set(rows) == {(mode, impl) for mode in ("fwd", "fwd+bwd")
                         for impl in ("rlk:native", "trl", "backbone")}
    for (mode, impl), row in rows.items():
        assert row.status == "pass", (mode, impl, row.reason)
        assert row.time_ms is not None and row.time_ms > 0 and row.flops > 0
        assert row.dims["tokens"] == row.dims["B"] * row.dims["T"]
    assert (tmp_path / "report.json").exists()
