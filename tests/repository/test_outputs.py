"""The replacing primitives stay private to the gate of every output (utils/outputs.py): no other module of the
package, script or benchmark calls or imports them, nor asks `atomic_path` for a directory."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "lm_human_preference_details" / "utils" / "outputs.py"


def private_names() -> set[str]:
    """The gate's private functions: `_replace_dir` and every other name it keeps to itself."""
    tree = ast.parse(GATE.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("_")}


def reaches(path: Path, private: set[str]) -> list[str]:
    """Where the module ``path`` names one of the gate's private functions, or asks atomic_path for a directory."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("utils.outputs"):
            found += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names if a.name in private]
        elif isinstance(node, ast.Attribute) and node.attr in private:
            found.append(f"{path.name}:{node.lineno} calls {node.attr}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "atomic_path" \
                and any(k.arg == "is_dir" for k in node.keywords):
            found.append(f"{path.name}:{node.lineno} asks atomic_path for a directory")
    return found


def test_only_the_gate_replaces_a_directory():
    private = private_names()
    assert "_replace_dir" in private
    modules = [p for folder in ("lm_human_preference_details", "benchmarks") for p in (ROOT / folder).rglob("*.py")]
    modules += sorted(ROOT.glob("*.py"))
    assert len(modules) > 50
    found = [hit for path in modules if path != GATE for hit in reaches(path, private)]
    assert not found, found


def test_a_planted_call_is_found(tmp_path):
    planted = tmp_path / "export.py"
    planted.write_text("from lm_human_preference_details.utils.outputs import _replace_dir\n"
                       "from lm_human_preference_details.utils import outputs\n"
                       "outputs._replace_dir(a, b)\natomic_path(out, is_dir=True)\n")
    assert len(reaches(planted, private_names())) == 3
