"""The backend written in docs/backends/writing-a-backend.md, pasted verbatim, passes the kit;
and the kit fails, saying why, on a backend that serves nothing it should."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from local_dist import install, passed, run_kit

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs/backends/writing-a-backend.md"
_TITLED_BLOCK = re.compile(r'^```\w+ title="([^"]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)


def guide_files() -> dict[str, str]:
    """Every code block of the guide that carries a file name, by that name."""
    return {name: text for name, text in _TITLED_BLOCK.findall(GUIDE.read_text())}


def build(root: Path, **edits: tuple[str, str]) -> None:
    """The guide's backend under `root`; `edits` maps a file to one (old, new) replacement."""
    files = guide_files()
    for name, (old, new) in edits.items():
        assert old in files[name], f"{name} no longer holds {old!r}"
        files[name] = files[name].replace(old, new, 1)
    install(root, files.pop("pyproject.toml"), files)


def test_the_guide_holds_a_whole_backend():
    assert set(guide_files()) == {"pyproject.toml", "rlk_mybackend/__init__.py",
                                  "rlk_mybackend/plugin.py", "rlk_mybackend/kernels.py"}


def test_the_backend_in_the_guide_passes_the_kit(tmp_path):
    build(tmp_path)
    done = run_kit(tmp_path, "mybackend")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert passed(done.stdout) > 200, done.stdout[-2000:]


def test_the_kit_fails_on_a_backend_whose_probe_refuses_everything(tmp_path):
    done = run_kit(tmp_path, "faraway", "-k", "small or serves")
    assert done.returncode != 0, done.stdout[-3000:]
    assert "needs a Faraway accelerator (none found)" in done.stdout


def test_the_kit_fails_on_a_raising_probe(tmp_path):
    build(tmp_path, **{"rlk_mybackend/plugin.py": (
        '    if device.type != "cpu":',
        '    raise OSError("no device table")\n    if device.type != "cpu":')})
    done = run_kit(tmp_path, "mybackend", "-k", "small or serves")
    assert done.returncode != 0, done.stdout[-3000:]
    assert "probe fails cpu: probe raised OSError: no device table" in done.stdout


def test_the_kit_catches_a_kernel_writing_its_inputs(tmp_path):
    build(tmp_path, **{"rlk_mybackend/kernels.py": (  # right results, then the input scribbled
        "    if out is not None:\n", "    logits.zero_()\n    if out is not None:\n")})
    done = run_kit(tmp_path, "mybackend", "-k", "small and forward")
    assert done.returncode != 0, done.stdout[-3000:]
    assert "forward kernel rlk_mybackend.kernels:forward wrote its input 'logits'" in done.stdout


def test_the_kit_names_why_a_backend_is_missing(tmp_path):
    done = run_kit(tmp_path, "broken", disabled="oldapi,badhook,lazyfail")
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "librlk_broken.so: cannot open shared object file" in output, output[-3000:]


@pytest.mark.parametrize("name", sorted(guide_files()))
def test_the_guides_python_is_valid(name):
    if name.endswith(".py"):
        compile(guide_files()[name], name, "exec")


def test_the_kit_ends_with_each_distinct_cause_once(tmp_path):
    build(tmp_path, **{"rlk_mybackend/kernels.py": (  # the API 1.0 lse: float32
        "    return logp, entropy, lse  #", "    return logp, entropy, lse.float()  #")})
    done = run_kit(tmp_path, "mybackend", "-k", "forward and (small or wide)")
    assert done.returncode != 0
    summary = done.stdout[done.stdout.index("rlk conformance kit:"):]
    header = re.search(r"rlk conformance kit: (\d+) failed, (\d+) distinct cause", summary)
    assert header is not None and int(header[1]) > 10 and header[2] == "2", summary[:3000]
    counts = re.findall(r"^ +(\d+) x rlk.errors.KernelError: backend 'mybackend' broke the "
                        r"'(logp|logp_entropy)' contract: .* output # is float32 \[#\]", summary,
                        re.MULTILINE)
    assert sum(int(n) for n, _ in counts) == int(header[1]), summary[:3000]
    assert "e.g. test_forward_matches_reference[logp-" in summary


def test_the_kit_catches_a_kernel_returning_an_alias_of_its_input(tmp_path):
    build(tmp_path, **{"rlk_mybackend/kernels.py": (  # float32 logits[:, 0]: right shape, dtype
        "    return logp, entropy, lse  #",
        "    logp = logits[:, 0] if logits.dtype == torch.float32 and rows is None else logp\n"
        "    return logp, entropy, lse  #")})
    done = run_kit(tmp_path, "mybackend", "-k", "float32-small and forward")
    assert done.returncode != 0, done.stdout[-3000:]
    assert "returned output 0 sharing memory with its input 'logits'" in done.stdout
