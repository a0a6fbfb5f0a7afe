"""Files on disk: the cache directory that downloads and built assets live in, and atomic writes.

An atomic write goes to a temporary beside its target, named ``.lmhp-tmp~HOST~PID~NAME~XXXX`` (a name no user file
has), and is renamed onto the target only when complete. A process killed half-way leaves that temporary behind;
the next atomic write into the same directory removes it once its owner (same host, that pid) is gone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Callable, Iterator

CACHE_DIR = Path(os.environ.get("LMHP_CACHE") or Path.home() / ".cache" / "lm_human_preference_details")
TMP, OLD = ".lmhp-tmp", ".lmhp-old"  # the prefixes of a write under way and of the target it replaces
HOST = socket.gethostname().replace("~", "-")
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# how a full disk reads where no errno comes with it: the C library's words (safetensors' SafetensorError quotes them),
# and torch.save's RuntimeError (its zip writer checks how far a write got: "unexpected pos N vs M", "PytorchStreamWriter
# failed writing file ...")
FULL_MESSAGES = (*map(os.strerror, FULL_ERRNOS), "unexpected pos", "file write failed")


def disk_full(error: BaseException) -> bool:
    """Whether ``error`` says a write failed for want of space, whatever its class (OSError, torch's RuntimeError,
    safetensors' SafetensorError): an OSError by its errno, any other exception by its message."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno in FULL_ERRNOS
    return isinstance(error, Exception) and any(m in str(error) for m in FULL_MESSAGES)


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


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; rename it onto ``final`` only if the block succeeds.

    Nothing half-written is ever visible at ``final``: on any error the temporary is removed.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP}~{HOST}~{os.getpid()}~{final.name}~", dir=final.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it owner-only; a renamed directory should not be
    target = tmp if is_dir else tmp / final.name
    try:
        yield target
        if is_dir:
            if final.exists():
                old = final.with_name(f"{OLD}~{HOST}~{os.getpid()}~{final.name}")
                os.replace(final, old)
                os.replace(target, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(target, final)
        else:
            os.replace(target, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes, read a MiB at a time (downloads' sidecars, checkpoints' SHA256SUMS)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def new_or_ours(final: str | os.PathLike, ours: Callable[[Path], bool]) -> Iterator[Path]:
    """Yield a temporary path beside the file ``final``; when the block succeeds, put it at ``final`` only where no
    entry has that name, or over a regular file that ``ours`` says this project wrote (docs/runs.md: never over a file
    the project did not write, never through a link). The name is taken with a hard link, which fails if anything took
    it since the check, so nothing that appears meanwhile is replaced. Else FileExistsError naming ``final``."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP}~{HOST}~{os.getpid()}~{final.name}~", dir=final.parent))
    target = tmp / final.name
    try:
        yield target
        if not _take_name(target, final):
            if final.is_symlink() or not final.is_file() or not ours(final):
                raise FileExistsError(errno.EEXIST, "not a file this project wrote", str(final))
            os.replace(target, final)  # a rename replaces the entry itself, never what a link points to
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _take_name(target: Path, final: Path) -> bool:
    """Put ``target`` at ``final`` if no entry has that name (then True), never over one; False if one has."""
    try:
        os.link(target, final)
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: claim the name exclusively, then rename onto the claim
        try:
            os.close(os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW))
        except FileExistsError:
            return False
        os.replace(target, final)
        return True
