"""Downloads: a URL fetched once into the cache, atomically, sha256-checked and retried; OpenAI's files with a mirror.

We keep this small downloader rather than `pooch`: `pooch.retrieve` neither retries nor re-checks a cached copy
when no hash is known (OpenAI publishes none), and retries a 404 like a dropped connection; wrapping it to keep
those behaviours (tests/utils/test_downloads.py) would take as many lines as this module.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import itertools
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator

from huggingface_hub import constants

from lm_human_preference_details.utils import files
from lm_human_preference_details.utils.errors import UserError, doing
from lm_human_preference_details.utils.files import atomic_path, cache_lock, sha256_of
from lm_human_preference_details.utils.progress import progress

OAI_URL = "https://openaipublic.blob.core.windows.net/lm-human-preferences"  # OpenAI's public container
HF_MIRROR = "vwxyzjn/lm-human-preferences"  # Hugging Face dataset repo mirroring OpenAI's label and tldr files


class DownloadError(UserError):
    """A URL could not be downloaded; ``reason`` is the short cause, ``str()`` the full one-line advice."""

    def __init__(self, url: str, reason: str, cache_path: Path, offline: bool):
        self.url, self.reason, self.cache_path = url, reason, cache_path
        where = "you appear to be offline: " if offline else ""
        super().__init__(f"cannot download {url} ({reason}); {where}download it on a machine with internet "
                         f"and pass its local path, or place it at {cache_path}")


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout: float = 5.0) -> bool:
    """Whether the Hugging Face Hub answers at all, asked once per process with a short timeout.

    Without it, an offline machine spends about a minute in the hub client's retries before any message.
    """
    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:  # an answer, even an error page, means the hub is there
        return True
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
        return False
    return True


def require_hub(what: str, fix: str) -> None:
    """A one-line UserError at once when ``what`` needs the Hugging Face Hub and the hub cannot be reached."""
    if not constants.HF_HUB_OFFLINE and not hub_reachable():
        raise UserError(f"cannot reach the Hugging Face Hub ({constants.ENDPOINT}) for {what}: you appear to be offline; "
                        f"set HF_HUB_OFFLINE=1 to use what the Hugging Face cache holds, or {fix}")


def is_url(source: str) -> bool:
    """A URL (scheme://...) rather than a local path."""
    return bool(re.match(r"^[a-z][a-z0-9+.-]*://", source, re.IGNORECASE))


def is_downloaded(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a copy that a download put in a cache (ours or the Hugging Face Hub's), not a user's file."""
    path = Path(path).resolve()
    return any(path.is_relative_to(Path(cache).expanduser().resolve()) for cache in (files.CACHE_DIR, constants.HF_HUB_CACHE))


def cache_path_of(url: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``fetch`` keeps ``url``: files.CACHE_DIR/host/path, like the original's /tmp/gcs-cache/bucket/path."""
    parts = urllib.parse.urlsplit(url)
    segments = [urllib.parse.unquote(s) for s in parts.path.split("/") if s]
    if any(s in (".", "..") or os.sep in s for s in segments):
        raise UserError(f"URL {url} has an unsafe path; pass a local path instead")
    name = segments.pop() if segments else "index"
    if parts.query:
        name += "-" + hashlib.sha256(parts.query.encode()).hexdigest()[:12]
    return Path(cache_dir or files.CACHE_DIR, parts.netloc.replace(":", "_"), *segments, name)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _cached_ok(path: Path, sha256: str | None) -> bool:
    """True if ``path`` holds a usable copy; writes the sidecar for a file a user placed there by hand."""
    if not path.is_file():
        return False
    actual = sha256_of(path)
    recorded = _sidecar(path).read_text().strip() if _sidecar(path).is_file() else None
    if (recorded is not None and recorded != actual) or (sha256 is not None and sha256 != actual):
        return False
    if recorded is None:
        try:
            with atomic_path(_sidecar(path)) as tmp:
                tmp.write_text(actual + "\n")
        except OSError:  # a read-only cache: the sidecar is only a convenience
            pass
    return True


def _read_chunk(response, received: int) -> bytes:
    """The next MiB of a response; a read that fails mid-stream (reset, TLS error) is a dropped connection, retried."""
    try:
        return response.read(1 << 20)
    except OSError as e:  # without this, fetch would report a network error as a cache write error
        raise ConnectionError(f"connection failed after {received} bytes ({e})") from None


def _validator(headers) -> str | None:
    """What identifies this version of a response's file for an If-Range request: a strong ETag, else its date."""
    etag = headers.get("ETag")
    return etag if etag and not etag.startswith("W/") else headers.get("Last-Modified")


def _download_into(url: str, part: Path, sha256: str | None, resume: dict) -> str:
    """One attempt: stream ``url`` into ``part``, continuing the bytes an earlier attempt left there when the server
    says they are of the same version (a Range request with If-Range: ``resume["validator"]``), else from the start;
    -> the file's sha256 once complete and checked."""
    have = part.stat().st_size if part.exists() else 0
    validator = resume.get("validator")
    headers = {"Range": f"bytes={have}-", "If-Range": validator} if have and validator else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as response:
        if getattr(response, "status", 200) != 206:  # the whole file (it changed, or no range is served)
            have = 0
        resume["validator"] = _validator(response.headers)
        size = response.headers.get("Content-Length")
        total = have + int(size) if size is not None else None
        h, received = hashlib.sha256(), have
        if have:
            with open(part, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        with open(part, "ab" if have else "wb") as f, progress(
            total=total, unit="B", unit_scale=True, desc=f"downloading {part.name}",
            disable=total is None or total < (8 << 20), leave=False,
        ) as bar:
            bar.update(have)
            for chunk in iter(lambda: _read_chunk(response, received), b""):
                f.write(chunk)
                h.update(chunk)
                received += len(chunk)
                bar.update(len(chunk))
        if total is not None and received != total:  # http.client returns a short body without an error
            raise ConnectionError(f"connection closed after {received} of {total} bytes")
    if sha256 is not None and h.hexdigest() != sha256:
        raise UserError(f"{url} downloaded with sha256 {h.hexdigest()}, expected {sha256}; "
                        "the file changed upstream or the checksum is wrong")
    return h.hexdigest()


def fetch(source: str, *, cache_dir: str | os.PathLike | None = None, sha256: str | None = None,
          retries: int = 3, backoff: float = 1.0) -> Path:
    """A local path as is, or an http(s) URL downloaded into the cache once (atomic, sha256-checked, retried)."""
    if not is_url(source):
        path = Path(source).expanduser()
        if not path.exists():
            raise UserError(f"{source} does not exist; pass an existing local path or an http(s) URL")
        return path
    if urllib.parse.urlsplit(source).scheme.lower() not in ("http", "https"):
        raise UserError(f"cannot fetch {source}: only http(s) URLs and local paths are supported")
    dest = cache_path_of(source, cache_dir)
    if _cached_ok(dest, sha256):
        return dest
    with cache_lock(dest):  # one process downloads, however many reach it; the others wait, then find it
        return _fetch_locked(source, dest, sha256, retries, backoff)


def _fetch_locked(source: str, dest: Path, sha256: str | None, retries: int, backoff: float) -> Path:
    """`fetch`'s download of ``source`` into ``dest``, retried, under its cache lock."""
    if _cached_ok(dest, sha256):  # another process downloaded it while this one waited
        return dest
    dest.unlink(missing_ok=True)  # a corrupted or mismatching copy: download it again
    _sidecar(dest).unlink(missing_ok=True)
    try:
        with atomic_path(dest) as part:  # kept across the attempts: a retry continues where the last one stopped
            digest = _attempts(source, dest, part, sha256, max(retries, 1), backoff)
        with atomic_path(_sidecar(dest)) as tmp:
            tmp.write_text(digest + "\n")
    except OSError as e:  # not the network (_attempts says that): the cache itself
        raise UserError(f"cannot write {dest} ({e}); set LMHP_CACHE to a writable directory") from None
    return dest


def _attempts(source: str, dest: Path, part: Path, sha256: str | None, retries: int, backoff: float) -> str:
    """Download ``source`` into ``part`` in up to ``retries`` attempts, each continuing the last; -> its sha256."""
    resume: dict = {}
    for attempt in range(retries):
        last = attempt == retries - 1
        try:
            with doing(f"downloading {source} into {dest}"):
                return _download_into(source, part, sha256, resume)
        except urllib.error.HTTPError as e:
            if e.code < 500 or last:  # a 4xx answer will not change on a retry
                raise DownloadError(source, f"HTTP {e.code} {e.reason}", dest, offline=False) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as e:
            if last:
                raise DownloadError(source, str(getattr(e, "reason", None) or e), dest, offline=True) from None
        time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")


def fetch_many(sources: Iterable[str], *, workers: int = 16, lookahead: int = 256,
               cache_dir: str | os.PathLike | None = None) -> Iterator[Path]:
    """``fetch`` of each source, yielded in order, ``workers`` downloads at a time, at most ``lookahead`` ahead.

    The first failure ends the stream with its one-line error; the downloads not started yet are cancelled.
    """
    total = len(sources) if hasattr(sources, "__len__") else None
    sources = iter(sources)
    pool = ThreadPoolExecutor(max_workers=workers)
    # shown only when the files take more than a few seconds (downloads, not cached copies)
    bar = progress(total=total, desc="fetching files", unit="file", delay=3, leave=False)
    try:
        pending = deque(pool.submit(fetch, s, cache_dir=cache_dir) for s in itertools.islice(sources, lookahead))
        while pending:
            path = pending.popleft().result()
            for s in itertools.islice(sources, 1):
                pending.append(pool.submit(fetch, s, cache_dir=cache_dir))
            bar.update()
            yield path
    finally:
        bar.close()
        pool.shutdown(wait=True, cancel_futures=True)


def fetch_oai(source: str, *, cache_dir: str | os.PathLike | None = None, retries: int = 3,
              backoff: float = 1.0) -> Path:
    """``fetch``, falling back to the Hugging Face mirror of OpenAI's files when OpenAI's URL fails."""
    try:
        return fetch(source, cache_dir=cache_dir, retries=retries, backoff=backoff)
    except DownloadError as first:
        if not source.startswith(OAI_URL + "/"):
            raise
        # the mirror keeps OpenAI's layout without the leading labels/ (labels/sentiment/x.json -> sentiment/x.json)
        filename = source[len(OAI_URL) + 1 :].removeprefix("labels/")
        try:
            from huggingface_hub import hf_hub_download  # the hub client's download stack (~1 s): the mirror is a rare path

            require_hub(f"the mirror {HF_MIRROR}", "download the file on a machine with internet and pass its local path")

            return Path(hf_hub_download(repo_id=HF_MIRROR, repo_type="dataset", filename=filename))
        except Exception as e:  # any hub failure (offline, missing file) ends in the one error below
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(
                f"cannot get {source}: OpenAI's URL failed ({first.reason}) and the Hugging Face mirror "
                f"{HF_MIRROR}/{filename} failed ({reason}); download either on a machine with internet and pass "
                f"its local path, or place it at {first.cache_path}"
            ) from None
