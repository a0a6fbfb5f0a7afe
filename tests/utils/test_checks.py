"""utils/checks.py: a flag value's checks (numbers, the device, the output directory), each a one-line
UserError."""

import re

import pytest
import torch

from lm_human_preference_details.ranks import devices
from lm_human_preference_details.ranks.devices import check_device, gpu_has_kernels, pick_device
from lm_human_preference_details.utils.checks import check_at_least, check_output_dir, check_positive
from lm_human_preference_details.utils.errors import UserError


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


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGUSR1"])  # docker stop; Slurm's --signal=USR1@T
def test_sigterm_outside_training_is_one_line_naming_what_it_interrupted(capsys, signum):
    import signal

    from lm_human_preference_details.utils.errors import doing, run_main

    signum = getattr(signal, signum)
    before = signal.getsignal(signum)

    def build():
        with doing("building the offline task's assets in /cache/offline-v4"):
            signal.raise_signal(signum)  # to this (the main) thread: the handler raises before the next line
            raise AssertionError("the signal did not interrupt the build")

    with pytest.raises(SystemExit) as e:
        run_main(build)
    assert e.value.code == 128 + signum
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: interrupted by {signal.Signals(signum).name} while building the offline task's assets in "
        "/cache/offline-v4; ")
    assert signal.getsignal(signum) is before  # run_main puts the previous handler back


def test_sigterm_during_the_offline_asset_build_leaves_no_partial_assets(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
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


def fake_torch(monkeypatch, cuda_build: str | None, gpu: tuple[int, int] | None, arch_list=("sm_75", "sm_80", "sm_86",
                                                                                          "sm_90", "sm_100", "sm_120",
                                                                                          "compute_120")):
    """torch as a CUDA build (``cuda_build``) or a CPU one, seeing one GPU of compute capability ``gpu`` or none."""
    monkeypatch.setattr(torch.version, "cuda", cuda_build)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu is not None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(gpu is not None))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Tesla V100" if gpu == (7, 0) else "NVIDIA H100")
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(arch_list))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(devices, "_said", set())  # nothing said yet in this process


@pytest.mark.parametrize("cuda_build, gpu, device, warning", [
    (None, None, "cpu", None),  # the CPU wheel: the CPU, said, no warning
    ("13.0", None, "cpu", r"^warning: torch .* is a CUDA 13.0 build but finds no usable GPU, so this run trains on the "
                          r"CPU: .*driver >= 580.*--gpus all.*pass --device cpu to silence this$"),
    ("13.0", (7, 0), "cpu", r"^warning: torch .* \(CUDA 13.0\) has no kernels for Tesla V100 \(compute capability 7.0; "
                            r"built for sm_75 .*\), so this run trains on the CPU"),
    ("13.0", (9, 0), "cuda", None),
])
def test_device_auto_says_what_it_chose_and_warns_on_a_cuda_build_without_a_gpu(monkeypatch, capsys, cuda_build, gpu,
                                                                                  device, warning):
    fake_torch(monkeypatch, cuda_build, gpu)
    torch.backends.cuda.matmul.allow_tf32 = False  # restored by conftest's keep_tf32
    assert pick_device("auto", tf32=True).type == device
    out, err = capsys.readouterr()
    chosen = "cuda (NVIDIA H100)" if device == "cuda" else "cpu"
    assert len(out.splitlines()) == 1 and out.startswith(f"--device auto: {chosen}; torch ") and "sees: cpu" in out
    if warning is None:
        assert err == ""
    else:
        assert len(err.splitlines()) == 1 and re.match(warning, err), err  # one line, on stderr
    assert torch.backends.cuda.matmul.allow_tf32 is (device == "cuda")  # TF32 is set up for a GPU only


def test_device_auto_is_said_once_per_run(monkeypatch, capsys):
    fake_torch(monkeypatch, "13.0", None)
    monkeypatch.setenv("RANK", "1")  # under torchrun, rank 0 says it
    assert pick_device("auto").type == "cpu" and capsys.readouterr() == ("", "")
    monkeypatch.setenv("RANK", "0")
    pick_device("auto")
    pick_device("auto")  # a policy run that trains its reward model picks again, in the same process
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and len(err.splitlines()) == 1


def test_an_explicit_device_is_taken_as_given(monkeypatch, capsys):
    fake_torch(monkeypatch, "13.0", None)
    assert pick_device("cpu").type == "cpu" and capsys.readouterr() == ("", "")


@pytest.mark.parametrize("capability, arch_list, ok", [
    ((9, 0), ["sm_80", "sm_90"], True),
    ((8, 9), ["sm_80", "sm_86"], True),  # a cubin runs on a later minor of its major
    ((8, 6), ["sm_89"], False),  # ... not on an earlier one
    ((9, 0), ["sm_80", "sm_86"], False),  # nor on another major
    ((12, 1), ["sm_100", "compute_120"], True),  # PTX is compiled for a later GPU by the driver
    ((7, 0), ["sm_75", "sm_80", "compute_120"], False),  # a V100 under a CUDA 13 build
    ((6, 0), [], False),
])
def test_gpu_has_kernels(capability, arch_list, ok):
    assert gpu_has_kernels(capability, arch_list) is ok


def test_micro_batches_count_query_response_sequences_in_both_scripts():
    from lm_human_preference_details.cli.run_args import RunArgs

    args = RunArgs(micro_batch_sequences=8)
    # an episode (policy) or a sampled query is one sequence: 8 rows per pass
    assert args.micro_batches(20) == [slice(0, 8), slice(8, 16), slice(16, 20)]
    # a best_of_4 label is 4 sequences: 2 labels per pass, a label never split
    assert args.micro_batches(6, sequences_per_row=4) == [slice(0, 2), slice(2, 4), slice(4, 6)]
    # off: the caller's default rows, else all
    assert RunArgs().micro_batches(6, default=4, sequences_per_row=4) == [slice(0, 4), slice(4, 6)]
    assert RunArgs().micro_batches(6) == [slice(0, 6)]
