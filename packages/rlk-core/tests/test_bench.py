"""rlk.bench on CPU: a smoke run writes every report with metadata and honest statuses,
rows that break stay rows, the float64 checks catch wrong outputs, the entry points work."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rlk
from rlk.bench import checks, metadata, plots, timing, workloads
from rlk.bench.options import Options
from rlk.bench.row import Row
from rlk.bench.workload import Blocked, Peer
from rlk.bench.workloads import logp as logp_workloads
from rlk.cli import main

REPO = Path(__file__).resolve().parents[3]
ALL_BUT_NATIVE = "logp,logp-bwd,logp-entropy,linear-logp,policy-loss,group-advantages,sample"


def load(directory: Path) -> dict:
    return json.loads((directory / "report.json").read_text())


def rows_of(report: dict, **where: str) -> list[dict]:
    return [r for r in report["rows"] if all(r[k] == v for k, v in where.items())]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """One smoke run over every workload (no torch.compile: it costs seconds per shape)."""
    out = tmp_path_factory.mktemp("smoke")
    code = main(["bench", "--smoke", "--workloads", ALL_BUT_NATIVE, "--backends", "native",
                 "--peers", "eager,liger,cce,flashinfer", "--output-dir", str(out),
                 "--no-summary"])
    return code, out


def test_smoke_writes_every_report_with_metadata(smoke: tuple[int, Path]) -> None:
    code, out = smoke
    assert code == 0
    report = load(out)
    meta = report["metadata"]
    for key in ("command", "commit", "python", "torch", "cuda", "device", "dtype", "shapes",
                "backends", "peers"):
        assert key in meta, key
    assert meta["python"] == sys.version.split()[0]
    assert meta["torch"] == torch.__version__
    assert meta["device"]["type"] == "cpu" and meta["dtype"] == "float32"
    assert meta["shapes"]["linear-logp"] == ["N=40 H=32 V=300"]
    assert "--smoke" in meta["command"]
    assert report["ceilings"]["copy_gbps"] > 0 and report["ceilings"]["gemm_tflops"] > 0
    with (out / "report.csv").open() as handle:
        lines = list(csv.DictReader(handle))
    assert len(lines) == len(report["rows"]) > 0
    table = (out / "report.md").read_text()
    assert "| logp-bwd | fwd+bwd |" in table and "copy" in table
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert any("matplotlib" in n for n in report["notes"])
    else:
        assert all((out / f"{name}.png").stat().st_size > 0
                   for name in ("time", "memory", "roofline"))


def test_smoke_covers_every_op_with_checked_passing_rows(smoke: tuple[int, Path]) -> None:
    report = load(smoke[1])
    assert {r["workload"] for r in report["rows"]} == set(ALL_BUT_NATIVE.split(","))
    for row in rows_of(report, impl="rlk:native") + rows_of(report, impl="eager"):
        assert row["status"] == "pass", row
        assert row["time_ms"] > 0 and row["reps"] >= 3
        assert row["roofline_pct"] > 0 and row["bound"] in ("memory", "compute")
        assert row["extra_memory_bytes"] is not None and row["memory_method"].startswith("cpu")
        assert row["max_abs_error"] is not None and row["max_abs_error"] < 1e-4, row
    backward = rows_of(report, workload="logp-bwd", impl="rlk:native")[0]
    assert 0 <= backward["grad_max_abs_error"] < 1e-5
    linear = rows_of(report, workload="linear-logp", mode="fwd+bwd", impl="rlk:native")[0]
    assert {"logp", "grad_hidden", "grad_weight"} <= set(linear["errors"])
    sampled = rows_of(report, workload="sample", impl="rlk:native")[0]
    assert {"logp", "processed_logp"} <= set(sampled["errors"])


def test_missing_peers_are_blocked_with_the_reason(smoke: tuple[int, Path]) -> None:
    report = load(smoke[1])
    liger = rows_of(report, workload="logp", impl="liger")
    cce = rows_of(report, workload="linear-logp", impl="cce")
    flashinfer = rows_of(report, workload="sample", impl="flashinfer")
    assert liger and cce and flashinfer
    for row in liger + cce + flashinfer:
        assert row["status"] == "blocked"
        assert "not installed" in row["reason"] or "CUDA devices only" in row["reason"]
        assert row["time_ms"] is None
    assert not rows_of(report, workload="group-advantages", impl="liger")


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workload, **options) -> list[Row]:
    monkeypatch.setitem(workloads.WORKLOADS, workload.name, workload)
    return rlk.bench.run(Options(workloads=[workload.name], smoke=True,
                                 output_dir=tmp_path, **options)).rows


def _with_peers(**peers: Peer):
    from dataclasses import replace

    return replace(logp_workloads.LOGP, name="logp-test", peers=peers,
                   smoke_cases=logp_workloads.SMOKE)


def test_a_bad_row_never_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def raises(error: Exception):
        def build(case, backward, device):
            def call(x):
                raise error
            return call
        return build

    def blocked(case, backward, device):
        raise Blocked("needs a frobnicator")

    workload = _with_peers(
        crash=Peer("crash", raises(RuntimeError("kernel exploded\nsecond line"))),
        oom=Peer("oom", raises(torch.OutOfMemoryError("CUDA out of memory. Tried 9 GiB"))),
        missing=Peer("missing", blocked),
        eager=logp_workloads.LOGP.peers["eager"],
    )
    rows = {r.impl: r for r in _run(tmp_path, monkeypatch, workload, backends=["native"])}
    assert rows["crash"].status == "failure"
    assert rows["crash"].reason == "RuntimeError: kernel exploded"
    assert rows["oom"].status == "oom" and "out of memory" in rows["oom"].reason
    assert rows["missing"].status == "blocked" and rows["missing"].reason == "needs a frobnicator"
    assert rows["eager"].status == rows["rlk:native"].status == "pass"
    assert load(tmp_path)["counts"] == {"pass": 2, "blocked": 1, "oom": 1, "failure": 1}


def test_a_workload_that_cannot_make_its_inputs_here_is_blocked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing framework (trl-grpo without TRL) blocks every row with the reason: no failure."""
    from dataclasses import replace

    def no_framework(*args, **kwargs):
        raise Blocked("TRL is not installed")

    workload = replace(_with_peers(eager=logp_workloads.LOGP.peers["eager"]), inputs=no_framework)
    rows = _run(tmp_path, monkeypatch, workload, backends=["native"])
    assert {r.impl for r in rows} == {"rlk:native", "eager"}
    assert all(r.status == "blocked" and r.reason == "TRL is not installed" for r in rows)


