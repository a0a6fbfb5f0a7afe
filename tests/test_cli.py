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


def test_sigterm_outside_training_is_one_line_naming_what_it_interrupted(capsys):
    import os
    import signal
    import time

    from lm_human_preference_details.cli import doing, run_main

    before = signal.getsignal(signal.SIGTERM)

    def build():
        with doing("building the offline task's assets in /cache/offline-v4"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises at once: this sleep is cut short

    with pytest.raises(SystemExit) as e:
        run_main(build)
    assert e.value.code == 128 + signal.SIGTERM
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: interrupted by SIGTERM while building the offline task's assets in /cache/offline-v4; ")
    assert signal.getsignal(signal.SIGTERM) is before  # run_main puts the previous handler back


def test_sigterm_during_the_offline_asset_build_leaves_no_partial_assets(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "LMHP_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": str(root), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(root / "train_reward.py"), "--task", "offline", "--output-dir",
                             str(tmp_path / "run")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("creating the offline task's assets in")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert proc.returncode == 128 + signal.SIGTERM and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert "while building the offline task's assets in" in errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no half-built assets, no run directory
