"""A diverging run with and without the stability guard: the laptop recipe (configs/shakespeare-char-cpu.yaml) run
by `tinylm fit`, with the LR 1000x at two optimizer steps (`LRExplodes`, a callback standing in for a schedule bug
or a bad restart). Draws both loss curves into docs/images/guard.png and prints the numbers for docs/benchmarks.md.

    python benchmarks/guard_divergence.py                   # 600 steps, the LR explodes at step 300
    python benchmarks/guard_divergence.py --steps 400 --at 200 --out /tmp/guard.png
    python benchmarks/guard_divergence.py --steps 100 --at 50 --every 25 --model.n_layer 2 --model.n_embd 64
        (any further --section.option goes to both `tinylm fit` runs)
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

sys.path.insert(0, str(Path(__file__).resolve().parent))  # LRExplodes is found by its class path

REPO = Path(__file__).resolve().parents[1]


class LRExplodes(L.Callback):
    """Every parameter group's LR times `factor` at optimizer steps `at` and `at + 1`."""

    def __init__(self, at: int = 300, factor: float = 1000.0) -> None:
        self.at, self.factor = at, factor

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step in (self.at, self.at + 1):
            for group in optimizer.param_groups:
                group["lr"] *= self.factor


def rows(run_dir: Path, key: str) -> list[tuple[int, float]]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return [(int(r["step"]), float(r[key])) for r in csv.DictReader(f) if r.get(key)]


def fit(root: Path, name: str, args, guard: bool) -> tuple[float, int]:
    from tinylm.cli import main

    argv = ["fit", "--config", str(REPO / "configs" / "shakespeare-char-cpu.yaml"),
            "--data.corpus", str(args.data / "tinyshakespeare.txt"), "--data.cache_dir", str(root / "cache"),
            "--trainer.default_root_dir", str(root), "--run.name", name, "--trainer.max_steps", str(args.steps),
            "--run.checkpoint_every", str(args.every), "--trainer.val_check_interval", str(args.every),
            "--samples.every_n_steps", "0",
            "--trainer.enable_progress_bar", "false",
            "--trainer.callbacks", json.dumps([{"class_path": "guard_divergence.LRExplodes",
                                                "init_args": {"at": args.at}}]),
            "--guard.enabled", str(guard).lower(), *args.fit_args]
    started = time.perf_counter()
    try:
        main(argv)
        code = 0
    except SystemExit as e:  # without the guard the health monitor ends the diverged run non-zero
        code = e.code or 0
    return time.perf_counter() - started, code


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--at", type=int, default=300, help="the optimizer step at which the LR explodes")
    p.add_argument("--every", type=int, default=100, help="steps between checkpoints and between validations")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "guard.png")
    args, args.fit_args = p.parse_known_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    with tempfile.TemporaryDirectory() as tmp:
        for name, guard, color in (("without", False, "tab:red"), ("with", True, "tab:blue")):
            seconds, code = fit(Path(tmp), name, args, guard)
            run = Path(tmp) / name
            loss, val = rows(run, "train/loss"), rows(run, "val/loss")
            skipped = rows(run, "train/skipped_steps") if guard else []
            ax.plot(*zip(*loss), color=color, lw=1, label=f"train/loss, guard {'on' if guard else 'off'}")
            ax.plot(*zip(*val), "o", color=color, ms=5, label=f"val/loss, guard {'on' if guard else 'off'}")
            print(f"guard {'on ' if guard else 'off'}: exit {code}, {seconds:.0f} s, final val/loss {val[-1][1]:.4f}"
                  f" at step {val[-1][0] + 1}, max train/loss {max(v for _, v in loss):.1f}"
                  + (f", skipped steps {skipped[-1][1]:.0f}" if skipped else ""))
    ax.axvline(args.at, color="gray", ls=":", lw=1)
    ax.text(args.at, ax.get_ylim()[1], f" LR x1000 at steps {args.at}-{args.at + 1}", va="top", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats, log scale)")
    ax.set_title(f"shakespeare-char-cpu {' '.join(args.fit_args)}, LR exploding mid-run:\n--guard.enabled false vs "
                 "true (default)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
