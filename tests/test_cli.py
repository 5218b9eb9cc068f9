"""`rlk-core doctor`, `backends` and `explain` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import rlk
from rlk import dispatch
from rlk.cli import main
from rlk_testbackend import FAILING_PLUGINS


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


@pytest.mark.parametrize("argv", [
    ["backends", "--device", "banana"],
    ["bench", "--device", "banana"],
    ["bench", "--smoke", "--workloads", "logp-native", "--output-dir", "/proc/xyz"],
    ["explain", "logp", "--shape", "99999999999999999999,5"],
    ["explain", "logp", "--shape", "999999999999999999,500"],
])
def test_bad_arguments_are_one_line_errors(fresh_rlk, capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlk-core {argv[0]}: error: ") and "\n" not in err, err


def test_strict_plugins_failure_is_a_one_line_error(fresh_rlk, capsys):
    fresh_rlk.setenv("RLK_DISABLE_PLUGINS", "oldapi,badhook,lazyfail")
    fresh_rlk.setenv("RLK_STRICT_PLUGINS", "1")
    dispatch.reset()
    assert main(["backends"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("rlk-core backends: error: rlk plugins failed to load")
    assert "librlk_broken.so" in err


def test_backends_exits_1_when_it_lists_a_failed_backend(fresh_rlk, capsys):
    assert main(["backends"]) == 0
    fresh_rlk.setenv("RLK_DISABLE_PLUGINS", "oldapi,badhook,lazyfail")
    dispatch.reset()
    assert main(["backends"]) == 1
    assert "broken" in capsys.readouterr().out


@pytest.mark.parametrize("variable, value", [("RLK_NATIVE_CHUNK_MB", "abc"),
                                             ("RLK_STRICT_PLUGINS", "maybe")])
def test_doctor_reports_a_setting_every_op_refuses(fresh_rlk, capsys, variable, value):
    fresh_rlk.setenv(variable, value)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert f"[error] bad-setting: {variable} must be" in out, out[-2000:]


@pytest.mark.parametrize("variable", ["RLK_CHECK_INPUTS", "RLK_STRICT"])
def test_a_setting_the_doctor_itself_reads_is_a_usage_error(fresh_rlk, capsys, variable):
    fresh_rlk.setenv(variable, "sometimes")
    assert main(["doctor"]) == 2
    assert f"error: {variable} must be one of" in capsys.readouterr().err


def test_doctor_into_a_closed_pipe_ends_quietly():
    """`rlk-core doctor --json | head`: the reader leaves early, no traceback follows."""
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "RLK_DISABLE_PLUGINS": FAILING_PLUGINS}
    done = subprocess.run([sys.executable, "-c", "import sys; from rlk.cli import main; "
                           "sys.exit(main())", "doctor", "--json"], stdout=write,
                          stderr=subprocess.PIPE, text=True, env=env, check=False)
    os.close(write)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def test_doctor_runs_under_value_checks(fresh_rlk, capsys):
    """Issue #31: the linear ops range-checked tokens under RLK_CHECK_INPUTS=1 even when they
    were the doctor's meta samples (Tensor.item() on a meta tensor)."""
    fresh_rlk.setenv("RLK_CHECK_INPUTS", "1")
    assert main(["doctor"]) == 0


def test_explain_gives_a_reason_for_backends_that_lost_on_rank(fresh_rlk, capsys):
    fresh_rlk.setenv("RLK_TESTBACKEND", "1")
    dispatch.reset()
    assert main(["explain", "logp", "--shape", "4,128", "--device", "cpu", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["backend"] == "testbackend"
    assert result["rejected"]["native"] == ("could serve this call, but 'testbackend' has a "
                                            "higher priority (100 > 0)")
    assert main(["doctor", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["matrix"]["cpu"]["logp"]
    assert row["rejected"]["native"].startswith("could serve this call")


def test_explain_dtypes_are_the_ops_dtypes(capsys):
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    assert "{bfloat16,float16,float32,float64}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "logp", "--shape", "4,8", "--dtype", "int64"])
    assert exit_.value.code == 2


def test_explain_says_why_a_public_function_is_not_an_op(fresh_rlk, capsys):
    assert main(["explain", "check_inputs", "--shape", "4,8"]) == 2
    assert "rlk.check_inputs is not a dispatched op" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not a dispatched op"):
        rlk.explain("check_inputs", torch.zeros(2), torch.zeros(2))
    assert rlk.explain("token_kl", torch.zeros(2), torch.zeros(2)).backend == "native"
