"""Actionable findings with stable ids, derived from a doctor report."""

from __future__ import annotations

from typing import Any

from rlk.plugins import BUILTIN_PLUGINS

ERROR, WARNING, INFO = "error", "warning", "info"


def _finding(fid: str, severity: str, message: str, hint: str = "") -> dict[str, str]:
    return {"id": fid, "severity": severity, "message": message, "hint": hint}


def _serving(table: dict[str, dict[str, Any]]) -> str:
    """Which backends serve which ops in one device's matrix, in words."""
    by_backend: dict[str, list[str]] = {}
    for op, row in table.items():
        by_backend.setdefault(row["selected"] or "no backend", []).append(op)
    if len(by_backend) == 1:
        return f"the {next(iter(by_backend))} backend"
    return "; ".join(f"{name} ({', '.join(ops)})" for name, ops in by_backend.items())


def derive(report: dict[str, Any]) -> list[dict[str, str]]:
    env = report["environment"]
    found = []
    for plugin in report["plugins"]:
        if plugin["status"] == "failed":
            found.append(_finding(
                "plugin-failed", ERROR,
                f"plugin '{plugin['name']}' ({plugin['distribution']} {plugin['version']}) "
                f"failed: {plugin['error']}",
                "reinstall it, or block it with RLK_DISABLE_PLUGINS=" + plugin["name"]))
        elif plugin["status"] == "duplicate":
            found.append(_finding(
                "plugin-duplicate", WARNING,
                f"entry point '{plugin['name']}' ({plugin['distribution']}) {plugin['error']}; "
                "it was loaded once", "remove the extra entry point from the distribution"))
    for message in report["settings"]:
        found.append(_finding("bad-setting", ERROR, message,
                              "fix or unset the variable: every rlk call refuses this value"))
    for line in report["misplaced_entry_points"]:
        found.append(_finding("entry-point-group", ERROR, line,
                              "rename the group in the distribution's pyproject.toml and "
                              "reinstall it"))
    for plugin in report["plugins"]:
        others = [name for name in plugin["backends"] if name != plugin["name"]]
        if plugin["name"] not in (*plugin["backends"], *BUILTIN_PLUGINS) and others:
            found.append(_finding(
                "plugin-name-mismatch", WARNING,
                f"entry point '{plugin['name']}' ({plugin['distribution']}) registers backend "
                f"'{others[0]}': users must learn two names for one backend",
                "name the entry point like the backend it registers (docs/backends/"
                "writing-a-backend.md)"))
    for message in report["controls"]:
        found.append(_finding("unknown-name", WARNING, message,
                              "fix the name: a control that names nothing does nothing"))
    for backend in report["backends"]:
        if backend["status"] == "failed" and backend["priority"] is not None:
            found.append(_finding(
                "backend-broken", ERROR,
                f"backend '{backend['name']}' is registered but broken: {backend['reason']}",
                f"reinstall {backend['distribution'] or backend['name']}, or block it with "
                f"RLK_DISABLE_PLUGINS={backend['plugin']}"))
    for name, verdicts in report["probes"].items():
        for device, verdict in verdicts.items():
            if verdict["failed"]:
                found.append(_finding(
                    "probe-failed", ERROR,
                    f"the probe of backend '{name}' fails on {device}: {verdict['reason']}",
                    "a probe returns None or a reason and never raises: fix or report the "
                    "backend's plugin"))
    nvidia = [g for g in env["gpus"] if g.get("vendor") == "nvidia"]
    if nvidia and env["torch_cuda"] is None:
        found.append(_finding(
            "torch-without-cuda", WARNING,
            f"{len(nvidia)} NVIDIA GPU(s) visible but torch {env['torch']} is a CPU build",
            "install a CUDA build of torch that matches the driver"))
    if not env["cuda_available"]:
        found.append(_finding("no-gpu", INFO, "no GPU visible to torch: ops run on the CPU "
                              f"through {_serving(report['matrix'].get('cpu', {}))}"))
    for device, table in report["matrix"].items():
        for op, row in table.items():
            if row["selected"] is None:
                found.append(_finding(
                    "op-unserved", ERROR, f"no backend can serve '{op}' on {device}",
                    "; ".join(f"{k}: {v}" for k, v in row["rejected"].items())))
            elif row["selected"] == "native" and device.startswith("cuda"):
                found.append(_finding(
                    "gpu-native-fallback", WARNING,
                    f"'{op}' on {device} runs on the native (PyTorch) backend",
                    "pip install 'rlk-core[cuda]' (or [rocm]) for fused kernels"))
    if env["flashinfer"] and env["nvcc"] is None:
        found.append(_finding(
            "nvcc-missing", WARNING,
            "flashinfer is installed but nvcc was not found (CUDA_HOME, PATH): its first call "
            "cannot JIT-compile", "install the CUDA toolkit or set CUDA_HOME"))
    failed = {(r["device"], r["op"], r["backend"]) for r in report.get("smoke", [])
              if r["status"] != "pass"}
    for row in report.get("smoke", []):
        if row["status"] == "pass":
            continue
        culprit = row["raised_by"] or row["backend"]
        where = f" (raised by backend '{culprit}')" if culprit != row["backend"] else ""
        table = report["matrix"].get(row["device"], {})
        for used in row["uses"]:
            serving = table.get(used, {}).get("selected")
            if serving != row["backend"] and (row["device"], used, serving) in failed:
                where += (f"; it runs '{used}' on backend '{serving}', whose own '{used}' "
                          "kernel fails its smoke test: likely the cause")
        hint = "report it with `rlk-core doctor --json`"
        if row["plugin"] and culprit != "native":
            hint = (f"run without backend '{culprit}': RLK_DISABLE_PLUGINS={row['plugin']}, "
                    "or report it to its authors")
        found.append(_finding(
            "smoke-failed", ERROR,
            f"smoke test of backend '{row['backend']}' kernel '{row['op']}' on {row['device']} "
            f"({row['dtype']}, case {row['case']}) failed{where}: {row['detail']}", hint))
    return found
