"""The helper of benchmarks/gpu/vs_nanogpt.sh: gives nanoGPT tinylm's prepared tokens, then reads both sides' logs.

    python benchmarks/gpu/vs_nanogpt.py link DATASET DEST [--meta]   # DATASET: a `tinylm prepare` folder
    python benchmarks/gpu/vs_nanogpt.py report WORK OUT [--skip N] [--log-every N]
    ... | python benchmarks/gpu/vs_nanogpt.py stamp        # each line of stdin with the time it arrived

`link` puts DATASET's train.bin / val.bin under DEST (nanoGPT's `data/<dataset>/`), so both sides read the same
token ids; `--meta` also writes the meta.pkl from which nanoGPT's train.py takes its vocabulary size (without it,
nanoGPT uses 50304: GPT-2's 50257 padded to a multiple of 64, as tinylm pads it).

`report` reads WORK/CASE/ for each case that ran: nanogpt.log (train.py's output) and tinylm's
runs/CASE/csv/metrics.csv, plus each side's "rc seconds" (nanogpt.rc, tinylm.rc), and writes OUT/vs_nanogpt.json
and OUT/vs_nanogpt.md. Tokens/s: nanoGPT's tokens per iteration over the median of its printed iteration times,
tinylm's median `train/tokens_per_sec` (its own SpeedMonitor: the rate over the last --window logging intervals),
each over the optimizer steps from --skip on (compilation and warm-up left out): for tinylm, the logged rates whose
whole window begins at --skip or later. When nanoGPT logs every N > 1 iterations (`--log_interval`), the time it
prints is that of the logging iteration alone, which also waits for the iterations queued before it: its rate is
then taken from the times its lines arrived (`stamp`), the tokens between two logged iterations over the seconds
between them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pickle
import re
import statistics
import sys
import time
from pathlib import Path

STAMP = r"^(?:(\d+\.\d+) )?"  # the time a line arrived, where `stamp` wrote one
ITER = re.compile(STAMP + r"iter (\d+): loss ([-\d.naif]+), time ([\d.]+)ms")
EVAL = re.compile(STAMP + r"step (\d+): train loss ([-\d.naif]+), val loss ([-\d.naif]+)")
TOKENS = re.compile(STAMP + r"tokens per iteration will be: ([\d,]+)")


def stamp() -> None:
    """Copy stdin to stdout, each line prefixed with the time it arrived (seconds since the epoch)."""
    for line in sys.stdin:
        sys.stdout.write(f"{time.time():.6f} {line}")
        sys.stdout.flush()


def link(dataset: Path, dest: Path, meta: bool) -> None:
    info = json.loads((dataset / "meta.json").read_text())
    if info["dtype"] != "uint16":  # nanoGPT's get_batch reads uint16
        raise SystemExit(f"{dataset} holds {info['dtype']} ids; nanoGPT's train.py reads uint16 only")
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("train.bin", "val.bin"):
        target = dest / name
        if target.is_symlink() or target.exists():
            target.unlink()
        os.symlink((dataset / name).resolve(), target)
    if meta:
        with open(dest / "meta.pkl", "wb") as f:
            pickle.dump({"vocab_size": info["vocab_size"]}, f)
    print(f"{dest}: {info['vocab_size']} ids, train/val from {dataset}")


def parse_nanogpt(log: Path) -> dict:
    """train.py's output: tokens per iteration, each `iter N: ... time Xms` line (and the time it arrived, or None),
    each `step N: ... val loss` line."""
    tokens, iters, evals = None, [], []
    for line in log.read_text(errors="replace").splitlines():
        if m := TOKENS.match(line):
            tokens = int(m[2].replace(",", ""))
        elif m := ITER.match(line):
            iters.append((int(m[2]), float(m[3]), float(m[4]) / 1e3, float(m[1]) if m[1] else None))
        elif m := EVAL.match(line):
            evals.append((int(m[2]), float(m[3]), float(m[4])))
    return {"tokens_per_iter": tokens, "iters": iters, "evals": evals}


def nanogpt_rate(nano: dict, skip: int) -> float | None:
    """nanoGPT's tokens/s over its iterations from ``skip`` on: from its printed iteration times when it logs every
    iteration, else from the times its lines arrived (see the module docstring)."""
    tokens, iters = nano["tokens_per_iter"], [i for i in nano["iters"] if i[0] >= skip]
    if not tokens or not iters:
        return None
    spaced = len(iters) > 1 and iters[1][0] - iters[0][0] > 1
    if spaced and all(i[3] is not None for i in iters):
        rates = [tokens * (b[0] - a[0]) / (b[3] - a[3]) for a, b in zip(iters, iters[1:]) if b[3] > a[3]]
        return median(rates)
    dt = median([i[2] for i in iters])
    return tokens / dt if dt else None


def parse_tinylm(metrics: Path) -> dict:
    """tinylm's metrics.csv: (step, tokens/s, MFU) of each logged training step, (step, val/loss) of each validation."""
    rates, vals = [], []
    with open(metrics) as f:
        for row in csv.DictReader(f):
            step = int(row["step"]) if row.get("step") else 0
            if row.get("train/tokens_per_sec"):
                mfu = row.get("train/mfu")
                rates.append((step, float(row["train/tokens_per_sec"]), float(mfu) if mfu else None))
            if row.get("val/loss"):
                vals.append((step, float(row["val/loss"])))
    return {"rates": rates, "vals": vals}


def side_status(path: Path) -> tuple[int | None, float | None]:
    try:
        rc, seconds = path.read_text().split()
        return int(rc), float(seconds)
    except (OSError, ValueError):
        return None, None


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def best(evals: list[tuple]) -> tuple[float | None, int | None]:
    if not evals:
        return None, None
    step, loss = min(((e[0], e[-1]) for e in evals), key=lambda e: e[1])
    return loss, step


