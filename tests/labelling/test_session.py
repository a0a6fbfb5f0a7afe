"""labelling/session.py: a labelling session's promises, tried as a careful and a hostile user would: a user's file is
never written, a full disk keeps a choice or refuses it (never half), an item is leased only while its tab lives. Real
files, the real server over HTTP (in a thread, or as users run it)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess

import pytest
from helpers.errors import assert_one_error_line
from helpers.labelling import FLAGS, call, fake_items, label_command, label_env, serving, snapshot, tiny_offline_cache
from helpers.processes import refused_in_process

from lm_human_preference_details import label
from lm_human_preference_details.labelling import session as label_session
from lm_human_preference_details.labelling.journal import journal_path
from lm_human_preference_details.labelling.session import LabelSession
from lm_human_preference_details.utils import files
from lm_human_preference_details.utils.errors import run_main


@pytest.fixture(scope="module")
def cache(assets, tmp_path_factory):
    return tiny_offline_cache(tmp_path_factory.mktemp("label_cache"), assets)


def stop_at_once(*args, **kwargs) -> None:
    raise KeyboardInterrupt  # Ctrl-C as the page is served


# ------------------------------------------------------------------ 1. a user's file is never written
def test_a_label_file_that_appears_while_sampling_is_left_alone(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(files, "CACHE_DIR", cache)
    user = tmp_path / "user.json"

    def sample_while_the_user_saves(args, device):
        user.write_bytes(b"the user's own labels")  # appears after the start's checks, before the first write
        return fake_items(3)

    monkeypatch.setattr(label, "sample_items", sample_while_the_user_saves)
    # were the file taken, the page would be served: a Ctrl-C stops it at once, so that the test ends either way
    monkeypatch.setattr(label.LabelServer, "serve_forever", stop_at_once)
    argv = ["--task", "offline", "--output", str(user), "--num-queries", "3", "--port", "0", "--device", "cpu"]
    with pytest.raises(SystemExit) as exit:
        run_main(lambda: label.main(argv))
    line = assert_one_error_line(subprocess.CompletedProcess(argv, exit.value.code, "", capsys.readouterr().err), "appeared")
    assert line.startswith("error: --output")
    assert snapshot(tmp_path) == {"user.json": b"the user's own labels"}  # and our journal is gone


def test_a_label_file_replaced_during_a_session_is_left_alone_and_the_choice_not_kept(tmp_path):
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, FLAGS, fake_items(3))
    with serving(session) as url:
        assert call(url, "/api/label", {"client": "a", "labeller": "ann", "item": 0, "best": 1})[0] == 200
        (tmp_path / "mine").write_text("mine")
        os.replace(tmp_path / "mine", out)  # another program saves its own file there
        journal = journal_path(out).read_bytes()
        status, answer = call(url, "/api/label", {"client": "a", "labeller": "ann", "item": 1, "best": 2})
        assert status == 409 and "replaced by another program" in answer["error"] and answer["kept"] is False
    session.close()
    assert out.read_text() == "mine" and journal_path(out).read_bytes() == journal


def test_output_paths_that_cannot_be_ours_are_one_line(cache, tmp_path):
    """The last case is a real `python -m lm_human_preference_details.label` (the line and status as a user gets them);
    the three output paths are refused in this process (helpers.processes.refused_in_process), where a new interpreter would
    only add its imports, with the same cache."""
    (tmp_path / "link.json").symlink_to("nowhere")  # a dangling link of the user's
    (tmp_path / "mine.txt").write_text("mine")
    before = snapshot(tmp_path)
    cases = [("link.json", [], "is a symbolic link"), ("newdir/", [], "names a directory"),
             (".", [], "names a directory"),
             # the tests' 799-line queries.txt gives 400 usable queries: more would repeat them
             ("n.json", ["--num-queries", "401"], "--num-queries 401 is more than the 400 queries")]
    for i, (output, extra, message) in enumerate(cases):
        command = label_command(tmp_path / "x", *extra)
        command[command.index("--output") + 1] = output
        if i < len(cases) - 1:
            result = refused_in_process(command[2], command[3:], tmp_path, {"LMHP_CACHE": cache})  # [python, -m, M, ...]
        else:
            result = subprocess.run(command, cwd=tmp_path, env=label_env(cache), capture_output=True, text=True,
                                    timeout=600)
        assert_one_error_line(result, message)
        assert snapshot(tmp_path) == before


# ------------------------------------------------------------------ 2. the page's promises
@pytest.fixture()
def small_disk(tmp_path, monkeypatch):
    """A directory on a 512 KiB tmpfs -> (the directory, fill(spare), free()): fill leaves ``spare`` bytes free.
    Where no tmpfs can be mounted (not root), fill makes the label file's temporary fail with ENOSPC instead."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)], capture_output=True).returncode:
        def no_space(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        yield disk, lambda spare: monkeypatch.setattr(files.tempfile, "mkstemp", no_space), monkeypatch.undo
        return
    filler = disk / "filler"

    def fill(spare: int) -> None:
        with open(filler, "wb", buffering=0) as f:
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 4096)
        st = os.statvfs(disk)
        os.truncate(filler, filler.stat().st_size - max(0, spare - st.f_bavail * st.f_frsize))

    try:
        yield disk, fill, lambda: filler.unlink()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_keeps_no_half_choice_and_never_blocks_the_session(small_disk):
    disk, fill, free = small_disk
    out = disk / "labels.json"
    items = fake_items(10)
    for item in items:
        item["query"] = item["query"] * 1000  # ~18 KiB a record: a label file's rewrite needs more than a journal line
    session = LabelSession.create(out, FLAGS, items)
    with serving(session) as url:
        assert call(url, "/api/label", {"client": "a", "labeller": "ann", "item": 0, "best": 1})[0] == 200
        fill(8192)  # the journal's line fits, the label file's rewrite does not
        journal, labels = journal_path(out).read_bytes(), out.read_bytes()
        for _ in range(2):  # refused and not kept: a retry is refused the same way, not as "decided by another tab"
            status, answer = call(url, "/api/label", {"client": "a", "labeller": "ann", "item": 1, "best": 2})
            assert (status, answer["kept"]) == (507, False) and "No space left" in answer["error"]
            assert (journal_path(out).read_bytes(), out.read_bytes()) == (journal, labels)
        free()
        assert call(url, "/api/label", {"client": "a", "labeller": "ann", "item": 1, "best": 3})[0] == 200
        fill(8192)
        assert call(url, "/api/label", {"client": "a", "labeller": "ann", "item": 2, "best": 0})[0] == 507
    session.close()
    again = LabelSession.resume(out, FLAGS)  # the same command continues, with the disk still full
    assert json.loads(out.read_bytes())[1]["best"] == 3 and len(json.loads(out.read_bytes())) == 2
    assert again.state("b")["item"]["index"] == 2
    again.close()


