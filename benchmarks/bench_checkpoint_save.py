"""What one checkpoint save costs in time and host memory: ``AtomicCheckpointIO.save_checkpoint`` streaming
torch.save into ``<path>.tmp`` (``streamed``, tinylm's save) against the save it replaced (``buffered``: torch.save
into an ``io.BytesIO``, ``getvalue()``, then the bytes written to ``<path>.tmp``, fsync, rename; main before
savefast, rebuilt here from the same helper), on CPU, for a checkpoint as a run writes it (weights, AdamW's two
moments, loops, callbacks, RNG states: `bench_checkpoint_share.make_checkpoint`).

Each case runs in a fresh process: it builds the checkpoint, resets the process's peak RSS (``/proc/self/clear_refs``,
Linux; elsewhere the peak of the build may hide a smaller save's), times one save (wall, fsync included) and reports
the peak RSS during the save over the RSS before it (``getrusage`` ``ru_maxrss``: torch's storages are not Python
objects, so tracemalloc would not see them). The two ways alternate within a round, so load from other jobs hits both
alike. Medians over the rounds; the machine and ``/proc/loadavg`` are printed (the machine may be shared).

    python benchmarks/bench_checkpoint_save.py                       # the laptop recipe and GPT-2 124M, 3 rounds
    python benchmarks/bench_checkpoint_save.py --sizes laptop --rounds 9 --dir /mnt/disk
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_checkpoint_share import SIZES, make_checkpoint  # noqa: E402 (the benchmarks folder is no package)
from bench_train_step import machine_line  # noqa: E402

from tinylm.checkpoint import atomic_write_bytes  # noqa: E402
from tinylm.train.checkpoint_io import AtomicCheckpointIO  # noqa: E402

WAYS = ("buffered", "streamed")


def buffered_save(checkpoint: dict, path: Path) -> None:
    """The save before savefast: the whole file in memory (twice: ``getvalue``) before its first byte is written."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (no /proc: the peak so far)


def reset_peak() -> bool:
    """Reset the peak RSS that ``ru_maxrss`` reports to the RSS now (Linux >= 4.0); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def one_case(size: str, way: str, folder: Path) -> dict:
    """One save in this (fresh) process: seconds, RSS before, peak RSS increase (KiB), file size."""
    ckpt = make_checkpoint(SIZES[size])
    gc.collect()
    path = folder / f"{size}-{way}.ckpt"
    reset = reset_peak()
    before = rss_kib()
    t = time.perf_counter()
    if way == "buffered":
        buffered_save(ckpt, path)
    else:
        AtomicCheckpointIO().save_checkpoint(ckpt, path)
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    result = {"seconds": seconds, "rss_before_kib": before, "peak_increase_kib": max(0, peak - before),
              "bytes": path.stat().st_size, "peak_reset": reset}
    path.unlink()
    return result


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder)")
    parser.add_argument("--case", nargs=2, metavar=("SIZE", "WAY"), help=argparse.SUPPRESS)  # one child process
    args = parser.parse_args()
    if args.case:
        print(json.dumps(one_case(*args.case, Path(args.dir))))
        return
    print(machine_line())
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for size in args.sizes:
            print(f"{size}: /proc/loadavg before: {loadavg()}")
            runs: dict[str, list[dict]] = {way: [] for way in WAYS}
            for i in range(args.rounds):
                for way in WAYS if i % 2 == 0 else WAYS[::-1]:  # alternate which goes first
                    out = subprocess.run([sys.executable, __file__, "--case", size, way, "--dir", tmp], check=True,
                                         capture_output=True, text=True).stdout
                    runs[way].append(json.loads(out.strip().splitlines()[-1]))
                    r = runs[way][-1]
                    print(f"  round {i + 1} {way}: {r['seconds']:.2f} s, peak RSS +{r['peak_increase_kib'] / 1024:,.1f}"
                          f" MiB over {r['rss_before_kib'] / 1024:,.0f} MiB (peak reset: {r['peak_reset']})")
            mb = runs["streamed"][0]["bytes"] / 1e6
            for way in WAYS:
                sec = statistics.median(r["seconds"] for r in runs[way])
                mib = statistics.median(r["peak_increase_kib"] for r in runs[way]) / 1024
                print(f"{size} ({mb:,.1f} MB a file), {way}: save {sec:.2f} s, peak RSS +{mib:,.1f} MiB "
                      f"({args.rounds} rounds, medians)")
            print(f"{size}: /proc/loadavg after: {loadavg()}")


if __name__ == "__main__":
    main()
