"""Gather the stages of benchmarks/gpu/run.sh (WORK) into report.md and report.json (OUT).

    python benchmarks/gpu/report.py WORK OUT
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

NANOGPT_VAL = 1.4697  # nanoGPT's published best val loss for its shakespeare-char recipe
STAGES = ("tests", "memory", "planmemory", "strategies", "syncs", "step124m", "loss124m", "tinystories",
          "tinystories256", "shakespeare", "vsnanogpt")


def load_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stage_status(work: Path) -> dict:
    out = {}
    for name in STAGES:
        try:
            rc, seconds = (work / f"{name}.rc").read_text().split()
            out[name] = {"rc": int(rc), "seconds": int(seconds)}
        except (OSError, ValueError):
            out[name] = None
    return out


def tests_summary(work: Path) -> dict | None:
    try:
        root = ET.parse(work / "tests.xml").getroot()
    except (OSError, ET.ParseError):
        return None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    cases = []
    for case in suite.iter("testcase"):
        state = "passed"
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                state = kind if kind != "failure" else "failed"
                message = (node.get("message") or "").splitlines()[0][:300] if node.get("message") else ""
                break
        else:
            message = ""
        cases.append({"name": case.get("name"), "state": state, "seconds": float(case.get("time", 0)),
                      "message": message})
    log = (work / "tests.log").read_text(errors="replace") if (work / "tests.log").exists() else ""
    return {"cases": cases, "resume": re.findall(r"exact resume on CUDA, .*", log)}


def shakespeare_summary(work: Path, status: dict | None) -> dict | None:
    path = work / "shakespeare" / "runs" / "shakespeare-char" / "csv" / "metrics.csv"
    if not path.exists():
        return None
    val, tps, mfu, last = [], [], [], 0
    with open(path) as f:
        for row in csv.DictReader(f):
            step = int(row["step"]) if row.get("step") else 0
            last = max(last, step)
            if row.get("val/loss"):
                val.append((float(row["val/loss"]), step))
            if row.get("train/tokens_per_sec") and step >= 100:
                tps.append(float(row["train/tokens_per_sec"]))
            if row.get("train/mfu") and step >= 100:
                mfu.append(float(row["train/mfu"]))
    best = min(val) if val else (None, None)
    return {"best_val_loss": best[0], "best_step": best[1], "last_step": last, "val_points": len(val),
            "final_val_loss": val[-1][0] if val else None,
            "tokens_per_sec_median": statistics.median(tps) if tps else None,
            "mfu_median": statistics.median(mfu) if mfu else None,
            "wall_seconds": status["seconds"] if status else None, "nanogpt_val_loss": NANOGPT_VAL}


def fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def step_table(bench: dict) -> list[str]:
    lines = [("| pass | side | step ms | tokens/s | TFLOP/s | MFU (datasheet) | MFU (measured matmul) | "
             "Lightning / plain |"), "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in bench.get("rows", []):
        ratio = r["lit_step"] / r["plain_step"]
        for side, label in (("lit", "Lightning"), ("plain", "plain PyTorch")):
            lines.append(f"| {r['pass']} | {label} | {r[f'{side}_step'] * 1e3:.2f} | "
                         f"{fmt(r.get(f'{side}_tokens_per_sec'), ',.0f')} | {fmt(r.get(f'{side}_tflops'), '.1f')} | "
                         f"{fmt(r.get(f'{side}_mfu'), '.1%')} | {fmt(r.get(f'{side}_mfu_measured'), '.1%')} | "
                         f"{f'{ratio:.3f}' if side == 'lit' else ''} |")
    return lines


def plan_memory_lines(p: dict | None) -> list[str]:
    """benchmarks/gpu/plan_memory.py's probes and plan-vs-measured rows, with what was alive at each peak."""
    if not p:
        return []
    mib = 2**20
    md = ["", "## `tinylm plan` against `max_memory_allocated` (benchmarks/gpu/plan_memory.py)", "",
          "| probe | MiB beyond its tensors |", "|---|---:|"]
    md += [f"| {r.get('probe', r.get('arg'))} | " + (f"{r['beyond_tensors'] / mib:.2f}" if "beyond_tensors" in r
                                                      else r.get("error", "")) + " |" for r in p["probes"]]
    md += ["", "| config | measured MiB | plan MiB | plan / measured | missing MiB |", "|---|---:|---:|---:|---:|"]
    md += [f"| {r['config']} | {r['measured_peak'] / mib:.1f} | {r['plan_peak'] / mib:.1f} | "
           f"{r['plan_over_measured']:.3f} | {r['missing'] / mib:.1f} |" if "error" not in r
           else f"| {r['arg']} | {r['error']} | | | |" for r in p["rows"]]
    for r in p["rows"]:
        md += ["", f"Alive at the peak of {r['config']}:", "", "```"] + [
            f"{g['bytes'] / mib:9.2f} MiB {g['blocks']:5d} blocks  {g['where']}" for g in r["at_peak"]] + ["```"] \
            if "at_peak" in r else []
    return md


