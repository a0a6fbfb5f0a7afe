"""Running the scripts as a user would: a real process (under torchrun too), or main(argv) in this process where a new
interpreter would add only its imports."""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
import warnings
from pathlib import Path
from typing import Callable, Iterator

import torch

from helpers.assets import SHORT_TASK

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now: for a c10d rendezvous, a page, or a server unreachable."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: Path | str, processes: int, *args, env_extra: dict | None = None,
           cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`started` and awaited: the job's stdout and stderr; it must succeed."""
    return started(script, processes, *args, env_extra=env_extra, cwd=cwd)()


def started(script: Path | str, processes: int, *args, env_extra: dict | None = None, cwd: Path | None = None,
            check: bool = True) -> Callable[[], subprocess.CompletedProcess]:
    """``torchrun --standalone --nproc-per-node PROCESSES SCRIPT ARGS`` (gloo), offline, one CPU thread per process, in
    ``cwd`` (default: the repository), as torchrun's own agent runs it (`torchrun_agent`), the agent a fork of this
    process. Three interpreters' imports fewer (torch's and transformers', ~8 CPU s each here) for a pair whose promise
    is what the processes do; what torchrun's command line itself prints, or does with a signal, is tested on the real
    command (tests/run/test_signals.py, tests/ranks/test_failures.py, tests/cli/test_run_args.py). Forked at once
    (while this process runs nothing else: a fork beside a running torch could inherit a lock it holds) -> a function
    that waits for the job and gives its exit status, stdout and stderr; with ``check``, it must have succeeded."""
    argv = [str(ROOT / script), *map(str, args)]
    agent = torchrun_agent(["--standalone", "--nproc-per-node", str(processes)], argv, env_extra, cwd)
    logs = tempfile.TemporaryDirectory(prefix="lmhp-torchrun-")
    finished = awaited(in_fork(agent, Path(logs.name) / "stdout", Path(logs.name) / "stderr"), logs, ["torchrun", *argv])

    def wait() -> subprocess.CompletedProcess:
        result = finished()
        assert result.returncode == 0 or not check, result.stderr[-3000:]
        return result

    return wait


def torchrun_agent(options: list[str], argv: list[str], env_extra: dict | None = None,
                   cwd: Path | None = None) -> Callable[[], None]:
    """``python -m torch.distributed.run OPTIONS SCRIPT ARGS`` (``argv``: SCRIPT ARGS) as a function for a fork of this
    process (`in_fork`): torchrun's own agent, its options parsed by torch.distributed.run, the same rendezvous (a c10d
    one on a free local port for --standalone, as torchrun makes it), environment, process group and report
    (elastic_launch), but its workers forks of the agent (the start method "fork"), each running SCRIPT as ``__main__``
    as `python SCRIPT` does (`run_as_main`), offline and on one CPU thread; it sees ``env_extra`` in ``cwd`` (default:
    the repository)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           **(env_extra or {})}

    def agent() -> None:
        # the c10d rendezvous names each event it records by inspect.stack(), which reads the source of every frame and
        # looks each one's module up among all of sys.modules: here the test process's thousands (~1 CPU s a job, six
        # jobs of tests/ranks/test_failures.py, test_cluster_runs.py and test_signals.py: 71 -> 67 CPU s). The same name,
        # from the frame itself
        dynamic_rendezvous.get_method_name = frame_function_name
        out, err = sys.stdout, sys.stderr
        with as_a_new_process(env, cwd or ROOT):
            sys.stdout, sys.stderr = out, err  # the fork's files, not as_a_new_process's capture
            for name in ("torch", "torch.distributed"):  # torch's log handlers hold the stderr they were made with
                for handler in logging.getLogger(name).handlers:
                    if isinstance(handler, logging.StreamHandler):
                        handler.setStream(err)
            parsed = parse_args([*options, *argv])
            if parsed.standalone:  # what torch.distributed.run.run makes of it
                parsed.rdzv_backend, parsed.rdzv_endpoint, parsed.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
            config, _, _ = config_from_args(parsed)
            config.start_method = "fork"
            elastic_launch(config, run_as_main)(*argv)

    return agent


def awaited(pid: int, logs: tempfile.TemporaryDirectory, argv: list) -> Callable[[], subprocess.CompletedProcess]:
    """A fork's wait -> a function that waits for ``pid`` and gives a CompletedProcess as subprocess.run does: its exit
    status, and what it wrote to LOGS/stdout and LOGS/stderr (empty where it wrote none); the logs are removed."""
    def wait() -> subprocess.CompletedProcess:
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        stdout, stderr = (Path(logs.name) / name for name in ("stdout", "stderr"))
        result = subprocess.CompletedProcess(argv, code, stdout.read_text(), stderr.read_text() if stderr.exists() else "")
        logs.cleanup()
        return result

    return wait


def frame_function_name(depth: int = 2) -> str:
    """torch's `dynamic_rendezvous.get_method_name` (``inspect.stack()[depth].function``, the frame ``depth`` calls
    up from it) without inspect.stack()'s source reads: the function's name from the frame."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a stack of ``depth`` frames or fewer
        return "no_method_name"


