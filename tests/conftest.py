"""What pytest needs here: the environment every test runs in, the shared fixtures (helpers/fixtures.py, helpers/browser.py),
the order the xdist workers take the test files in, and a heap frozen at each file's start."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

# Before torch loads, as train_policy.py and train_reward.py set it: an `in_process` run allocates as the script does
# (large CPU tensors in 2 MiB pages, not 4 KiB ones faulted in one at a time: 72 CPU s instead of 60 for the offline task)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import pytest  # noqa: E402

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS.parent), str(TESTS), str(TESTS / "helpers" / "site")]  # the package, helpers/, the audit hook
import lmhp_events  # noqa: E402, F401  (runs forked from a test stop at their events as the runs it starts do)

FIXTURES = ["helpers.fixtures", "helpers.browser"]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # three workers on the 2-core CI (addopts' -n 3): a second intra-op thread would only spin at OpenMP's barriers
    # while the other workers hold the cores; the runs a test starts inherit OMP_NUM_THREADS
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    # a full collection after every 100 collections of the middle generation, not 10: each test file's start collects in
    # full anyway (pytest_runtest_setup), and in between they walked the file's runs again and again (the online
    # collection's, checkpoints' and smoke files alone, 2026-11-29: 43 -> 9 of them, 4.2 -> 1.3 s; +215 MB at the peak)
    gc.set_threshold(*gc.get_threshold()[:2], 100)


def pytest_configure(config):
    """The shared fixtures (FIXTURES) where tests run: in each xdist worker, or in this process without workers. The
    controller that hands the tests to the workers never imports them, nor torch with them: the workers start about 2 s
    sooner."""
    if config.getoption("numprocesses", default=None) and not hasattr(config, "workerinput"):
        return
    for name in FIXTURES:
        config.pluginmanager.import_plugin(name)


# Parallel workers (pytest-xdist; `-n 3 --dist loadgroup --no-loadscope-reorder` in pyproject.toml's addopts). A test
# file is one group, run by one worker, so its module fixtures are built once; files that share a costly session fixture
# are one group. Groups go to the workers in the order sorted here (without --no-loadscope-reorder xdist would hand
# them out by their count of tests, and the few-test slow files would come last, with one worker idle).
SHARED_GROUPS = {"e2e/test_resume_hardware.py": "ranks/test_emulated.py",  # both read `exact_policy_runs` (~30 s)
                 "offline/test_assets.py": "offline/test_task.py"}  # the first unpacks `offline_cache`, the second runs on it
# the files with the longest runs start first, so that the workers end together (longest first by their seconds in
# an idle suite on the 2-core VM, 2026-11-29; the files after them take under 8 s each)
SLOW_FIRST = ["offline/test_task.py", "online/test_collection.py", "benchmarks/test_offline.py", "e2e/test_smoke.py",
              "ranks/test_emulated.py", "run/test_signals.py", "run/test_directory.py", "e2e/test_online_page.py",
              "run/test_checkpoint.py", "ranks/test_failures.py", "utils/test_files.py", "benchmarks/test_compare.py",
              "e2e/test_evaluate_page.py", "benchmarks/test_speed_variants.py", "e2e/test_user_files.py",
              "e2e/test_label_page.py", "test_export.py", "e2e/test_cluster_runs.py", "test_sample.py",
              "cli/test_run_args.py"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under xdist: each test's group (its file, or SHARED_GROUPS'), and the slow files first."""
    if not hasattr(config, "workerinput"):  # a plain run, or xdist's controller: the order as collected
        return

    def group(item) -> str:
        name = item.path.relative_to(TESTS).as_posix()
        return SHARED_GROUPS.get(name, name)

    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(group(item), len(rank)))  # stable


_frozen_at: Path | None = None  # the test file at whose start the heap was last frozen


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """At each test file's start, before its module fixtures: collect, then freeze what is left (gc.freeze). What
    outlives a file is imports (torch and transformers alone: 450k objects, 0.27 s a full collection), caches and
    session fixtures; every automatic full collection walked them again, and pytest runs five at a worker's end.
    Frozen, they are left out (the runs a test forks inherit it). Nothing is lost: a frozen object is still freed
    when its last reference goes; only a cycle among them stays. Measured on the 2-core VM (2026-11-29, one suite
    each): 649 -> 612 CPU s."""
    global _frozen_at
    if item.path != _frozen_at:
        _frozen_at = item.path
        gc.collect()
        gc.freeze()
