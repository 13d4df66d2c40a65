"""`tinylm plan`'s memory estimate against `torch.cuda.max_memory_allocated`, and what CUDA allocates that plan
does not count, named from a memory snapshot (issue 34: plan missed ~130-145 MiB at every size on an H200).

1. probes, each in a fresh process: what the allocator holds after one matmul forward, its backward (autograd's
   own thread), the same under bf16 autocast, SDPA forward and backward, minus the tensors the probe made: the
   libraries' workspaces (cuBLAS keeps one per handle and stream, and autograd's thread has a handle of its own).
2. per configuration of benchmarks/bench_memory.py (same shapes; its CPU measurements are in docs/benchmarks.md):
   three training steps as tinylm runs them (loss, backward, clip, fused AdamW or Muon + AdamW, zero_grad to None),
   the measured peak beside plan's, and, from a snapshot of the allocator's history, the blocks alive at the
   peak grouped by where they were allocated (the largest groups first), so what plan lacks has a name.

    python benchmarks/gpu/plan_memory.py [--json OUT] [--configs 0,4]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: bench_memory's configurations
from bench_memory import CONFIGS, _setup  # noqa: E402

MiB = 2**20
PROBES = ("matmul", "matmul_backward", "bf16_matmul", "bf16_matmul_backward", "sdpa", "sdpa_backward")


def probe(name: str) -> dict:
    """Bytes the allocator holds after one small computation beyond its inputs, outputs and gradients (what autograd
    saves for the backward counts in the forward's: 128 KiB of bf16 x under autocast)."""
    import torch.nn.functional as F

    dev = torch.device("cuda")
    torch.empty(1, device=dev)  # the context, outside the count
    bf16, sdpa = name.startswith("bf16"), name.startswith("sdpa")
    x = (torch.randn(2, 4, 128, 64, device=dev, dtype=torch.bfloat16) if sdpa
         else torch.randn(256, 256, device=dev)).requires_grad_()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()  # (x is there already)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        y = F.scaled_dot_product_attention(x, x, x, is_causal=True) if sdpa else x @ x
    torch.cuda.synchronize()
    forward = torch.cuda.memory_allocated() - base - y.nbytes
    if not name.endswith("backward"):
        return {"probe": name, "beyond_tensors": forward}
    y.float().sum().backward()
    torch.cuda.synchronize()
    return {"probe": name, "forward_beyond_tensors": forward,
            "beyond_tensors": torch.cuda.memory_allocated() - base - y.nbytes - x.grad.nbytes}


_LIBRARY = re.compile(r"blas|cudnn|workspace|nccl|flash|cutlass", re.I)


def _frames_key(frames: list[dict]) -> str:
    """Where a block was allocated: the innermost library frame that names its owner (cuBLAS, cuDNN: their
    workspaces) and the innermost tinylm frame (else the innermost Python one)."""
    def short(f: dict | None) -> str | None:
        if f is None:
            return None
        file = f.get("filename", "")
        return f.get("name", "?") + (f" ({Path(file).name}:{f.get('line', '')})" if file.endswith(".py") else "")

    library = next((f for f in frames if _LIBRARY.search(f.get("name", ""))), None)
    python = [f for f in frames if f.get("filename", "").endswith(".py")]
    ours = next((f for f in python if "tinylm" in f["filename"] or "bench_memory" in f["filename"]),
                python[0] if python else None)
    return " < ".join(filter(None, (short(library), short(ours)))) or "?"


def live_at_peak(snapshot: dict) -> tuple[int, list[tuple[str, int, int]]]:
    """(peak bytes, [(where, bytes, blocks)] alive at that moment, largest first), replaying the device trace."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for event in (snapshot.get("device_traces") or [[]])[0]:
        action, addr, size = event.get("action"), event.get("addr"), event.get("size", 0)
        if action == "alloc":
            live[addr] = (size, f"{_frames_key(event.get('frames') or [])} [{size / MiB:.3g} MiB blocks]"
                          if size >= MiB else _frames_key(event.get("frames") or []))
            total += size
            if total > peak:
                peak, at_peak = total, dict(live)
        elif action in ("free_requested", "free") and addr in live:
            total -= live.pop(addr)[0]
    groups: Counter = Counter()
    counts: Counter = Counter()
    for size, where in at_peak.values():
        groups[where] += size
        counts[where] += 1
    return peak, [(where, size, counts[where]) for where, size in groups.most_common(12)]


def measure(name: str) -> dict:
    """Three training steps of CONFIGS[name] on the GPU: the measured peak, plan's, and the blocks at the peak."""
    from tinylm.studies.plan import CUDA_WORKSPACES, memory

    kwargs, batch, precision = CONFIGS[name]
    dev = torch.device("cuda")
    torch.empty(1, device=dev)
    # C++ frames name a library's allocation (cuBLAS, cuDNN); symbolizing them takes a while, so the first config
    # (the laptop recipe: what plan lacks is most of its peak) gets them, the others Python frames only
    stacks = "all" if name == next(iter(CONFIGS)) else "python"
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks=stacks)
    base = torch.cuda.memory_allocated()
    module, _, _, step = _setup(name, False, "cuda")
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - base
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    planned = memory(module.model, batch_size=batch, precision=precision, checkpointing=False,
                     optimizer=module.hparams.optimizer, workspace=CUDA_WORKSPACES).peak  # as `tinylm plan` on a GPU
    peak, groups = live_at_peak(snapshot)
    return {"config": name, "measured_peak": measured, "plan_peak": planned, "plan_over_measured": planned / measured,
            "missing": measured - planned, "trace_peak": peak,
            "at_peak": [{"where": w, "bytes": b, "blocks": n} for w, b, n in groups]}


def _fresh(fn: str, arg: str, timeout: float = 120) -> dict:
    code = f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import plan_memory as m; " \
           f"print('RESULT', json.dumps(m.{fn}({arg!r})))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s", "arg": arg}
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1][:300], "arg": arg}
    return json.loads(lines[-1][7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(str(i) for i in range(len(CONFIGS))),
                        help="indices into bench_memory.CONFIGS")
    parser.add_argument("--json", type=Path, default=None, help="written after every result (a timeout keeps them)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "probes": [], "rows": []}

    def keep(kind: str, r: dict) -> dict:
        result[kind].append(r)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
        return r

    print(f"GPU: {result['gpu']}, torch {result['torch']}\n| probe | MiB held beyond its tensors |\n|---|---:|")
    for name in PROBES:
        p = keep("probes", _fresh("probe", name, timeout=60))
        print(f"| {name} | " + (f"{p['beyond_tensors'] / MiB:.2f}" if "beyond_tensors" in p else p["error"]) + " |",
              flush=True)
    print("\n| config | measured peak MiB | plan MiB | plan / measured | missing MiB |\n|---|---:|---:|---:|---:|")
    for i in args.configs.split(","):
        r = keep("rows", _fresh("measure", list(CONFIGS)[int(i)]))
        print(f"| {r['arg']} | {r['error']} | | | |" if "error" in r else
              f"| {r['config']} | {r['measured_peak'] / MiB:.1f} | {r['plan_peak'] / MiB:.1f} | "
              f"{r['plan_over_measured']:.3f} | {r['missing'] / MiB:.1f} |", flush=True)
    for r in result["rows"]:
        if "at_peak" in r:
            print(f"\nalive at the peak of {r['config']} ({r['trace_peak'] / MiB:.1f} MiB in the trace):")
            for g in r["at_peak"]:
                print(f"  {g['bytes'] / MiB:9.2f} MiB  {g['blocks']:5d} blocks  {g['where']}")


if __name__ == "__main__":
    main()
