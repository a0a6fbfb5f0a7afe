"""The suite's one assertion of a refusal: exactly one `error:` line, the exit status, no traceback, nothing written."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

import pytest


def assert_one_error_line(result: subprocess.CompletedProcess, message: str = "", *, status: int | None = 2,
                          out: Path | None = None, cwd: Path | None = None, alone: bool = True) -> str:
    """``result`` ended with ``status`` (any failure where None) and one `error:` line holding ``message``, with no
    traceback; ``alone``: nothing else on stderr. Nothing written: ``out`` does not exist (not even empty), and the
    working directory ``cwd`` is as empty as it was. -> the line."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error")]
    assert result.returncode != 0 if status is None else result.returncode == status, result.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith("error: ") and (not alone or lines == errors), result.stderr[-3000:]
    assert message in errors[0], errors[0]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    if out is not None:
        assert not out.exists(), sorted(out.rglob("*"))
    if cwd is not None:
        assert not any(cwd.iterdir()), sorted(cwd.iterdir())
    return errors[0]


def one_error_line(capsys, main: Callable[[list[str]], object], argv: list) -> str:
    """``main(argv)`` under run_main, as the scripts run it -> its one stderr line (exit 2, no traceback, no stdout)."""
    from lm_human_preference_details.utils.errors import run_main  # the package, once the test runs

    with pytest.raises(SystemExit) as e:
        run_main(lambda: main([str(a) for a in argv]))
    out, err = capsys.readouterr()
    return assert_one_error_line(subprocess.CompletedProcess(argv, e.value.code, out, err))
