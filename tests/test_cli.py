"""`rlk-core doctor`, `backends` and `explain` as a user runs them."""

from __future__ import annotations

import json

import pytest
import torch

from rlk import dispatch
from rlk.cli import main


def test_doctor_healthy_json(fresh_rlk, capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema_version"] == 1
    assert report["matrix"]["cpu"]["logp"]["selected"] == "native"
    names = {b["name"] for b in report["backends"]}
    assert {"native", "testbackend", "faraway"} <= names
    assert not torch.cuda.is_initialized()


def test_doctor_reports_failing_plugins_as_errors(fresh_rlk, capsys):
    fresh_rlk.delenv("RLK_DISABLE_PLUGINS")
    dispatch.reset()
    assert main(["doctor"]) == 1
    text = capsys.readouterr().out
    assert "broken" in text and "librlk_broken.so" in text
    assert "[error] plugin-failed" in text


def test_doctor_smoke_runs_kernels(fresh_rlk, capsys):
    assert main(["doctor", "--smoke", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    smoke = [row for row in report["smoke"] if row["op"] == "logp"]
    assert smoke and all(row["status"] == "pass" for row in smoke)


def test_usage_errors_exit_2(fresh_rlk, capsys):
    try:
        main(["doctor", "--no-such-flag"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("argparse accepted an unknown flag")
    assert main(["explain", "logp", "--shape", "4,y"]) == 2
    assert main(["explain", "nosuchop", "--shape", "4,8"]) == 2
    assert main(["doctor", "--device", "3"]) == 2


def test_explain_and_backends(fresh_rlk, capsys):
    assert main(["explain", "logp", "--shape", "4,128", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "native" in out and "faraway: needs a Faraway accelerator" in out
    assert main(["backends", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert any(r["name"] == "native" and r["status"] == "ready" for r in records)


def test_explain_refuses_shapes_and_devices_it_cannot_mean(fresh_rlk, capsys):
    assert main(["explain", "logp", "--shape", "4"]) == 2
    assert "logp takes --shape N,V" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["explain", "logp", "--shape", "4,8", "--device", "cuda"]) == 2
        assert "sees no CUDA device" in capsys.readouterr().err
    assert main(["explain", "logp", "--shape", "4,8", "--device", "tpu"]) == 2
    assert "--device must name a torch device" in capsys.readouterr().err


def test_explain_help_lists_every_op_shape(capsys):
    from rlk._runtime.spec import specs

    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    for name, spec in specs().items():
        assert f"{name} {spec.shape_help}" in flat, name


def test_numpy_is_a_dependency_so_no_command_warns_about_it():
    """torch prints a NumPy warning on import when numpy is absent: rlk-core requires it."""
    from importlib import metadata

    requirements = metadata.requires("rlk-core") or []
    assert any(r.startswith("numpy") and "extra ==" not in r for r in requirements), requirements
