"""labelling/server.py: the page's server answers only requests for itself from its own page, and checks every field."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading

import pytest
from helpers.labelling import FLAGS, call, expected_file, fake_items, serving

from lm_human_preference_details.labelling.server import LabelServer, who_can_reach
from lm_human_preference_details.labelling.session import LabelSession
from lm_human_preference_details.utils.errors import UserError


def raw_post(url: str, path: str, body: bytes, headers: dict) -> tuple[int, dict]:
    """POST ``body`` as it is (not JSON-encoded by us) -> (status, JSON answer): the server must answer, not drop."""
    host, port = url.split("//")[1].rstrip("/").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_stopped_server_binds_its_port_again_at_once_and_a_live_one_keeps_it(tmp_path):
    session = LabelSession.create(tmp_path / "labels.json", FLAGS, fake_items(2))
    with serving(session) as url:
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        for _ in range(3):  # the server closes each connection first: they linger in TIME-WAIT on its port
            assert call(url, "/api/state?client=a")[0] == 200
        with pytest.raises(UserError, match=f"--port {port} is in use"):  # a live server's port is never shared
            LabelServer("127.0.0.1", port)
    with serving(session, port) as again:  # stopped: the same port at once
        assert again == url and call(again, "/api/state?client=a")[0] == 200
    session.close()


def test_only_requests_for_this_server_from_its_page_are_answered(tmp_path):
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, FLAGS, fake_items(2))
    with serving(session) as url:
        port = url.rstrip("/").rsplit(":", 1)[1]
        evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}  # a rebound DNS name
        body = {"client": "x", "labeller": "ann", "item": 0, "best": 0}
        refused = [call(url, "/api/state?client=x", headers={"Host": evil["Host"]})[0],
                   call(url, "/api/label", body, evil)[0],
                   call(url, "/api/label", body, {"Origin": "http://evil.example"})[0],
                   call(url, "/api/label", body, {"Origin": ""})[0],
                   call(url, "/api/label", body, {"Host": "10.1.2.3:1", "Origin": "http://10.1.2.3:1"})[0],
                   call(url, "/api/label", body, {"X-Lmhp-Label": "0"})[0]]
        page = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
        page.request("GET", "/", headers={"Host": evil["Host"]})
        refused.append(page.getresponse().status)
        page.close()
        assert refused == [403] * 7
        assert json.loads(out.read_text()) == []
        local = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
        assert call(url, "/api/label", body, local)[0] == 200
    session.close()
    assert json.loads(out.read_text()) == expected_file({0: 0}, "ann")


def test_a_request_from_another_page_is_refused(tmp_path):
    session = LabelSession.create(tmp_path / "labels.json", FLAGS, fake_items(2))
    server = LabelServer("127.0.0.1", 0)
    server.show(session)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        status, _ = call(server.url(), "/api/label", {"client": "x", "labeller": "ann", "item": 0, "best": 0},
                         {"X-Lmhp-Label": "0"})
        bad_best, _ = call(server.url(), "/api/label", {"client": "x", "labeller": "ann", "item": 0, "best": 4})
        no_item, _ = call(server.url(), "/api/skip", {"client": "x", "labeller": "ann"})
    finally:
        server.shutdown()
        server.server_close()
        session.close()
    assert (status, bad_best, no_item) == (403, 400, 400)
    assert json.loads((tmp_path / "labels.json").read_text()) == []


def test_every_request_field_is_checked_and_answered(tmp_path):
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, FLAGS, fake_items(3))
    with serving(session) as url:
        headers = {"X-Lmhp-Label": "1", "Origin": url.rstrip("/"), "Content-Type": "application/json"}
        ok = b'"client": "a", "labeller": "ann", '
        bodies = [b'{' + ok + b'"item": Infinity, "best": 1}', b'{' + ok + b'"item": 1e400, "best": 1}',
                  b'{' + ok + b'"item": NaN, "best": 1}', b'{' + ok + b'"item": "0", "best": 1}',
                  b'{' + ok + b'"item": true, "best": 1}', b'{' + ok + b'"item": 3, "best": 1}',
                  b'{' + ok + b'"item": 0, "best": 7}', b'{' + ok + b'"item": 0, "best": -1}',
                  b'{' + ok + b'"item": 0}', b'{"client": 5, "labeller": "ann", "item": 0, "best": 1}',
                  b'{"labeller": "ann", "item": 0, "best": 1}', b'[0, 1]', b'{' + ok + b'"item": 0, "best": 1',
                  # a labeller's name: missing, empty, too long, not printable, not a string, blank
                  b'{"client": "a", "item": 0, "best": 1}', b'{"client": "a", "labeller": "", "item": 0, "best": 1}',
                  b'{"client": "a", "labeller": "' + b'x' * 65 + b'", "item": 0, "best": 1}',
                  b'{"client": "a", "labeller": "a\\u0007b", "item": 0, "best": 1}',
                  b'{"client": "a", "labeller": 5, "item": 0, "best": 1}',
                  b'{"client": "a", "labeller": "   ", "item": 0, "best": 1}']
        answers = [raw_post(url, "/api/label", body, headers) for body in bodies]
        assert [status for status, _ in answers] == [400] * len(bodies)
        assert all(answer["error"].startswith("bad request: ") for _, answer in answers)
        assert raw_post(url, "/api/skip", b'{"client": "a", "labeller": "ann", "item": 1.0}', headers)[0] == 400
        assert raw_post(url, "/api/skip", b'{"client": "a", "item": 1}', headers)[0] == 400  # no labeller
        assert call(url, "/api/state?client=a&labeller=%07")[0] == 400
        assert raw_post(url, "/api/label", b'{"client": "a", "labeller": "ann", "item": 0, "best": 1}', headers)[0] == 200
    session.close()
    assert json.loads(out.read_text()) == expected_file({0: 1}, "ann")


def test_a_request_the_server_cannot_answer_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    session = LabelSession.create(tmp_path / "labels.json", FLAGS, fake_items(2))

    def broken(client: str, labeller: str) -> dict:
        raise RuntimeError("planted")

    monkeypatch.setattr(session, "state", broken)
    with serving(session) as url:
        with pytest.raises(http.client.RemoteDisconnected):
            call(url, "/api/state?client=a")
    session.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(RuntimeError: planted)" in err and "Traceback" not in err


def test_a_host_header_is_served_with_an_address_or_name_of_it_at_its_port_or_a_loopback_name_at_any():
    server = LabelServer("127.0.0.1", 0)
    try:
        port = server.server_address[1]
        served = [f"127.0.0.1:{port}", f"10.1.2.3:{port}", f"[::1]:{port}", f"LOCALHOST:{port}",
                  f"{socket.gethostname()}:{port}",  # any address: a page that rebinds has a name, never an address
                  f"127.0.0.1:{port + 1}", "localhost:9000", "127.0.0.1", f"[::1]:{port + 1}"]  # ssh -L: any port
        refused = [None, "", f"10.1.2.3:{port + 1}", f"{socket.gethostname()}:{port + 1}", "10.1.2.3",  # no port: 80
                   f"evil.example:{port}", f"localhost.evil.example:{port}", "[::1", f"127.0.0.1:{port}:1"]
        assert [server.serves(host) for host in served] == [True] * len(served)
        assert [server.serves(host) for host in refused] == [False] * len(refused)
    finally:
        server.server_close()


def test_the_start_says_who_can_open_the_page():
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert who_can_reach(host) == "only this machine can open it", host
    for host in ("0.0.0.0", "192.168.1.5", "box.example"):
        assert who_can_reach(host) == (f"--host {host}: anyone who can reach this machine on that port can open it and "
                                       "label (no password); serve on 127.0.0.1 (the default) to keep it to this machine")


def forward(port: int) -> tuple[int, threading.Event]:
    """What `ssh -L LOCAL:127.0.0.1:PORT` does on a laptop, here: a local port whose connections are relayed to
    ``port`` -> (the local port, an event that ends the relay)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    done = threading.Event()

    def pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def serve() -> None:
        with listener:
            while not done.is_set():
                try:
                    client, _ = listener.accept()
                except (TimeoutError, socket.timeout):
                    continue
                upstream = socket.create_connection(("127.0.0.1", port))
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], done


