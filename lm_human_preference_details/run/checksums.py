"""A checkpoint's SHA256SUMS: written beside its files, checked before it is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import sha256_of

CHECKSUMS = "SHA256SUMS"  # beside state.pt, in sha256sum's format: `sha256sum -c SHA256SUMS` checks it by hand too


def write_checksums(directory: Path) -> None:
    """DIRECTORY/SHA256SUMS: the sha256 of each file in ``directory``, one ``HEX  NAME`` line each (sha256sum's)."""
    files = sorted(p for p in Path(directory).iterdir() if p.is_file() and p.name != CHECKSUMS)
    (Path(directory) / CHECKSUMS).write_text("".join(f"{sha256_of(p)}  {p.name}\n" for p in files))


def verify_checksums(path: Path, fall_back: Callable[[Path], str]) -> bool:
    """Every file of the checkpoint ``path`` is named in its SHA256SUMS with its sha256, else a one-line UserError
    naming the file and what to do (``fall_back(path)``); -> False when there is no SHA256SUMS to check (a checkpoint
    saved before checksums were written, or one whose sums file was deleted: the caller says it is unverified)."""
    sums = Path(path) / CHECKSUMS
    if not sums.is_file():
        return False
    listed: dict[str, str] = {}
    for number, line in enumerate(sums.read_text(errors="replace").splitlines(), 1):
        digest, _, name = line.partition("  ")
        if not name or len(digest) != 64 or name in listed:
            raise UserError(f"checkpoint {path} is corrupt: line {number} of {sums} is not one `SHA256  NAME` of a file "
                            f"named once; {fall_back(path)}")
        listed[name] = digest
    files = {p.name for p in Path(path).iterdir() if p.name != CHECKSUMS}
    unnamed = sorted(files - set(listed))  # an empty SHA256SUMS names no file: state.pt is unnamed
    if unnamed:
        raise UserError(f"checkpoint {path} is corrupt: {sums} does not name {Path(path) / unnamed[0]}, so it cannot be "
                        f"checked; {fall_back(path)}")
    for name, digest in listed.items():
        file = Path(path) / name
        if not file.is_file() or sha256_of(file) != digest:
            raise UserError(f"checkpoint {path} is corrupt: {file} does not match its sha256 in {sums}; {fall_back(path)}")
    return True


def unverified(path: Path) -> str:
    """The line a checkpoint without SHA256SUMS is loaded with (docs/checkpoints.md: a warning, not a refusal)."""
    return (f"warning: checkpoint {path} has no {CHECKSUMS}, so its files are loaded unverified (saved before "
            f"checksums existed, or the file was deleted); if it may be damaged, delete {path} to resume from an "
            "earlier checkpoint")
