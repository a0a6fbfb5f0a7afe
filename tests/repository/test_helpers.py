"""tests/helpers/: the suite's own helpers keep their promises (each catches the fault it is there to catch)."""

from __future__ import annotations

import os
import random
import subprocess

import numpy as np
import pytest
import torch
from helpers.rng import global_generators_kept


def test_global_generators_are_given_back_after_a_seed_and_draws():
    torch.manual_seed(0), np.random.seed(0), random.seed(0)  # draw the same numbers again
    expected = torch.rand(3), np.random.rand(3), random.random()
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    with global_generators_kept():
        torch.manual_seed(123), np.random.seed(123), random.seed(123)
        torch.rand(5), np.random.rand(5), random.random()
    after = torch.rand(3), np.random.rand(3), random.random()
    assert torch.equal(after[0], expected[0]) and np.array_equal(after[1], expected[1]) and after[2] == expected[2]


def test_assert_one_line_error_refuses_an_empty_run_directory_and_a_touched_working_directory(tmp_path):
    from helpers.errors import assert_one_error_line

    refused = subprocess.CompletedProcess([], 2, "", "error: --ppo.lr is 0.0; pass a positive number\n")
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    cwd.mkdir()
    assert_one_error_line(refused, "--ppo.lr is 0.0", out=out, cwd=cwd)
    out.mkdir()  # an empty run directory left behind
    with pytest.raises(AssertionError):
        assert_one_error_line(refused, "--ppo.lr is 0.0", out=out, cwd=cwd)
    out.rmdir()
    (cwd / "runs").mkdir()  # something written where the command ran
    with pytest.raises(AssertionError):
        assert_one_error_line(refused, "--ppo.lr is 0.0", out=out, cwd=cwd)
    (cwd / "runs").rmdir()
    for bad in (subprocess.CompletedProcess([], 1, "", refused.stderr),  # a crash's status
                subprocess.CompletedProcess([], 2, "", "Traceback (most recent call last):\n" + refused.stderr)):
        with pytest.raises(AssertionError):
            assert_one_error_line(bad, "--ppo.lr is 0.0", out=out, cwd=cwd)


PROBE = '''
import os
from lm_human_preference_details.utils import files

def main(argv):
    print(argv, os.environ["LMHP_PROBE"], os.getcwd(), files.CACHE_DIR)
'''


def test_in_process_gives_the_run_its_variables_directory_and_cache_then_gives_back_this_processs(tmp_path):
    from helpers.processes import in_process

    from lm_human_preference_details.utils import files

    (tmp_path / "in_process_probe.py").write_text(PROBE)
    (tmp_path / "run").mkdir()
    before = os.getcwd(), files.CACHE_DIR, os.environ.get("LMHP_CACHE")
    result = in_process(tmp_path / "in_process_probe.py", "--flag", 1, cwd=tmp_path / "run",
                        env_extra={"LMHP_PROBE": "seen", "LMHP_CACHE": tmp_path / "cache"})
    assert result.stdout == f"['--flag', '1'] seen {tmp_path / 'run'} {tmp_path / 'cache'}\n"  # as a fresh process
    assert (os.getcwd(), files.CACHE_DIR, os.environ.get("LMHP_CACHE")) == before and "LMHP_PROBE" not in os.environ