class Clock:
    """time.monotonic for the session, moved by hand: leases without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_an_item_is_leased_only_while_its_tab_lives(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(label_session, "time", clock)
    session = LabelSession.create(tmp_path / "labels.json", FLAGS, fake_items(3))
    state = lambda c: call(url, f"/api/state?client={c}")[1]  # noqa: E731
    with serving(session) as url:
        assert [state(c)["item"]["index"] for c in "abc"] == [0, 1, 2]
        assert call(url, "/api/label", {"client": "c", "labeller": "ann", "item": 2, "best": 0})[0] == 200
        waiting = state("c")
        assert waiting["item"] is None and waiting["leased"] == 2  # not "every item is decided"
        for _ in range(3):  # a's and b's tabs say they are alive: their items stay theirs
            clock.now += 0.6 * label_session.LEASE_S
            assert call(url, "/api/alive", {"client": "a"})[0] == 200
            assert call(url, "/api/alive", {"client": "b"})[0] == 200
            assert state("c")["item"] is None
        assert call(url, "/api/release", {"client": "a"})[0] == 200  # a's tab closes: its item is free at once
        assert state("c")["item"]["index"] == 0
        clock.now += label_session.LEASE_S  # b's tab died without a word: its lease ends, c's tab lives on
        assert call(url, "/api/alive", {"client": "c"})[0] == 200
        assert state("d")["item"]["index"] == 1
    session.close()