def main(work: Path, out: Path) -> None:
    status = stage_status(work)
    report = {"env": (work / "env.txt").read_text() if (work / "env.txt").exists() else None, "stages": status,
              "tests": tests_summary(work), "memory": load_json(work / "memory.json"),
              "plan_memory": load_json(work / "plan_memory.json"),
              "syncs": load_json(work / "syncs.json"), "step124m": load_json(work / "step124m.json"),
              "loss124m": load_json(work / "loss124m.json"),
              "tinystories": load_json(work / "tinystories.json"),
              "tinystories256": load_json(work / "tinystories256.json"),
              "shakespeare": shakespeare_summary(work, status.get("shakespeare"))}
    strategies = work / "strategies" / "status.txt"
    report["strategies"] = strategies.read_text().split("\n") if strategies.exists() else None
    md = ["# tinylm on a GPU: report of benchmarks/gpu/run.sh", "", "```", (report["env"] or "").strip(), "```", "",
          "| stage | exit | seconds |", "|---|---:|---:|"]
    md += [f"| {k} | {v['rc'] if v else 'not run'} | {v['seconds'] if v else ''} |" for k, v in status.items()]
    t = report["tests"]
    if t:
        counts = {s: sum(c["state"] == s for c in t["cases"]) for s in ("passed", "failed", "error", "skipped")}
        md += ["", "## GPU tests (`pytest -m gpu`)", "", ", ".join(f"{n} {s}" for s, n in counts.items() if n), "",
               "| test | result | seconds | message |", "|---|---|---:|---|"]
        md += [f"| {c['name']} | {c['state']} | {c['seconds']:.1f} | {c['message'].replace('|', '/')} |"
               for c in t["cases"]]
        md += [f"- {line}" for line in t["resume"]]
    for key, title in (("step124m", "GPT-2 124M: Lightning vs plain PyTorch, compile + bf16 + flash + fused AdamW"),
                       ("loss124m", ("GPT-2 124M: Lightning (the model and the loss compiled as one graph) vs "
                                    "plain PyTorch with the loss outside the compiled model, as tinylm did before")),
                       ("tinystories", "tinystories shape (~7M, BPE 8192): Lightning vs plain PyTorch"),
                       ("tinystories256", ("tinystories shape, micro-batch 256 (the recipe's tokens per optimizer step "
                                          "with accumulate_grad_batches 1): Lightning vs plain PyTorch"))):
        b = report[key]
        if b:
            md += ["", f"## {title}", "", (f"{b['gpu']}; micro-batch {b['batch_size']} x {b['block_size']}, "
                   f"{b['precision']}, compile {b['compile']}; datasheet peak "
                   f"{fmt(b.get('datasheet_peak') and b['datasheet_peak'] / 1e12, '.0f')} TFLOP/s, measured bf16 "
                   f"matmul {fmt(b.get('matmul_peak') and b['matmul_peak'] / 1e12, '.0f')} TFLOP/s"), ""]
            md += step_table(b)
            if b.get("profile"):
                md += ["", "torch.profiler, 3 plain steps, by CUDA time:", "", "```", b["profile"].strip(), "```"]
    s = report["shakespeare"]
    if s:
        md += ["", "## nanoGPT's shakespeare-char recipe (`configs/shakespeare-char.yaml`, 5000 steps)", "",
               (f"best val/loss {fmt(s['best_val_loss'], '.4f')} at step {s['best_step']} (nanoGPT: {NANOGPT_VAL}); "
               f"final {fmt(s['final_val_loss'], '.4f')}; {s['last_step'] + 1} steps; wall time of `tinylm fit` "
               f"{s['wall_seconds']} s (compilation, validation every 250 steps and samples included); "
               f"median {fmt(s['tokens_per_sec_median'], ',.0f')} tokens/s, MFU {fmt(s['mfu_median'], '.1%')}")]
    report["vs_nanogpt"] = load_json(out / "vs_nanogpt.json")
    if (out / "vs_nanogpt.md").exists():  # benchmarks/gpu/vs_nanogpt.sh's table
        md += ["", "#" + (out / "vs_nanogpt.md").read_text().strip()]
    m = report["memory"]
    if m:
        md += ["", "## Peak GPU memory per recipe (bf16-mixed, eager, `max_memory_allocated`)", "",
               "| config | params | micro-batch x block | optimizer | peak GiB |", "|---|---:|---|---|---:|"]
        md += [f"| {r['config']} | {r['params'] / 1e6:.1f}M | {r['batch_size']} x {r['block_size']} | "
               f"{r['optimizer']} | {r['peak_gib']:.2f} |" if "error" not in r else f"| {r['config']} | | | | OOM |"
               for r in m["rows"]]
    md += plan_memory_lines(report["plan_memory"])
    if report["strategies"]:
        md += ["", "## Strategies on one GPU (start, train, checkpoint, resume)", ""]
        md += [f"- {line}" for line in report["strategies"] if line]
    y = report["syncs"]
    if y:
        md += ["", "## Host syncs per step (`tinylm fit`, shakespeare-char, eager)", "",
               (f"{y['syncs_per_other_step']:.2f} per step that logs nothing ({y['other_steps']} steps), "
               f"{y['syncs_per_logging_step']:.2f} per logging step ({y['logging_steps']} steps)"), ""]
        md += [f"- {n} x {where}" for where, n in y["where"].items()]
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print("\n".join(md))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
