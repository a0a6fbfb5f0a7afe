"""Downloads: cached once, atomic, sha256-checked, retried; OpenAI's files with the Hugging Face mirror."""

from __future__ import annotations

import hashlib

import pytest
from helpers.http_server import server_max_in_flight, server_ranges
from helpers.processes import free_port

from lm_human_preference_details.utils import downloads
from lm_human_preference_details.utils.downloads import DownloadError, cache_path_of, fetch, fetch_many, fetch_oai
from lm_human_preference_details.utils.errors import UserError


# ------------------------------------------------------------------------------ fetch (the `server` fixture: conftest.py)
def test_fetch_local_path(tmp_path):
    path = tmp_path / "labels.json"
    path.write_text("[]")
    assert fetch(str(path)) == path
    with pytest.raises(UserError, match="does not exist"):
        fetch(str(tmp_path / "nope.json"))
    with pytest.raises(UserError, match="only http"):
        fetch("gs://bucket/file.json")


def test_fetch_downloads_once_and_records_sha256(server, tmp_path):
    base, www, requests = server
    (www / "sub").mkdir()
    (www / "sub" / "labels.json").write_text('{"a": 1}')
    cache = tmp_path / "cache"
    path = fetch(f"{base}/sub/labels.json", cache_dir=cache)
    assert path == cache_path_of(f"{base}/sub/labels.json", cache)
    assert path.is_relative_to(cache) and path.parts[-2:] == ("sub", "labels.json")
    assert path.read_text() == '{"a": 1}'
    sidecar = path.with_name("labels.json.sha256")
    assert sidecar.read_text().strip() == hashlib.sha256(b'{"a": 1}').hexdigest()
    assert fetch(f"{base}/sub/labels.json", cache_dir=cache) == path
    assert requests == ["/sub/labels.json"]  # the second call used the cache

    path.write_text('{"a": 2}')  # corrupted cache: sha256 no longer matches the sidecar
    assert fetch(f"{base}/sub/labels.json", cache_dir=cache).read_text() == '{"a": 1}'
    assert requests == ["/sub/labels.json"] * 2


def test_fetch_checks_the_given_sha256(server, tmp_path):
    base, www, requests = server
    (www / "f.txt").write_text("hello")
    good = hashlib.sha256(b"hello").hexdigest()
    cache = tmp_path / "cache"
    assert fetch(f"{base}/f.txt", cache_dir=cache, sha256=good).read_text() == "hello"
    with pytest.raises(UserError, match="expected 0000"):
        fetch(f"{base}/f.txt", cache_dir=cache, sha256="0" * 64, retries=1)
    dest = cache_path_of(f"{base}/f.txt", cache)
    assert not dest.exists() and list(dest.parent.iterdir()) == []  # nothing half-written, no sidecar


def test_fetch_accepts_a_file_placed_in_the_cache_by_hand(tmp_path):
    url = "http://127.0.0.1:9/never/contacted.json"
    dest = cache_path_of(url, tmp_path)
    dest.parent.mkdir(parents=True)
    dest.write_text("[]")
    assert fetch(url, cache_dir=tmp_path) == dest
    assert dest.with_name("contacted.json.sha256").read_text().strip() == hashlib.sha256(b"[]").hexdigest()


def test_fetch_leaves_no_partial_file_when_the_connection_drops(server, tmp_path):
    base, _, requests = server
    with pytest.raises(DownloadError, match="closed after 10 of 100 bytes") as e:
        fetch(f"{base}/truncated.bin", cache_dir=tmp_path, retries=2, backoff=0)
    assert requests == ["/truncated.bin"] * 2
    assert not e.value.cache_path.exists() and list(e.value.cache_path.parent.iterdir()) == []


def test_a_retry_continues_a_cut_download_from_where_it_stopped(server, tmp_path):
    """The second attempt asks for the rest of the same version (Range + If-Range), not the whole file."""
    base, _, requests = server
    path = fetch(f"{base}/resumable.bin", cache_dir=tmp_path, retries=2, backoff=0)
    assert path.read_bytes() == bytes(range(100))
    assert server_ranges() == [None, "bytes=10-"]
    assert path.with_name("resumable.bin.sha256").read_text().strip() == hashlib.sha256(bytes(range(100))).hexdigest()
    assert sorted(p.name for p in path.parent.iterdir()) == ["resumable.bin", "resumable.bin.sha256"]


