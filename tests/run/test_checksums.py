"""run/checksums.py: a checkpoint's SHA256SUMS, written beside its files and checked before it is loaded."""

from pathlib import Path

import pytest
import torch
from helpers.runs import fake_train

from lm_human_preference_details.run.checkpoint import STATE_FILE, list_checkpoints, load_checkpoint, save_checkpoint
from lm_human_preference_details.run.checksums import CHECKSUMS, unverified
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import sha256_of


def flipped_checkpoint(tmp_path) -> tuple[Path, bytes]:
    """A saved checkpoint whose state.pt then had one bit of a weight flipped (it still loads) -> (path, its bytes)."""
    path = save_checkpoint(tmp_path, 2, {"update": 2, "weight": torch.arange(8.0)}, keep=1)
    data = bytearray((path / STATE_FILE).read_bytes())
    data[bytes(data).index(torch.arange(8.0).numpy().tobytes()) + 5] ^= 0x10
    (path / STATE_FILE).write_bytes(bytes(data))
    return path, bytes(data)


@pytest.mark.parametrize("sums", ["", "\n", "partial"])
def test_a_sums_file_that_does_not_name_every_file_is_one_line(tmp_path, sums):
    path, flipped = flipped_checkpoint(tmp_path)
    if sums == "partial":  # the sums of a checkpoint that also held a file it does not name
        (path / "extra.pt").write_bytes(b"x")
        sums = (path / CHECKSUMS).read_text().replace(STATE_FILE, "extra.pt")
        sums = sums.replace(sums[:64], sha256_of(path / "extra.pt"))
    (path / CHECKSUMS).write_text(sums)
    with pytest.raises(UserError, match=f"does not name {path / STATE_FILE}|line 1 of .* is not one") as e:
        load_checkpoint(path)
    assert "\n" not in str(e.value) and "--overwrite starts the run again" in str(e.value)
    assert (path / STATE_FILE).read_bytes() == flipped and (path / CHECKSUMS).read_text() == sums


def test_a_sums_line_that_is_not_a_sum_is_one_line(tmp_path):
    path, _ = flipped_checkpoint(tmp_path)
    good = (path / CHECKSUMS).read_text()
    (path / CHECKSUMS).write_text(good + good)  # state.pt named twice
    with pytest.raises(UserError, match=f"line 2 of {path / CHECKSUMS} is not one `SHA256  NAME`"):
        load_checkpoint(path)


def test_a_checkpoint_without_its_sums_loads_with_a_warning(tmp_path, capsys):
    path, _ = flipped_checkpoint(tmp_path)
    with pytest.raises(UserError, match="does not match its sha256"):
        load_checkpoint(path)
    (path / CHECKSUMS).unlink()
    state = load_checkpoint(path)  # the flipped bit is not seen: loaded as it is, with the line that says so
    assert not torch.equal(state["weight"], torch.arange(8.0))
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: checkpoint {path} has no SHA256SUMS, so its files are loaded unverified (saved before "
                   f"checksums existed, or the file was deleted); if it may be damaged, delete {path} to resume from "
                   "an earlier checkpoint"]
    load_checkpoint(path, quiet=True)  # the processes other than 0: process 0 says it once
    assert capsys.readouterr().err == ""


def test_a_run_resumes_from_a_checkpoint_without_its_sums_with_one_warning(tmp_path, capsys):
    """As a resumed run meets it (run.Run on process 0): the checkpoint is loaded, and stderr says it is unverified."""
    fake_train(tmp_path / "run", updates=2)
    (checkpoint,) = list_checkpoints(tmp_path / "run")
    (checkpoint / CHECKSUMS).unlink()
    capsys.readouterr()
    assert len(fake_train(tmp_path / "run", updates=4, resume=True)) == 2  # updates 2 and 3 after the checkpoint
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert warnings == [unverified(checkpoint)]
