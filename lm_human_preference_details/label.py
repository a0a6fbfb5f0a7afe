"""Label best-of-4 samples yourself: a local page that writes OpenAI's label schema (docs/labelling.md).

    python -m lm_human_preference_details.label --task offline --output my_labels.json
    python train_reward.py --task offline --labels.source my_labels.json --labels.num-train 96 --batch-size 8

The items are drawn once, from the seed: --num-queries queries of the task's training stream (processed and
formatted as in training, FIDELITY A4 query processing, A5 query formatting), four responses each from the policy (the task's
base model, or --policy)
at the task's temperature and response length (C1 plain sampling), truncated as PPO scores them and as OpenAI's labellers saw
them
(E2 truncate and score). A page served by the standard library on 127.0.0.1 (another address only with --host) shows each query
with its
four responses; each choice is journaled and written to --output at once (label_session.py). Run the same command
again to continue where you stopped.
"""

from __future__ import annotations

import dataclasses
import errno
import http.server
import ipaddress
import json
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import parse_qs, urlsplit

import torch
import tyro

from lm_human_preference_details.cli import check_at_least
from lm_human_preference_details.devices import pick_device
from lm_human_preference_details.errors import Interrupted, UserError, run_main
from lm_human_preference_details.label_journal import N_SAMPLES, is_int, refuse_constant
from lm_human_preference_details.label_session import LabelSession, check_output_path
from lm_human_preference_details.labels import OAI_PAD
from lm_human_preference_details.oai_checkpoints import resolve_policy
from lm_human_preference_details.parsing import parse_args
from lm_human_preference_details.policies import check_policy_path, load_policy
from lm_human_preference_details.ppo import truncate_responses
from lm_human_preference_details.progress import progress
from lm_human_preference_details.queries import format_queries, make_query_sampler
from lm_human_preference_details.ranks import check_seed
from lm_human_preference_details.tasks import TaskHParams, check_task, check_task_inputs, get_task
from lm_human_preference_details.tokenizer import decode, encode_plain, load_tokenizer

PAGE = Path(__file__).with_name("label_page.html")
CHUNK = 64  # queries sampled per forward pass
MAX_BODY = 4096  # bytes of a request body the page may send
CALLS = {"/api/label": ("item", "best"), "/api/skip": ("item",), "/api/undo": (), "/api/alive": (),
         "/api/release": ()}  # -> fields


@dataclass
class Args:
    task: TaskHParams = field(default_factory=TaskHParams)
    """query processing, response length, temperature, truncation (preset from --task; every field overridable)"""
    output: Optional[str] = None
    """the label file to write, OpenAI's best_of_4 schema (default labels_<task>_seed<seed>.json); an existing one is
    continued only if a session of this tool wrote it"""
    base_model: str = "gpt2"
    """the policy sampled when --policy is not given: Hugging Face name or local directory (the task's initial model)"""
    policy: Optional[str] = None
    """a trained policy to sample instead: RUN/policy saved by train_policy.py, oai:NAME or an OAI TF policy directory"""
    num_queries: int = 100
    """queries to label, four responses each"""
    seed: int = 1
    """seed of the query order and of the sampling draws: the same seed gives the same items"""
    host: str = "127.0.0.1"
    """address the page is served on; anything but a loopback address lets other machines label"""
    port: int = 8765
    """TCP port of the page (0: any free port)"""
    device: str = "auto"
    """torch device for sampling: auto (cuda if available), cpu, cuda ..."""
    task_name: tyro.conf.Suppress[str] = "sentiment"
    labels_source: tyro.conf.Suppress[str] = ""

    def finalize(self) -> "Args":
        """The task's defaults, and a one-line error for each bad flag, before anything is loaded or written."""
        check_at_least("--num-queries", self.num_queries, 1, "queries to label")
        check_seed(self.seed, 1)
        if not 0 <= self.port <= 65535:
            raise UserError(f"--port {self.port} is not a TCP port; pass 1..65535, or 0 for any free port")
        if self.output is None:
            self.output = f"labels_{self.task_name}_seed{self.seed}.json"
        if not self.output.strip():
            raise UserError("--output is empty; pass the path of the label file to write")
        check_output_path(self.output)
        check_task(self.task)
        self.task = self.task.resolved()
        if self.policy is not None:
            check_policy_path("--policy", self.policy, None, self.task)
        get_task(self.task_name).prepare()  # a task's local assets, before their files are checked
        check_task_inputs(self.task, self.base_model, self.labels_source)
        return self

    def policy_source(self) -> str:
        """What samples the responses: --policy, else --base-model."""
        return self.policy or self.base_model

    def session_flags(self) -> dict:
        """The flags that fix a session's items: a session continues only with the same."""
        return {"task_name": self.task_name, "task": dataclasses.asdict(self.task), "policy": self.policy_source(),
                "num_queries": self.num_queries, "seed": self.seed}


def build_args(task_name: str) -> Args:
    """The defaults of the `--task` preset."""
    task = get_task(task_name)
    return Args(task=task.task, base_model=task.base_model, task_name=task_name, labels_source=task.labels.source)


def to_oai(tokens: list[int], pad_id: int) -> list[int]:
    """Our pad -> OpenAI's 50259, as their label files hold it."""
    # A2 OAI pad remap: the file is read back with 50259 mapped to our pad (labels.py), so it never reaches a model
    return [OAI_PAD if t == pad_id else t for t in tokens]


