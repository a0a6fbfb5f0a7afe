"""docs/FIDELITY.md names only code and tests that exist: every function, class, method and test its rule map cites, in
each form it writes them, and every `file.py: name` of ours in its readings."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import lru_cache
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPAN = re.compile(r"`([^`]*)`|([()])")  # a code span, or a parenthesis outside code spans
CITED_FILE = re.compile(r"([\w/]+\.py)(?::\s*(.+))?")  # `file.py` or `file.py: name`
PROSE_CITATION = re.compile(r"(OAI\s+)?`([\w/]+\.py): ([A-Za-z_][\w.]*)`")
NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?")  # function, class, Class.method, module-level name
TEST = re.compile(r"(tests/[\w/]+\.py)?::(test_\w+\*?)")


def assigned(body: list[ast.stmt]) -> set[str]:
    """Names that the statements of ``body`` (not those nested in them) assign."""
    targets = [t for n in body if isinstance(n, (ast.Assign, ast.AnnAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def self_attributes(cls: ast.ClassDef) -> set[str]:
    """Attributes that the methods of ``cls`` set on ``self``."""
    targets = [t for n in ast.walk(cls) if isinstance(n, (ast.Assign, ast.AnnAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
    return {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


@lru_cache
def names_in(path: str) -> set[str]:
    """Every function, class and module-level name defined in ``path``, and each class's methods, class-level names and
    attributes set on ``self`` (as Class.name and alone); a function's local variables are not among them."""
    tree = ast.parse((ROOT / path).read_text())
    names = assigned(tree.body)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            members = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
            members |= assigned(node.body) | self_attributes(node)
            names |= members | {f"{node.name}.{m}" for m in members}
    return names


def rule_rows() -> list[tuple[str, str, str]]:
    """(rule, implemented in, tested by) for each row of the rule map."""
    rows = []
    for line in (ROOT / "docs" / "FIDELITY.md").read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and re.fullmatch(r"[A-G]\d+|R\d+", cells[0]):
            rows.append((cells[0], cells[2], cells[3]))
    return rows


def package_path(path: str) -> str:
    """A cited file as a path from the repository root: a module named from inside the package (`ppo.py`,
    `queries/samplers.py`) is the package's."""
    if path.startswith(("lm_human_preference_details/", "tests/", "benchmarks/")) or (ROOT / path).exists():
        return path
    return f"lm_human_preference_details/{path}"


def cited_code(cell: str) -> list[tuple[Optional[str], str]]:
    """(file, name) for every name a cell cites, in each form the doc uses: `file.py: name` in one code span,
    `file.py` (or `file.py: name`) followed by further `name` spans, and names in parentheses, which belong to the file
    named last inside the parentheses or else to the one named last before them. None: no file named before it."""
    files: list[Optional[str]] = [None]  # the file named last, at each depth of parentheses
    cited = []
    for span, paren in SPAN.findall(cell):
        if paren == "(":
            files.append(files[-1])
        elif paren == ")":
            files = files[:-1] or [None]
        elif match := CITED_FILE.fullmatch(span):
            files[-1] = package_path(match.group(1))
            cited += [(files[-1], match.group(2))] if match.group(2) else []
        else:
            cited.append((files[-1], span))
    return cited


def missing_code(rows: list[tuple[str, str, str]]) -> list[str]:
    """'rule: file: name' for each cited name that its file does not define (and each span that is no citation)."""
    missing = []
    for rule, code, _ in rows:
        for path, name in cited_code(code):
            if path is None or not NAME.fullmatch(name) or not (ROOT / path).is_file() or name not in names_in(path):
                missing.append(f"{rule}: {path}: {name}")
    return missing


def test_the_rule_map_has_its_rows():
    assert {rule for rule, _, _ in rule_rows()} >= {f"{s}{i}" for s, n in zip("ABCDE", (5, 5, 3, 8, 10))
                                                    for i in range(1, n + 1)}


def test_every_cited_function_class_and_method_exists():
    missing = missing_code(rule_rows())
    assert not missing, "docs/FIDELITY.md cites code that does not exist:\n" + "\n".join(missing)


def readings_citations(text: str) -> list[tuple[str, str]]:
    """(file, name) of each `file.py: name` span in the prose after the rule map (the readings, the additions), but
    those the doc marks as the original's (`OAI` just before the span)."""
    prose = text.split("## Readings of ambiguous points", 1)[1]
    return [(package_path(m.group(2)), m.group(3)) for m in PROSE_CITATION.finditer(prose) if not m.group(1)]


def test_every_code_cited_in_the_readings_exists():
    cited = readings_citations((ROOT / "docs" / "FIDELITY.md").read_text())
    assert len(cited) > 15  # the prose's citations are really read
    missing = [f"{path}: {name}" for path, name in cited if not (ROOT / path).is_file() or name not in names_in(path)]
    assert not missing, "docs/FIDELITY.md's readings cite code that does not exist:\n" + "\n".join(missing)
    planted = "## Readings of ambiguous points\nOAI `rewards.py: get_rewards_op` and ours, `ppo.py: kl_reward`."
    assert readings_citations(planted) == [("lm_human_preference_details/ppo.py", "kl_reward")]


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


