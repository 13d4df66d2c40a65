"""Where the GPU waits in a real `tinylm fit`: a torch.profiler trace of steady optimizer steps, with Lightning's
action names, and the GPU's idle gaps laid against what the host was doing in them.

`StepsProfiler` is a Lightning `PyTorchProfiler` (so every callback hook, the batch fetch, the training step,
backward and the optimizer step carry a `[pl][profile]...` label in the trace) that records `active` micro-batches
after skipping `wait` (Lightning steps the torch profiler once per `training_step`). Give it to the user's command:

    python -m tinylm fit --config configs/gpt2-124m.yaml ... --trainer.max_steps 16 \\
      --trainer.profiler '{"class_path": "benchmarks.gpu.profile_fit.StepsProfiler",
                           "init_args": {"out": "OUT", "wait": 95, "active": 24}}'

(run from the repository root, with it on PYTHONPATH). When the recording ends it writes into OUT:
- `trace.json.gz`: the chrome trace (chrome://tracing, https://ui.perfetto.dev);
- `profile.json` / `profile.md`: the GPU's busy share of the recorded span, its idle gaps of 50 µs or more (count,
  total, the 15 longest with the host's innermost Lightning action and CUDA runtime calls inside each), the host
  time and the GPU idle time under each Lightning action, the CUDA runtime calls (syncs, copies, launches) by total
  time, and the kernels by total time.

    python benchmarks/gpu/profile_fit.py TRACE.json[.gz] OUT   # the same analysis of a trace written before
"""

from __future__ import annotations

import collections
import gzip
import json
import sys
from pathlib import Path

import torch
from lightning.pytorch.profilers import PyTorchProfiler

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
GAP_US = 50.0  # a gap between two device events shorter than this is launch latency, not waiting


