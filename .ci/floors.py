"""Print the constraints of the floors job: every requirement of pyproject.toml (its `test` extra too) at its floor,
the lowest version pyproject allows, and every other package at its version in constraints.txt.

    python .ci/floors.py > /tmp/floors.txt && pip install -c /tmp/floors.txt -e ".[test]"

.ci/run installs them in a venv of their own and runs the tests that read what the floors decide (FLOOR_TESTS).
"""

from __future__ import annotations

import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# what the floors of transformers, huggingface-hub and tokenizers decide: loading and saving model directories, the
# GPT-2 forward, the tokenizer, cards, exports and TRL on them
# (test_gpt2's torch.compile test, 35 s, reads torch's compiler, not the floors)
FLOOR_TESTS = ["tests/language/test_gpt2.py", "tests/language/test_interop.py", "tests/language/test_cards.py",
               "tests/language/test_tokenizer.py", "tests/test_export.py",
               "--deselect", "tests/language/test_gpt2.py::test_compiled_blocks_give_the_same_numbers_and_gradients"]


def floors(project: dict) -> dict[str, str]:
    """Canonical name -> the floor (its one `>=` version) of each requirement of ``project`` and its test extra."""
    found = {}
    for line in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        req = Requirement(line)
        (floor,) = [s.version for s in req.specifier if s.operator == ">="]
        found[canonicalize_name(req.name)] = floor
    return found


def main() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lowest = floors(project)
    print("# The floors job's constraints: written by .ci/floors.py (pyproject's floors, the rest from constraints.txt)")
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#") and canonicalize_name(Requirement(line).name) not in lowest:
            print(line)
    print("".join(f"{name}=={version}\n" for name, version in sorted(lowest.items())), end="")


if __name__ == "__main__":
    if sys.argv[1:] == ["--tests"]:
        print(" ".join(FLOOR_TESTS))
    else:
        main()