# where each worker of a forked torchrun job appends "RANK STATUS" as it exits (the forked agent's report, unlike the
# real command's, names the first process that failed alone): `exit_statuses`
EXITS = "LMHP_TEST_EXITS"


def run_as_main(script: str, *args: str) -> None:
    """``python SCRIPT ARGS`` in this process (a forked torchrun worker): SCRIPT's file run as ``__main__`` with its
    argv, on one CPU thread; its exit status is the worker's (appended to $LMHP_TEST_EXITS where it is set)."""
    sys.argv = [script, *args]
    torch.set_num_threads(1)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if path := os.environ.get(EXITS):  # the status the interpreter would exit with
            with open(path, "a") as f:
                f.write(f"{os.environ['RANK']} {e.code if isinstance(e.code, int) else int(e.code is not None)}\n")
        raise


def exit_statuses(path: Path) -> dict[int, int]:
    """The statuses the workers of a forked torchrun job exited with (`run_as_main`) -> {rank: status}; a worker that
    ended otherwise (killed) is missing."""
    lines = path.read_text().splitlines() if path.exists() else []
    return {int(rank): int(code) for rank, code in map(str.split, lines)}


def exact_policy(assets: Path, run_dir: Path, processes: int, *extra) -> Callable[[], subprocess.CompletedProcess]:
    """A policy run with --exact-ranks (4 emulated ranks) that trains its reward model first (2 batches of 16 labels),
    then 2 PPO updates, a checkpoint after each (both kept): on 1 process a function that runs it in this one
    (`in_process`), on more a torchrun job already `started` -> a function that gives its output (for `beside_its_pair`).
    Queries of 16 tokens and responses of 8 (helpers.assets.SHORT_TASK: what is promised does not depend on them).
    Two updates are the least that shows both promises: update 1 samples from weights that update 0 trained, and a
    resume from the update-1 checkpoint (which reuses the finished reward model) has one update left to run. Both
    phases in one run: a torchrun job's rendezvous and model loads cost more than a phase's own work."""
    new = "--rewards.train-new-model."
    args = ["--base-model", assets / "tiny-gpt2", f"{new}labels.source", assets / "short_labels.json",
            f"{new}labels.num-train", 32, f"{new}batch-size", 16, f"{new}lr", 1e-3, f"{new}rollout-batch-size", 32,
            f"{new}normalize-samples", 32, f"{new}eval-labels", 0, "--task.query-dataset", assets / "queries.txt", *SHORT_TASK,
            "--ppo.total-episodes", 64, "--ppo.batch-size", 32, "--ppo.nminibatches", 2,
            "--ppo.noptepochs", 2, "--ppo.lr", 1e-3, "--ppo.no-whiten-rewards", "--num-ranks", 4, "--exact-ranks",
            "--device", "cpu", "--save-interval", 1, "--keep-checkpoints", 2, "--output-dir", run_dir, *extra]
    if processes == 1:
        return lambda: in_process("train_policy.py", *args)
    return started("train_policy.py", processes, *args)


def beside_its_pair(one: Callable[[], object], pair: Callable[[], object]) -> tuple:
    """``one()`` (a 1-process twin, in this process on one thread) while its torchrun pair, already `started` (a fork
    made before the twin's torch runs, which a fork must not come beside), runs -> (one's result, ``pair()``: the pair's,
    awaited whatever the twin does). The twin's single thread would leave a core idle while it ran alone, and nothing
    here is timed."""
    try:
        first = one()
    finally:
        second = pair()
    return first, second


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


