"""Start-up of the `tinylm` commands that should answer at once: two source trees side by side (e.g. main and a
branch), each command run as a fresh process with the tree first on PYTHONPATH, trees interleaved round by round.

    python benchmarks/ab_startup.py --baseline ../main --candidate . --repeats 7   (../main: a checkout of main)

Each command is timed as a user runs it (wall time of the whole process, plus its CPU time and peak RSS from
os.wait4); the table gives the medians and the ratio candidate / baseline, and the load average before and after
(the machine may be shared). The commands:

    --help              tinylm --help
    fit --help          LightningCLI's help (once made, a tree that keeps it prints the kept text)
    missing config      tinylm fit --config missing.yaml (refused)
    folder in use       tinylm fit into a run folder another process holds (refused)
    prepare (cached)    tinylm prepare of a dataset already prepared (tokenizer loaded, meta.json read, summary)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def _measure(cmd: list[str], env: dict, cwd: Path) -> dict:
    """Wall time, CPU time (user + system) and peak RSS of ``cmd`` run to its end in ``cwd`` (not a source tree:
    `python -m` puts the working directory first on sys.path, before PYTHONPATH's tree)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024,
            "code": os.waitstatus_to_exitcode(status), "err": err}


def _setup(tmp: Path, fixtures: Path) -> dict[str, list[str]]:
    """A tiny config, its dataset prepared once, a run folder held by a process: the commands to time."""
    corpus = tmp / "shakespeare.txt"
    corpus.write_text((fixtures / "tinyshakespeare_100k.txt").read_text(encoding="utf-8"), encoding="utf-8")
    cfg = {"run": {"name": "busy", "wandb_project": None},
           "trainer": {"default_root_dir": str(tmp / "runs"), "max_steps": 10},
           "model": {"n_layer": 2, "n_head": 2, "n_embd": 32},
           "data": {"corpus": str(corpus), "tokenizer": "bpe", "vocab_size": 512, "block_size": 64,
                    "cache_dir": str(tmp / "cache")}}
    (tmp / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    (tmp / "runs" / "busy").mkdir(parents=True)
    (tmp / "runs" / "busy" / ".lock").write_text("pid 4242")
    return {
        "--help": ["--help"],
        "fit --help": ["fit", "--help"],
        "missing config": ["fit", "--config", str(tmp / "missing.yaml")],
        "folder in use": ["fit", "--config", str(tmp / "tiny.yaml")],
        "prepare (cached)": ["prepare", "--config", str(tmp / "tiny.yaml")],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="source tree of the baseline (e.g. main)")
    ap.add_argument("--candidate", type=Path, required=True, help="source tree measured against it")
    ap.add_argument("--repeats", type=int, default=5, help="rounds; each runs every command once in each tree")
    ap.add_argument("--only", nargs="*", help="time only these commands (names as in the table)")
    args = ap.parse_args()
    trees = {"baseline": args.baseline.resolve(), "candidate": args.candidate.resolve()}
    rows: dict[tuple[str, str], list[dict]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ab_startup-") as tmp_name:
        tmp = Path(tmp_name)
        commands = _setup(tmp, trees["candidate"] / "tests" / "fixtures")
        if args.only:
            commands = {k: v for k, v in commands.items() if k in args.only}
        holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1]); "
                                   "fcntl.flock(f, fcntl.LOCK_EX); time.sleep(86400)", str(tmp / "runs/busy/.lock")])
        env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "XDG_CACHE_HOME": str(tmp / "xdg"), "TQDM_DISABLE": "1"}
        try:
            for tree in trees.values():  # the dataset prepared, each tree's kept help made: not timed
                tree_env = {**env, "PYTHONPATH": str(tree)}
                _measure([sys.executable, "-m", "tinylm", *commands.get("prepare (cached)", ["--help"])], tree_env, tmp)
                _measure([sys.executable, "-m", "tinylm", "fit", "--help"], tree_env, tmp)
            for r in range(args.repeats):
                order = list(trees) if r % 2 == 0 else list(reversed(trees))
                for label, argv in commands.items():
                    for name in order:
                        m = _measure([sys.executable, "-m", "tinylm", *argv], {**env, "PYTHONPATH": str(trees[name])},
                                     tmp)
                        rows.setdefault((label, name), []).append(m)
                print(f"round {r + 1}/{args.repeats} done, load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            holder.kill()
            holder.wait()
    load_after = os.getloadavg()
    print(f"\n{os.cpu_count()} cores, python {sys.version.split()[0]}, {args.repeats} interleaved rounds; load average "
          f"(1/5/15 min) before {'/'.join(f'{x:.1f}' for x in load_before)}, after "
          f"{'/'.join(f'{x:.1f}' for x in load_after)}")
    print(f"baseline {trees['baseline']}, candidate {trees['candidate']}\n")
    print("| command | exit | baseline wall s | candidate wall s | ratio | baseline CPU s | candidate CPU s | "
          "baseline RSS MB | candidate RSS MB |\n|---|---|---:|---:|---:|---:|---:|---:|---:|")
    summary = {}
    for label in commands:
        b, c = rows[(label, "baseline")], rows[(label, "candidate")]
        med = lambda ms, k: statistics.median(m[k] for m in ms)  # noqa: E731
        summary[label] = {side: {k: med(ms, k) for k in ("wall", "cpu", "rss_mb")} for side, ms in
                          (("baseline", b), ("candidate", c))}
        codes = f"{b[0]['code']}/{c[0]['code']}"
        print(f"| {label} | {codes} | {med(b, 'wall'):.2f} | {med(c, 'wall'):.2f} | "
              f"{med(c, 'wall') / med(b, 'wall'):.2f}x | {med(b, 'cpu'):.2f} | {med(c, 'cpu'):.2f} | "
              f"{med(b, 'rss_mb'):.0f} | {med(c, 'rss_mb'):.0f} |")
        for side, ms in (("baseline", b), ("candidate", c)):  # what a refusal said: the same refusal on both sides
            if ms[0]["code"] != 0:
                print(f"  ({side}'s {label} ended {ms[0]['code']}: {ms[0]['err'].strip().splitlines()[-1][:150]})")
    print(json.dumps({"load_before": load_before, "load_after": load_after, "medians": summary}))


if __name__ == "__main__":
    main()
