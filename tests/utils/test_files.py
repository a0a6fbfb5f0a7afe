"""utils/files.py: a cache entry is built once however many processes reach it (files.cache_lock), and a directory entry's
publish tolerates a concurrent one (outputs.atomic_dir(replace=False)): the offline task's assets with the real builder, a
download, and the directory swap itself."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from helpers.processes import in_fork, in_process, launch

from lm_human_preference_details.utils.downloads import fetch
from lm_human_preference_details.utils.files import HOST, cache_lock, hold_lock, lock_holder
from lm_human_preference_details.utils.outputs import atomic_dir

ROOT = Path(__file__).resolve().parents[2]


def test_a_directory_entry_published_by_another_writer_meanwhile_is_kept(tmp_path):
    final = tmp_path / "entry"
    with atomic_dir(final, replace=False) as late:
        (late / "who").write_text("late")
        with atomic_dir(final, replace=False) as early:  # a concurrent writer that finishes first
            (early / "who").write_text("early")
        assert (final / "who").read_text() == "early"
    assert (final / "who").read_text() == "early"  # the first publish stays whole; the late copy is dropped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]  # no temporaries left


def test_a_rename_onto_a_directory_published_at_the_same_moment_is_dropped(tmp_path, monkeypatch):
    """The other writer publishes between this one's look and its rename: the rename fails (ENOTEMPTY), quietly."""
    final = tmp_path / "entry"
    final.mkdir()
    (final / "who").write_text("other")
    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda self: False if self == final else real_exists(self))
    with atomic_dir(final, replace=False) as mine:
        (mine / "who").write_text("mine")
    assert (final / "who").read_text() == "other"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_four_threads_fetching_one_url_download_it_once(server, tmp_path):
    base, www, requests = server
    (www / "slow").mkdir()
    (www / "slow" / "f.txt").write_text("payload")
    got = []
    threads = [threading.Thread(target=lambda: got.append(fetch(f"{base}/slow/f.txt", cache_dir=tmp_path / "c")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(got) == 4 and len(set(got)) == 1 and got[0].read_text() == "payload"
    assert requests == ["/slow/f.txt"]  # one download; the others waited for its lock, then found it
    assert sorted(p.name for p in got[0].parent.iterdir()) == ["f.txt", "f.txt.sha256"]  # no lock file left


def test_an_incomplete_assets_directory_is_built_again(tmp_path, monkeypatch):
    from lm_human_preference_details.offline.assets import ensure_offline_assets
    from lm_human_preference_details.utils import files

    monkeypatch.setattr(files, "CACHE_DIR", tmp_path)  # a cache entry: the gate replaces only the cache's (or a run's)
    out = tmp_path / "offline"
    out.mkdir()
    (out / "queries.txt").write_text("cut short\n")  # no labels.json: not a complete entry
    ensure_offline_assets(out)
    assert (out / "labels.json").is_file() and (out / "queries.txt").read_text() != "cut short\n"


def build_when_told(out: Path, go: Path, ready: Path) -> None:
    """In a forked builder: say it is ready, wait for ``go``, then run the real builder."""
    from lm_human_preference_details.offline.assets import ensure_offline_assets

    ready.touch()
    while not go.exists():  # every process starts building at the same moment
        time.sleep(0.01)
    ensure_offline_assets(out)


def test_three_processes_build_the_offline_assets_once(tmp_path):
    """The real builder, as every torchrun process runs it before the process group exists (RunArgs.finalize_run)."""
    out, go = tmp_path / "cache" / "offline", tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(3)]
    logs = [tmp_path / f"builder{i}.log" for i in range(3)]
    # processes of their own, forks of this one (a new interpreter each would add only its imports)
    pids = [in_fork(lambda r=r: build_when_told(out, go, r), stdout=log) for r, log in zip(ready, logs)]
    deadline = time.monotonic() + 300
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    text = "\n".join(log.read_text() for log in logs)
    assert codes == [0, 0, 0], text[-3000:]
    assert text.count("(once)") == 1, text[-3000:]  # built by one process
    assert text.count("waiting for pid") >= 1, text[-3000:]  # the others waited for its lock, and said so
    assert (out / "labels.json").is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["offline"]  # no temporaries, no lock file


def test_two_torchrun_processes_from_an_empty_cache_build_once_and_train_as_one(tmp_path):
    """A short offline reward run under torchrun, 2 processes (helpers.processes.launch: torchrun's agent and its workers
    as forks of this process, which reads LMHP_CACHE as a new one would), from an empty LMHP_CACHE: the assets built once,
    no error, and the metrics of the same run on one process with that cache (--exact-ranks: bit for bit), made in
    this process (helpers.processes.in_process) with that cache as its LMHP_CACHE."""
    sizes = ["--task", "offline", "--labels.num-train", "64", "--batch-size", "16", "--rollout-batch-size", "32",
             "--normalize-samples", "32", "--eval-labels", "32"]
    two = launch("train_reward.py", 2, *sizes, "--output-dir", tmp_path / "two", env_extra={"LMHP_CACHE": tmp_path / "cache"},
                 cwd=tmp_path)
    out = two.stdout + two.stderr
    assert two.returncode == 0 and "error" not in out, out[-3000:]
    assert out.count("(once)") == 1, out[-3000:]
    one = in_process("train_reward.py", *sizes, "--output-dir", tmp_path / "one", env_extra={"LMHP_CACHE": tmp_path / "cache"},
                     cwd=tmp_path)
    assert "(once)" not in one.stdout, one.stdout[-3000:]  # found the assets the torchrun job built
    rows = {name: (tmp_path / name / "metrics.jsonl").read_text().splitlines() for name in ("one", "two")}
    assert len(rows["one"]) > 2 and rows["one"] == rows["two"]
    assert len(list((tmp_path / "cache").iterdir())) == 1  # the assets' directory: no temporaries, no lock file


def test_a_held_lock_names_its_holder_and_a_cache_lock_leaves_no_file(tmp_path, capsys):
    """hold_lock writes its holder line, which a second taker shows; cache_lock's waiter says for whom it waits, and the
    holder removes the lock file as it leaves."""
    path = tmp_path / ".lmhp-building~entry"
    held = hold_lock(path)
    assert held is not None and lock_holder(path) == f"pid {os.getpid()} on {HOST}"
    assert hold_lock(path) is None  # another taker (its own descriptor: flock is per open file) finds it held
    entered = [cache_lock(tmp_path / "entry", poll_s=0.01)]  # kept: a context left to the collector would leave
    waited = threading.Thread(target=entered[0].__enter__)
    waited.start()
    time.sleep(0.3)
    path.unlink()  # as cache_lock's holder leaves: the file first, then the lock
    held.release()
    waited.join(timeout=10)
    assert f"waiting for pid {os.getpid()} on {HOST} to build {tmp_path / 'entry'}" in capsys.readouterr().out
    assert lock_holder(path) == f"pid {os.getpid()} on {HOST}"  # the waiter holds a new lock file now
    entered[0].__exit__(None, None, None)
    assert not path.exists()
    with cache_lock(tmp_path / "other"):
        assert (tmp_path / ".lmhp-building~other").exists()
    assert not (tmp_path / ".lmhp-building~other").exists()


def test_a_waiter_names_a_holder_whose_line_comes_a_moment_after_its_lock(tmp_path, capsys, monkeypatch):
    """The holder writes its line just after taking the lock: a waiter that looks in between waits for the line rather
    than saying "another process" (three processes starting at once caught it there); a line that never comes is
    "another process"."""
    from filelock import FileLock

    path = tmp_path / ".lmhp-building~entry"
    held = FileLock(path, is_singleton=False, thread_local=False)
    held.acquire()  # taken, no line yet
    entered = [cache_lock(tmp_path / "entry", poll_s=0.01)]
    waited = threading.Thread(target=entered[0].__enter__)
    waited.start()
    time.sleep(0.1)
    path.write_text("pid 12345 on elsewhere")
    time.sleep(0.3)
    path.unlink()
    held.release()
    waited.join(timeout=10)
    entered[0].__exit__(None, None, None)
    out = capsys.readouterr().out
    assert out.count("waiting for") == 1 and "waiting for pid 12345 on elsewhere to build" in out, out
    from lm_human_preference_details.utils import files

    monkeypatch.setattr(files, "HOLDER_LINE_WAIT_S", 0.2)  # (1 s by default)
    held = FileLock(path, is_singleton=False, thread_local=False)
    held.acquire()  # a holder that never writes its line (another tool's lock)
    entered = [cache_lock(tmp_path / "entry", poll_s=0.01)]
    waited = threading.Thread(target=entered[0].__enter__)
    waited.start()
    time.sleep(1.5)
    path.unlink()
    held.release()
    waited.join(timeout=10)
    entered[0].__exit__(None, None, None)
    assert "waiting for another process to build" in capsys.readouterr().out


def test_on_a_file_system_without_locks_a_cache_entry_is_built_unlocked(tmp_path, monkeypatch):
    """NFS without a lock daemon answers flock with ENOLCK: the build runs unlocked (replace=False publishes keep the
    entry whole), and hold_lock leaves the error to its caller (a run directory refuses it in one line)."""
    import errno

    import filelock._unix
    import pytest

    def no_locks(fd: int) -> bool:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(filelock._unix, "lock_fd_nonblocking", no_locks)
    built = []
    with cache_lock(tmp_path / "entry", poll_s=0.01):
        built.append(True)
    assert built
    with pytest.raises(OSError) as e:
        hold_lock(tmp_path / "lock")
    assert e.value.errno == errno.ENOLCK