def case_result(folder: Path, gpu: str, skip: int, window: int, log_every: int = 1) -> dict:
    case = folder.name
    recipe = case.startswith("shakespeare-char")
    # tinylm's rate at a logged step spans the last `window` logging intervals: count those that begin at `skip`
    tiny_from = skip + window * (10 if recipe else log_every)  # (the recipe logs every 10 steps; the 124M cases
    # as LOG_EVERY says: the config's every step by default)
    nano = parse_nanogpt(folder / "nanogpt.log") if (folder / "nanogpt.log").exists() else None
    found = list(folder.glob(f"runs/{case}/csv/metrics.csv"))
    tiny = parse_tinylm(found[0]) if found else None
    out: dict = {"case": case, "gpu": gpu}
    out["nanogpt_tokens_per_s"] = nanogpt_rate(nano, skip) if nano else None
    out["tinylm_tokens_per_s"] = median([r for s, r, _ in tiny["rates"] if s >= tiny_from]) if tiny else None
    out["ratio"] = (out["tinylm_tokens_per_s"] / out["nanogpt_tokens_per_s"]
                    if out["tinylm_tokens_per_s"] and out["nanogpt_tokens_per_s"] else None)
    out["tinylm_mfu"] = median([m for s, _, m in tiny["rates"] if s >= tiny_from]) if tiny else None
    # the same model and tokens, so nanoGPT's MFU as tinylm counts FLOPs (nanoGPT's own print assumes an A100)
    out["nanogpt_mfu"] = out["tinylm_mfu"] / out["ratio"] if out["tinylm_mfu"] and out["ratio"] else None
    out["steps_timed"] = {"nanogpt": sum(i[0] >= skip for i in nano["iters"]) if nano else 0,
                          "tinylm": sum(s >= tiny_from for s, _, _ in tiny["rates"]) if tiny else 0}
    for side in ("nanogpt", "tinylm"):
        rc, seconds = side_status(folder / f"{side}.rc")
        out[f"{side}_rc"], out[f"{side}_wall_s"] = rc, seconds
    if recipe:  # a whole recipe: wall time and best validation loss count
        out["nanogpt_best_val"], out["nanogpt_best_step"] = best(nano["evals"]) if nano else (None, None)
        out["tinylm_best_val"], out["tinylm_best_step"] = best(tiny["vals"]) if tiny else (None, None)
        if out["nanogpt_wall_s"] and out["tinylm_wall_s"]:
            out["wall_ratio"] = out["tinylm_wall_s"] / out["nanogpt_wall_s"]
    return out


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def report(work: Path, out: Path, skip: int, window: int, log_every: int = 1) -> dict:
    gpu = (work / "gpu.txt").read_text().strip() if (work / "gpu.txt").exists() else "unknown"
    order = (work / "cases.txt").read_text().split() if (work / "cases.txt").exists() else []
    cases = [case_result(work / c, gpu, skip, window, log_every) for c in order if (work / c).is_dir()]
    result = {"gpu": gpu, "skip_steps": skip, "tinylm_window": window, "log_every_124m": log_every, "cases": cases}
    (out / "vs_nanogpt.json").write_text(json.dumps(result, indent=1) + "\n")
    md = [f"# tinylm fit vs nanoGPT's train.py on {gpu}", "",
          (f"Tokens/s: medians over optimizer steps >= {skip} (tinylm: over its logged rates whose {window}-interval "
           "window begins there); wall: the whole process, start to exit."), "",
          "| case | nanoGPT tokens/s | tinylm tokens/s | tinylm / nanoGPT | tinylm MFU | nanoGPT MFU | "
          "wall s (nanoGPT, tinylm) | best val (nanoGPT, tinylm) |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for c in cases:
        val = (f"{fmt(c.get('nanogpt_best_val'), '.4f')}, {fmt(c.get('tinylm_best_val'), '.4f')}"
               if "nanogpt_best_val" in c else "")
        md.append(f"| {c['case']} | {fmt(c['nanogpt_tokens_per_s'], ',.0f')} | {fmt(c['tinylm_tokens_per_s'], ',.0f')}"
                  f" | {fmt(c['ratio'], '.3f')} | {fmt(c['tinylm_mfu'], '.1%')} | {fmt(c['nanogpt_mfu'], '.1%')} | "
                  f"{fmt(c['nanogpt_wall_s'], '.0f')}, {fmt(c['tinylm_wall_s'], '.0f')} | {val} |")
    (out / "vs_nanogpt.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("link", help="give nanoGPT a tinylm-prepared dataset")
    p.add_argument("dataset", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--meta", action="store_true", help="write meta.pkl with the dataset's vocabulary size")
    p = sub.add_parser("report", help="read the cases' logs, write vs_nanogpt.json and .md")
    p.add_argument("work", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--skip", type=int, default=10, help="optimizer steps left out of the rates (warm-up)")
    p.add_argument("--window", type=int, default=10, help="logging intervals that tinylm's SpeedMonitor averages over")
    p.add_argument("--log-every", type=int, default=1, help="steps between the 124M cases' logged steps (LOG_EVERY)")
    sub.add_parser("stamp", help="copy stdin to stdout, each line prefixed with the time it arrived")
    args = parser.parse_args()
    if args.command == "link":
        link(args.dataset, args.dest, args.meta)
    elif args.command == "stamp":
        stamp()
    else:
        report(args.work, args.out, args.skip, args.window, args.log_every)


if __name__ == "__main__":
    main()