class StepsProfiler(PyTorchProfiler):
    """Records micro-batches ``wait + 2`` to ``wait + 1 + active`` (1-based: after ``wait`` skipped and one warm-up)
    and analyses them."""

    def __init__(self, out: str, wait: int = 95, active: int = 24) -> None:
        self.out = Path(out)
        super().__init__(dirpath=out, filename="lightning-summary", record_module_names=False,
                         export_to_chrome=False, with_stack=False, record_shapes=False,
                         schedule=torch.profiler.schedule(wait=wait, warmup=1, active=active),
                         on_trace_ready=self._ready)

    def _ready(self, prof) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        raw = self.out / "trace.json"
        prof.export_chrome_trace(str(raw))
        trace = json.loads(raw.read_text())
        with gzip.open(self.out / "trace.json.gz", "wt") as f:
            json.dump(trace, f)
        raw.unlink()
        table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=70)
        write(analyse(trace), self.out, table)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def analyse(trace: dict) -> dict:
    """The GPU's busy share, its idle gaps and what the host did in them, from a chrome trace's events."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    device = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events if e.get("cat") in DEVICE_CATS]
    actions = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("[pl][profile]")]
    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]
    if not device:
        return {"device_events": 0, "note": "no GPU events in the trace (a CPU run)"}
    busy = _union(device)
    t0, t1 = busy[0][0], busy[-1][1]
    gaps = [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] - a[1] >= GAP_US]

    def innermost(g0: float, g1: float) -> list[tuple[str, float]]:
        inside = [(e["name"][len("[pl][profile]"):], _overlap(g0, g1, e["ts"], e["ts"] + e["dur"]), e["dur"])
                  for e in actions]
        inside = [x for x in inside if x[1] >= 0.1 * (g1 - g0)]
        inside.sort(key=lambda x: x[2])  # innermost (shortest) first
        return [(n, round(o, 1)) for n, o, _ in inside[:4]]

    def calls(g0: float, g1: float) -> list[tuple[str, float]]:
        out = [(e["name"], round(_overlap(g0, g1, e["ts"], e["ts"] + e["dur"]), 1)) for e in runtime]
        return sorted((x for x in out if x[1] >= 5), key=lambda x: -x[1])[:4]

    longest = sorted(gaps, key=lambda g: g[0] - g[1])[:15]
    per_action: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for e in actions:
        a0, a1 = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if _overlap(a0, a1, t0, t1) <= 0:
            continue
        row = per_action[e["name"][len("[pl][profile]"):]]
        row[0] += e["dur"]
        row[1] += sum(_overlap(a0, a1, g0, g1) for g0, g1 in gaps)
        row[2] += 1
    per_call: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in runtime:
        if _overlap(e["ts"], e["ts"] + e["dur"], t0, t1) > 0:
            per_call[e["name"]][0] += e["dur"]
            per_call[e["name"]][1] += 1
    per_kernel: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("cat") in DEVICE_CATS:
            per_kernel[e["name"][:90]][0] += e["dur"]
            per_kernel[e["name"][:90]][1] += 1
    span = t1 - t0
    busy_us = sum(b - a for a, b in busy)
    return {
        "span_ms": round(span / 1e3, 3), "gpu_busy_ms": round(busy_us / 1e3, 3),
        "gpu_busy_share": round(busy_us / span, 4), "device_events": len(device),
        "gaps_over_50us": len(gaps), "gaps_total_ms": round(sum(b - a for a, b in gaps) / 1e3, 3),
        "longest_gaps": [{"at_ms": round((a - t0) / 1e3, 3), "us": round(b - a, 1), "host_actions": innermost(a, b),
                          "runtime_calls": calls(a, b)} for a, b in longest],
        "actions": sorted(({"action": k, "calls": int(v[2]), "host_ms": round(v[0] / 1e3, 3),
                            "gpu_idle_under_ms": round(v[1] / 1e3, 3)} for k, v in per_action.items()),
                          key=lambda r: -r["gpu_idle_under_ms"])[:40],
        "runtime_calls": sorted(({"call": k, "calls": int(v[1]), "ms": round(v[0] / 1e3, 3)}
                                 for k, v in per_call.items()), key=lambda r: -r["ms"])[:15],
        "kernels": sorted(({"kernel": k, "calls": int(v[1]), "ms": round(v[0] / 1e3, 3)}
                           for k, v in per_kernel.items()), key=lambda r: -r["ms"])[:25],
    }


def write(result: dict, out: Path, table: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(result, indent=1) + "\n")
    md = ["# Where the GPU waits in `tinylm fit` (benchmarks/gpu/profile_fit.py)", ""]
    if "span_ms" not in result:
        md += [result.get("note", "")]
    else:
        md += [f"Recorded span {result['span_ms']} ms: GPU busy {result['gpu_busy_ms']} ms "
               f"({100 * result['gpu_busy_share']:.1f} %); {result['gaps_over_50us']} idle gaps of 50 µs or more, "
               f"{result['gaps_total_ms']} ms in all.", "", "## Longest gaps", "",
               "| at ms | µs | host's Lightning actions in it (overlap µs) | CUDA runtime calls in it |",
               "|---:|---:|---|---|"]
        md += [f"| {g['at_ms']} | {g['us']} | {'; '.join(f'{n} ({o})' for n, o in g['host_actions'])} | "
               f"{'; '.join(f'{n} ({o})' for n, o in g['runtime_calls'])} |" for g in result["longest_gaps"]]
        md += ["", "## Lightning actions by GPU idle time under them", "",
               "| action | calls | host ms | GPU idle under it, ms |", "|---|---:|---:|---:|"]
        md += [f"| {r['action']} | {r['calls']} | {r['host_ms']} | {r['gpu_idle_under_ms']} |"
               for r in result["actions"]]
        md += ["", "## CUDA runtime calls", "", "| call | calls | ms |", "|---|---:|---:|"]
        md += [f"| {r['call']} | {r['calls']} | {r['ms']} |" for r in result["runtime_calls"]]
        md += ["", "## Kernels", "", "| kernel | calls | ms |", "|---|---:|---:|"]
        md += [f"| `{r['kernel']}` | {r['calls']} | {r['ms']} |" for r in result["kernels"]]
    if table:
        md += ["", "## torch.profiler key averages", "", "```", table, "```"]
    (out / "profile.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python benchmarks/gpu/profile_fit.py TRACE.json[.gz] OUT")
    src = Path(sys.argv[1])
    opener = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt") as f:
        write(analyse(json.load(f)), Path(sys.argv[2]))
    print((Path(sys.argv[2]) / "profile.md").read_text())