def test_fetch_retries_server_errors_but_not_404(server, tmp_path):
    base, _, requests = server
    assert fetch(f"{base}/flaky.txt", cache_dir=tmp_path, retries=2, backoff=0).read_text() == "finally"
    with pytest.raises(DownloadError, match=r"HTTP 404") as e:
        fetch(f"{base}/missing.json", cache_dir=tmp_path, retries=3, backoff=0)
    assert "offline" not in str(e.value)
    assert requests == ["/flaky.txt", "/flaky.txt", "/missing.json"]


def test_a_read_error_mid_stream_is_a_network_error(tmp_path, monkeypatch):
    """A TLS or socket error after the headers is retried and reported as a download failure, not a cache error."""

    class Response:
        headers = {"Content-Length": "100"}
        reads = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, n):
            type(self).reads += 1
            if type(self).reads % 2:
                return b"0123456789"
            raise OSError("[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC] decryption failed")

    monkeypatch.setattr(downloads.urllib.request, "urlopen", lambda url, timeout: Response())
    url = "https://example.com/big.bin"
    with pytest.raises(DownloadError, match=r"connection failed after 10 bytes .*DECRYPTION_FAILED") as e:
        fetch(url, cache_dir=tmp_path, retries=2, backoff=0)
    assert Response.reads == 4  # two attempts, each failing after its first chunk
    assert "\n" not in str(e.value) and not cache_path_of(url, tmp_path).exists()


def test_fetch_many_downloads_concurrently_in_order_and_caches(server, tmp_path):
    base, www, requests = server
    (www / "slow").mkdir()
    for i in range(8):
        (www / "slow" / f"{i}.txt").write_text(f"story {i}")
    urls = [f"{base}/slow/{i}.txt" for i in range(8)]
    paths = list(fetch_many(urls, workers=4, cache_dir=tmp_path))
    assert [p.read_text() for p in paths] == [f"story {i}" for i in range(8)]  # in the sources' order
    assert 2 <= server_max_in_flight() <= 4  # several at a time, never more than the workers
    assert list(fetch_many(urls, workers=4, cache_dir=tmp_path)) == paths and len(requests) == 8  # cached


def test_fetch_many_stops_at_the_first_failure(server, tmp_path):
    base, www, requests = server
    (www / "a.txt").write_text("a")
    stream = fetch_many([f"{base}/a.txt", f"{base}/missing.txt", *[f"{base}/a{i}.txt" for i in range(50)]],
                        workers=2, lookahead=2, cache_dir=tmp_path)
    assert next(stream).read_text() == "a"
    with pytest.raises(DownloadError, match="missing.txt .*HTTP 404"):
        next(stream)
    assert len(requests) <= 5  # the look-ahead is bounded: the 50 after it were never all requested


def test_fetch_offline_message(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/labels/x.json"
    with pytest.raises(UserError) as e:
        fetch(url, cache_dir=tmp_path, retries=1)
    message = str(e.value)
    assert message.startswith(f"cannot download {url} (")
    assert "you appear to be offline" in message and "pass its local path" in message
    assert str(cache_path_of(url, tmp_path)) in message and "\n" not in message


def test_fetch_oai_falls_back_to_the_hf_mirror(tmp_path, monkeypatch):
    import huggingface_hub

    def fail(url, **kwargs):
        raise DownloadError(url, "timed out", tmp_path / "x.json", offline=True)

    calls = []

    def hub(**kwargs):
        calls.append(kwargs)
        return str(tmp_path / "mirror.json")

    monkeypatch.setattr(downloads, "fetch", fail)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub)
    url = f"{downloads.OAI_URL}/labels/sentiment/offline_5k.json"
    assert fetch_oai(url) == tmp_path / "mirror.json"
    assert calls == [dict(repo_id="vwxyzjn/lm-human-preferences", repo_type="dataset",
                          filename="sentiment/offline_5k.json")]

    def hub_offline(**kwargs):
        raise OSError("hub unreachable")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub_offline)
    with pytest.raises(UserError, match=r"OpenAI's URL failed \(timed out\).*mirror.*\(hub unreachable\)"):
        fetch_oai(url)
    with pytest.raises(DownloadError):  # not an OpenAI URL: no mirror to try
        fetch_oai("https://example.com/labels.json")
