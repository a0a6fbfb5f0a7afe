"""What the labelling tests share: the offline task on the tests' tiny assets, a labelling server in a process of its own
or in a thread, the page's calls made over HTTP, and a directory's entries to compare before and after."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

from helpers.processes import ForkedProcess, differing
from lm_human_preference_details.label_format import OAI_PAD
from lm_human_preference_details.labelling.server import LabelServer
from lm_human_preference_details.labelling.session import LabelSession
from lm_human_preference_details.offline import assets as offline_assets
from lm_human_preference_details.offline import corpus as offline_corpus
from lm_human_preference_details.offline import report as offline_report

ROOT = Path(__file__).resolve().parents[2]
QUERY_LENGTH, RESPONSE_LENGTH = offline_corpus.QUERY_LENGTH, offline_corpus.RESPONSE_LENGTH
START_WAIT_S = 600  # a bound on waiting for a server to print its URL (torch's import and sampling, on a loaded CPU)


def tiny_offline_cache(cache: Path, assets: Path) -> Path:
    """$LMHP_CACHE holding the offline task's files made of the tests' tiny assets (the real ones take minutes)."""
    d = cache / offline_assets.VERSION
    d.mkdir(parents=True)
    (d / "tiny-gpt2").symlink_to(assets / "tiny-gpt2")
    for name in ("queries.txt", "queries_test.txt"):
        (d / name).symlink_to(assets / "queries.txt")
    (d / "labels.json").symlink_to(assets / "labels.json")
    return cache


def label_env(cache: Path) -> dict[str, str]:
    # an online run's closing report on 16 held-out queries: no labelling test reads its numbers
    return {**os.environ, "LMHP_CACHE": str(cache), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
            offline_report.HELDOUT_QUERIES_HOOK: "16"}


def label_command(output: Path, *extra: str, port: str | None = "0") -> list[str]:
    """The label tool on the offline task; ``port`` None: its default port."""
    return [sys.executable, "-m", "lm_human_preference_details.label", "--task", "offline", "--output", str(output),
            "--num-queries", "8", *(["--port", port] if port is not None else []), "--device", "cpu", *extra]


def start_server(cache: Path, output: Path, *extra: str, port: str | None = "0") -> tuple[ForkedProcess, str, list[str]]:
    """A labelling server of the offline task, `python -m lm_human_preference_details.label` in a process of its own (a
    fork of this one, helpers.processes.ForkedProcess: a new interpreter would add only its imports) -> (process, its
    URL, the lines it printed)."""
    env = differing(label_env(cache))
    proc = ForkedProcess(*label_command(output, *extra, port=port)[2:], env_extra=env, cwd=output.parent)
    lines = []
    for line in proc.stdout:  # ends when the process does: a failed start is reported below, not waited on
        lines.append(line.rstrip("\n"))
        if line.startswith("labelling page: "):
            return proc, line.split()[2], lines
    proc.wait(START_WAIT_S)
    raise AssertionError("the labelling server did not start:\n" + "\n".join(lines))


@contextlib.contextmanager
def serving(session: LabelSession, port: int = 0):
    """The page's server for ``session`` in a thread -> its URL; stopped and closed after."""
    server = LabelServer("127.0.0.1", port)
    server.show(session)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server.url()
    finally:
        server.shutdown()
        server.server_close()


def call(url: str, path: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, dict]:
    """GET (no body) or POST one of the page's calls, with the headers the page's own requests carry (``headers``
    added or replacing them) -> (HTTP status, JSON answer)."""
    data = None if body is None else json.dumps(body).encode()
    origin = url.rstrip("/")
    sent = {"X-Lmhp-Label": "1", "Origin": origin} if data else {}
    request = urllib.request.Request(origin + path, data=data, headers={**sent, **(headers or {})})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy: the server is local
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def read_labels(path: Path) -> list[dict]:
    """The label file's records, checked as --labels.source reads them (OpenAI's schema, pads 50259)."""
    from lm_human_preference_details.label_format import load_best_of_n_labels

    load_best_of_n_labels(path, n=4, query_length=QUERY_LENGTH, response_length=RESPONSE_LENGTH, pad_id=50257)
    return json.loads(path.read_text())


def journal_items(output: Path) -> list[dict]:
    """The items a session's journal holds (its first line)."""
    with open(output.with_name(output.name + ".session.jsonl")) as f:
        return json.loads(f.readline())["items"]


FLAGS = {"task_name": "offline", "seed": 1}


def fake_items(n: int) -> list[dict]:
    """``n`` items with distinct tokens: item i's query is [i, i, pad], its samples [10 i + j, pad]."""
    return [{"query": [i, i, OAI_PAD], "samples": [[10 * i + j, OAI_PAD] for j in range(4)], "query_text": f"q{i}",
             "sample_texts": [f"s{i}.{j}" for j in range(4)]} for i in range(n)]


def expected_file(best: dict[int, int], labeller: str = "anonymous") -> list[dict]:
    """The records the label file should hold for the choices ``best`` (item -> sample) of fake_items, each the one
    label of its item, by ``labeller``."""
    return [{"query": [i, i, OAI_PAD], **{f"sample{j}": [10 * i + j, OAI_PAD] for j in range(4)}, "best": b,
             "labeller": labeller, "labels": [{"labeller": labeller, "best": b}]} for i, b in sorted(best.items())]


def snapshot(directory: Path) -> dict[str, object]:
    """Every entry under ``directory``: a file's bytes, a link's target."""
    return {str(p.relative_to(directory)): os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
            for p in sorted(directory.rglob("*"))}