GOOD_CELL = ("`lm_human_preference_details/ppo.py: kl_rewards`, `whiten_in_groups`; `train_policy.py: train` "
             "(used by `rollout`; GPT-2: `language/gpt2.py: KVCache`, `packed_hidden`), `minibatch_indices`; "
             "`language/model.py`: `Policy`, "
             "`LMWithHead.lm_logits` (`n_vocab`), `last_real_indices`")


@pytest.mark.parametrize("good, planted", [
    ("ppo.py: kl_rewards", "ppo.py: kl_reward"),  # path and name in one span
    ("`whiten_in_groups`", "`whitened_in_groups`"),  # a further span after `file.py: name`
    ("`rollout`", "`rollouts`"),  # in parentheses, of the file named before them
    ("`packed_hidden`", "`packed_hiddens`"),  # in parentheses, of the file named inside them
    ("`minibatch_indices`", "`packed_hidden`"),  # after the parentheses: the file before them again (train_policy.py)
    ("`Policy`", "`Policies`"),  # `file.py`: then names in their own spans
    ("`n_vocab`", "`vocab_size`"),  # an attribute, in parentheses
    ("`LMWithHead.lm_logits`", "`Policy.lm_logits`"),  # a method of the wrong class
])
def test_a_wrong_name_is_caught_in_every_form(good, planted):
    """The check reads each form the doc writes citations in: a planted wrong name in any of them fails it."""
    assert missing_code([("X1", GOOD_CELL, "")]) == []
    assert len(cited_code(GOOD_CELL)) == 11
    wrong = GOOD_CELL.replace(good, planted)
    assert wrong != GOOD_CELL and len(missing_code([("X1", wrong, "")])) == 1, missing_code([("X1", wrong, "")])


# ----------------------------------------------------------------------------------------------- tags in the code
TAG = re.compile(r"(?<![\w./-])([A-E](?:10|[1-9]))(?![\w-])")


def rule_names() -> dict[str, str]:
    """Tag -> name, from docs/FIDELITY.md's "Rule names" list (`- **E4** KL controller`)."""
    section = (ROOT / "docs" / "FIDELITY.md").read_text().split("## Rule names", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^- \*\*([A-E]\d+)\*\* (.+)$", section, flags=re.M))


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment (comments on consecutive lines as one text) and docstring of a Python source."""
    found: list[tuple[int, str]] = []
    last = -1
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            if found and tok.start[0] == last + 1:
                found[-1] = (found[-1][0], found[-1][1] + "\n" + tok.string)
            else:
                found.append((tok.start[0], tok.string))
            last = tok.start[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return found


def unnamed_tags(source: str, names: dict[str, str]) -> list[tuple[int, str]]:
    """(line, tag) of each FIDELITY tag not followed by its rule's name (spaces and line breaks may sit between)."""
    bad = []
    for line, text in comments_and_docstrings(source):
        flat = re.sub(r"\s*\n\s*#?\s*", " ", text)  # a name may run on over a comment's or docstring's next line
        for match in TAG.finditer(flat):
            tag = match.group(1)
            if tag in names and not flat[match.end():].startswith(f" {names[tag]}"):
                bad.append((line, tag))
    return bad


def code_files() -> list[Path]:
    return sorted([*(ROOT / "lm_human_preference_details").rglob("*.py"), ROOT / "train_policy.py",
                   ROOT / "train_reward.py", *(ROOT / "benchmarks").glob("*.py")])


def test_every_rule_has_a_name():
    assert set(rule_names()) == {rule for rule, _, _ in rule_rows() if re.fullmatch(r"[A-E]\d+", rule)}


def test_every_fidelity_tag_in_the_code_carries_its_rules_name():
    names = rule_names()
    bad = [f"{path.relative_to(ROOT)}:{line}: {tag} (name: {names[tag]!r})"
           for path in code_files() for line, tag in unnamed_tags(path.read_text(), names)]
    assert not bad, "a FIDELITY tag without its rule's name (docs/FIDELITY.md, Rule names):\n" + "\n".join(bad)


@pytest.mark.parametrize("source, expected", [
    ("# E4 KL controller: adapt\n", []),
    ("# E4 KL controller and E9 per-rank seeds\n", []),
    ('def f():\n    """(FIDELITY E4 KL controller)."""\n', []),
    ("# the value (E4 KL\n# controller): split over two lines\n", []),
    ("# E4\n", [(1, "E4")]),  # a bare tag
    ("x = 1  # see E4 and E9\n", [(1, "E4"), (1, "E9")]),
    ('def f():\n    """Adapt it (FIDELITY E4)."""\n', [(2, "E4")]),
    ("# E4 adaptive KL\n", [(1, "E4")]),  # a name the doc does not spell so
    ("# E501, C3PO and E4-like are no tags\n", []),
])
def test_the_tag_check_reads_comments_and_docstrings(source, expected):
    assert unnamed_tags(source, {"E4": "KL controller", "E9": "per-rank seeds"}) == expected
