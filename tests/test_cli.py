"""The shared run options' checks (cli.py): numbers, the device, the output directory; each a one-line UserError."""

import pytest
import torch

from lm_human_preference_details.cli import UserError, check_at_least, check_device, check_output_dir, check_positive


def test_check_at_least_names_the_flag_and_the_fix():
    check_at_least("--batch-size", 1, 1, "labels per batch")
    check_at_least("--normalize-samples", 0, 0, "samples")
    with pytest.raises(UserError, match=r"^--batch-size is 0, .* at least 1; pass --batch-size 1 or more$"):
        check_at_least("--batch-size", 0, 1, "labels per batch")
    with pytest.raises(UserError, match="--x is nan"):
        check_at_least("--x", float("nan"), 0, "a number")


def test_check_positive_rejects_zero_negative_and_not_finite():
    check_positive("--task.temperature", 0.7, "the temperature")
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(UserError, match="--task.temperature .* must be a finite number > 0"):
            check_positive("--task.temperature", bad, "the temperature")


def test_check_device_says_what_torch_sees():
    check_device("auto")
    check_device("cpu")
    with pytest.raises(UserError, match=r"--device gpu is not a torch device; torch .* sees: cpu"):
        check_device("gpu")
    with pytest.raises(UserError, match="only cpu, cuda"):
        check_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match=r"--device cuda, but torch .* sees: cpu \(no usable CUDA GPU\)"):
            check_device("cuda")
    with pytest.raises(UserError, match="cuda:99"):
        check_device("cuda:99")


def test_check_output_dir_writes_nothing(tmp_path):
    check_output_dir(str(tmp_path / "new" / "run"))  # made later, by the run
    check_output_dir(str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # the probe left nothing behind
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        check_output_dir(str(tmp_path / "f"))
    with pytest.raises(UserError, match=f"lies under the file {tmp_path / 'f'}"):
        check_output_dir(str(tmp_path / "f" / "a" / "run"))
    with pytest.raises(UserError, match="cannot be written"):
        check_output_dir("/proc/lmhp-run")
