"""Finish and check the wheelhouse that `nox -s wheels` writes to dist/.

    python tools/wheelhouse.py dist --repair RAW_DIR --limit-mb 50 --python 3.10=python3.10 ...

--repair: auditwheel repairs each native wheel of RAW_DIR into dist/ (it gives the wheel the
manylinux tag its contents allow, and would copy in any library outside that policy). Then the
checks, one line per problem and a non-zero exit if any:
- every package has one sdist; rlk-core, rlk-flashinfer, rlk-quack and rlk-vllm one pure wheel;
  rlk-cuda and rlk-rocm one wheel per given Python below 3.12 plus one cp312-abi3 (when a given
  Python is 3.12 or later); all of one version; none larger than the limit;
- auditwheel leaves each native wheel as it is: its tag is the one its contents allow and it
  needs no library from outside but those its package names in EXTERNAL;
- each native wheel's extension loads under every given Python its tag admits.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PURE = ("rlk_core", "rlk_flashinfer", "rlk_quack", "rlk_vllm")
NATIVE = ("rlk_cuda", "rlk_rocm")
# Libraries a native wheel takes from its environment although no manylinux policy lists them:
# rlk-rocm's HIP runtime is the one its ROCm torch has loaded; a copy in the wheel would clash.
EXTERNAL = {"rlk_cuda": (), "rlk_rocm": ("libamdhip64.so.*",)}
STABLE_ABI_FROM = (3, 12)
WHEEL = re.compile(r"(?P<name>\w+)-(?P<version>[^-]+)-(?P<python>[^-]+)-(?P<abi>[^-]+)-"
                   r"(?P<platform>[^-]+)\.whl")


def interpreter(spec: str) -> tuple[tuple[int, int], str]:
    """`3.12=/usr/bin/python3.12` -> ((3, 12), '/usr/bin/python3.12')."""
    version, _, path = spec.partition("=")
    major, minor = version.split(".")
    return (int(major), int(minor)), path


def native_tags(versions: list[tuple[int, int]]) -> list[str]:
    """`cp310-cp310` for each version below 3.12, then `cp312-abi3` if any is 3.12 or later."""
    tags = sorted({f"cp3{minor}-cp3{minor}" for major, minor in versions
                   if (major, minor) < STABLE_ABI_FROM})
    return tags + (["cp312-abi3"] if any(v >= STABLE_ABI_FROM for v in versions) else [])


def admits(python_abi: str, version: tuple[int, int]) -> bool:
    """Whether a wheel tagged `python_abi` (`cp311-cp311`, `cp312-abi3`) installs on `version`."""
    python, abi = python_abi.split("-")
    built_for = (3, int(python.removeprefix("cp3")))
    return version >= built_for if abi == "abi3" else version == built_for


def repair(wheel: Path, into: Path) -> Path:
    """auditwheel's repair of `wheel` into the directory `into`; returns the wheel it wrote."""
    package = wheel.name.split("-")[0]
    excluded = [arg for lib in EXTERNAL[package] for arg in ("--exclude", lib)]
    done = subprocess.run([sys.executable, "-m", "auditwheel", "repair", *excluded,
                           "--wheel-dir", str(into), str(wheel)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"auditwheel repair {wheel.name}: {done.stderr.strip()}")
    written = re.findall(r"Fixed-up wheel written to (\S+\.whl)", done.stdout + done.stderr)
    return Path(written[-1])


def auditwheel_disagrees(wheel: Path) -> str | None:
    """None when auditwheel's repair leaves `wheel` as it is, else what it changes."""
    with tempfile.TemporaryDirectory() as tmp:
        repaired = repair(wheel, Path(tmp))
        if repaired.name != wheel.name:
            return f"auditwheel makes it {repaired.name}"
        with zipfile.ZipFile(repaired) as archive:
            grafted = [name for name in archive.namelist() if ".libs/" in name]
    return f"auditwheel copies in {grafted}" if grafted else None


def load_error(wheel: Path, package: str, python: str) -> str | None:
    """None when `package._C` from `wheel` imports under `python`, else its last error line."""
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tmp)
        [library] = Path(tmp, package).glob("_C.*so")
        code = ("import importlib.util as u, sys; "
                f"s = u.spec_from_file_location('{package}._C', sys.argv[1]); "
                "s.loader.exec_module(u.module_from_spec(s))")
        done = subprocess.run([python, "-c", code, str(library)], capture_output=True, text=True,
                              check=False)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def check_inventory(dist: Path, limit_mb: float, versions: list[tuple[int, int]]) -> list[str]:
    """The sdists and wheels present, their version and size (no tool runs)."""
    problems = []
    wheels = [(path, WHEEL.fullmatch(path.name)) for path in sorted(dist.glob("*.whl"))]
    problems += [f"{path.name}: not a wheel name" for path, match in wheels if match is None]
    named = [(path, match) for path, match in wheels if match is not None]
    found = {match["version"] for _, match in named}
    found |= {path.name.removesuffix(".tar.gz").rsplit("-", 1)[1] for path in dist.glob("*.tar.gz")}
    if len(found) > 1:
        problems.append(f"versions differ: {sorted(found)}")
    for package in (*PURE, *NATIVE):
        sdists = list(dist.glob(f"{package}-*.tar.gz"))
        if len(sdists) != 1:
            problems.append(f"{package}: {len(sdists)} sdists")
        tags = sorted(f"{m['python']}-{m['abi']}-{m['platform'].split('_')[0]}"
                      for _, m in named if m["name"] == package)
        want = (["py3-none-any"] if package in PURE
                else sorted(f"{tag}-manylinux" for tag in native_tags(versions)))
        if tags != want:
            problems.append(f"{package}: wheels {tags}, expected {want}")
    for path, _ in named:
        size_mb = path.stat().st_size / 2**20
        if size_mb > limit_mb:
            problems.append(f"{path.name}: {size_mb:.1f} MB, over the {limit_mb:g} MB limit")
    return problems


def check(dist: Path, limit_mb: float, pythons: dict[tuple[int, int], str]) -> list[str]:
    problems = check_inventory(dist, limit_mb, list(pythons))
    for path in sorted(dist.glob("*.whl")):
        match = WHEEL.fullmatch(path.name)
        if match is None or match["name"] not in NATIVE:
            continue
        if disagreement := auditwheel_disagrees(path):
            problems.append(f"{path.name}: {disagreement}")
        tag = f"{match['python']}-{match['abi']}"
        for version, python in pythons.items():
            if admits(tag, version) and (error := load_error(path, match["name"], python)):
                problems.append(f"{path.name}: the extension fails under {python}: {error}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dist", type=Path)
    parser.add_argument("--repair", type=Path, metavar="RAW_DIR",
                        help="repair the native wheels of RAW_DIR into dist first")
    parser.add_argument("--limit-mb", type=float, required=True)
    parser.add_argument("--python", action="append", default=[], dest="pythons", type=interpreter,
                        metavar="X.Y=PATH", help="an interpreter the native wheels serve (repeat)")
    args = parser.parse_args()
    for wheel in sorted(args.repair.glob("*.whl")) if args.repair else []:
        print(f"repaired: {repair(wheel, args.dist).name}")
    problems = check(args.dist, args.limit_mb, dict(args.pythons))
    for path in sorted(args.dist.iterdir()):
        print(f"{path.stat().st_size / 2**20:8.2f} MB  {path.name}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
