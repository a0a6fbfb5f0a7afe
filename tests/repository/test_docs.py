"""The user's documentation holds together: README.md is a short guide in a fixed order with no commit hashes, its
test command is CI's, and every relative link in it, docs/*.md and benchmarks/README.md names a file (and heading)
that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
README_MAX_CHARS = 12_000
# the README's `## ` sections, in this order (a heading starts with its name: "The real tasks (GPU box)")
README_SECTIONS = ["Quickstart", "The real tasks", "Expected results", "Layout", "Differences from the original",
                   "Tests", "Citing"]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEX_WORD = re.compile(r"\b[0-9a-fA-F]{7,40}\b")


def prose(text: str) -> str:
    """The text outside fenced code blocks (code in them is not rendered as links or headings)."""
    return FENCE.sub("", text)


def headings(text: str) -> list[tuple[int, str]]:
    """(level, title) of each Markdown heading outside code blocks."""
    return [(len(m.group(1)), m.group(2).strip()) for m in re.finditer(r"^(#{1,6})\s+(.+)$", prose(text), re.M)]


def github_slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a page; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, title in headings(text):
        slug = github_slug(title)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def broken_links(page: Path) -> list[str]:
    """Relative links of a page whose file, or heading in that file, does not exist."""
    text = page.read_text()
    broken = []
    for target in LINK.findall(INLINE_CODE.sub("", prose(text))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ... : not ours to check
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no file {file})")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(f"{target} (no heading #{anchor} in {file})")
    return broken


def commit_like_words(text: str) -> list[str]:
    """Hex words of 7-40 characters that are not plain numbers: commit hashes, md5 sums (32 hex digits)."""
    return [w for w in HEX_WORD.findall(text) if not w.isdigit()]


def readme_section_problems(text: str) -> list[str]:
    found = [title for level, title in headings(text) if level == 2]
    problems = []
    if len(found) != len(README_SECTIONS) or not all(t.startswith(s) for t, s in zip(found, README_SECTIONS)):
        problems.append(f"sections {found}, expected {README_SECTIONS} in that order")
    intro = prose(text).split("\n## ", 1)[0]
    if len([line for line in intro.splitlines() if line.strip() and not line.startswith("#")]) < 2:
        problems.append("no paragraph saying what this is before the first section")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert page.exists()
    assert not broken_links(page), f"{page.relative_to(ROOT)}: broken links:\n" + "\n".join(broken_links(page))


def test_readme_is_short():
    size = len((ROOT / "README.md").read_text())
    assert size <= README_MAX_CHARS, f"README.md has {size} characters, at most {README_MAX_CHARS}: move detail to docs/"


def test_readme_holds_no_commit_hash_or_md5():
    words = commit_like_words((ROOT / "README.md").read_text())
    assert not words, f"README.md holds commit hashes or checksums (they belong in docs/ pages): {words}"


def test_readme_sections_in_order():
    problems = readme_section_problems((ROOT / "README.md").read_text())
    assert not problems, "; ".join(problems)


def test_readme_test_command_is_what_ci_runs():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    command = [line for line in ci if line and not line.startswith("#")][-1]
    assert "pytest" in command, f".ci/run's last command is not the test command: {command}"
    readme_lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()]
    assert command in readme_lines, f"README.md does not give CI's test command as a line of its own: {command}"


def test_the_checks_catch_what_they_look_for(tmp_path):
    """Each helper finds a planted fault, so a passing test above means something."""
    (tmp_path / "there.md").write_text("# There\n## A part\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok](there.md#a-part) [ok](#here) [web](https://example.org/x.md)\n# Here\n"
                    "`[code](nowhere.md)`\n```\n[code](nowhere.md)\n```\n[bad](missing.md) [bad](there.md#b-part)\n")
    assert [b.split()[0] for b in broken_links(page)] == ["missing.md", "there.md#b-part"]
    assert commit_like_words("fixed in 1e1df7e; md5 bd68d6b5e0c1a2f3b4c5d6e7f8091a2b; 50257 tokens; 1e-5") == [
        "1e1df7e", "bd68d6b5e0c1a2f3b4c5d6e7f8091a2b"]
    assert github_slug("Measured (stand-in base image)") == "measured-stand-in-base-image"
    assert github_slug("`--exact-ranks`: bit for bit") == "--exact-ranks-bit-for-bit"
    assert anchors("# A\n## Same\n## Same\n```\n## not a heading\n```\n") == {"a", "same", "same-1"}
    shuffled = "intro\ntext\n" + "".join(f"## {s}\n" for s in reversed(README_SECTIONS))
    assert readme_section_problems(shuffled)
    assert not readme_section_problems("intro\ntext\n" + "".join(f"## {s}\n" for s in README_SECTIONS))


def test_readme_lists_the_presets_help_lists():
    """The README's Tasks line names each `--task` preset that --help offers (TASK_NAMES), and no other."""
    from lm_human_preference_details.tasks import TASK_NAMES

    line = re.search(r"^- \*\*Tasks\*\*(.*?)Every preset", (ROOT / "README.md").read_text(), re.M | re.S).group(1)
    named = {w.strip("`") for w in INLINE_CODE.findall(line)} - {"--task"}
    assert named == set(TASK_NAMES), f"README's Tasks: {sorted(named)}; --help's: {sorted(TASK_NAMES)}"


def test_the_readmes_real_task_commands_run_in_the_baselines_fp32():
    """Expected results needs --no-tf32: each training command of "The real tasks" passes it."""
    section = re.search(r"^## The real tasks.*?```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.M | re.S).group(1)
    commands = [c for c in section.replace("\\\n", " ").splitlines() if re.search(r"train_(policy|reward)\.py|LMHP_ARGS", c)]
    assert commands and all("--no-tf32" in c for c in commands), [c for c in commands if "--no-tf32" not in c]
