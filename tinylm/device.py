"""Device and precision choice, in one place: what `auto` means for training and for generation."""

from __future__ import annotations

from pathlib import Path

import torch


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` is the first CUDA device when there is one, else the CPU; anything else is passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but this machine has no CUDA device; use --device cpu")
    return device


# bf16-mixed on a CPU with native bf16 ran 1.35x slower than 32-true at n_embd 128 (autocast overhead on small
# matrices) and 1.5x faster at n_embd 384 (benchmarks/bench_precision_cpu.py, docs/benchmarks.md).
CPU_BF16_MIN_WIDTH = 256


def resolve_precision(requested: str | None, n_embd: int) -> str:
    """The Trainer precision to use when a config leaves it unset.

    bf16-mixed on GPUs that support it (16-mixed on older ones). On CPUs: bf16-mixed only for models at least
    CPU_BF16_MIN_WIDTH wide on CPUs with native bf16 instructions (AVX512-BF16 or AMX), else 32-true.
    """
    if requested is not None:
        return str(requested)
    if torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    return "bf16-mixed" if n_embd >= CPU_BF16_MIN_WIDTH and _cpu_has_native_bf16() else "32-true"


def _cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags
