"""Frozen plugins, one per plugin API version, as their authors wrote them from that version's
docs: each must keep meeting the compatibility policy (docs/backends/compatibility.md) on
today's rlk-core. 2.0's and 2.1's pass the conformance kit (a minor version only adds); 1.0's
is refused at load, with a record that says what changed and how to port, instead of loading
"ready" and failing every call."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from local_dist import install, passed, run_kit

from rlk_testbackend import FAILING_PLUGINS

FROZEN = Path(__file__).resolve().parent / "plugins/frozen"
# sha256 of every file: these plugins stand for code in the field, which nobody edits
DIGESTS = {
    "api-1.0": "0ba46c2379bce167324db0757f0a5703e0aa7a0654a436a1c4f2a214e66225b3",
    "api-2.0": "375ce6b7e80f5565d96fd2780ef29dad84b007f20fedcd71a29da9fe68a3f991",
    "api-2.1": "e86722f64084991ad754cc9d3799a6d246339e6426a70235bddc902643599061",
}


def digest(version: str) -> str:
    files = sorted(p for p in (FROZEN / version).rglob("*") if p.is_file()
                   and "__pycache__" not in p.parts)
    total = hashlib.sha256()
    for path in files:
        total.update(path.relative_to(FROZEN / version).as_posix().encode())
        total.update(path.read_bytes())
    return total.hexdigest()


def lay_out(version: str, root: Path) -> None:
    source = FROZEN / version
    files = {p.relative_to(source).as_posix(): p.read_text() for p in source.rglob("*.py")}
    install(root, (source / "pyproject.toml").read_text(), files)


@pytest.mark.parametrize("version", sorted(DIGESTS))
def test_frozen_plugins_are_unchanged(version):
    assert digest(version) == DIGESTS[version], (
        f"tests/plugins/frozen/{version} changed: it stands for a plugin in the field, written "
        "once; add a new frozen plugin for a new API version instead")


@pytest.mark.parametrize(("version", "backend", "least"),
                         [("api-2.0", "frozen20", 300), ("api-2.1", "frozen21", 200)])
def test_the_api_2_plugins_pass_the_kit(tmp_path, version, backend, least):
    """Least: the kit's cases for the plugin's ops (logp and logp_entropy; entropy)."""
    lay_out(version, tmp_path)
    done = run_kit(tmp_path, backend)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert passed(done.stdout) > least, done.stdout[-2000:]


def _doctor(root: Path) -> dict:
    env = {**os.environ, "RLK_DISABLE_PLUGINS": FAILING_PLUGINS,
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", "import sys; from rlk.cli import main; "
                           "sys.exit(main())", "doctor", "--json"], env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout)


def test_the_api_1_0_plugin_is_refused_with_a_porting_record(tmp_path):
    lay_out("api-1.0", tmp_path)
    record = next(p for p in _doctor(tmp_path)["plugins"] if p["name"] == "frozen10")
    assert (record["status"], record["api"]) == ("failed", "1.0")
    assert "written for plugin API 1.0, which rlk-core 2.1 no longer serves" in record["error"]
    assert "lse in float64" in record["error"] and "compatibility.md" in record["error"]
    done = run_kit(tmp_path, "frozen10")
    assert done.returncode != 0
    assert "no longer serves" in done.stdout + done.stderr, done.stdout[-3000:]
