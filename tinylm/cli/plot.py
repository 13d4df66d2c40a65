"""`tinylm plot`: a run's (or several runs') curves from metrics.csv, as one PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Literal


def plot(runs: list[str], out: str | None = None, reference: float | None = None,
         metric: Literal["loss", "bpb"] | None = None) -> Path:
    """Draw train/val loss, learning rate, gradient norm and tokens/s of one or more runs, with training-health
    alerts marked, into one PNG (several runs are overlaid): tinylm plot RUN [RUN ...] [--out PNG].

    Args:
        runs: Run folders written by `tinylm fit` (runs/NAME, holding csv/metrics.csv), run names under runs/, or
            metrics.csv files.
        out: PNG to write (default: plot.png in the first run's folder); not a PNG with a .json beside it
            (another command's picture of its numbers).
        reference: Draw a horizontal reference (e.g. a published result) in the first panel, in its unit.
        metric: The first panel: loss (train/loss, val/loss in nats per token) or bpb (val/bpb, and train/bpb if a
            callback of yours logs it: bits per byte of raw text, comparable across tokenizers). Default: bpb when
            the runs' tokenizers differ (a line says so), loss otherwise.
    """
    from tinylm.ranges import check_ranges
    from tinylm.studies.curves import check_drawable, choose_metric, metrics_csv, plot_runs, read_run
    from tinylm.studies.plots import check_png_path, drawn_by

    check_ranges("--", {"reference": reference}, {"reference": "[0, inf)"})  # a cross-entropy
    if not runs:
        raise ValueError("name at least one run: tinylm plot runs/NAME [runs/OTHER ...]")
    runs = [str(Path(r).expanduser()) if str(r).startswith("~") else r for r in runs]  # (quoted: the shell's is not)
    curves = [read_run(r) for r in runs]
    names = [c.name for c in curves]
    for run, c in zip(runs, curves, strict=True):  # runs/a/x and runs/b/x: named by their paths, not both "x"
        if names.count(c.name) > 1:
            c.name = str(run).rstrip("/")
    for run, c in zip(runs, curves, strict=True):
        check_drawable(c, str(metrics_csv(run)))
    named = out is not None  # (else its run folder's plot.png: plot's own file there, replaced)
    if out is None:
        csv = metrics_csv(runs[0])
        out = str((csv.parent.parent if csv.parent.name == "csv" else csv.parent) / "plot.png")
    check_png_path(out)
    if Path(out).exists() and (numbers := Path(out).with_suffix(".json")).exists():  # lr-find's, scaling's, plan's
        raise ValueError(f"--out {out!r} is the picture of the numbers in {numbers} (an lr-find, scaling or plan "
                         "result): plot would replace it; pick another --out")
    report = Path(out).parent / "report.md"
    if Path(out).exists() and report.is_file() and Path(out).name in report.read_text(errors="replace"):
        raise ValueError(f"--out {out!r} is a picture of the sample report {report} (tinylm sample-report): plot "
                         "would replace it; pick another --out")
    if named and Path(out).is_file() and drawn_by(out) != "plot":  # a user's own picture (plan's too: its .json)
        raise ValueError(f"--out {out!r} already exists, and is not marked as drawn by `tinylm plot` (a file of "
                         "yours, or a picture drawn before plot marked its own); pick another --out, or move it away")
    metric, why = choose_metric(curves, metric)
    if why:
        print(why)
    path = plot_runs(curves, out, reference=reference, metric=metric)
    for c in curves:
        last = {k: c.series[k][-1] for k in (f"train/{metric}", f"val/{metric}") if c.series.get(k)}
        said = ", ".join(f"{k} {v:.4f} (step {s})" for k, (s, v) in last.items()) or f"no {metric} logged yet"
        bad = "".join(f"; {k} NaN/inf at {len(v)} step(s) from {v[0]} (x, not drawn)" for k, v in c.nonfinite.items()
                      if k in ("train/loss", "val/loss", f"train/{metric}", f"val/{metric}", "train/grad_norm"))
        alerts = f"; health alerts: {', '.join(f'{k} at {s}' for s, k in c.alerts)}" if c.alerts else ""
        print(f"{c.name}: {said}{bad}{alerts}")
    print(f"wrote {path}")
    return path
