"""Mistakes a backend author makes that rlk names instead of passing them silently: an entry
point in a near-miss group, an entry point named unlike its backend (RLK_DISABLE_PLUGINS takes
either name), and the doctor's no-GPU note naming the backends that really serve."""

from __future__ import annotations

import json

import pytest
from local_dist import install

import rlk
from rlk import dispatch
from rlk.cli import main
from rlk.testing.cases import backend_kernels

PLUGIN = '''
from rlk.backend import hookimpl

RLK_PLUGIN_API = "2.0"


@hookimpl
def rlk_register(registry):
    registry.add_backend("mine", priority=1, version="0.1")
    registry.add_kernel("logp", "mine", "rlk.ops.logp.native:forward",
                        backward="rlk.ops.logp.native:backward", devices=("cpu",))
'''


def _distribution(root, group: str, entry_point: str, monkeypatch) -> None:
    pyproject = (f'[project]\nname = "rlk-mine"\nversion = "0.1"\n\n'
                 f'[project.entry-points."{group}"]\n{entry_point} = "rlk_mine_plugin"\n')
    install(root, pyproject, {"rlk_mine_plugin.py": PLUGIN})
    monkeypatch.syspath_prepend(str(root))
    dispatch.reset()


def _doctor(capsys) -> tuple[int, dict]:
    code = main(["doctor", "--json"])
    return code, json.loads(capsys.readouterr().out)


def _finding(report: dict, fid: str) -> dict:
    found = [f for f in report["findings"] if f["id"] == fid]
    assert found, [f["id"] for f in report["findings"]]
    return found[0]


def test_an_entry_point_in_a_near_miss_group_is_an_error(fresh_rlk, tmp_path, capsys):
    _distribution(tmp_path, "rlk.backend", "mine", fresh_rlk)
    code, report = _doctor(capsys)
    assert code == 1
    finding = _finding(report, "entry-point-group")
    assert finding["severity"] == "error"
    assert "'mine' in group 'rlk.backend'" in finding["message"]
    with pytest.raises(ValueError, match=r"group 'rlk\.backend', which rlk does not read"):
        backend_kernels("mine")


def test_an_entry_point_named_unlike_its_backend_is_a_finding(fresh_rlk, tmp_path, capsys):
    _distribution(tmp_path, "rlk.backends", "mine_plugin", fresh_rlk)
    code, report = _doctor(capsys)
    finding = _finding(report, "plugin-name-mismatch")
    assert "entry point 'mine_plugin'" in finding["message"]
    assert "backend 'mine'" in finding["message"]
    assert code == 0  # a warning


def test_disable_plugins_takes_the_backend_name(fresh_rlk, tmp_path, caplog):
    fresh_rlk.setenv("RLK_DISABLE_PLUGINS", "mine")
    _distribution(tmp_path, "rlk.backends", "mine_plugin", fresh_rlk)
    records = {r.name: r for r in rlk.backends("cpu")}
    assert "mine" not in records
    assert records["mine_plugin"].status == "blocked"
    assert "its backend 'mine'" in records["mine_plugin"].reason
    loader = dispatch.get_dispatcher().loader
    assert not [w for w in loader.unknown_filters() if "'mine'" in w]


def test_the_no_gpu_note_names_the_backends_serving(fresh_rlk, capsys):
    _, report = _doctor(capsys)
    if report["environment"]["cuda_available"]:
        pytest.skip("the note is about machines without a GPU")
    assert _finding(report, "no-gpu")["message"].endswith("through the native backend")
    fresh_rlk.setenv("RLK_TESTBACKEND", "1")
    dispatch.reset()
    _, report = _doctor(capsys)
    message = _finding(report, "no-gpu")["message"]
    assert "testbackend (logp, logp_entropy)" in message, message
    assert "native (" in message