def test_errors_are_measured_against_float64(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def shifted(offset: float):
        def build(case, backward, device):
            return lambda x: {"logp": logp_workloads.eager_logp(x["logits"], x["tokens"]) + offset}
        return build

    workload = _with_peers(off=Peer("off", shifted(0.125)),
                           nan=Peer("nan", shifted(float("nan"))))
    rows = {r.impl: r for r in _run(tmp_path, monkeypatch, workload, backends=["native"])}
    assert rows["off"].status == "pass"
    assert rows["off"].max_abs_error == pytest.approx(0.125, abs=1e-5)
    assert rows["nan"].status == "failure" and "not finite" in rows["nan"].reason
    assert rows["rlk:native"].max_abs_error < 1e-5


def test_a_peer_that_overwrites_its_inputs_is_restored_before_each_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Like Liger's cross entropy, which writes the gradient over the logits."""
    seen: list[float] = []

    def build(case, backward, device):
        eager = logp_workloads.LOGP.peers["eager"].build(case, backward, device)

        def call(x):
            seen.append(float(x["logits"].detach().abs().sum()))
            found = eager(x)
            with torch.no_grad():
                x["logits"].zero_()
            return found
        return call

    from dataclasses import replace

    workload = replace(logp_workloads.LOGP_BWD, name="logp-test",
                       smoke_cases=logp_workloads.LOGP.smoke_cases,
                       peers={"clobber": Peer("clobber", build, mutates=("logits",)),
                              "eager": logp_workloads.LOGP.peers["eager"]})
    rows = _run(tmp_path, monkeypatch, workload, backends=[])
    # a dense case, then a strided one (the logits a view into a wider buffer)
    assert [r.impl for r in rows] == ["clobber", "eager"] * 2
    assert rows[0].case + " strided" == rows[2].case
    for clobber, eager in (rows[:2], rows[2:]):
        assert clobber.status == "pass" and clobber.grad_max_abs_error < 1e-5
        assert eager.max_abs_error < 1e-5  # the next row saw the original logits
    assert len(seen) > 3 and min(seen) > 0
    assert len(set(seen)) == 2  # one value per case: every call saw pristine logits


def test_a_backend_variant_runs_under_its_environment(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A variant row (like rlk:cuda-tma) sets its environment while it runs, and only then."""
    from dataclasses import replace

    from rlk.bench.workload import Variant

    seen: list[str | None] = []

    def rlk_call(backward):
        call = logp_workloads.LOGP.rlk_call(backward)

        def watched(x):
            seen.append(os.environ.get("RLK_BENCH_TEST_PATH"))
            return call(x)
        return watched

    monkeypatch.delenv("RLK_BENCH_TEST_PATH", raising=False)
    variants = (Variant("native", "fast", {"RLK_BENCH_TEST_PATH": "fast"}),
                Variant("native", "never", {}, lambda device: "needs a frobnicator"),
                Variant("nosuch", "fast", {}))
    workload = replace(logp_workloads.LOGP, name="logp-test", rlk_call=rlk_call, peers={},
                       variants=variants)
    rows = {r.impl: r for r in _run(tmp_path, monkeypatch, workload, backends=["native"])}
    assert list(rows) == ["rlk:native", "rlk:native-fast", "rlk:native-never"]
    assert rows["rlk:native"].status == rows["rlk:native-fast"].status == "pass"
    assert rows["rlk:native-never"].status == "blocked"
    assert rows["rlk:native-never"].reason == "needs a frobnicator"
    assert set(seen) == {None, "fast"} and seen[0] is None and seen[-1] == "fast"
    assert "RLK_BENCH_TEST_PATH" not in os.environ


def test_missing_op_and_unknown_backend_are_blocked(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    report = rlk.bench.run(Options(workloads=["group-advantages"], backends=["nosuch"],
                                   peers=[], smoke=True, output_dir=tmp_path / "a"))
    (row,) = report.rows
    assert row.impl == "rlk:nosuch" and row.status == "blocked"
    assert "not installed" in row.reason
    monkeypatch.delattr(rlk, "sample")
    report = rlk.bench.run(Options(workloads=["sample"], backends=["native"], peers=["eager"],
                                   smoke=True, output_dir=tmp_path / "b"))
    rows = {r.impl: r for r in report.rows}
    assert rows["rlk:native"].status == "blocked"
    assert "has no rlk.sample" in rows["rlk:native"].reason
    assert rows["eager"].status == "pass"


def test_time_limit_reports_unrun_rows_and_still_writes(tmp_path: Path) -> None:
    code = main(["bench", "--smoke", "--workloads", "logp,group-advantages", "--peers", "eager",
                 "--backends", "native", "--time-limit", "1e-6", "--output-dir", str(tmp_path),
                 "--no-summary"])
    assert code == 0
    report = load(tmp_path)
    assert len(report["rows"]) == 6  # logp: a dense and a strided case
    for row in report["rows"]:
        assert row["status"] == "blocked" and "--time-limit" in row["reason"]
    assert "--time-limit" in report["metadata"]["command"]
    assert main(["bench", "--smoke", "--time-limit", "0", "--output-dir", str(tmp_path)]) == 2


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--smoke", "--workloads", "logp,nope", "--output-dir",
                 str(tmp_path)]) == 2
    assert "unknown workload(s) nope" in capsys.readouterr().err
    assert main(["bench", "--smoke", "--peers", "vllm", "--output-dir", str(tmp_path)]) == 2
    assert "unknown peer(s) vllm" in capsys.readouterr().err
    assert main(["bench", "--smoke", "--dtype", "int8", "--output-dir", str(tmp_path)]) == 2


def test_plots_are_skipped_with_a_note_without_matplotlib(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    row = Row("logp", "logp", "fwd", "N=1 V=2", {}, "float32", "cpu", "eager", "peer",
              time_ms=1.0)
    written, note = plots.write([row], tmp_path)
    assert written == {} and note is not None and "matplotlib" in note
    assert not list(tmp_path.iterdir())


def _kept_by_loops(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """The top-k / top-p / min-p set, one row at a time in plain Python (no ties in the data)."""
    keep = torch.zeros(logits.shape, dtype=torch.bool)
    for i, row in enumerate(torch.softmax(logits.double(), -1)):
        order = sorted(range(row.numel()), key=lambda j: -float(row[j]))[:top_k]
        mass = sum(float(row[j]) for j in order)
        total, chosen = 0.0, []
        for j in order:
            if total < top_p:
                chosen.append(j)
            total += float(row[j]) / mass
        best = float(row[order[0]])
        for j in chosen:
            keep[i, j] = float(row[j]) >= min_p * best
    return keep


@pytest.mark.parametrize(("top_k", "top_p", "min_p"), [(5, 1.0, 0.0), (40, 0.7, 0.0),
                                                       (12, 0.9, 0.2)])
def test_sample_check_knows_the_kept_tokens(top_k: int, top_p: float, min_p: float) -> None:
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(3)) * 2
    logp, keep = checks.kept_tokens(logits, 1.0, top_k, top_p, min_p)
    assert torch.equal(keep, _kept_by_loops(logits, top_k, top_p, min_p))
    assert torch.allclose(logp, torch.log_softmax(logits.double(), -1))
    processed = checks.processed_logp(logp, keep)
    assert torch.allclose(processed.exp().sum(-1), torch.ones(6, dtype=torch.float64))
    assert torch.isinf(processed[~keep]).all()


@pytest.mark.parametrize("script", ["benchmarks/profiler.py", "scripts/run_profile_suite.py"])
def test_seed_entry_points(script: str, tmp_path: Path) -> None:
    command = [sys.executable, str(REPO / script), "--smoke", "--workloads", "logp-native",
               "--no-summary"]
    if script.startswith("scripts"):
        command += ["--output-dir", str(tmp_path / "reports")]
        out = tmp_path / "reports"
    else:
        out = tmp_path / "bench-results"
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # --no-summary: no table
    report = load(out)
    assert {r["impl"]: r["status"] for r in report["rows"]} == {"rlk:native": "pass",
                                                                "eager": "pass"}
    assert (out / "report.csv").exists() and (out / "report.md").exists()


@pytest.mark.parametrize("command", [
    ["benchmarks/cpu/small_ops_overhead.py", "--reps", "3"],
    ["benchmarks/cpu/kernel_checks_overhead.py", "--reps", "3"],
    ["benchmarks/linear_logp_cpu.py", "--n", "8", "--h", "4", "--v", "16", "--reps", "1"],
])
def test_cpu_studies_run(command: list[str]) -> None:
    done = subprocess.run([sys.executable, str(REPO / command[0]), *command[1:]], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert " ms" in done.stdout or " us" in done.stdout


def test_the_shuffled_group_advantages_rows_are_checked_in_group_order() -> None:
    from rlk.bench.workloads import group_advantages as adv

    case = adv.sweep_case(16, 4, "shuffled")
    x = adv.adv_inputs(case, torch.float32, torch.device("cpu"), 0, False)
    found = adv.adv_reference(x, False)
    right = adv.eager_ids_advantages(x["rewards"], x["group_ids"])
    assert adv.adv_compare(found, {"advantages": right}, x)[0].max_abs < 1e-5
    wrong = adv.eager_advantages(x["rewards"], 4)  # groups of consecutive shuffled rewards
    assert adv.adv_compare(found, {"advantages": wrong}, x)[0].max_abs > 1e-3


def test_a_named_commit_wins_over_a_copied_git_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLK_BENCH_COMMIT", "0123abc")
    assert metadata.commit() == {"sha": "0123abc", "dirty": None}
    monkeypatch.delenv("RLK_BENCH_COMMIT")
    assert metadata.commit()["sha"] != "0123abc"


def test_host_and_wall_times_count_every_call() -> None:
    calls = []
    host, wall = timing.host_and_wall_ms(lambda: calls.append(1), 7, torch.device("cpu"), warmup=2)
    assert len(calls) == 9
    assert 0.0 < host <= wall


def _row(impl: str, kind: str, time_ms: float | None, roofline_pct: float | None = 95.0,
         status: str = "pass", case: str = "N=8 V=32", note: str = "") -> Row:
    return Row(workload="logp", op="logp", mode="fwd", case=case, dims={}, dtype="float16",
               device="cuda", impl=impl, kind=kind, status=status, time_ms=time_ms,
               roofline_pct=roofline_pct, bound="memory", note=note)


def test_findings_flag_rlk_rows_below_the_roofline_floor_or_slower_than_a_peer() -> None:
    from rlk.bench import findings

    rows = [
        _row("rlk:cuda", "rlk", 2.0, roofline_pct=50.0),
        _row("rlk:native", "rlk", 9.0),
        _row("rlk:fast", "rlk", 0.5, roofline_pct=96.0),
        _row("rlk:blocked", "rlk", None, None, status="blocked"),
        _row("liger", "peer", 1.5, roofline_pct=60.0, note="loss in the logits' dtype"),
        _row("eager", "peer", 4.0),
        _row("rlk:other-shape", "rlk", 3.0, case="N=16 V=32"),
    ]
    findings.flag(rows)
    cuda, native, fast, blocked, liger, eager, other = rows
    assert cuda.findings == [
        "50% of its memory roofline (below 80%)",
        "slower than liger: 2 ms against 1.5 ms (1.33x; loss in the logits' dtype)"]
    assert [f.split(":")[0] for f in native.findings] == ["slower than liger", "slower than eager"]
    assert fast.findings == blocked.findings == liger.findings == eager.findings == []
    assert other.findings == []  # peers of another shape do not count
    listed = findings.lines(rows)
    assert listed[0] == "logp fwd N=8 V=32 float16 rlk:cuda: 50% of its memory roofline (below 80%)"
    assert len(listed) == 4


def test_a_floor_row_is_a_bound_never_a_finding() -> None:
    from rlk.bench import findings
    from rlk.bench.report import markdown_table

    rows = [_row("rlk:cuda", "rlk", 3.3, roofline_pct=90.0), _row("cublas", "floor", 3.0),
            _row("rlk:cuda", "rlk", 2.0, case="N=16 V=32"),
            _row("rlk:bad", "rlk", 6.0, status="failure")]
    findings.flag(rows)
    same, floor, other, failed = rows
    assert same.findings == [] and same.floor_ratio == pytest.approx(1.1)
    assert other.floor_ratio is None and floor.floor_ratio is None
    assert failed.floor_ratio == pytest.approx(2.0) and failed.findings == []
    table = markdown_table(rows)
    assert "1.100x the cublas floor" in table and "2.000x the cublas floor" in table
    backbone = [_row("rlk:cuda", "rlk", 145.0), _row("backbone", "floor", 130.0)]
    findings.flag(backbone)
    assert backbone[0].floor == "backbone" and backbone[0].floor_ratio == pytest.approx(145 / 130)
    assert "1.115x the backbone floor" in markdown_table(backbone)


def test_the_gemm_floor_runs_the_ops_gemms_and_is_not_checked(tmp_path: Path) -> None:
    from rlk.bench.floors import gemm_floor
    from rlk.bench.workload import Case

    calls: list[tuple[int, ...]] = []
    real_mm = torch.mm

    def counting_mm(a, b, **kwargs):
        calls.append((a.shape[0], b.shape[1]))
        return real_mm(a, b, **kwargs)

    x = {"hidden": torch.randn(2, 5, 8), "weight": torch.randn(30, 8)}
    gspo = Case("GSPO", {"GSPO": 1})
    call = gemm_floor(lambda case: 2 if case.dims["GSPO"] else 1).build(gspo, True,
                                                                          torch.device("cpu"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "mm", counting_mm)
        assert call(x) == {}
    # the logits twice, then grad_hidden [N, H] and grad_weight [V, H]
    assert calls == [(10, 30), (10, 30), (10, 8), (30, 8)]


def test_reports_carry_the_findings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a roofline floor no row can reach, every rlk row is a finding: the JSON, CSV and
    Markdown reports must all say so."""
    monkeypatch.setattr("rlk.bench.findings.ROOFLINE_FLOOR_PCT", 1e9)
    workload = _with_peers(eager=logp_workloads.LOGP.peers["eager"])
    rows = _run(tmp_path, monkeypatch, workload, backends=["native"])
    native = [r for r in rows if r.impl == "rlk:native"]
    assert native and all(any("roofline" in f for f in r.findings) for r in native)
    report = load(tmp_path)
    assert len(report["findings"]) >= len(native)
    assert all("rlk:native" in line for line in report["findings"])
    with (tmp_path / "report.csv").open() as handle:
        lines = [line for line in csv.DictReader(handle) if line["impl"] == "rlk:native"]
    assert lines and all("roofline" in line["findings"] for line in lines)
    table = (tmp_path / "report.md").read_text()
    assert "## Findings:" in table and "finding: " in table


def test_each_case_runs_in_every_dtype_of_the_sweep() -> None:
    from rlk.bench import runner
    from rlk.bench.options import SWEEP_DTYPES, parse_dtypes

    assert (torch.float32, torch.bfloat16, torch.float16) == SWEEP_DTYPES
    options = Options(workloads=["logp", "policy-loss"], smoke=True,
                      dtypes=parse_dtypes("float16,bf16,fp16"))
    assert options.sweep_dtypes == [torch.float16, torch.bfloat16]
    groups = runner.plan(workloads.select(options.workloads), options)
    logp = [(g.case.label, g.dtype) for g in groups if g.workload.name == "logp"]
    assert logp == [(case.label, dtype) for case in logp_workloads.LOGP.smoke_cases
                    for dtype in (torch.float16, torch.bfloat16)]
    # a case that pins its dtype (the small ops' float32 inputs) runs once, in it
    assert {g.dtype for g in groups if g.workload.name == "policy-loss"} == {torch.float32}
    assert Options(smoke=True).sweep_dtypes == [torch.float32]  # CPU: float32 only
    with pytest.raises(ValueError, match="int8"):
        parse_dtypes("bf16,int8")


def test_compute_rooflines_use_the_rows_dtype() -> None:
    """A float32 GEMM row is held to float32's measured rate, not bfloat16's."""
    from rlk.bench.ceilings import Ceilings

    limits = Ceilings(copy_gbps=1000.0, copy_bytes=1, gemm_tflops=800.0, gemm_size=8192,
                      gemm_dtype="bfloat16",
                      gemm_tflops_by_dtype={"bfloat16": 800.0, "float32": 50.0})
    assert limits.roofline_ms(1e9, 8e14, "bfloat16") == (1000.0, "compute")
    assert limits.roofline_ms(1e9, 8e14, "float32") == (16000.0, "compute")
    assert limits.roofline_ms(1e9, 8e14, "float16") == (1000.0, "compute")  # not measured
    assert limits.roofline_ms(4e9, 0.0, "float32") == (4.0, "memory")


def test_a_smoke_runs_timing_findings_are_labelled_not_meaningful(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A smoke run times tiny shapes a few times on a shared machine: its findings read like
    regressions unless they say what they are, in the report and on the console."""
    from rlk.bench.report import findings_section

    monkeypatch.setattr("rlk.bench.findings.ROOFLINE_FLOOR_PCT", 1e9)
    workload = _with_peers(eager=logp_workloads.LOGP.peers["eager"])
    rows = _run(tmp_path, monkeypatch, workload, backends=["native"])
    table = (tmp_path / "report.md").read_text()
    assert "Not meaningful: a smoke run" in table
    listed = [line for line in table.splitlines() if line.startswith("- logp-test")]
    assert listed and all(line.endswith("(smoke: not meaningful)") for line in listed)
    assert "not meaningful" not in findings_section(rows, smoke=False)