def test_the_page_works_through_a_forwarded_port_and_a_name_still_needs_its_own(tmp_path):
    """Labelling on a laptop while a GPU box samples: the browser reaches the page at localhost:LOCAL through an ssh
    tunnel, so its Host and Origin name the laptop's port; the page and its calls work. A rebound DNS name, or a
    non-loopback address, at another port is still refused."""
    session = LabelSession.create(tmp_path / "labels.json", FLAGS, fake_items(2))
    with serving(session) as url:
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        local, done = forward(port)
        try:
            forwarded = f"http://localhost:{local}/"
            status, state = call(forwarded, "/api/state?client=a")
            assert status == 200 and state["item"]["index"] == 0
            assert call(forwarded, "/api/label", {"client": "a", "labeller": "ann", "item": 0, "best": 3})[0] == 200
            for host in (f"evil.example:{local}", f"192.0.2.1:{local}"):
                assert call(url, "/api/state?client=b", headers={"Host": host})[0] == 403
        finally:
            done.set()
    assert [r["best"] for r in json.loads((tmp_path / "labels.json").read_text())] == [3]


def test_a_name_is_trimmed_on_every_route_and_an_empty_one_is_refused(tmp_path):
    """"ann " and "ann" are one person: the second label of an item by either is refused as ann's second; an empty
    name asks for no state (400), as a missing one is anonymous."""
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, {**FLAGS, "labels_per_item": 2}, fake_items(2))
    with serving(session) as url:
        assert call(url, "/api/state?client=a&labeller=")[0] == 400
        assert call(url, "/api/state?client=a&labeller=%20%20")[0] == 400
        assert call(url, "/api/state?client=a&labeller=%20ann%20")[0] == 200
        assert call(url, "/api/label", {"client": "a", "labeller": "ann ", "item": 0, "best": 1})[0] == 200
        status, _ = call(url, "/api/label", {"client": "b", "labeller": "ann", "item": 0, "best": 2})
        assert status == 409  # ann labelled item 0 already
    session.close()
    assert [label["labeller"] for label in json.loads(out.read_text())[0]["labels"]] == ["ann"]