def in_fork(work: Callable[[], int | None], stdout: Path | int | None = None, stderr: Path | None = None,
            new_session: bool = False) -> int:
    """``work()`` in a fork of this process -> the child's pid: a process of its own without a new interpreter's imports
    (torch's and transformers', ~7 CPU s here). The child runs on one thread (no thread pool of the parent's is used in
    it), draws its progress bars under a lock of its own, writes its output to ``stdout`` (a path, or a pipe's
    descriptor) and ``stderr`` (default: stdout's; none given: nowhere), leads a session of its own with ``new_session``
    (as Popen(start_new_session=True): a kill of its process group ends all it started), and exits with what ``work``
    returns (None: 0), or 1 with the traceback after an exception."""
    from tqdm import tqdm
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast  # noqa: F401

    # transformers' GPT-2 classes load lazily, ~3.5 CPU s here at their first use: imported once in this process, not
    # again in every child that loads a model (and lost at its exit)
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        # tqdm's default lock holds a semaphore shared with every process forked after it was made: a child killed
        # while it held it (SIGKILL in a progress bar's write) would leave it taken for the test's own bars
        tqdm.set_lock(threading.RLock())
        torch.set_num_threads(1)
        if new_session:
            os.setsid()
        out = open(stdout if stdout is not None else os.devnull, "w", buffering=1, closefd=not isinstance(stdout, int))
        sys.stdout, sys.stderr = out, open(stderr, "w", buffering=1) if stderr is not None else out
        code = work() or 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def forked(script: str | Path, *args, env_extra: dict | None = None, cwd: Path | None = None,
           stdout: Path | int | None = None, stderr: Path | None = None, before: Callable[[], None] | None = None,
           new_session: bool = False) -> int:
    """``python SCRIPT ARGS`` as `run_main(main)` in a fork of this process (`in_fork`, with its ``stdout``, ``stderr``
    and ``new_session``) -> the child's pid, for a run that a test kills, stops or drives (`helpers.events.drive`, with
    ``env_extra`` setting $LMHP_TEST_EVENTS): a process of its own, as a user's run is. The child sees ``env_extra`` and
    ``cwd`` as a fresh process would (`as_a_new_process`), calls ``before()`` first (a fault to inject), and exits with
    the status the script's command line would give."""
    from lm_human_preference_details.utils.errors import run_main

    main = script_main(script)

    def run() -> int:
        out, err = sys.stdout, sys.stderr
        with as_a_new_process(env_extra, cwd):
            sys.stdout, sys.stderr = out, err  # the fork's files, not as_a_new_process's capture
            sys.argv = [sys.modules[main.__module__].__file__, *map(str, args)]  # as the interpreter sets it
            if before is not None:
                before()
            try:
                run_main(lambda: main([str(a) for a in args]))
            except SystemExit as e:
                return e.code if isinstance(e.code, int) else (e.code is not None)
            return 0

    return in_fork(run, stdout, stderr, new_session)


def run_forked(script: str | Path, *args, env_extra: dict | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` run to its end in a fork of this process (`forked`) -> a CompletedProcess as
    subprocess.run gives, its output and errors together in stdout: a process of its own as a user's run is, without a
    new interpreter's imports, for a run whose command line another test starts for real (tests/e2e/test_smoke.py)."""
    logs = tempfile.TemporaryDirectory(prefix="lmhp-forked-")
    pid = forked(script, *args, env_extra=env_extra, cwd=cwd, stdout=Path(logs.name) / "stdout")
    return awaited(pid, logs, [str(script), *map(str, args)])()


def differing(env: dict) -> dict:
    """The variables of ``env`` that this process's environment lacks or holds otherwise: the ``env_extra`` that makes a
    run in this process or in a fork of it see ``env``, an environment built for a subprocess."""
    return {name: value for name, value in env.items() if os.environ.get(name) != value}


class ForkedProcess:
    """A script run in a fork of this process (`forked`), its output read from a pipe, handled as a subprocess.Popen:
    ``pid``, ``stdout`` (its output and errors, as text), ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``."""

    def __init__(self, script: str | Path, *args, env_extra: dict | None = None, cwd: Path | None = None,
                 output: bool = True):
        """``output`` False: its output goes nowhere, and ``stdout`` is None (Popen's stdout=DEVNULL)."""
        read, write = os.pipe() if output else (None, None)
        self.pid = forked(script, *args, env_extra=env_extra, cwd=cwd, stdout=write, new_session=True)
        self.stdout = None
        if output:
            os.close(write)  # the child's copy is the only one: its exit ends the parent's reading
            self.stdout = os.fdopen(read, "r")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedAgent(ForkedProcess):
    """torchrun's agent (`torchrun_agent`: OPTIONS, SCRIPT ARGS) in a fork of this process, its output and errors
    written to ``log``, handled as a subprocess.Popen of the real command (``pid``, ``poll``, ``wait``, ``send_signal``)."""

    def __init__(self, options: list[str], argv: list[str], log: Path, env_extra: dict | None = None,
                 cwd: Path | None = None):
        self.pid = in_fork(torchrun_agent(options, argv, env_extra, cwd), stdout=log)
        self.stdout = None
        self.returncode = None
