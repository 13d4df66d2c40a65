"""Plot a run's train/val loss and bits-per-byte from its metrics.csv (no W&B needed).

    python benchmarks/plot_run.py runs/shakespeare-char-cpu --out docs/images/shakespeare-char-cpu.png
"""

import argparse
import csv
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, help="a run folder (holds csv/metrics.csv)")
    p.add_argument("--out", type=Path, required=True, help="PNG to write")
    p.add_argument("--reference", type=float, default=None, help="draw a horizontal reference val loss")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.run_dir / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    train = [(int(r["step"]) + 1, float(r["train/loss"])) for r in rows if r.get("train/loss")]
    val = [(int(r["step"]) + 1, float(r["val/loss"])) for r in rows if r.get("val/loss")]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(*zip(*train), lw=1, alpha=0.6, label="train/loss")
    ax.plot(*zip(*val), "o-", lw=2, label="val/loss")
    if args.reference:
        ax.axhline(args.reference, ls="--", c="gray", label=f"nanoGPT laptop result ({args.reference})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(f"{args.run_dir.name}: final val/loss {val[-1][1]:.3f}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