@torch.no_grad()
def sample_items(args: Args, device: torch.device) -> list[dict]:
    """The session's items, fixed by --seed: each query with four truncated responses, as tokens (OpenAI's pads) and
    as the texts the page shows."""
    task, source = args.task, args.policy_source()
    tokenizer = load_tokenizer(resolve_policy(source))
    # A4 query processing: the training stream's first num_queries queries, in the order the seed shuffles them
    sampler = make_query_sampler(tokenizer, task, batch_size=args.num_queries, seed=args.seed, num_ranks=1,
                                 labels_source=args.labels_source, shuffle_seed=args.seed)
    queries = next(sampler)  # [num_queries, query_length]
    one_pass = sampler.queries_per_pass()
    if one_pass is not None and args.num_queries > one_pass:  # the stream repeats: items would be asked twice
        raise UserError(f"--num-queries {args.num_queries} is more than the {one_pass} queries of "
                        f"{task.query_dataset}'s training stream; pass --num-queries {one_pass} or less")
    policy, _ = load_policy(source, tokenizer, task.temperature, device)
    prefix, suffix = encode_plain(tokenizer, [task.query_prefix, task.query_suffix])
    generator = torch.Generator(device=device).manual_seed(args.seed)
    items = []
    for start in progress(range(0, len(queries), CHUNK), desc="sampling the items", unit="batch"):
        chunk = queries[start : start + CHUNK].to(device)  # [c, query_length]
        contexts = format_queries(chunk, prefix, suffix).repeat_interleave(N_SAMPLES, dim=0)  # [c * 4, p + q + s]
        # C1 plain sampling: exactly response_length tokens at the task's temperature
        responses = policy.sample(contexts, task.response_length, generator=generator)["responses"]
        # E2 truncate and score: cut after the first truncate_token at index >= truncate_after, as PPO scores a response
        # and as OpenAI's labellers were shown it (its label files hold truncated, padded samples)
        samples = truncate_responses(responses, task.truncate_token, task.truncate_after, tokenizer.pad_token_id)
        samples = samples.view(len(chunk), N_SAMPLES, task.response_length).tolist()  # [c, 4, response_length]
        for query, four in zip(chunk.tolist(), samples):
            items.append({
                "query": to_oai(query, tokenizer.pad_token_id),
                "samples": [to_oai(s, tokenizer.pad_token_id) for s in four],
                "query_text": task.query_prefix + decode(tokenizer, query) + task.query_suffix,
                "sample_texts": [decode(tokenizer, s) for s in four],
            })
    return items


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
            client = parse_qs(url.query).get("client", [""])[0]
            self.reply_json(200, self.server.session.state(client[:64]))
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
            if self.path == "/api/label":
                done, state = session.label(body["client"], body["item"], body["best"])
            elif self.path == "/api/skip":
                done, state = session.skip(body["client"], body["item"])
            elif self.path == "/api/undo":
                done, state = session.undo(body["client"])
            else:  # the tab's heartbeat, or its last word as it closes
                (session.alive if self.path == "/api/alive" else session.release)(body["client"])
                return self.reply_json(200, {})
        except BadRequest as e:
            return self.reply_json(400, {"error": f"bad request: {e}"})
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
    """The fields of a POST's JSON body, each checked: client a string of 1..64 characters, and of ``names``, item an
    integer in 0..n_items-1 and best one in 0..3 (JSON numbers only: NaN and Infinity are refused)."""
    try:
        body = json.loads(data, parse_constant=refuse_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not JSON ({e})") from None
    if not isinstance(body, dict):
        raise BadRequest("the body is not a JSON object")
    client = body.get("client")
    if not isinstance(client, str) or not 0 < len(client) <= 64:
        raise BadRequest("client must be a string of 1..64 characters")
    for name in names:
        limit = {"item": n_items, "best": N_SAMPLES}[name]
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
        self.session: Optional[LabelSession] = None

    def serves(self, host_header: Optional[str]) -> bool:
        """Whether a request's Host names this server: its port, and an IP address (never what a rebinding page
        has: a name), localhost, --host or this machine's name."""
        try:
            url = urlsplit(f"//{host_header}")
            name, port = url.hostname, url.port or 80
        except ValueError:
            return False
        if not host_header or name is None or port != self.server_address[1]:
            return False
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return name in self.names

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


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(build_args, __doc__.split("\n")[0], argv).finalize()
    output = check_output_path(args.output)
    session = LabelSession.resume(output, args.session_flags())  # checked and locked, or None: a new session
    server = LabelServer(args.host, args.port)  # a port in use ends here, before anything is sampled or written
    try:
        if session is None:
            items = sample_items(args, pick_device(args.device))
            session = LabelSession.create(output, args.session_flags(), items)
        server.session = session
        print(f"{session.progress_line()}; each choice is saved to {output} as it is made")
        print(f"labelling page: {server.url()} ({who_can_reach(args.host)}); Ctrl-C stops it", flush=True)
        try:
            server.serve_forever(poll_interval=0.2)
        except (KeyboardInterrupt, Interrupted):
            print(f"stopped: {session.progress_line()}; run the same command to continue", flush=True)
    finally:
        server.server_close()
        if session is not None:
            session.close()
    return output


if __name__ == "__main__":
    run_main(main)
