"""rlk-core's pytest plugin loads into every pytest run where rlk-core is installed: it must
leave a project that has nothing to do with rlk as it is, its own `gpu` tests included, and
act only when asked (`-p rlk.testing`, or `--rlk-backend` for the conformance kit)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

PROJECT = {
    "pytest.ini": "[pytest]\nmarkers =\n    gpu: this project's own GPU tests\n",
    "test_theirs.py": ("import pytest\n\n\n@pytest.mark.gpu\ndef test_their_gpu_test():\n"
                       "    assert sum([1, 2]) == 3\n"),
}


def _pytest(root, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLK_")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", *args], cwd=root,
                          env=env, capture_output=True, text=True, check=False)


@pytest.fixture
def project(tmp_path):
    for name, text in PROJECT.items():
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.skipif(torch.cuda.is_available(), reason="the plugin skips nothing with a GPU")
def test_a_project_with_rlk_installed_keeps_its_gpu_tests(project):
    done = _pytest(project)
    assert "rlk.testing.plugin" in _pytest(project, "--trace-config").stdout  # loaded, inert
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the plugin skips nothing with a GPU")
@pytest.mark.parametrize("opt_in", [["-p", "rlk.testing"], ["--rlk-backend", "native"]])
def test_asking_for_the_plugin_skips_gpu_tests_without_a_device(project, opt_in):
    done = _pytest(project, *opt_in)
    assert "1 skipped" in done.stdout and "no CUDA device" in done.stdout, done.stdout
