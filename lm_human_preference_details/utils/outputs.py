"""The one gate every path a command writes for its user passes (docs/runs.md, "What a command may write"): a run
directory, the label tool's file, sample's output, export's OUT, compare's report and pictures, a benchmark's output.

A command may write at a path that is new, an empty directory, or an output this project wrote and marked as its own
of the same kind (a run directory's `.lmhp-run.json`, an exported directory's `.lmhp-output.json`, a file's own mark),
and there only with --overwrite (or --resume, for a run); anything else is one line before anything is read, written,
renamed or deleted. An output never equals, holds or lies inside one of the command's inputs, nor holds the current
directory. Only this module replaces a directory that exists (`_replace_dir`, private: tests/repository/test_outputs.py
fails on a call from any other module); everyone else asks `atomic_dir`, `write_output_dir` or `new_or_ours`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from lm_human_preference_details.utils import files
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import HOST, OLD, TMP, cache_writable, remove_leftovers

RUN_MARKER = ".lmhp-run.json"  # a run directory's (run/directory.py: its kinds, entries and lock)
OUTPUT_MARKER = ".lmhp-output.json"  # a directory a command wrote whole (export): its kind and the entries it wrote
# the project's own entries of a run directory, never someone else's: the marker and the lock
RUN_OWN = (RUN_MARKER, ".lmhp-run.lock")


def marker(directory: Path) -> Optional[dict]:
    """The mark that makes ``directory`` an output of this project (a run's or a written directory's), or None."""
    for name in (RUN_MARKER, OUTPUT_MARKER):
        try:
            mark = json.loads((Path(directory) / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(mark, dict) and isinstance(mark.get("kind"), str):
            return {**mark, "marker": name}
    return None


def both_paths(path: str | Path) -> set[Path]:
    """``path`` as written (absolute, links not followed) and where its links lead: a deletion in the first removes
    the entry named, a deletion through a link would remove the second."""
    path = Path(path).expanduser()
    return {Path(os.path.abspath(path)), path.resolve()}


def local_inputs(paths: Iterable[Optional[str | Path]]) -> list[Path]:
    """The inputs that are files or directories here (Hugging Face names, oai:NAME and URLs are not), each both as
    written and with its links resolved (`both_paths`)."""
    return [p for path in paths if path and Path(path).expanduser().exists() for p in sorted(both_paths(path))]


def within(inner: Path, outer: Path) -> bool:
    """``inner`` is ``outer`` or lies inside it."""
    return inner == outer or outer in inner.parents


def _an(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


@dataclass(frozen=True)
class Output:
    """A path a command may write, as the gate decided: ``mode`` is "fresh" (nothing of anyone's there), "resume" or
    "overwrite" (an output of ours of ``kind``, the flag given)."""

    path: Path
    kind: str
    mode: str
    flag: str


def check_output_dir(raw: str | Path, kind: str, *, flag: str, overwrite: bool, resume: bool = False,
                     resumable: bool = False, inputs: Iterable[Optional[str | Path]] = (), whole: bool = False,
                     noun: str = "run") -> Output:
    """Whether a command may write the directory ``raw`` (its ``flag``), for an output of ``kind``; writes nothing.
    ``whole``: the command replaces the directory itself (export), so one holding the current directory is refused
    even when new, and one of ours only where it holds nothing but what it wrote. ``noun``: what the command writes,
    in its messages ("run", "output")."""
    path = Path(raw).expanduser()
    _check_reachable(path, flag)
    here = both_paths(path)
    if whole and any(within(Path.cwd().resolve(), out) for out in here):
        raise UserError(f"{flag} {raw} holds the current directory; pass another {flag}")
    link = whole and path.is_symlink()  # a directory replaced whole: never a link's target, nor the link
    if not path.exists() or (path.is_dir() and not link and not any(path.iterdir())):
        _check_inputs(raw, here, inputs, flag, whole or overwrite, noun)
        return Output(path, kind, "fresh", flag)
    if not path.is_dir() or link:
        what = "a symbolic link" if link else "a file"
        raise UserError(f"{flag} {raw} is {what}; pass a directory (it is made if missing)")
    mark = marker(path)
    if mark is None:
        example = sorted(p.name for p in path.iterdir())[0]
        raise UserError(f"{flag} {raw} holds files that are not {_an(noun)} of this project (e.g. {example!r}); "
                        f"{_an(noun)} is never written over them: pass a new or empty directory")
    if mark["kind"] != kind:
        theirs = "run" if mark["marker"] == RUN_MARKER else "export"
        raise UserError(f"{flag} {raw} holds {_an(mark['kind'])} {theirs}, and this is {_an(kind)} {noun}: "
                        f"pass another {flag}")
    if not (resume or overwrite):
        again = ("--resume to continue it, or --overwrite to delete it and start again" if resumable
                 else f"--overwrite to replace it, or another {flag}")
        raise UserError(f"{raw} already holds {_an(kind)} {noun}; pass {again}")
    _check_inputs(raw, here, inputs, flag, whole or overwrite, noun)
    if overwrite and any(within(Path.cwd().resolve(), out) for out in here):
        raise UserError(f"--overwrite would delete the {noun} in {raw}, which holds the current directory; "
                        f"pass another {flag}")
    if overwrite and whole:
        foreign = sorted(set(p.name for p in path.iterdir()) - set(mark.get("entries", ())) - {OUTPUT_MARKER})
        if foreign:
            raise UserError(f"{flag} {raw} holds {foreign[0]!r}, which this project did not write there; --overwrite "
                            f"replaces only what it wrote: move it away, or pass another {flag}")
    return Output(path, kind, "resume" if resume else "overwrite", flag)


def check_output_file(raw: str | Path, *, flag: str, inputs: Iterable[Optional[str | Path]] = (),
                      ours: Optional[Callable[[Path], bool]] = None, what: str = "file",
                      writer: str = "command of this project") -> Path:
    """Whether a command may write the file ``raw`` (its ``flag``): not a directory's name, nor a link, nor under a
    file, never an input; an existing file only where ``ours`` says this project wrote it (None: never); writes
    nothing -> the path."""
    path = Path(raw).expanduser()
    if str(raw).endswith(("/", os.sep)) or path.name in ("", ".", "..") or (path.is_dir() and not path.is_symlink()):
        raise UserError(f"{flag} {raw} names a directory; pass the path of a {what} to write, such as "
                        f"{os.path.join(str(raw), 'labels.json' if what == 'label file' else 'out')}")
    if path.is_symlink():
        raise UserError(f"{flag} {raw} is a symbolic link; it is never written through nor replaced: pass another "
                        f"{flag}")
    _check_reachable(path, flag)
    for given in local_inputs(inputs):
        if any(within(out, given) for out in both_paths(path)):
            raise UserError(f"{flag} {raw} is, or lies inside, the input {given}; pass another {flag}")
    if path.exists() and (ours is None or not ours(path)):
        raise UserError(f"{flag} {raw} exists and no {writer} wrote it; it is never written over: move it away, or "
                        f"pass another {flag}")
    return path


def first_line_starts(prefix: bytes) -> Callable[[Path], bool]:
    """``ours`` for `check_output_file` and `new_or_ours`: a file whose first line starts with ``prefix`` (a report's
    own heading) is one this project wrote."""
    def ours(path: Path) -> bool:
        with open(path, "rb") as f:
            return f.readline().startswith(prefix)
    return ours


def _check_inputs(raw, here: set[Path], inputs, flag: str, deletes: bool, noun: str) -> None:
    """The output never lies inside (nor is) an input; where it ``deletes`` what it holds, it never holds one."""
    for given in local_inputs(inputs):
        if any(within(out, given) for out in here):
            raise UserError(f"{flag} {raw} is, or lies inside, the input {given}; writing there would change the "
                            f"input: pass another {flag}")
        if deletes and any(within(given, out) for out in here):
            raise UserError(f"--overwrite would delete {given}, an input of this {noun}, which lies in {raw}; "
                            f"pass another {flag}")


def _check_reachable(path: Path, flag: str) -> None:
    """A path a command can make: not under a file, not a link to nothing, not under one."""
    for up in [path, *path.parents]:
        if up.is_symlink() and not up.exists():
            raise UserError(f"{flag} {path} is, or lies under, a symbolic link to nothing ({up} -> "
                            f"{os.readlink(up)}); pass another {flag}")
        if up != path and up.exists() and not up.is_dir():
            raise UserError(f"{flag} {path} lies under the file {up}; pass another {flag}")


@contextlib.contextmanager
def _temporary_beside(final: Path) -> Iterator[Path]:
    """A new temporary directory beside ``final`` (named as a write under way, so `files.remove_leftovers` knows it),
    readable as the umask allows; removed after the block, whatever happened."""
    with cache_writable(final.parent):
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(final.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP}~{HOST}~{os.getpid()}~{final.name}~", dir=final.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it owner-only; a renamed directory should not be
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _replace_dir(target: Path, final: Path) -> None:
    """Put the directory ``target`` at ``final``, the directory there moved aside first (``.lmhp-old~...``: a kill
    between the renames leaves it for `files.remove_leftovers` to put back), then deleted. Private: only the gate's
    own writers call it, each after deciding that ``final`` is the project's own."""
    old = final.with_name(f"{OLD}~{HOST}~{os.getpid()}~{final.name}")
    os.replace(final, old)
    os.replace(target, final)
    shutil.rmtree(old, ignore_errors=True)


def _put_new(target: Path, final: Path) -> bool:
    """Rename the directory ``target`` onto ``final`` where nothing is, or an empty directory -> True; False where
    something (a file, a directory with entries) is there by now: it stays as it was."""
    try:
        os.rename(target, final)
        return True
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            return False
        raise


def _ours_to_replace(final: Path) -> bool:
    """Whether the existing directory ``final`` is the project's own to replace without asking: an entry of the cache,
    or an entry of a run directory (ours by its marker, as the run directory's gate decided when the run began)."""
    final = Path(os.path.abspath(final))
    if final.is_symlink():
        return False
    if within(final, Path(os.path.abspath(files.CACHE_DIR))):
        return True
    return any((up / RUN_MARKER).is_file() for up in list(final.parents)[:2])  # RUN/NAME, RUN/checkpoints/NAME


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary directory beside ``final``; put it at ``final`` only if the block succeeds. Where a directory
    is there: ``replace=False`` (a cache entry, the same whoever builds it) keeps it and drops this one; else it is
    replaced only where it is the project's own (`_ours_to_replace`: a run's entry, the cache's), and anything else
    there is a FileExistsError, left as it was."""
    final = Path(final)
    with _temporary_beside(final) as tmp:
        yield tmp
        if _put_new(tmp, final) or not replace:
            return
        if not final.is_dir() or not _ours_to_replace(final):
            raise FileExistsError(errno.EEXIST, "not a directory this project wrote", str(final))
        _replace_dir(tmp, final)


def claim_dir(output: Output) -> Path:
    """Make the new (or empty) directory the gate allowed for a command that writes entries inside it (a benchmark's
    --out), marked as this project's of ``output.kind`` so that its own entries may be replaced -> its path."""
    if output.mode != "fresh":
        raise UserError(f"{output.flag} {output.path} already holds {_an(output.kind)} output; pass a new or empty one")
    output.path.mkdir(parents=True, exist_ok=True)
    with files.atomic_path(output.path / RUN_MARKER) as tmp:
        tmp.write_text(json.dumps({"kind": output.kind, "by": "lm-human-preference-details"}) + "\n")
    return output.path


@contextlib.contextmanager
def write_output_dir(output: Output) -> Iterator[Path]:
    """Yield a temporary directory for the output the gate allowed (`check_output_dir`); when the block succeeds, mark
    it as ours (its kind, the entries written) and put it at ``output.path``: where nothing (or an empty directory) is,
    or, for "overwrite", over the output of ours checked again now. Anything that appeared there meanwhile stays as it
    was: one line."""
    final = output.path
    with _temporary_beside(final) as tmp:
        yield tmp
        entries = sorted(p.name for p in tmp.iterdir())
        (tmp / OUTPUT_MARKER).write_text(json.dumps({"kind": output.kind, "entries": entries,
                                                     "by": "lm-human-preference-details"}, indent=2) + "\n")
        if _put_new(tmp, final):
            return
        mark = marker(final) if output.mode == "overwrite" and final.is_dir() and not final.is_symlink() else None
        if mark is None or mark["kind"] != output.kind or set(p.name for p in final.iterdir()) - {
                OUTPUT_MARKER, *mark.get("entries", ())}:
            raise UserError(f"{output.flag} {final} appeared or changed while this command ran, and this command did "
                            "not write it; it is left as it is: move it away and run the same command again")
        _replace_dir(tmp, final)


@contextlib.contextmanager
def new_or_ours(final: str | os.PathLike, ours: Callable[[Path], bool]) -> Iterator[Path]:
    """Yield a temporary path beside the file ``final``; when the block succeeds, put it at ``final`` only where no
    entry has that name, or over a regular file that ``ours`` says this project wrote (never over a file the project
    did not write, never through a link). The name is taken with a hard link, which fails if anything took it since the
    check, so nothing that appears meanwhile is replaced. Else FileExistsError naming ``final``."""
    final = Path(final)
    with _temporary_beside(final) as tmp:
        target = tmp / final.name
        yield target
        if not _take_name(target, final):
            if final.is_symlink() or not final.is_file() or not ours(final):
                raise FileExistsError(errno.EEXIST, "not a file this project wrote", str(final))
            os.replace(target, final)  # a rename replaces the entry itself, never what a link points to


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
