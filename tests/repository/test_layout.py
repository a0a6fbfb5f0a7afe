"""The package's layout: no import cycle, a docstring per module, no task-specific branch in the scripts' train(),
modules, classes and functions of a readable size."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lm_human_preference_details"


def module_name(path: Path) -> str:
    """The dotted name of a package file below the package: ``ranks/gradients.py`` -> ``ranks.gradients``."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    """Every module of the package and its sub-packages by dotted name (``__init__`` files as their package)."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if module_name(p)}


def imports_of(path: Path) -> set[str]:
    """Package modules (dotted, below the package) that ``path`` imports anywhere in it, top level or in functions;
    ``from pkg.wing import name`` counts as the module ``wing.name`` where that is a module, else as ``wing``."""
    known = set(package_modules())
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == PACKAGE.name:
            base = node.module[len(PACKAGE.name) + 1:]
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                found.add(sub if sub in known else base)
        elif isinstance(node, ast.Import):
            found.update(a.name[len(PACKAGE.name) + 1:] for a in node.names if a.name.startswith(PACKAGE.name + "."))
    return found - {""}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph as a list of nodes, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_by_hand():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_package_has_no_import_cycle():
    modules = package_modules()
    graph = {name: imports_of(path) - {name} for name, path in modules.items()}
    assert graph["tasks"] and graph["offline.task"]  # the graph is really read
    assert find_cycle(graph) is None, find_cycle(graph)
    offline = {n for n in modules if n.split(".")[0] == "offline"}
    assert not offline & set().union(*(deps for name, deps in graph.items() if name not in offline))  # demo at the edge


def test_the_wings_import_each_other_without_a_circle():
    """Folder by folder (each wing one room, each module at the root one room) the arrows run one way: no room imports
    a room that imports it back, so every arrow runs down."""
    graph: dict[str, set[str]] = {}
    for name, path in package_modules().items():
        graph.setdefault(name.split(".")[0], set()).update(dep.split(".")[0] for dep in imports_of(path))
    graph = {room: deps - {room} for room, deps in graph.items()}
    assert len(graph) >= 12 and find_cycle(graph) is None, find_cycle(graph)


# a run's life sits above the wings it drives: what they share with it (random state, shared-directory waits) is beneath
BELOW_RUN = ("ranks", "labelling", "online")


def imports_against_the_floors(graph: dict[str, set[str]]) -> list[str]:
    """The arrows from a module of ``BELOW_RUN`` into ``run/``."""
    return sorted(f"{name} -> {dep}" for name, deps in graph.items() if name.split(".")[0] in BELOW_RUN
                  for dep in deps if dep.split(".")[0] == "run")


def test_no_wing_beneath_a_runs_life_imports_from_it():
    assert imports_against_the_floors({"ranks.emulated": {"run.checkpoint", "utils.files"}, "run.lifecycle": {"ranks"}}) \
        == ["ranks.emulated -> run.checkpoint"]
    modules = package_modules()
    graph = {name: imports_of(path) for name, path in modules.items()}
    assert {w for w in BELOW_RUN if w in modules} == set(BELOW_RUN)  # the wings named are there
    assert not imports_against_the_floors(graph), imports_against_the_floors(graph)


