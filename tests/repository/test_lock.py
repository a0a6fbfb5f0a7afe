"""constraints.txt, the lock of the versions CI tests with: complete, consistent with pyproject.toml, used by CI and the
Docker image, and covering the CUDA build's own dependencies for Linux x86_64 (.ci/lock.py)."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LINUX_X86 = {**default_environment(), "platform_system": "Linux", "platform_machine": "x86_64"}


def lock_lines() -> list[Requirement]:
    lines = [line.strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    reqs = [Requirement(line) for line in lines if line and not line.startswith("#")]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in reqs), "one exact version a line"
    return reqs


def locked(marked: bool = False) -> dict[str, str]:
    """Name -> version of the lock's lines without a marker (every platform), or with one (``marked``)."""
    return {canonicalize_name(r.name): next(iter(r.specifier)).version for r in lock_lines() if bool(r.marker) == marked}


def load_lock_script():
    spec = importlib.util.spec_from_file_location("lock", ROOT / ".ci" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_dependency_is_pinned_inside_its_range():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pins = locked()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    for line in requirements:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} is not locked"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside {req.specifier}"
    assert canonicalize_name(project["name"]) not in pins  # pip refuses a constraint on the editable project


def test_torch_pin_accepts_cpu_and_cuda_builds():
    # a local label (+cpu) would refuse a CUDA build of the same release; a bare version accepts every build
    pin = locked()["torch"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", pin)
    spec = Requirement(f"torch=={pin}").specifier
    assert spec.contains(f"{pin}+cpu") and spec.contains(f"{pin}+cu130") and not spec.contains("2.0.0")


def test_cuda_build_dependencies_are_pinned_for_linux_x86_64_only():
    marked, unmarked = locked(marked=True), locked()
    # what PyPI's Linux torch 2.13.0 requires beyond the CPU build (its wheel's Requires-Dist), and their own needs
    assert {"triton", "cuda-bindings", "cuda-pathfinder", "cuda-toolkit", "nvidia-cudnn-cu13", "nvidia-nccl-cu13",
            "nvidia-nvjitlink", "nvidia-cublas"} <= set(marked)
    assert not set(marked) & set(unmarked), "a package pinned twice"
    for req in lock_lines():
        if req.marker:
            assert req.marker.evaluate(LINUX_X86)
            assert not req.marker.evaluate({**LINUX_X86, "platform_machine": "aarch64"})
            assert not req.marker.evaluate({**LINUX_X86, "platform_system": "Darwin", "platform_machine": "arm64"})


def test_lock_script_adds_only_what_the_cuda_build_brings(tmp_path):
    """linux_cuda_pins against a stand-in pip that writes the report pip's dry run writes: new names only, with pip's
    versions; the installed pins go in as constraints."""
    lock = load_lock_script()
    fake = tmp_path / "pip.py"
    fake.write_text(
        "import json, sys\n"
        "args = sys.argv[1:]\n"
        "constraints = open(args[args.index('-c') + 1]).read()\n"
        "installs = [{'metadata': {'name': n, 'version': v}} for n, v in\n"
        "            [('torch', '9.9.9'), ('MarkupSafe', '1.0'), ('nvidia_nccl-cu13', '2.0'), ('Triton', '3.0')]]\n"
        "json.dump({'install': installs}, open(args[args.index('--report') + 1], 'w'))\n"
        "ok = 'torch==9.9.9' in constraints and args[-1] == 'torch==9.9.9' and '--dry-run' in args\n"
        "sys.exit(0 if ok and '--platform=manylinux_2_28_x86_64' in args else 3)\n")
    pins = {"torch": "9.9.9", "markupsafe": "1.0"}
    assert lock.linux_cuda_pins(pins, [sys.executable, str(fake)]) == {"nvidia-nccl-cu13": "2.0", "triton": "3.0"}
    fake.write_text("import sys; print('ERROR: no network', file=sys.stderr); sys.exit(1)\n")
    with pytest.raises(SystemExit, match=r"^error: resolving the CUDA build's dependencies .* failed \(ERROR: no network\)"):
        lock.linux_cuda_pins(pins, [sys.executable, str(fake)])


@pytest.mark.parametrize("version, ok", [("pip 26.0 from /x (python 3.11)", True), ("pip 25.2 from /x", False),
                                         ("not pip", False)])
def test_lock_script_refuses_a_pip_that_downloads_the_wheels(tmp_path, version, ok):
    lock = load_lock_script()
    fake = tmp_path / "pip.py"
    fake.write_text(f"print({json.dumps(version)})\n")
    if ok:
        lock.check_pip([sys.executable, str(fake)])
    else:
        with pytest.raises(SystemExit, match="error: .* downloads every CUDA wheel .* pass --pip with a pip >= 26"):
            lock.check_pip([sys.executable, str(fake)])


def test_ci_and_docker_install_from_the_lock():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -c constraints.txt -e ".[test]" && ruff check . && python -m pytest -q' in ci
    docker = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("RUN pip install")]
    assert docker and all("-c constraints.txt" in line for line in docker)


def test_the_docker_build_argument_installs_another_cuda_build_of_the_locked_torch():
    """--build-arg TORCH_CUDA=cu126: the torch install line, as the image's sh expands it (echoed: no network), takes
    the locked release from PyTorch's cu126 index; without it, from PyPI (its CUDA 13.0 build). The entry point's first
    line says which build the image has. Neither build was run on a GPU here (docs/docker.md)."""
    import subprocess

    lines = (ROOT / "Dockerfile").read_text().splitlines()
    assert "ARG TORCH_CUDA=" in lines and "ENV LMHP_TORCH_CUDA=${TORCH_CUDA}" in lines
    (run,) = [line for line in lines if line.startswith("RUN pip install") and " torch==" in line]
    entry = json.loads(next(line for line in lines if line.startswith("ENTRYPOINT ")).removeprefix("ENTRYPOINT "))
    for value, index, says in (
        ("", None, "torch 2.13.0, CUDA 13.0 build: needs an NVIDIA driver >= 580"),
        ("cu126", "https://download.pytorch.org/whl/cu126", "torch 2.13.0, cu126 build from PyTorch's index (not run"),
    ):
        env = {"PATH": "/usr/bin:/bin", "TORCH_CUDA": value, "LMHP_TORCH_CUDA": value}
        words = subprocess.run(["sh", "-c", f"echo {run.removeprefix('RUN ')}"], env=env, capture_output=True, text=True,
                               check=True).stdout.split()
        assert words[:2] == ["pip", "install"] and words[words.index("-c") + 1] == "constraints.txt"
        assert words[-1] == f"torch=={locked()['torch']}"
        assert (words[words.index("--index-url") + 1] if "--index-url" in words else None) == index
        started = subprocess.run(["sh", "-c", entry[entry.index("-c") + 1], "lmhp", "echo", "ran"], env=env,
                                 capture_output=True, text=True)
        assert started.stdout == "ran\n" and says in started.stderr, started.stderr
