"""Which torch device a run uses: --device checked against what this torch sees, and 'auto' decided once (a usable
CUDA GPU, else the CPU, with a warning or a refusal when a GPU was expected)."""

from __future__ import annotations

import sys
from typing import Optional

import torch

from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.torchrun import processes_per_node, torchrun_rank


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
    """--device names a device this torch can use, one per torchrun process of a node, else one line saying what it
    can see."""
    if name == "auto":
        if why_no_gpu() is None:  # auto takes the GPUs: one per process, as cuda
            check_gpus_per_process(name, torch.device("cuda"))
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
    check_gpus_per_process(name, device)


def check_gpus_per_process(name: str, device: torch.device) -> None:
    """Under torchrun, each process of a node takes a GPU of its own (GPU LOCAL_RANK, ranks.setup_distributed): a fixed
    cuda:N for several processes of a node, or more processes than the node's GPUs, is one line here, before any
    process group (else NCCL refuses two processes on one GPU, or CUDA says "invalid device ordinal" in a collective)."""
    per_node = processes_per_node()
    if per_node <= 1 or device.type != "cuda":
        return
    if device.index is not None:
        raise UserError(f"--device {name} puts all {per_node} processes of this node on GPU {device.index}, which NCCL "
                        "refuses: pass --device cuda (process i of a node takes GPU i), and choose the GPUs with "
                        "CUDA_VISIBLE_DEVICES")
    gpus = torch.cuda.device_count()
    if per_node > gpus:
        raise UserError(f"torchrun starts {per_node} processes on this node, one per GPU, but {visible_devices()} "
                        f"({gpus} GPU{'s' if gpus != 1 else ''}): pass --nproc-per-node {gpus} or fewer")
