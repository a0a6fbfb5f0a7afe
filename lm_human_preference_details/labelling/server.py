"""The labelling page's server (docs/labelling.md): the page, its calls (JSON in and out) and the checks that keep them
to this server's own page (Host, Origin, a custom header). It serves a session: session.LabelSession (the label tool's
fixed items, label.py) or online/page.OnlineSession (an online run's requests, online/page.PageLabeller).
"""

from __future__ import annotations

import errno
import http.server
import ipaddress
import json
import socket
import sys
from pathlib import Path
from typing import Optional
from urllib.parse import parse_qs, urlsplit

from lm_human_preference_details.labelling.journal import (
    ANONYMOUS,
    N_SAMPLES,
    is_int,
    labeller_name,
    labeller_problem,
    refuse_constant,
)
from lm_human_preference_details.labelling.session import StaleChoice
from lm_human_preference_details.utils.errors import UserError

PAGE = Path(__file__).with_name("page.html")
MAX_BODY = 4096  # bytes of a request body the page may send
CALLS = {"/api/label": ("item", "best", "labeller"), "/api/skip": ("item", "labeller"), "/api/undo": (),
         "/api/alive": (), "/api/release": ()}  # -> fields


class PageHandler(http.server.BaseHTTPRequestHandler):
    """The page and its calls: GET /api/state, POST /api/label, /api/skip, /api/undo, /api/alive, /api/release (JSON in
    and out).
    Only requests addressed to this server (Host) and, for POSTs, sent by its own page (Origin and a custom header)
    are answered."""

    server: LabelServer

    def log_message(self, format: str, *args) -> None:
        pass  # the terminal shows the URL and the choices' count, not every request

    def do_GET(self) -> None:
        if not self.server.serves(self.headers.get("Host")):
            return self.refuse_host()
        url = urlsplit(self.path)
        if url.path == "/":
            self.reply(200, self.server.page, "text/html; charset=utf-8")
        elif url.path == "/api/state":
            query = parse_qs(url.query, keep_blank_values=True)  # an empty name is a bad one, not no name
            client, labeller = query.get("client", [""])[0], query.get("labeller", [ANONYMOUS])[0]
            if (why := labeller_problem(labeller)) is not None:
                return self.reply_json(400, {"error": f"bad request: {why}"})
            self.reply_json(200, self.server.session.state(client[:64], labeller_name(labeller)))
        else:
            self.reply_json(404, {"error": f"no page {url.path}"})

    def do_POST(self) -> None:
        host = self.headers.get("Host")
        if not self.server.serves(host):
            return self.refuse_host()
        # a page of another origin cannot send the custom header without a CORS preflight (never granted here), and
        # its browser names its origin in Origin: only this page can label
        if self.headers.get("X-Lmhp-Label") != "1" or (self.headers.get("Origin") or "").lower() != f"http://{host}".lower():
            return self.reply_json(403, {"error": "requests come from the labelling page only"})
        length = self.headers.get("Content-Length", "")
        if not length.isdigit() or not 0 < int(length) <= MAX_BODY:
            return self.reply_json(400, {"error": f"a request body of 1..{MAX_BODY} bytes is expected"})
        if self.path not in CALLS:
            return self.reply_json(404, {"error": f"no call {self.path}"})
        session = self.server.session
        try:
            body = request_fields(self.rfile.read(int(length)), CALLS[self.path], len(session.items))
            if "item" in CALLS[self.path]:
                session.check_request(body["item"], body.get("request"))
            if self.path == "/api/label":
                done, state = session.label(body["client"], body["item"], body["best"], body["labeller"])
            elif self.path == "/api/skip":
                done, state = session.skip(body["client"], body["item"], body["labeller"])
            elif self.path == "/api/undo":
                done, state = session.undo(body["client"], body.get("labeller", ANONYMOUS))
            else:  # the tab's heartbeat, or its last word as it closes
                (session.alive if self.path == "/api/alive" else session.release)(body["client"])
                return self.reply_json(200, {})
        except BadRequest as e:
            return self.reply_json(400, {"error": f"bad request: {e}"})
        except StaleChoice as e:  # a page shown before a resume: its index now names another request
            return self.reply_json(409, {"error": str(e), "kept": False, "reload": True})
        except UserError as e:  # the label file was replaced meanwhile: the choice is not kept, the file left alone
            return self.reply_json(409, {"error": str(e), "kept": False})
        except OSError as e:  # a full disk: neither file keeps the choice, and the page says so
            return self.reply_json(507, {"error": f"cannot save the choice ({e.strerror or e}); it was not kept: free "
                                                  f"space on {session.output.parent} and choose again", "kept": False})
        self.reply_json(200 if done else 409, state)

    def refuse_host(self) -> None:
        self.reply_json(403, {"error": f"this server answers only requests for {self.server.url()} (the Host header "
                                       "names another site: a page that rebinds its name to this machine)"})

    def reply_json(self, status: int, body: dict) -> None:
        self.reply(status, json.dumps(body).encode(), "application/json")

    def reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)


