"""`rlk-core doctor --smoke` runs every registered kernel itself: a wrong kernel is named, not
found later as a failure of a native op that ran it."""

from __future__ import annotations

import json

from rlk.cli import main


def test_smoke_names_a_plugin_whose_logp_ignores_the_temperature(use_plugins, capsys):
    use_plugins(cold="fake_plugins:cold")
    assert main(["doctor", "--smoke", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    rows = [r for r in report["smoke"] if r["backend"] == "cold"]
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16", "float16", "float64"}
    failed = {r["case"] for r in rows if r["status"] == "failure"}
    passed = {r["case"] for r in rows if r["status"] == "pass"}
    assert "temperature" in failed and "small" in passed, rows
    messages = [f["message"] for f in report["findings"] if f["id"] == "smoke-failed"]
    assert any(m.startswith("smoke test of backend 'cold' kernel 'logp' on cpu") for m in messages)
    nested = [m for m in messages if "backend 'native'" in m]
    assert nested and all("whose own 'logp' kernel fails its smoke test" in m for m in nested)


def test_smoke_covers_every_kernel_in_each_dtype_it_declares(use_plugins, capsys):
    from rlk._runtime.spec import specs

    use_plugins()

    assert main(["doctor", "--smoke", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    native = {(r["op"], r["dtype"]) for r in report["smoke"] if r["backend"] == "native"}
    for name, spec in specs().items():
        for dtype in spec.dtypes:
            assert (name, str(dtype).replace("torch.", "")) in native, (name, dtype)