def test_the_package_is_in_wings_each_with_its_map():
    """At most 12 modules at the root; at least 5 sub-packages, each opening with a map naming its every module; no
    folder holds three modules whose names start alike (``label_*``)."""
    root = [p for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    wings = sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert len(root) <= 12 and len(wings) >= 5, (len(root), [w.name for w in wings])
    for folder in [PACKAGE, *wings]:
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        modules = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
        if folder != PACKAGE:
            assert not [m for m in modules if m not in doc], f"{folder.name}/__init__.py's map misses a module"
        prefixes = [m.split("_")[0] for m in modules if "_" in m]
        assert not [p for p in set(prefixes) if prefixes.count(p) >= 3], (folder.name, modules)
    assert [w.name for w in wings if w.name not in ((PACKAGE / "__init__.py").read_text())] == []


def test_the_commands_share_policy_loading_and_import_no_command():
    """sample.py and label.py are commands: both load policies through language/trained_models.py, and no module
    imports either."""
    importers = {p.stem for p in PACKAGE.rglob("*.py") if imports_of(p) & {"sample", "label"}}
    assert {"language.trained_models"} <= imports_of(PACKAGE / "sample.py") & imports_of(PACKAGE / "label.py")
    assert not importers, importers


def unexplained_imports(source: str, name: str) -> list[str]:
    """The imports inside a function of ``source`` whose group of import lines has no comment (why they wait) on its
    first line or the line above it."""
    lines = source.splitlines()

    def explained(i: int) -> bool:  # i: the import's line index
        while i > 0 and lines[i - 1].strip().startswith(("import ", "from ")):
            i -= 1
        return "#" in lines[i] or lines[i - 1].strip().startswith("#")

    return [f"{name}:{node.lineno}: {lines[node.lineno - 1].strip()}"
            for function in ast.walk(ast.parse(source)) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(function)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not explained(node.lineno - 1)]


def test_an_import_inside_a_function_says_why():
    """An import belongs at the top of its module; one that waits (a heavy import on a rare path) says why in a comment.
    queries/ keeps its own rule (tests/queries/test_source.py)."""
    assert unexplained_imports("def f():\n    import json\n", "m.py") == ["m.py:2: import json"]
    assert not unexplained_imports("def f():\n    import json  # rare\n", "m.py")
    sources = [p for p in PACKAGE.rglob("*.py") if p.parent.name != "queries"]
    sources += [ROOT / "train_policy.py", ROOT / "train_reward.py"]
    found = [f for p in sources for f in unexplained_imports(p.read_text(), p.name)]
    assert not found, found


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def test_torchrun_environment_is_read_in_one_place():
    """torchrun.py alone reads torchrun's variables: every other module asks it, so none can read them differently."""
    sources = [*PACKAGE.rglob("*.py"), ROOT / "train_policy.py", ROOT / "train_reward.py"]
    readers = sorted(str(p.relative_to(ROOT)) for p in sources
                     if p.name != "torchrun.py" and any(f'"{name}"' in p.read_text() for name in TORCHRUN_VARIABLES))
    assert '"RANK"' in (PACKAGE / "utils" / "torchrun.py").read_text() and not readers, readers


def test_every_module_says_its_job():
    for path in PACKAGE.rglob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and len(doc.splitlines()[0]) > 20, f"{path.name} has no docstring saying its job"


# what tells one task from another: the run's task name and query dataset, and their values as strings
TASK_FIELDS = {"task_name", "query_dataset"}


def task_words() -> set[str]:
    """Every task's name and the name of its preset's query dataset (paths left out)."""
    from lm_human_preference_details.tasks import TASK_NAMES, get_task

    datasets = {get_task(name).task.query_dataset for name in TASK_NAMES}
    return set(TASK_NAMES) | {d for d in datasets if "/" not in d}


def names_a_task(node: ast.AST, words: set[str]) -> bool:
    """Whether the expression reads a task-identifying field or holds a task's (or its dataset's) name."""
    return any((isinstance(n, ast.Name) and n.id in TASK_FIELDS) or (isinstance(n, ast.Attribute) and n.attr in TASK_FIELDS)
               or (isinstance(n, ast.Constant) and n.value in words) for n in ast.walk(node))


def task_branches(function: ast.FunctionDef, words: set[str]) -> list[str]:
    """The comparisons, conditions and match subjects in ``function`` that read which task this is."""
    tests = [n for n in ast.walk(function) if isinstance(n, ast.Compare)]
    tests += [n.test for n in ast.walk(function) if isinstance(n, (ast.If, ast.IfExp, ast.While, ast.Assert))]
    tests += [n.subject for n in ast.walk(function) if isinstance(n, ast.Match)]
    return sorted({ast.unparse(t) for t in tests if names_a_task(t, words)})


def script_train(source: str) -> ast.FunctionDef:
    return next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "train")


