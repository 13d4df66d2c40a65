"""The whole `tinylm fit` run vs the same run as a plain PyTorch script (nanoGPT's train.py), start to exit.

`bench_train_step.py` compares one training step; this compares what a user waits for: interpreter start,
imports, setup, W&B, validation, sampling, checkpoints, logging and teardown included. Both sides run as child
processes on the same prepared dataset (tokenized once, before any timing), with the recipe's model shape,
optimizer, schedule and evaluation cadence:

- tinylm: `tinylm fit --config RECIPE` exactly as a user runs it (W&B offline when there are no credentials,
  the progress bar on), plus `--data.corpus/--data.cache_dir` pointing at the prepared data and a fresh run folder.
- plain: `benchmarks/baseline_nanogpt_run.py` (what nanoGPT's train.py does for this recipe; see its docstring).

Per run: wall time, CPU time (user + sys of the child and of every descendant it leaves behind, from `os.wait4`
and this process's `RUSAGE_CHILDREN`, with this process as the subreaper of orphans such as W&B's service),
and peak RSS (of the child's largest process: Python's, not W&B's service). The machine may be shared with other jobs,
so runs alternate in pairs (tinylm first in odd pairs, plain first in even pairs) and the CPU-time ratio is the number
to trust: other jobs stretch wall time but hardly CPU time.

Both sides run with this Python's environment. What `make train` runs is tinylm[plots] alone; `make test`'s
tinylm[dev] adds transformers and scipy, which Lightning's import pulls in (through torchmetrics) and pays ~1.6 s
for: the first line says which one is measured.

    python benchmarks/bench_whole_run.py                       # 3 pairs of full runs (about 8 minutes on 2 cores)
    python benchmarks/bench_whole_run.py --pairs 1 --max-steps 300
    python benchmarks/bench_whole_run.py --tinylm-args "--run.wandb_project null"   # what W&B costs
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_step import (
    DEFAULT_CONFIG,
    DEFAULT_DATA,
    load_recipe,
    machine_line,
    make_datamodule,
    quiet_lightning,
)

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "benchmarks" / "baseline_nanogpt_run.py"
PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Run:
    side: str
    wall: float  # seconds
    cpu: float  # user + sys seconds, descendants included
    rss_mb: float  # peak resident set of the largest process
    val_loss: float | None


def become_subreaper() -> None:
    """Orphaned grandchildren (W&B's service process) are re-parented to us, so their CPU time is counted."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: orphans' CPU time goes uncounted


def _reap_orphans() -> None:
    """Wait for every remaining descendant (adopted orphans), so RUSAGE_CHILDREN includes them."""
    while True:
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run_child(side: str, cmd: list[str], log: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """Run `cmd` to completion; return (wall s, CPU s of it and its descendants, peak RSS MB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    _reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{side} run failed with exit code {proc.returncode}; the end of {log}:\n{tail}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, usage.ru_maxrss / 1024  # KB on Linux


def tinylm_val_loss(run_dir: Path) -> float | None:
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        vals = [r["val/loss"] for r in csv.DictReader(f) if r.get("val/loss")]
    return float(vals[-1]) if vals else None


def baseline_val_loss(log: Path) -> float | None:
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("step ") and "val loss" in ln]
    return float(lines[-1].rsplit("val loss", 1)[1]) if lines else None


def environment_line() -> str:
    """Which of the packages that Lightning's import pulls in when installed (torchmetrics imports them) this
    environment has: `make train` installs tinylm[plots] (neither), `make test` tinylm[dev] (both), and they add
    ~1.6 s of CPU and ~85 MB to every `tinylm fit` (docs/benchmarks.md)."""
    import importlib.util

    extras = [name for name in ("transformers", "scipy") if importlib.util.find_spec(name) is not None]
    return (f"{', '.join(extras)} installed (tinylm[dev]: Lightning's import pays for them)" if extras else
            "neither transformers nor scipy installed (as `make train` sets up: tinylm[plots])")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the recipe both sides run")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding tinyshakespeare.txt")
    parser.add_argument("--pairs", type=int, default=3, help="pairs of runs (one tinylm + one plain each)")
    parser.add_argument("--max-steps", type=int, default=None, help="optimizer steps per run (default: the recipe's)")
    parser.add_argument("--tinylm-args", default="", help="extra arguments for `tinylm fit` (one string)")
    parser.add_argument("--sides", default="tinylm,plain", help="comma-separated: tinylm, plain")
    parser.add_argument("--threads", type=int, default=0,
                        help="OMP_NUM_THREADS for both sides (0: torch's default); 1 keeps CPU time honest on a "
                             "loaded machine, where idle OpenMP threads spin and burn CPU while waiting")
    parser.add_argument("--keep", type=Path, default=None, help="keep run folders and logs here (default: a temp dir)")
    args = parser.parse_args()
    quiet_lightning()
    become_subreaper()
    recipe = load_recipe(args.config)
    steps = args.max_steps or recipe["trainer"]["max_steps"]
    tinylm_bin = Path(sys.executable).with_name("tinylm")
    sides = args.sides.split(",")
    print(f"machine: {machine_line()}", flush=True)
    print(f"environment: {environment_line()}", flush=True)
    print(f"recipe: {args.config.name}, {steps} steps; {args.pairs} pair(s), alternating; "
          f"threads {args.threads or 'default'}; tinylm extra args: {args.tinylm_args or '(none)'}\n", flush=True)

    with tempfile.TemporaryDirectory() as tmpdir:
        work = args.keep or Path(tmpdir)
        work.mkdir(parents=True, exist_ok=True)
        cache = work / "cache"
        dm = make_datamodule(recipe, args.data, cache)  # tokenized and packed once, before any timing
        corpus, dataset = Path(args.data) / "tinyshakespeare.txt", dm.dataset_dir
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)
        runs: list[Run] = []
        for pair in range(args.pairs):
            order = sides if pair % 2 == 0 else sides[::-1]
            for side in order:
                name = f"{side}-{pair}"
                if side == "tinylm":
                    cmd = [str(tinylm_bin), "fit", "--config", str(args.config), "--data.corpus", str(corpus),
                           "--data.cache_dir", str(cache), "--trainer.default_root_dir", str(work / "runs"),
                           "--run.name", name, "--trainer.max_steps", str(steps), *shlex.split(args.tinylm_args)]
                elif side == "plain":
                    cmd = [sys.executable, str(BASELINE), "--config", str(args.config), "--dataset", str(dataset),
                           "--out", str(work / "runs" / name), "--max-steps", str(steps)]
                else:
                    raise ValueError(f"unknown side {side!r}; choose tinylm or plain")
                log = work / f"{name}.log"
                wall, cpu, rss = run_child(side, cmd, log, env)
                val = tinylm_val_loss(work / "runs" / name) if side == "tinylm" else baseline_val_loss(log)
                runs.append(Run(side, wall, cpu, rss, val))
                print(f"{name}: wall {wall:.1f} s, CPU {cpu:.1f} s, peak RSS {rss:.0f} MB, last val/loss "
                      f"{val if val is None else round(val, 4)}  ({machine_line().split(', ')[-1]})", flush=True)

    med = {s: {k: statistics.median(getattr(r, k) for r in runs if r.side == s) for k in ("wall", "cpu", "rss_mb")}
           for s in sides}
    print("\nmedians over pairs")
    print("| side | wall (s) | CPU (s) | peak RSS (MB) |\n|---|---:|---:|---:|")
    for s in sides:
        print(f"| {s} | {med[s]['wall']:.1f} | {med[s]['cpu']:.1f} | {med[s]['rss_mb']:.0f} |")
    if set(sides) == {"tinylm", "plain"}:
        pairs = [(a, b) for a, b in zip([r for r in runs if r.side == "tinylm"],
                                        [r for r in runs if r.side == "plain"])]
        paired = {k: statistics.median(getattr(a, k) / getattr(b, k) for a, b in pairs)
                  for k in ("wall", "cpu", "rss_mb")}
        print(f"| **tinylm / plain** | **{med['tinylm']['wall'] / med['plain']['wall']:.3f}** "
              f"(paired {paired['wall']:.3f}) | **{med['tinylm']['cpu'] / med['plain']['cpu']:.3f}** "
              f"(paired {paired['cpu']:.3f}) | **{med['tinylm']['rss_mb'] / med['plain']['rss_mb']:.3f}** |")
    print(f"\nafter: {machine_line()}")


if __name__ == "__main__":
    main()
