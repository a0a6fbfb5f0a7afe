"""docs/FIDELITY.md names only code and tests that exist: every function, class, method and test its rule map cites."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(r"`?((?:lm_human_preference_details/|tests/|benchmarks/)?[\w/]+\.py)`?:\s*")
TEST = re.compile(r"(tests/\w+\.py)?::(test_\w+\*?)")


@lru_cache
def names_in(path: str) -> set[str]:
    """Every function, class, method (as Class.method and alone) and module-level name defined in ``path``."""
    tree = ast.parse((ROOT / path).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names.update(f"{node.name}.{item.name}" for item in node.body
                             if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def rule_rows() -> list[tuple[str, str, str]]:
    """(rule, implemented in, tested by) for each row of the rule map."""
    rows = []
    for line in (ROOT / "docs" / "FIDELITY.md").read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and re.fullmatch(r"[A-G]\d+|R\d+", cells[0]):
            rows.append((cells[0], cells[2], cells[3]))
    return rows


def cited_code(cell: str) -> list[tuple[str, str]]:
    """(file, name) for each `file.py: name, name` of a cell; parentheses are remarks and are skipped."""
    cell = re.sub(r"\([^()]*\)", "", re.sub(r"\([^()]*\)", "", cell))  # two levels of remarks
    cited = []
    for part in cell.split(";"):
        pieces = PATH.split(part)
        for i in range(1, len(pieces) - 1, 2):
            path, names = pieces[i], pieces[i + 1]
            if not path.startswith(("lm_human_preference_details/", "tests/", "benchmarks/")) and "/" not in path \
                    and not (ROOT / path).exists():
                path = f"lm_human_preference_details/{path}"
            cited += [(path, n) for n in re.findall(r"`([A-Za-z_][\w.]*)`", names)]
    return cited


def test_the_rule_map_has_its_rows():
    assert {rule for rule, _, _ in rule_rows()} >= {f"{s}{i}" for s, n in zip("ABCDE", (5, 5, 3, 8, 10))
                                                    for i in range(1, n + 1)}


def test_every_cited_function_class_and_method_exists():
    missing = [f"{rule}: {path}: {name}" for rule, code, _ in rule_rows() for path, name in cited_code(code)
               if not (ROOT / path).exists() or name not in names_in(path)]
    assert not missing, "docs/FIDELITY.md cites code that does not exist:\n" + "\n".join(missing)


def test_every_cited_test_exists():
    missing = []
    for rule, _, tests in rule_rows():
        current = None
        for path, name in TEST.findall(tests):
            current = path or current
            defined = names_in(current) if current and (ROOT / current).exists() else set()
            found = any(n.startswith(name[:-1]) for n in defined) if name.endswith("*") else name in defined
            if not found:
                missing.append(f"{rule}: {current}::{name}")
    assert not missing, "docs/FIDELITY.md cites tests that do not exist:\n" + "\n".join(missing)
