"""`rlk-core doctor`: what is installed, what each backend says, which backend serves what."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import torch

from rlk import environment
from rlk.cli import findings, matrix, settings, smoke
from rlk.config import env_names
from rlk.dispatch import Dispatcher, get_dispatcher
from rlk.introspect import backend_records
from rlk.plugins import misplaced_entry_points

SCHEMA_VERSION = 1


def devices(only: int | None) -> list[torch.device]:
    count = torch.cuda.device_count()
    if only is not None:
        if not 0 <= only < count:
            raise ValueError(f"--device {only} does not exist ({count} CUDA device(s) visible)")
        return [torch.device("cpu"), torch.device("cuda", only)]
    return [torch.device("cpu")] + [torch.device("cuda", i) for i in range(count)]


def build_report(device_index: int | None = None, run_smoke: bool = False) -> dict[str, Any]:
    dispatcher = get_dispatcher()
    dispatcher.loader.load()  # never the strict-mode error: the doctor reports failures
    targets = devices(device_index)
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "environment": environment.collect(),
        "plugins": [dataclasses.asdict(r) for r in dispatcher.loader.records],
        "misplaced_entry_points": [line for _, line in misplaced_entry_points()],
        "controls": unknown_names(dispatcher),
        "settings": settings.errors(),
    }
    report["backends"] = [dataclasses.asdict(b) for b in backend_records(dispatcher,
                                                                          targets[-1])]
    report["probes"] = {
        backend.name: {str(d): dataclasses.asdict(dispatcher.registry.probe(backend.name, d))
                       for d in targets}
        for backend in dispatcher.registry.backends.values()
    }
    report["matrix"] = {str(d): matrix.device_matrix(d) for d in targets}
    if run_smoke:
        report["smoke"] = [row for d in targets for row in smoke.run(d)]
    report["findings"] = findings.derive(report)
    return report


def unknown_names(dispatcher: Dispatcher) -> list[str]:
    """Names in RLK_PLUGINS, RLK_DISABLE_PLUGINS and RLK_BACKENDS that match nothing here."""
    found = dispatcher.loader.unknown_filters()
    for name in env_names("RLK_BACKENDS"):
        if name not in dispatcher.registry.backends:
            found.append(f"RLK_BACKENDS names '{name}', which is {dispatcher.missing(name)}")
    return found


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = ["rlk doctor", "", "Environment"]
    for key in ("python", "platform", "rlk", "torch", "torch_cuda", "torch_hip",
                "cuda_available", "nvcc", "triton", "flashinfer", "quack", "cutlass_dsl",
                "vllm"):
        lines.append(f"  {key:15} {env[key] if env[key] is not None else 'not found'}")
    for gpu in env["gpus"]:
        arch = gpu.get("capability") or gpu.get("arch")
        driver = gpu.get("driver", "?")
        lines.append(f"  gpu {gpu['index']:<11} {gpu['name']} ({arch}) driver {driver}")
    lines += ["", "Plugins"]
    for plugin in report["plugins"]:
        extra = f": {plugin['error']}" if plugin["error"] else ""
        api = f"API {plugin['api'] or '?'}"
        lines.append(f"  {plugin['name']:15} {plugin['status']:9} {api:9} "
                     f"{plugin['distribution']} {plugin['version']}{extra}")
    lines += ["", "Backends (probe per device)"]
    for backend in report["backends"]:
        lines.append(f"  {backend['name']:15} {backend['status']:12} priority "
                     f"{backend['priority']}  {backend['reason']}")
        for device, verdict in report["probes"].get(backend["name"], {}).items():
            said = "ok" if verdict["reason"] is None else verdict["reason"]
            lines.append(f"      {device:10} {'probe failed: ' if verdict['failed'] else ''}{said}")
    for device, table in report["matrix"].items():
        lines += ["", f"Ops on {device} (* = selected)"]
        for op, row in table.items():
            chosen = row["selected"] or "NONE"
            via = "".join(f" (runs {used} on {table[used]['selected'] or 'NONE'})"
                          for used in row["uses"] if used in table)
            lines.append(f"  {op:24} * {chosen} [{row['dtype']}]{via}")
            for name, why in row["rejected"].items():
                lines.append(f"  {'':24}   {name}: {why}")
    if "smoke" in report:
        passed = sum(row["status"] == "pass" for row in report["smoke"])
        lines += ["", f"Smoke tests (every kernel, run directly): {passed} passed, "
                      f"{len(report['smoke']) - passed} failed"]
        for row in report["smoke"]:
            if row["status"] != "pass":
                lines.append(f"  {row['op']:20} {row['device']:8} {row['backend']:10} "
                             f"{row['dtype']:9} {row['case']:14} {row['detail']}")
    lines += ["", "Findings"]
    if not report["findings"]:
        lines.append("  none: healthy")
    for finding in report["findings"]:
        lines.append(f"  [{finding['severity']}] {finding['id']}: {finding['message']}")
        if finding["hint"]:
            lines.append(f"      hint: {finding['hint']}")
    return "\n".join(lines)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("doctor", help="diagnose the installation and dispatch")
    parser.add_argument("--json", action="store_true", help="machine-readable report")
    parser.add_argument("--smoke", action="store_true",
                        help="run every registered kernel on tiny inputs against the reference")
    parser.add_argument("--device", type=int, default=None, help="only this CUDA device index")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    report = build_report(args.device, args.smoke)
    print(json.dumps(report, indent=2, default=str) if args.json else render(report))
    return 1 if any(f["severity"] == findings.ERROR for f in report["findings"]) else 0