class BadRequest(ValueError):
    """A request the page never sends: answered 400 with what is wrong."""


def request_fields(data: bytes, names: tuple[str, ...], n_items: int) -> dict:
    """The fields of a POST's JSON body, each checked: client a string of 1..64 characters, request (the item's, as the
    page was shown it) a string if given, and of ``names``, item an integer in 0..n_items-1, best one in 0..3 (JSON
    numbers only: NaN and Infinity are refused) and labeller a name of 1..64 printable characters (undo's labeller,
    the page's, where given)."""
    try:
        body = json.loads(data, parse_constant=refuse_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not JSON ({e})") from None
    if not isinstance(body, dict):
        raise BadRequest("the body is not a JSON object")
    client = body.get("client")
    if not isinstance(client, str) or not 0 < len(client) <= 64:
        raise BadRequest("client must be a string of 1..64 characters")
    if "request" in body and not (isinstance(body["request"], str) and len(body["request"]) <= 128):
        raise BadRequest("request must be a string of at most 128 characters")
    if "labeller" in names or "labeller" in body:
        if (why := labeller_problem(body.get("labeller"))) is not None:
            raise BadRequest(why)
        body["labeller"] = labeller_name(body["labeller"])  # as every route takes it: "ann " is "ann"
    for name in (n for n in names if n != "labeller"):
        # an item named with its request may lie past the items now (a page shown before a resume): the session says so
        limit = {"item": n_items if "request" not in body else 2**31, "best": N_SAMPLES}[name]
        if not (is_int(body.get(name)) and 0 <= body[name] < limit):
            raise BadRequest(f"{name} must be an integer in 0..{limit - 1}")
    return body


class LabelServer(http.server.ThreadingHTTPServer):
    """The page's server: bound (or refused in one line) before anything is sampled or written."""

    daemon_threads = True
    # SO_REUSEADDR: a restart binds at once although the stopped server's connections linger in TIME-WAIT; on Linux
    # it never lets a second server bind a port a live one listens on (that stays "in use")
    allow_reuse_address = True

    def __init__(self, host: str, port: int, flags: tuple[str, str] = ("--host", "--port")):
        """Bound on ``host``:``port``; ``flags``: the names of the flags that set them, for the one-line errors."""
        host_flag, port_flag = flags
        if not 0 <= port <= 65535:
            raise UserError(f"{port_flag} {port} is not a TCP port; pass 1..65535, or 0 for any free port")
        if not host.strip():  # an empty address binds every interface of the machine: never by accident
            raise UserError(f"{host_flag} is empty; pass an address of this machine (127.0.0.1: this machine only, or "
                            "0.0.0.0 to serve every interface on purpose)")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.address_family = family
        try:
            super().__init__((host, port), PageHandler)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"{port_flag} {port} is in use on {host}; stop what uses it or pass another "
                                f"{port_flag} (0: any free port)") from None
            raise UserError(f"cannot serve on {host_flag} {host} {port_flag} {port} ({e.strerror or e}); pass an "
                            "address of this machine (127.0.0.1: this machine only)") from None
        self.names = {"localhost", host.lower(), socket.gethostname().lower()}
        self.page = PAGE.read_bytes()
        self.session = None  # what the page labels: `show` sets it before the server serves

    def show(self, session) -> None:
        """Serve ``session`` (its items, answers and state): bound first so that a port in use ends a command before
        anything is sampled or written, the server is given what it shows once that exists."""
        self.session = session

    def serves(self, host_header: Optional[str]) -> bool:
        """Whether a request's Host names this server: an IP address (never what a rebinding page has: a name),
        localhost, --host or this machine's name, at its port; a loopback name at any port, as `ssh -L PORT:...`
        forwards a laptop's own port to the page."""
        try:
            url = urlsplit(f"//{host_header}")
            name, port = url.hostname, url.port or 80
        except ValueError:
            return False
        if not host_header or name is None:
            return False
        try:
            ip, known = ipaddress.ip_address(name), True
        except ValueError:
            ip, known = None, name in self.names
        loopback = name == "localhost" or (ip is not None and ip.is_loopback)
        return known and (port == self.server_address[1] or loopback)

    def handle_error(self, request, client_address) -> None:
        """A request that failed in a way no answer covers (the connection dropped): one line, never a traceback."""
        problem = sys.exc_info()[1]
        print(f"a request from {client_address[0]} was not answered ({type(problem).__name__}: {problem}); the page "
              "can send it again", file=sys.stderr, flush=True)

    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def who_can_reach(host: str) -> str:
    """The line that says who can open the page."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return "only this machine can open it"
    return (f"--host {host}: anyone who can reach this machine on that port can open it and label (no password); "
            "serve on 127.0.0.1 (the default) to keep it to this machine")