def test_the_scripts_train_has_no_task_specific_branch():
    words = task_words()
    assert {"sentiment", "tldr", "offline", "bookcorpus"} <= words
    for script in ("train_policy.py", "train_reward.py"):
        train = script_train((ROOT / script).read_text())
        names = {n.id for n in ast.walk(train) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(train) if isinstance(n, ast.Attribute)}
        assert not task_branches(train, words), f"{script}: train() branches on the task: {task_branches(train, words)}"
        assert "offline" not in names, f"{script}: train() names the offline demo"


@pytest.mark.parametrize("branch", [
    "if args.task_name == 'tldr': pass",
    "x = 1 if 'cnndm' in (args.task_name, 'x') else 2",
    "if task.query_dataset != 'bookcorpus': pass",
    "if name.startswith('tl') and args.task_name: pass",
    "ok = 'sentiment' == current",
    "match args.task.query_dataset:\n        case _: pass",
    "while 'offline' not in seen: pass",
])
def test_the_task_branch_check_sees_each_form(branch):
    planted = script_train(f"def train(args, task, name, current, seen):\n    {branch}\n")
    assert task_branches(planted, task_words())
    assert not task_branches(script_train("def train(args):\n    if args.ppo.lr > 0 and get_task(args.x): pass\n"),
                             task_words())


