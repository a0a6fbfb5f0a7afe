"""Write constraints.txt: the exact versions of the project's dependencies, for the CPU build CI tests and the CUDA build.

    python .ci/lock.py > constraints.txt      # after `pip install -c constraints.txt -e ".[test]"` and any upgrades
    python .ci/lock.py --pip /tmp/venv/bin/pip > constraints.txt   # resolve with another pip (>= 26, see below)

The lock is the closure of the project's requirements (with its `test` extra) over the installed
distributions, markers evaluated here (Linux, this Python); the project itself is left out (pip
refuses a constraint on an editable install). torch is written without its local build label
(2.13.0+cpu -> 2.13.0), so the CPU wheel and a CUDA build of the same release both satisfy it.

PyPI's Linux x86_64 wheel of torch is its CUDA build, which pulls in the CUDA runtime as wheels
(nvidia-*, cuda-bindings, cuda-pathfinder, triton...) that the CPU build installed here lacks. They are
resolved from PyPI for manylinux x86_64 and this Python (`pip install --dry-run --report`, consistent
with the pins above) and written with a Linux x86_64 marker; pip's fast-deps reads each wheel's metadata
with HTTP range requests, so this takes a few MB, not the GBs of the wheels (pip >= 26; pip 25.2 and
older still download every wheel of a dry run's result). Needs the network.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT, EXTRAS = "lm-human-preference-details", ("test",)
INDEX = "https://pypi.org/simple"
CUDA_MARKER = 'platform_system == "Linux" and platform_machine == "x86_64"'
# manylinux_2_28 (torch's own tag) and every older glibc tag: pip takes --platform literally, and the CUDA wheels are
# tagged from manylinux1 to manylinux_2_28
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(28, 4, -1)] + ["manylinux2014_x86_64", "manylinux2010_x86_64",
                                                                      "manylinux1_x86_64"]


def closure(project: str, extras: tuple[str, ...]) -> dict[str, str]:
    """Canonical name -> installed version of every distribution ``project`` (with ``extras``) pulls in here."""
    todo = [(r, e) for r in metadata.distribution(project).requires or [] for e in ("", *extras)]
    versions: dict[str, str] = {}
    while todo:
        line, extra = todo.pop()
        req = Requirement(line)
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in versions:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            sys.exit(f"error: {req.name} is required but not installed; install the project first")
        versions[name] = dist.version
        todo += [(r, e) for r in dist.requires or [] for e in ("", *sorted(req.extras))]
    return versions


def check_pip(pip: list[str]) -> None:
    """Exit with one line unless ``pip`` is >= 26: an older pip downloads the CUDA wheels (GBs) in a dry run."""
    result = subprocess.run([*pip, "--version"], capture_output=True, text=True)
    version = result.stdout.split()[1] if result.returncode == 0 and result.stdout.startswith("pip ") else "?"
    if not version.split(".")[0].isdigit() or int(version.split(".")[0]) < 26:
        sys.exit(f"error: {' '.join(pip)} is pip {version}, which downloads every CUDA wheel (GBs) in a dry run; "
                 "pass --pip with a pip >= 26 (python -m venv /tmp/venv && /tmp/venv/bin/pip install -U 'pip>=26')")


def linux_cuda_pins(pins: dict[str, str], pip: list[str]) -> dict[str, str]:
    """Canonical name -> version of what PyPI's Linux x86_64 torch==pins['torch'] adds to ``pins`` (its CUDA runtime)."""
    # our own index settings only: a find-links or extra index (a local CPU wheel) would answer for torch
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL",
                                                            "PIP_NO_INDEX")}
    env["PIP_CONFIG_FILE"] = os.devnull
    with tempfile.TemporaryDirectory() as tmp:
        constraints, report = Path(tmp, "constraints.txt"), Path(tmp, "report.json")
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        cmd = [*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--no-cache-dir",
               "--use-feature=fast-deps", "--only-binary=:all:", "--python-version", python, "--target", str(Path(tmp, "t")),
               *(f"--platform={p}" for p in PLATFORMS), "--index-url", INDEX, "-c", str(constraints),
               "--report", str(report), f"torch=={pins['torch']}"]
        result = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["(no message)"])[-1]
            sys.exit(f"error: resolving the CUDA build's dependencies from {INDEX} failed ({last}); "
                     "run this with network access to the index")
        installs = json.loads(report.read_text())["install"]
    found = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}
    return {name: version for name, version in found.items() if name not in pins}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pip", help="the pip that resolves the CUDA build's dependencies (default: this Python's)")
    args = parser.parse_args()
    pip = [args.pip] if args.pip else [sys.executable, "-m", "pip"]
    check_pip(pip)
    versions = closure(PROJECT, EXTRAS)
    versions["torch"] = versions["torch"].split("+")[0]  # any build (cpu, cu130...) of the pinned release
    cuda = linux_cuda_pins(versions, pip)
    print("# The versions CI tests with: written by `python .ci/lock.py > constraints.txt`; use with pip's -c.")
    print("".join(f"{name}=={version}\n" for name, version in sorted(versions.items())), end="")
    print(f"# What PyPI's Linux x86_64 torch=={versions['torch']} (its CUDA build, as in the Dockerfile) adds:")
    print("".join(f"{name}=={version}; {CUDA_MARKER}\n" for name, version in sorted(cuda.items())), end="")


if __name__ == "__main__":
    main()
