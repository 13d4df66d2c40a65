"""Device and precision choice, in one place: what `auto` means for training and for generation."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import torch

from tinylm.machine import usable_cpus


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` is the first CUDA device when there is one, else the CPU; anything else is passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from e
    if device.type not in ("cpu", "cuda", "mps", "xpu"):  # e.g. meta: tensors without data, nothing can run there
        raise ValueError(f"device {name!r} cannot run a model; use auto, cpu, cuda or cuda:N (or mps, xpu)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but this machine has no CUDA device; use --device cpu")
    try:
        torch.empty(0, device=device)  # mps without Apple's backend, cuda:7 on a 1-GPU machine, ...
    except (RuntimeError, AssertionError) as e:
        reason = str(e).splitlines()[0].split(". ")[0][:150]
        raise ValueError(f"device {name!r} is not usable here ({reason}); use --device auto or cpu") from None
    return device


COMPILE_TORCH = (2, 7)
"""The oldest torch whose torch.compile trains tinylm's model on the gradients eager mode gives (measured on the CPU
with inductor: 2.3 failed to compile RMSNorm and RoPE; 2.6 gave every model, the default too, wrong gradients;
2.7.1, 2.8.0, 2.9.1, 2.10.0, 2.11 (with layers._as_dtype) and later agree with eager within 5e-6 in fp32, the
default and the modern GPT, and their 20-step compiled fits follow the eager loss curve within 1e-6)."""


def check_compile_torch(version: str = torch.__version__) -> None:
    """Refuse model.compile_model on a torch older than COMPILE_TORCH, in one line with the ways out."""
    from tinylm.errors import UnavailableError

    if tuple(map(int, re.match(r"(\d+)\.(\d+)", version).groups())) < COMPILE_TORCH:
        raise UnavailableError(f"model.compile_model=true needs torch >= {'.'.join(map(str, COMPILE_TORCH))} (older "
                               "torch.compile gave tinylm's layers wrong gradients, silently, or failed on them); this "
                               f"is torch {version}: upgrade torch, or set model.compile_model false")


def wide_dtype(device: torch.device) -> torch.dtype:
    """The dtype of sums that need float64 (validation's nats and bytes) on ``device``: float32 on Apple's MPS, which
    has no float64 (moving a float64 tensor there is a TypeError: `tinylm fit` on an Apple-silicon Mac, where
    Lightning's accelerator ``auto`` is MPS, failed as it moved the module there)."""
    return torch.float32 if device.type == "mps" else torch.float64


def precision_dtypes(precision: str | int) -> tuple[torch.dtype, torch.dtype]:
    """(dtype of the weights, dtype of the matmuls) under a Lightning precision: "bf16-mixed" and "16-mixed" (and
    their old names "bf16", "16") keep fp32 weights and autocast matmuls to 16 bits; "bf16-true" and "16-true" hold
    the weights in 16 bits too; "32-true" / 32 and "64-true" / 64 are fp32 and fp64 throughout."""
    precision = str(precision)  # Lightning takes 16, 32 and 64 as numbers too
    compute = torch.bfloat16 if "bf16" in precision else torch.float16 if "16" in precision else \
        torch.float64 if precision.startswith("64") else torch.float32
    mixed = compute in (torch.bfloat16, torch.float16) and not precision.endswith("-true")  # fp32 master weights
    return (torch.float32 if mixed else compute), compute


# bf16-mixed on a CPU with native bf16 ran 1.35x slower than 32-true at n_embd 128 (autocast overhead on small
# matrices) and 1.5x faster at n_embd 384 (benchmarks/bench_precision_cpu.py, docs/benchmarks.md).
CPU_BF16_MIN_WIDTH = 256


def resolve_precision(requested: str | None, n_embd: int, accelerator: object = None) -> str:
    """The Trainer precision to use when a config leaves it unset.

    bf16-mixed on GPUs that support it (16-mixed on older ones). On CPUs: bf16-mixed only for models at least
    CPU_BF16_MIN_WIDTH wide on CPUs with native bf16 instructions (AVX512-BF16 or AMX), else 32-true. A run that
    trains on the CPU of a machine with a GPU (``accelerator`` "cpu", --trainer.accelerator's) takes the CPU's: the
    GPU's 16-mixed there was Lightning's warning that fp16 AMP does not run on a CPU, and bf16-mixed in its place.
    """
    if requested is not None:
        return str(requested)
    if torch.cuda.is_available() and not names_cpu(accelerator):
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    return "bf16-mixed" if n_embd >= CPU_BF16_MIN_WIDTH and _cpu_has_native_bf16() else "32-true"


def names_cpu(accelerator: object) -> bool:
    """Whether --trainer.accelerator is the CPU: "cpu" (any case), a CPUAccelerator (a config's ``class_path:
    lightning.pytorch.accelerators.CPUAccelerator``, instantiated), or its class_path as a config record holds it (a
    dict, jsonargparse's Namespace): an accelerator object took the GPU's 16-mixed on a machine with a GPU."""
    if isinstance(accelerator, str):
        return accelerator.strip().lower() == "cpu"
    import importlib

    from lightning.pytorch.accelerators import CPUAccelerator

    if hasattr(accelerator, "get"):  # {"class_path": "lightning.pytorch.accelerators.CPUAccelerator", ...}
        module, _, name = str(accelerator.get("class_path") or "").rpartition(".")
        try:
            accelerator = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            return False
    return isinstance(accelerator, CPUAccelerator) or isinstance(accelerator, type) and \
        issubclass(accelerator, CPUAccelerator)


def _cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


# Dense bf16/fp16 tensor-core peaks (FLOP/s, fp32 accumulation as PyTorch's matmuls use), most specific name first.
# MFU = achieved model FLOP/s / this number (the PaLM paper's definition, as nanoGPT's estimate_mfu). These take
# precedence over Lightning's table (`get_available_flops`), which misses newer chips, lists some Hopper parts at
# their 2:4-sparse peak (H100 NVL bf16 1979e12 and the H200s ~2000e12, twice what a dense matmul can reach; its H100
# SXM entry is the dense 989e12), and gives the RTX/A6000/A40 cards their vector (non-tensor-core) rate for 16-bit,
# a half or a quarter of what their tensor cores reach. Lightning's table covers the rest (V100, T4, fp32, ...).
PEAK_BF16 = {
    "b200": 2250e12,
    "gh200": 989.5e12,  # the H100 SXM's compute die beside a Grace CPU
    "h200 nvl": 835.5e12,
    "h200": 989.5e12,  # same SXM compute die as the H100 SXM; more and faster memory
    "h100 pcie": 756e12,
    "h100 nvl": 835e12,
    "h100": 989.5e12,  # SXM ("NVIDIA H100 80GB HBM3")
    "mi300x": 1307e12,
    "a100": 312e12,
    "l40s": 362e12,
    "l40": 181e12,
    "l4": 121e12,
    "a10g": 70e12,
    "a6000": 154.8e12,  # RTX A6000 (Ampere): pro cards accumulate in fp32 at full rate
    "a40": 149.7e12,
    "4090": 165.2e12,  # GeForce: fp32 accumulation at half the fp16-accumulate rate
    "4080 super": 104.4e12,
    "4080": 97.5e12,
    "3090 ti": 80e12,
    "3090": 71e12,
    "3080 ti": 68.2e12,
    "3080": 59.5e12,
    "3070 ti": 43.5e12,
    "3070": 40.6e12,
}
# nvidia-smi's names of the SXM parts name no form factor ("NVIDIA H100 80GB HBM3"): Lightning's key for each
_SXM = {"gh200": "h100 sxm", "h100": "h100 sxm", "h200": "h200 sxm1"}  # GH200: the H100 SXM's compute die


def _names_chip(name: str, chip: str) -> bool:
    """Whether `chip` ("a40", "v100 sxm") appears in `name` as whole words, or a model number's start ("v100 sxm"
    in "v100 sxm2"): "a40" is not in "rtx a4000", "l4" not in "l40s", "h20" not in "h200"."""
    return re.search(rf"(?<![a-z0-9]){re.escape(chip)}(?![a-z0-9])", name) is not None or (
        " " in chip and re.search(rf"(?<![a-z0-9]){re.escape(chip)}\d*(?![a-z])", name) is not None)


def known_gpu(name: str) -> bool:
    """Whether ``name`` names a GPU whose peak FLOP/s tinylm knows at some precision (ours or Lightning's table)."""
    return any(peak_flops_by_name(name, p) for p in ("bf16-mixed", "16-mixed", "32-true"))


def gpu_names() -> list[str]:
    """The GPU names `--gpu` takes (short forms; a full device name containing one works too)."""
    from lightning.fabric.utilities.throughput import _CUDA_FLOPS

    # Lightning's table spells two H200 keys "h200 nvl1" / "h200 sxm1"; "h200" covers them
    return sorted(n for n in set(PEAK_BF16) | set(_CUDA_FLOPS) if not re.search(r"(nvl|sxm)1$", n))


def peak_flops_by_name(name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of the GPU called ``name`` (e.g. "NVIDIA H100 80GB HBM3", "h100", "a100") at a Lightning
    precision string, or None when unknown. A 32-bit precision counts TF32's peak once fp32 matmuls may use it
    (torch.set_float32_matmul_precision "high" or "medium")."""
    name = re.sub(r"[-_\s]+", " ", name.lower()).strip()  # "Tesla V100-SXM2-16GB" -> "tesla v100 sxm2 16gb"
    dtype = precision_dtypes(precision)[1]
    tf32 = dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest"
    if dtype in (torch.bfloat16, torch.float16) or tf32:
        found = next((v for k, v in PEAK_BF16.items() if _names_chip(name, k)), None)
        if found is not None:  # TF32 runs at half the 16-bit rate on each of these (Lightning's table gives the
            return found / 2 if tf32 else found  # sparse TF32 figure for the H200 and H100 NVL: twice the dense)
    if dtype == torch.float32 and not tf32 and _names_chip(name, "h100 nvl"):
        return 60e12  # one card's (Lightning's 133.8e12 is the pair's)
    from lightning.fabric.utilities.throughput import (
        _CUDA_FLOPS,  # private: guarded in test_lightning_private_api
    )

    if tf32:
        dtype = "tfloat32"  # fp32 matmuls on the tensor cores in TF32 (7x the fp32 peak of an H100), as Lightning's
    # Lightning's keys are chip names ("h100 sxm", "a100"): "NVIDIA A100-SXM4-40GB" contains one; an H100 or H200
    # that names no form factor is the SXM part; a short name is the start of a key ("v100": "v100 sxm", SXM
    # first); a fragment that names no chip ("", "x", "a") matches nothing
    # ("v100 32gb", "2080 ti": a short name with its memory, or a key's end without its "rtx", names it too)
    short = re.sub(r"\s*\b\d+\s*gb\b", "", name).strip()
    prefix = re.fullmatch(r"[a-z]*\d+\w*", short) is not None
    chip = next((k for k in _CUDA_FLOPS if _names_chip(name, k)), None) or \
        next((sxm for short, sxm in _SXM.items() if _names_chip(name, short)), None) or \
        next((k for k in sorted(_CUDA_FLOPS, key=lambda k: "sxm" not in k) if prefix and k.startswith(short + " ")
              or re.match(r"\d", short) and k.endswith(" " + short)), None)
    flops = _CUDA_FLOPS[chip].get(dtype) if chip else None
    return float(flops) if flops else None


# ---- CPU threads on a shared machine -----------------------------------------------------------------------------
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # set: the user chose torch's thread count, tinylm keeps it


_TORCH_DEFAULT: list[int] = []


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) jiffies of all CPUs together since boot (``/proc/stat``), or None where the OS does not say."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields[:8])  # idle + iowait; without guest time


def others_cpu_seconds() -> float | None:
    """CPU seconds that all processes but this one have used since boot (``/proc/stat`` less this process's CPU
    time), or None where the OS does not say; the difference of two readings over their wall time is how many CPUs
    other jobs kept busy meanwhile."""
    times = _cpu_times()
    if times is None:
        return None
    idle, total = times
    return (total - idle) / os.sysconf("SC_CLK_TCK") - time.process_time()


def torch_default_threads() -> int:
    """Torch's own CPU thread count, before a command of this process changed it (scaling runs several; a notebook's
    `main([...])` puts it back after each)."""
    if not _TORCH_DEFAULT:
        _TORCH_DEFAULT.append(torch.get_num_threads())
    return _TORCH_DEFAULT[0]


def busy_cpus(sample_s: float = 0.3) -> float:
    """How many CPUs other processes keep busy now: the machine's busy CPU time over ``sample_s`` seconds less this
    process's own (its OpenMP threads spin for a while after torch's last operator), over the interval. Where
    ``/proc/stat`` is missing: the 1-minute load average. Both are for the whole machine, scaled to the share of it
    this process may use."""
    cpus, machine = usable_cpus(), os.cpu_count() or 1
    before, own, t0 = _cpu_times(), time.process_time(), time.perf_counter()
    if before is not None:
        time.sleep(sample_s)
        after, own, elapsed = _cpu_times(), time.process_time() - own, time.perf_counter() - t0
        if after is not None and after[1] > before[1]:
            busy = (1 - (after[0] - before[0]) / (after[1] - before[1])) * machine - own / elapsed
            return min(float(cpus), max(0.0, busy) * cpus / machine)
    try:
        return min(float(cpus), os.getloadavg()[0] * cpus / machine)
    except (AttributeError, OSError):
        return 0.0


def choose_cpu_threads(requested: int | None = None, *, default: int | None = None,
                       busy: float | None = None, resumed: int | None = None,
                       setter: str = "--run.threads N") -> tuple[int, str]:
    """Torch's CPU thread count for a run, and why, in words for the start line.

    ``requested`` (``--run.threads``) wins, then the environment (`THREAD_ENV_VARS`), then ``resumed`` (the count of
    the run a resume continues, from its checkpoint: exact resume). Otherwise the CPUs other
    processes leave free, rounded, at least 1 and at most torch's own default (``default``: the physical cores, what
    it runs with today). Why: torch's threads meet at a barrier after every operator, so with every CPU taken each
    step waits for its slowest, descheduled thread; a laptop-recipe step at load ~14 on 2 cores took 5.8 s with 2
    threads and 0.64 s with 1 (benchmarks/bench_cpu_threads.py measures it at load ~= cores). ``setter``: how the
    user sets the count instead, for the words.
    """
    default = default or torch_default_threads()
    if requested is not None:
        return requested, f"{requested} (--run.threads)"
    ignored = ""
    for var in THREAD_ENV_VARS:
        if (value := os.environ.get(var, "").strip()).isdigit() and int(value) > 0:
            return torch.get_num_threads(), f"{torch.get_num_threads()} (torch's, from {var}={value})"
        if value:  # 0 or "abc": OpenMP warns and torch ignores it (the line said "from OMP_NUM_THREADS=0")
            ignored += f"; {var}={value!r} is no thread count, ignored"
    if resumed:  # another count sums in another order: losses off the uninterrupted run's in the 4th-5th digit
        return resumed, (f"{resumed}, the run's own (from its checkpoint: a resume sums as the run did, exactly); "
                         f"{setter} sets it{ignored}")
    busy = busy_cpus() if busy is None else busy
    cpus = usable_cpus()
    n = max(1, min(default, round(cpus - busy)))
    why = f"{n} of {default}" + (f": other processes kept {busy:.1f} of {cpus} CPUs busy" if n < default else "")
    return n, why + f"; {setter} sets it" + ignored


def use_free_cpus(device: torch.device) -> None:
    """Torch's threads for a command that runs a trained model (generate, eval, sample-report) on ``device``: on a
    CPU, the CPUs other processes leave free (`choose_cpu_threads`; OMP_NUM_THREADS sets it), said in one line. A
    sample of the laptop recipe's model beside a training run on 2 cores took 42-50 s with torch's 2 threads and 21 s
    with 1 (its logits, and a 384-wide GPT-2-vocabulary model's, were bitwise the same with 1 and 2 threads)."""
    if device.type != "cpu":
        return
    import logging

    threads, why = choose_cpu_threads(busy=busy_cpus(0.1), setter="OMP_NUM_THREADS=N")
    torch.set_num_threads(threads)
    logging.getLogger("tinylm").info("CPU threads: %s", why)


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` now: CUDA's own count, else the machine's available physical memory (Linux's
    MemAvailable: free pages and the file cache the kernel gives back; the free pages alone, sysconf's count, are a
    few GB on a machine that has read its corpus, and refused what fits), or less where a cgroup's limit or the
    process's own (`ulimit -v`) leaves less; None where there is no cheap reading (then no check refuses anything)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # not Linux
            return None
    return min([available, *(f for f in (_cgroup_free(), address_space_free()) if f is not None)])


def address_space_free() -> int | None:
    """What this process's address-space limit (`ulimit -v`, RLIMIT_AS: a login node's, a batch system's) lets it
    map still, or None without one: past it every allocation fails (a fit's step ended in a 140-line allocator
    traceback) whatever the machine has free."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status", encoding="ascii") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (ImportError, OSError, ValueError, IndexError, StopIteration):  # not Linux
        return None
    return max(0, limit - mapped)


def _cgroup_free(root: Path = Path("/sys/fs/cgroup"), own: str | None = None, own_v1: str | None = None) -> int | None:
    """What this process's cgroup (a container's, a SLURM job's memory limit) and those above it let it allocate
    still, the least any of them leaves, or None without a limit: the machine's MemAvailable counts memory the kernel
    would kill the process for using. `own` is the process's cgroup v2 below `root` (/proc/self/cgroup's): a SLURM
    job's limit sits on the job's cgroup, above the step's that the process runs in (only the root's was read, where
    a container's cgroup namespace puts it), and a limit's level can be any of them. `own_v1`: its cgroup v1 memory
    controller's, below `root`/memory (a host on cgroup v1 or hybrid, a SLURM cluster's on RHEL 7/8: its limit was
    not read, and a run the job could not hold was let through to the kernel's OOM kill)."""
    frees = [*_levels_free(root, _own_cgroup() if own is None else own, v1=False),
             *_levels_free(root / "memory", _own_cgroup("memory") if own_v1 is None else own_v1, v1=True)]
    return min((f for f in frees if f is not None), default=None)


def _levels_free(root: Path, own: str, *, v1: bool) -> list[int | None]:
    """`_cgroup_level_free` of the cgroup ``own`` below ``root`` and of each level above it, up to ``root``."""
    folder = root / own.strip("/")
    return [_cgroup_level_free(f, v1=v1) for f in (folder, *folder.parents) if f == root or root in f.parents]


def _own_cgroup(controller: str = "") -> str:
    """This process's cgroup path: v2's (the "0::/PATH" line of /proc/self/cgroup), or under cgroup v1 the one of
    ``controller`` ("4:memory:/PATH"); "" where none is read."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return ""
    return next((path for _, names, path in (line for line in lines if len(line) == 3)
                 if (names == "" if not controller else controller in names.split(","))), "")


_V1_UNLIMITED = 2**62
"""A cgroup v1 memory.limit_in_bytes this large is none: "unlimited" reads 9223372036854771712 (2^63 less a page)."""


def _cgroup_level_free(folder: Path, *, v1: bool = False) -> int | None:
    """What one cgroup folder's limit (v2's memory.max, v1's memory.limit_in_bytes) leaves free: its use less its
    inactive file cache (the working set, as `docker stats` and the kubelet count it): a container that had read its
    corpus was charged the pages the kernel gives back, and had 0 bytes free."""
    names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file") if v1 else \
        ("memory.max", "memory.current", "inactive_file")  # (v1's total_: the level's and those below it, as its use)
    try:
        limit = (folder / names[0]).read_text().strip()
        used = int((folder / names[1]).read_text())
    except (OSError, ValueError):
        return None
    try:
        stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines() if line.count(" ") == 1)
        used -= min(used, int(stat.get(names[2], 0)))
    except (OSError, ValueError):
        pass
    if limit == "max" or v1 and limit.isdigit() and int(limit) >= _V1_UNLIMITED:
        return None
    return max(0, int(limit) - used)