def test_the_readme_layout_lists_every_root_module_and_wing():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```")[1]
    listed = {line.split()[0] for line in block.splitlines() if line.startswith("  ") and line[2] != " "}
    wings = {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert listed == {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"} | wings


# a module a maintainer can read in one sitting; the scripts are single files by design, so only their parts are held.
# A class owns its state whole (Run, OnlineCollection: nothing sets their attributes from outside), hence 200, not 150
MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 450, 200, 75


def too_long(source: str, name: str, whole_module: bool) -> list[str]:
    """What in ``source`` is over its size: the module itself (when held), and each class and function."""
    found = [f"{name}: {len(source.splitlines())} lines"] if whole_module and len(source.splitlines()) > MODULE_LINES else []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            limit = CLASS_LINES if isinstance(node, ast.ClassDef) else FUNCTION_LINES
            if node.end_lineno - node.lineno + 1 > limit:
                found.append(f"{name}: {node.name} {node.end_lineno - node.lineno + 1} lines")
    return found


def test_no_module_class_or_function_is_over_its_size():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 30 and any(p.parent.name == "queries" for p in modules)  # the sub-packages are walked too
    found = [f for p in modules for f in too_long(p.read_text(), p.name, whole_module=True)]
    found += [f for script in ("train_policy.py", "train_reward.py")
              for f in too_long((ROOT / script).read_text(), script, whole_module=False)]
    assert not found, found


# a script's train() is the paper's outline (CONTRIBUTING.md, "In the scripts"): its steps are named calls, so it stays
# short; 80 leaves the policy's loop room to show its saves and stops without lines packed to fit (it stood at 69 of 70)
SCRIPT_TRAIN_LINES = 80


def test_each_scripts_train_reads_as_an_outline():
    for script in ("train_policy.py", "train_reward.py"):
        train = script_train((ROOT / script).read_text())
        assert train.end_lineno - train.lineno + 1 <= SCRIPT_TRAIN_LINES, f"{script}: train() is over {SCRIPT_TRAIN_LINES}"


def test_the_size_check_sees_each_kind():
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    assert too_long(f"def train():\n{body}\n", "s.py", whole_module=False) == ["s.py: train 76 lines"]
    attributes = "\n".join(f"    x{i} = {i}" for i in range(CLASS_LINES))
    assert too_long(f"class A:\n{attributes}\n", "m.py", whole_module=False) == [f"m.py: A {CLASS_LINES + 1} lines"]
    assert too_long("x = 1\n" * 451, "m.py", whole_module=True) == ["m.py: 451 lines"]
    assert too_long("x = 1\n" * 451, "m.py", whole_module=False) == []


TESTS = ROOT / "tests"


def test_every_module_has_its_test_file_in_its_wings_folder():
    """tests/ mirrors the package: lm_human_preference_details/WING/NAME.py is tested in tests/WING/test_NAME.py."""
    missing = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"
               and not (TESTS / p.parent.relative_to(PACKAGE) / f"test_{p.name}").is_file()]
    assert len(list(PACKAGE.rglob("*.py"))) > 40 and not missing, missing


def test_no_test_file_imports_another_and_conftest_stays_small():
    """Shared code lives in tests/helpers/ (with --import-mode=importlib a test file cannot import another anyway)."""
    test_names = {p.stem for p in TESTS.rglob("test_*.py")}
    importing = sorted(f"{p.relative_to(TESTS)}: {name}" for p in TESTS.rglob("*.py")
                       for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
                       for name in ([node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
                       if name.split(".")[-1] in test_names | {"conftest"})
    assert not importing, importing
    assert len((TESTS / "conftest.py").read_text().splitlines()) < 200


# what points outside the repository or into its tracker: an issue's number, the team's own folder beside the checkout
OUTSIDE = re.compile(r"\bissues? ?#?\d+\b|\bshared/|\bSTYLE\.md\b|\brule \d+\b", re.IGNORECASE)


def outside_references(text: str) -> list[str]:
    return [m.group(0) for m in OUTSIDE.finditer(text)]


def test_the_outside_check_sees_each_form():
    # spelled apart, so that this file does not hold them as they stand
    planted = [p.replace("|", "") for p in ("iss|ue 42", "iss|ue #30", "sha|red/", "STY|LE.md", "ru|le 5")]
    text = "as {} asked; {}; see ../{}FIDELITY.md and {} ({})".format(*planted)
    assert outside_references(text) == planted
    assert outside_references("github.com/openai/lm-human-preferences/issues/17; tissue 4; CONTRIBUTING.md") == []


def test_nothing_in_the_repository_points_outside_it_or_at_an_issue_number():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if path.suffix in {".py", ".md", ".toml", ".sh", ".sbatch", ".html", ".txt", ""} and path.is_file():
            found += [f"{name}: {ref}" for ref in outside_references(path.read_text(errors="replace"))]
    assert len(files) > 100 and not found, found


# what a docstring may name that is not this repository's: the original's files (OAI ...) and a user's example program
ELSEWHERE = {"launch.py", "lm_tasks.py", "datasets.py", "label_types.py", "books.py", "judge.py"}
PY_NAME = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b")  # labelling/server.py, train_reward.py
DOTTED_NAME = re.compile(r"(?<![\w./-])((?:[a-z_]+/)*[a-z_][a-z0-9_]*)\.([A-Za-z_]\w*)\b")  # run/directory.check_run_dir
FILE_TYPES = {"py", "md", "json", "jsonl", "txt", "html", "parquet", "png", "pt", "safetensors", "toml", "log", "ckpt",
              "arrow", "csv", "yaml", "sh", "gz", "zip"}  # labels.json is a file, not the module labels' name json
CODE = re.compile(r"``.*?``|\"[^\"\n]*\"", re.DOTALL)  # code and quoted strings: expressions, not names of modules


def top_level_names(path: Path) -> set[str]:
    """What ``path`` defines at its top level (functions, classes, assigned names), its imports left out."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names.update(e.id for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name))
    return names


def stale_names(doc: str, files: list[Path], tracked: set[str]) -> list[str]:
    """The modules and module.function names in ``doc`` that do not exist: a path (``wing/module.py``, a bare
    ``module.py``) no file of ``tracked`` has (paths from the root; a test is named by its path alone), a
    ``module.name`` whose module (by its stem, or ``wing/module``) is one of ``files`` but defines no such name, a
    flat-layout name (``label_session.X``) or a ``lm_human_preference_details.X`` that is no module."""
    doc = CODE.sub("", doc)
    found = [ref for ref in PY_NAME.findall(doc) if ref not in ELSEWHERE and not (
        ref in tracked or f"{PACKAGE.name}/{ref}" in tracked or ref.startswith("lm_human_preferences/") if "/" in ref
        else any(t.split("/")[-1] == ref for t in tracked if not t.startswith("tests/")))]  # a test is named by its path
    by_stem: dict[str, list[Path]] = {}
    for path in files:
        by_stem.setdefault(path.stem, []).append(path)
    for head, name in DOTTED_NAME.findall(doc):
        if name in FILE_TYPES:
            continue
        if head == PACKAGE.name:
            found += [] if f"{PACKAGE.name}/{name}.py" in tracked or f"{PACKAGE.name}/{name}/__init__.py" in tracked \
                else [f"{head}.{name}"]
        elif head.split("/")[-1] in by_stem:
            modules = [p for p in by_stem[head.split("/")[-1]] if p.with_suffix("").as_posix().endswith(head)]
            found += [] if any(name in top_level_names(p) for p in modules) else [f"{head}.{name}"]
        elif "_" in head and head.split("_")[0] in set(by_stem) | {w.name for w in PACKAGE.iterdir() if w.is_dir()}:
            found.append(f"{head}.{name}")  # label_session.X, online_answers.X: the flat layout's names
    return found


def test_the_stale_name_check_sees_each_form(tmp_path):
    (tmp_path / "server.py").write_text("def serve():\n    pass\n")
    (tmp_path / "label.py").write_text("")
    files, tracked = [tmp_path / "server.py", tmp_path / "label.py"], {"lm_human_preference_details/labelling/server.py"}
    assert stale_names("labelling/server.py, server.serve, ``x.y`` and launch.py", files, tracked) == []
    planted = "label_server.py, labelling/x.py, server.stop, label_session.LabelSession, lm_human_preference_details.nothing"
    assert stale_names(planted, files, tracked) == planted.split(", ")


def test_every_module_or_function_a_docstring_names_exists():
    """A docstring that names a module (``labelling/server.py``) or a module's function (``directory.check_run_dir``)
    names one that exists, so that a move leaves no docstring pointing at the old place."""
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split())
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "__init__.py"]
    files += [ROOT / "train_policy.py", ROOT / "train_reward.py"]
    found = []
    for path in [*PACKAGE.rglob("*.py"), ROOT / "train_policy.py", ROOT / "train_reward.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{path.relative_to(ROOT)}: {name}"
                          for name in stale_names(ast.get_docstring(node) or "", files, tracked)]
    assert len(files) > 60 and not found, found


def package_classes() -> set[str]:
    return {node.name for path in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)}


def assembled_from_outside(source: str, classes: set[str]) -> list[str]:
    """``x.attr = ...`` in a function of ``source`` where ``x`` was built there by one of ``classes``: an object whose
    attributes its maker sets, instead of its class taking them (``online = OnlineCollection(...); online.say = f``)."""
    tree, found = ast.parse(source), []
    own = {id(f): c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in ast.walk(c)}  # a class's methods
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        others = classes - {own.get(id(function))}  # a class may build its own copy (Decisions.after)
        built = {t.id for node in ast.walk(function) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                 and (getattr(node.value.func, "id", None) or getattr(node.value.func, "attr", None)) in others
                 for t in node.targets if isinstance(t, ast.Name)}
        found += [f"{function.name}: {ast.unparse(t)}" for node in ast.walk(function) if isinstance(node, ast.Assign)
                  for t in node.targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                  and t.value.id in built]
    return found


def test_the_outside_assembly_check_sees_it():
    planted = "def start(f):\n    online = OnlineCollection(1)\n    online.say = f\n    x = dict()\n    x.y = 1\n"
    assert assembled_from_outside(planted, {"OnlineCollection"}) == ["start: online.say"]
    assert assembled_from_outside("def start():\n    online = OnlineCollection(say=print)\n", {"OnlineCollection"}) == []
    own = "class A:\n    def copy(self):\n        new = A()\n        new.x = self.x\n        return new\n"
    assert assembled_from_outside(own, {"A"}) == []


def test_no_object_of_the_package_is_assembled_from_outside_its_class():
    """An object is built by its own class: no function sets the attributes of an object of ours it has just built."""
    classes = package_classes()
    assert {"OnlineCollection", "LabelServer", "Run"} <= classes
    sources = [*PACKAGE.rglob("*.py"), ROOT / "train_policy.py", ROOT / "train_reward.py"]
    found = [f"{p.relative_to(ROOT)}: {f}" for p in sources for f in assembled_from_outside(p.read_text(), classes)]
    assert not found, found
