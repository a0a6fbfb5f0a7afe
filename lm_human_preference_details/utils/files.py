"""Files on disk: the cache directory that downloads and built assets live in, its build locks, and atomic writes.

An atomic write goes to a temporary beside its target, named ``.lmhp-tmp~HOST~PID~NAME~XXXX`` (a name no user file
has), and is renamed onto the target only when complete. A process killed half-way leaves that temporary behind;
the next atomic write into the same directory removes it once its owner (same host, that pid) is gone.

A cache entry (the offline task's assets, a download, a converted ``oai:`` model) is built once however many processes
and nodes reach it: the builder holds the entry's lock (`cache_lock`), the others wait for it, polling, then find the
entry built. A directory entry is published with ``outputs.atomic_dir(replace=False)``: a concurrent publish (a file
system without locks) keeps the first one, and a reader never finds the directory missing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.torchrun import torchrun_rank

CACHE_DIR = Path(os.environ.get("LMHP_CACHE") or Path.home() / ".cache" / "lm_human_preference_details")
TMP, OLD = ".lmhp-tmp", ".lmhp-old"  # the prefixes of a write under way and of the target it replaces
BUILDING = ".lmhp-building"  # the prefix of a cache entry's lock file, beside the entry
HOST = socket.gethostname().replace("~", "-")
# how long a process whose view of a directory all nodes share differs from process 0's looks again before the job
# ends: a file system shared over NFS may show another node's new files after its attribute cache expires (acdirmin: 30 s)
SHARED_DIR_WAIT_S = 30.0
ANOTHER = "another process"  # a lock whose holder line cannot be read (yet)
HOLDER_LINE_WAIT_S = 1.0  # how long a waiter looks for the holder's line before it says "another process"


def _owner_gone(name: str) -> bool:
    """Whether the process that made our temporary ``name`` (``PREFIX~HOST~PID~...``) has ended."""
    parts = name.split("~")
    if len(parts) < 4 or parts[1] != HOST or not parts[2].isdigit():
        return False  # another machine's (a shared file system): not ours to judge
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


def cannot_write_in(directory: Path) -> str | None:
    """Why this process cannot make an entry in the existing ``directory`` (the system's words), or None. A real probe,
    a directory made and removed: os.access says yes to root on a read-only or special file system."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".lmhp-write-check-", dir=directory))
    except OSError as e:
        return str(e.strerror or e)
    return None


def remove_leftovers(directory: str | os.PathLike) -> list[str]:
    """Remove the temporaries that killed atomic writes left in ``directory``; put back a target whose
    replacement never arrived. Only our own names are looked at; -> the names handled."""
    directory = Path(directory)
    handled = []
    if not directory.is_dir():
        return handled
    for entry in sorted(directory.iterdir()):
        name = entry.name
        if not (name.startswith(TMP + "~") or name.startswith(OLD + "~")) or not _owner_gone(name):
            continue
        if name.startswith(OLD + "~"):
            final = directory / "~".join(name.split("~")[3:])
            if not final.exists():  # killed between the two renames: the previous version comes back
                os.replace(entry, final)
                handled.append(name)
                continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:  # a file, or a link: removed itself, never what it points to
            entry.unlink(missing_ok=True)
        handled.append(name)
    return handled


# how a cache that cannot be written fails: a read-only file system, a file where a directory should be, no permission
NOT_WRITABLE_ERRNOS = (errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EACCES, errno.EPERM)


@contextlib.contextmanager
def cache_writable(directory: Path) -> Iterator[None]:
    """A directory under CACHE_DIR that cannot be made or written in: one line naming LMHP_CACHE and the fix, not an
    OSError's traceback (elsewhere the OSError goes on as it is)."""
    try:
        yield
    except OSError as e:
        if e.errno not in NOT_WRITABLE_ERRNOS or not Path(directory).absolute().is_relative_to(CACHE_DIR.absolute()):
            raise

        raise UserError(f"the cache LMHP_CACHE={CACHE_DIR} cannot be written ({directory}: {e.strerror or e}); set "
                        "LMHP_CACHE to a directory this process can write (default: ~/.cache/lm_human_preference_"
                        "details)") from None


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside the file ``final``; rename it onto ``final`` only if the block succeeds.

    Nothing half-written is ever visible at ``final``: on any error the temporary is removed. A directory is written
    through utils/outputs.py (`atomic_dir`), which alone decides whether one that exists may be replaced.
    """
    final = Path(final)
    with cache_writable(final.parent):
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(final.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP}~{HOST}~{os.getpid()}~{final.name}~", dir=final.parent))
    try:
        yield tmp / final.name
        if (tmp / final.name).is_dir():
            raise IsADirectoryError(errno.EISDIR, "a directory: write it with outputs.atomic_dir", str(final))
        os.replace(tmp / final.name, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def cache_lock(entry: str | os.PathLike, poll_s: float = 1.0) -> Iterator[None]:
    """Hold the build lock of the cache entry ``entry`` (``.lmhp-building~NAME`` beside it, `hold_lock`) while the
    block builds it. A process that finds it held waits, polling (never in a collective: the wait is as long as the
    build, past NCCL's 10 minutes if need be), and says for whom once; the kernel drops a dead builder's lock. The
    holder removes the lock file as it leaves. Where no lock can be taken (a read-only cache, a file system without
    locks) the block runs unlocked."""
    path = Path(entry).parent / f"{BUILDING}~{Path(entry).name}"
    lock = _take(path, poll_s)
    try:
        yield
    finally:
        if lock is not None:
            path.unlink(missing_ok=True)  # before the lock is dropped: a waiter then finds its file gone, and retries
            lock.release()


def _take(path: Path, poll_s: float) -> FileLock | None:
    """The lock file ``path`` held by this process, waited for; None where no lock can be taken."""
    said, name_by = False, time.monotonic() + HOLDER_LINE_WAIT_S  # until name_by, a nameless holder is looked at again
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = hold_lock(path)
        except OSError:  # no locks on this file system (ENOLCK), or no writing: replace=False publishes keep an entry whole
            return None
        if lock is not None:
            return lock
        holder = lock_holder(path)
        if holder == ANOTHER and not said and time.monotonic() < name_by:  # a holder writes its line just after
            time.sleep(min(poll_s, 0.05))  # taking the lock: look again soon
            continue
        if not said and torchrun_rank() == "0":  # under torchrun, process 0 says it
            print(f"waiting for {holder} to build {path.parent / path.name.split('~', 1)[1]}", flush=True)
        said = True
        time.sleep(poll_s)


def hold_lock(path: Path) -> FileLock | None:
    """filelock's exclusive lock on the file ``path`` (flock: the kernel drops it when its process dies), taken without
    waiting, with this process's holder line written in the file -> the lock, or None when another holds it. A lock
    file its holder removed while this process opened it is not taken (filelock sees it unlinked): None, try again.
    An OSError (a file system without locks: filelock's soft-lock fallback is off, as a killed holder would leave
    its file locked for ever) is the caller's."""
    lock = FileLock(path, is_singleton=False, thread_local=False, fallback_to_soft=False)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        return None
    try:
        path.write_text(f"pid {os.getpid()} on {HOST}")  # the holder line others show (filelock writes nothing)
    except BaseException:
        lock.release()
        raise
    return lock


def lock_holder(path: Path) -> str:
    """Who holds the lock file ``path``: its holder line, or "another process"."""
    try:
        return path.read_bytes()[:200].decode(errors="replace").strip() or ANOTHER
    except OSError:
        return ANOTHER


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes, read a MiB at a time (downloads' sidecars, checkpoints' SHA256SUMS)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def synced_temporary(final: Path, data: bytes) -> Path:
    """``data`` in a new temporary file beside ``final`` (named as a write under way, so `remove_leftovers` knows it),
    fsynced and readable as the umask allows (mkstemp makes it owner-only) -> its path, for the caller to link or
    rename into place and then remove; a write that fails removes it."""
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP}~{HOST}~{os.getpid()}~{final.name}~", dir=final.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)
