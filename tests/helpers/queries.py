"""Small query files in the schemas of the baseline's Hugging Face sources."""

from __future__ import annotations

import zipfile


def write_tldr_zip(path, lines: list[bytes]):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("corpus-webis-tldr-17.json", b"".join(line + b"\n" for line in lines))
    return path
