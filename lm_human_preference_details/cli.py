"""The command line both scripts share: one-line errors, the device, and the checks of a flag's value (the run options
themselves, RunArgs, are run_args.py's)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from lm_human_preference_details.files import disk_full


class UserError(Exception):
    """A problem the user can fix: printed as one line ("error: ..."), exit status 2."""


class Interrupted(BaseException):
    """SIGTERM outside a training loop (which turns it into a stop after its update, run.py): like Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def doing(what: str) -> Iterator[None]:
    """Name the long step under way ("building the offline task's assets"): an interruption (SIGTERM, Ctrl-C) raised
    inside it carries the name of the innermost step, which run_main's one line says."""
    try:
        yield
    except (KeyboardInterrupt, Interrupted) as e:
        if not hasattr(e, "while_doing"):
            e.while_doing = what
        raise


def torchrun_rank() -> str:
    """This process's rank in a torchrun job ("0" without torchrun): only process 0 speaks for the job."""
    return os.environ.get("RANK") or "0"


def _raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


def run_main(main: Callable[[], object]) -> None:
    """Call ``main``; a UserError, Ctrl-C or SIGTERM ends the process with one line and a non-zero exit.

    Under torchrun every process meets the same bad input (and the same Ctrl-C), so the line comes from process 0 only
    (say_once).
    """
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        main()
    except UserError as e:
        if getattr(e, "said", False):  # a torchrun job's agreed failure, printed by process 0 (ranks.agree_on)
            leave_quietly(e.exit_code)
        say_once(f"error: {e}")
        sys.exit(getattr(e, "exit_code", 2))
    except Exception as e:  # a full disk at any write, whichever class the writer raises (files.disk_full)
        if disk_full(e):
            where = f" writing {e.filename}" if getattr(e, "filename", None) else ""
            say_once(f"error: the disk is full{where} ({str(e)[:200]}); free some space and run the command again (a "
                     "run keeps its last checkpoint: continue it with --resume)")
            sys.exit(2)
        if torchrun_rank() == "0":  # under torchrun, a peer's collective failing as process 0 dies: no traceback there
            raise
        say_once(f"error: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
        sys.exit(1)
    except (KeyboardInterrupt, Interrupted) as e:  # reaches every process of a torchrun job: process 0 says it
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        what = f" while {e.while_doing}" if hasattr(e, "while_doing") else ""
        if torchrun_rank() == "0":
            print(f"error: interrupted by {signal.Signals(signum).name}{what}; nothing half-written is kept (a run keeps "
                  "its last checkpoint: continue with --resume)", file=sys.stderr, flush=True)
        sys.exit(128 + signum)
    finally:
        signal.signal(signal.SIGTERM, previous)


def leave_quietly(exit_code: int) -> None:
    """End a process whose job's error line is printed: process 0 at once; the others first wait (up to
    OTHER_RANKS_WAIT_S) for torchrun to stop them once process 0 has ended, so that process 0 is never stopped first."""
    if torchrun_rank() != "0":
        try:
            time.sleep(OTHER_RANKS_WAIT_S)
        except Interrupted as e:  # torchrun stopping this process once process 0 has ended: 128 + SIGTERM
            sys.exit(128 + e.signum)
    sys.exit(exit_code)


OTHER_RANKS_WAIT_S = 10.0  # how long processes 1..n-1 of a torchrun job wait for process 0 before they speak


def say_once(line: str) -> None:
    """Print a torchrun job's error ``line`` once, from process 0 (RANK), or from the only process.

    torchrun stops every process as soon as one fails. The other processes first wait OTHER_RANKS_WAIT_S for process 0
    to fail (torchrun then stops them); one still running after that met an error of its own and says it.
    """
    rank = torchrun_rank()
    if rank != "0":
        try:
            time.sleep(OTHER_RANKS_WAIT_S)
        except (KeyboardInterrupt, Interrupted):  # torchrun stopping this process once process 0 has failed
            sys.exit(1)
        line = f"{line} (process {rank})"
    print(line, file=sys.stderr, flush=True)


def gpu_has_kernels(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a GPU of compute ``capability`` runs this torch's kernels (torch.cuda.get_arch_list()): a cubin for
    the same major and an equal or lower minor, or PTX (compute_XY) for an equal or lower capability."""
    major, minor = capability
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        if not number.isdigit():
            continue
        a_major, a_minor = int(number[:-1]), int(number[-1])  # sm_120 -> 12.0, sm_75 -> 7.5
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= capability:
            return True
    return False


def why_no_gpu() -> Optional[tuple[str, str]]:
    """None when this torch can run on the first CUDA GPU; else (why it cannot, what would fix it), in words."""
    build = torch.version.cuda
    if build is None:
        return f"torch {torch.__version__} is a CPU-only build", "install a CUDA build of torch (docs/install.md)"
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} is a CUDA {build} build but finds no usable GPU",
                "it needs an NVIDIA GPU and driver (CUDA 13.x builds: driver >= 580; in Docker: docker run --gpus all)")
    capability, arch_list = torch.cuda.get_device_capability(0), torch.cuda.get_arch_list()
    if not gpu_has_kernels(capability, arch_list):
        return (f"torch {torch.__version__} (CUDA {build}) has no kernels for {torch.cuda.get_device_name(0)} (compute "
                f"capability {capability[0]}.{capability[1]}; built for {' '.join(arch_list)})",
                "install a torch build for this GPU")
    return None


def auto_device() -> tuple[torch.device, Optional[str]]:
    """--device auto: the first CUDA GPU if this torch can run on it, else the CPU; and a warning when a CUDA build of
    torch falls back to the CPU (no GPU visible, a driver too old for the build, or a GPU it has no kernels for)."""
    missing = why_no_gpu()
    if missing is None:
        return torch.device("cuda"), None
    if torch.version.cuda is None:  # the CPU wheel: the CPU is what it is for
        return torch.device("cpu"), None
    why, fix = missing
    return torch.device("cpu"), f"{why}, so this run trains on the CPU: {fix}; pass --device cpu to silence this"


_said: set[str] = set()  # the device lines this process printed: a policy run trains its reward model in-process


def print_once(text: str, file=None) -> None:
    """Print ``text`` unless this process printed it already."""
    if text not in _said:
        _said.add(text)
        print(text, file=file)


def pick_device(name: str, tf32: bool = True, gpu_sized: str = "") -> torch.device:
    """'auto' -> cuda if usable else cpu, said in one line on stdout (and a warning on stderr when a CUDA build of torch
    finds no usable GPU); on CUDA, TF32 matmuls unless ``tf32`` is False. ``gpu_sized``: the task, when its runs take
    days on a CPU: 'auto' then refuses the CPU in one line (--device cpu insists)."""
    if name == "auto":
        device, warning = auto_device()
        if device.type == "cpu" and gpu_sized:
            why, fix = why_no_gpu()
            raise UserError(f"--device auto finds no usable GPU ({why}), and a --task {gpu_sized} run takes days on a "
                            f"CPU: {fix}, or pass --device cpu to train on the CPU anyway")
        if torchrun_rank() == "0":  # once per run under torchrun: every rank picks the same
            where = f"cuda ({torch.cuda.get_device_name(0)})" if device.type == "cuda" else "cpu"
            print_once(f"--device auto: {where}; {visible_devices()}")  # stdout: stderr is for warnings and errors only
            if warning:
                print_once(f"warning: {warning}", file=sys.stderr)
    else:
        device = torch.device(name)
    if device.type == "cuda":
        # DEVIATION: TF32 matmuls on Ampere+ GPUs (the original ran fp32 on V100s) - several times faster
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return device


def check_at_least(flag: str, value: float, minimum: float, what: str) -> None:
    """A one-line UserError naming ``flag`` unless ``value`` >= ``minimum`` (``what`` says what the flag counts)."""
    if not value >= minimum:  # also catches NaN
        raise UserError(f"{flag} is {value}, but it is {what} and must be at least {minimum}; pass {flag} {minimum} or more")


def check_positive(flag: str, value: float, what: str) -> None:
    """A one-line UserError naming ``flag`` unless ``value`` is a finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{flag} is {value}, but it is {what} and must be a finite number > 0; pass a positive {flag}")


def check_in_range(flag: str, value: float, low: float, high: float, what: str, low_open: bool = False) -> None:
    """A one-line UserError naming ``flag`` unless ``low`` <= ``value`` <= ``high`` (``low`` < ``value`` if
    ``low_open``)."""
    if not ((value > low if low_open else value >= low) and value <= high):  # also catches NaN
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise UserError(f"{flag} is {value}, but it is {what} and must lie in {interval}; pass {flag} in {interval}")


def visible_devices() -> str:
    """What this torch can run on, in words: 'torch 2.x+cpu sees: cpu' or '... cpu, cuda:0 (NVIDIA H100 ...)'."""
    seen = ["cpu"]
    if torch.cuda.is_available():
        seen += [f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        seen.append("mps")
    return f"torch {torch.__version__} sees: {', '.join(seen)}"


def check_device(name: str) -> None:
    """--device names a device this torch can use, else one line saying what it can see."""
    if name == "auto":
        return
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(f"--device {name} is not a torch device; {visible_devices()}: pass --device auto, cpu or "
                        "cuda[:N]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}, but {visible_devices()} (no usable CUDA GPU): pass --device cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"--device {name}, but {visible_devices()}: pass --device cuda:N with N below "
                        f"{torch.cuda.device_count()}")
    if device.type == "mps" and "mps" not in visible_devices():
        raise UserError(f"--device {name}, but {visible_devices()}: pass --device cpu or auto")
    if device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device {name}: only cpu, cuda[:N] and mps are supported; {visible_devices()}")


def expand_home(path: Optional[str]) -> Optional[str]:
    """A path flag as the user meant it, resolved once when the flags are parsed: a leading ``~`` or ``~user`` is that
    home directory, also where the shell left it as typed (``--output-dir=~/runs``). Every check and every write then
    uses the returned value. Hub model names, oai:NAME and URLs never start with ``~``."""
    return os.path.expanduser(path) if path and path.startswith("~") else path


def check_output_dir(path: str, flag: str = "--output-dir") -> None:
    """``flag`` names a directory, or one that can be made: not a file, not under a file, not a link to nowhere,
    writable. ``path`` is the flag's value after `expand_home`. Writes nothing."""
    target = Path(path).absolute()
    if target.exists() and not target.is_dir():
        raise UserError(f"{flag} {path} is a file; pass a directory (it is made if missing)")
    existing = target
    while not existing.exists():
        if existing.is_symlink():  # a link to nowhere: making the directory would fail, or write where it points
            raise UserError(f"{flag} {path}: {existing} is a symbolic link to {os.readlink(existing)}, which does not "
                            "exist; pass a directory path without a dangling link")
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {path} lies under the file {existing}; pass a directory path with no file in it")
    try:  # a real probe: os.access says yes to root on a read-only or special file system
        os.rmdir(tempfile.mkdtemp(prefix=".lmhp-write-check-", dir=existing))
    except OSError as e:
        raise UserError(f"{flag} {path} cannot be written (making a directory in {existing} failed: "
                        f"{e.strerror or e}); pass a writable directory") from None
