"""The four charts to watch on every run (loss, learning rate, gradient norm, tokens/s) with the training-health
alerts marked, read back from runs' ``csv/metrics.csv``: no W&B account needed. Several runs share one figure."""

from __future__ import annotations

import csv
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

MUON_LR = "train/muon_lr"  # Muon's LR (the blocks' matrices), beside train/lr (AdamW's: embeddings, head, norms)
PANELS = (  # (title, metric keys drawn in it, log-scale y)
    ("loss (nats/token)", ("train/loss", "val/loss"), False),
    ("learning rate", ("train/lr", MUON_LR), False),  # (a Muon run's two: log scale, named)
    ("gradient norm (before clipping)", ("train/grad_norm",), True),
    ("tokens / s", ("train/tokens_per_sec",), False),
)
METRICS = {  # --metric: the first panel, what it draws
    "loss": ("loss (nats/token)", ("train/loss", "val/loss")),
    "bpb": ("bits per byte of raw text (comparable across tokenizers)", ("train/bpb", "val/bpb")),
}
HEALTH_PREFIX = "health/"
CORPUS_LOSS = "val/loss/"  # a mixture's val/loss/NAME per corpus, drawn beside val/loss
EVAL_PANELS = (("eval: acc_norm (acc where a task has none)", ("_acc_norm", "_acc")), ("eval: bits per byte of the "
               "right answers", ("_bpb",)))
"""Drawn when a run has eval scores: the in-loop EvalTasks' (csv/metrics.csv) and `tinylm eval`'s (eval/metrics.csv)."""


@dataclass
class RunCurves:
    """One run's logged series: metric -> [(step, value)], and its health alerts [(step, kind)]."""

    name: str
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    alerts: list[tuple[int, str]] = field(default_factory=list)
    tokenizer: str | None = None  # "char", "bpe (vocab 2048)", ...: from the run folder; None for a bare CSV
    nonfinite: dict[str, list[int]] = field(default_factory=dict)  # metric -> steps logged NaN or inf (marked x)
    columns: tuple[str, ...] = ()  # the CSV's header
    resumes: list[int] = field(default_factory=list)  # the steps it was resumed at (config.resume-step<N>.yaml)


def check_drawable(curves: RunCurves, path: str) -> None:
    """A run whose metrics.csv is not one (no step column), or whose every loss logged is NaN or inf, is said in
    one line: its picture would be empty under "no loss logged yet"."""
    if curves.columns and "step" not in curves.columns:
        raise ValueError(f"{path!r} is not a tinylm metrics.csv (no 'step' column; its columns are "
                         f"{list(curves.columns)[:5]}); pass a run folder written by `tinylm fit`")
    losses = ("train/loss", "val/loss")
    if not any(curves.series.get(k) for k in losses) and (bad := {k: curves.nonfinite[k] for k in losses
                                                                   if curves.nonfinite.get(k)}):
        said = ", ".join(f"{len(n)} {k}" for k, n in bad.items())
        raise ValueError(f"run {curves.name!r} logged no finite loss ({said} values, every one NaN or inf): it "
                         "diverged from its first logged step; lower --model.lr or check the data, and train again")


def metrics_csv(run: str | Path) -> Path:
    """The metrics.csv of ``run``: a run folder (``runs/NAME``), a run name under ``runs/``, or the CSV itself."""
    path = Path(run)
    candidates = [path] if path.suffix == ".csv" else [path / "csv" / "metrics.csv", Path("runs") / run / "csv" /
                                                         "metrics.csv"]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None and path.is_file():  # a checkpoint, a config: its run folder is what plot reads
        folder = next((p for p in path.resolve().parents if (p / "csv" / "metrics.csv").is_file()), None)
        fix = f"pass its run folder {folder}" if folder else "pass a run folder written by `tinylm fit` (runs/NAME)"
        raise ValueError(f"{str(run)!r} is a file, not a run or a metrics.csv: {fix}")
    if found is None and path.is_dir() and any((path / p).exists() for p in ("config.yaml", "checkpoints", "wandb")):
        wandb = f"; its W&B run is in {path / 'wandb'} (`wandb sync` it to see the curves there)" if (
            path / "wandb").is_dir() else ""
        raise FileNotFoundError(f"run {str(run)!r} has no {candidates[0]}, the file plot draws (removed, or not "
                                f"copied with the folder){wandb}")
    if found is None:
        raise FileNotFoundError(f"no metrics for run {str(run)!r}: {candidates[0]} not found; pass a run folder "
                                "written by `tinylm fit` (e.g. runs/NAME, holding csv/metrics.csv)")
    return found


def read_run(run: str | Path) -> RunCurves:
    """Every numeric column of the run's metrics.csv. A last line without its newline is being written (a run in
    progress) or was cut by a crash: it is left out, as a resume drops it ("2." may be the start of "2.5")."""
    path = metrics_csv(run)
    name = path.parent.parent.name if path.parent.name == "csv" else path.stem
    curves = RunCurves(name, tokenizer=run_tokenizer(path.parent.parent) if path.parent.name == "csv" else None)
    _read_rows(path, curves, shift=0 if path.parent.name in ("eval", "validate") else 1)  # theirs: steps done
    if path.parent.name == "csv":  # a resume may change the batch, accumulation, logging: the seam is drawn
        curves.resumes = sorted({int(m[1]) for p in path.parent.parent.glob("config.resume-step*.yaml")
                                 if (m := re.fullmatch(r"config\.resume-step(\d+)(-\d+)?\.yaml", p.name))})
    evals = path.parent.parent / "eval" / "metrics.csv"  # `tinylm eval`'s rows of the run's checkpoints
    if path.parent.name == "csv" and evals.is_file():
        _read_rows(evals, curves, shift=0)
        for points in curves.series.values():
            points.sort()
    return curves


def run_tokenizer(folder: Path) -> str | None:
    """The tokenizer a run folder's run read, as "SPEC (vocab N)": Lightning's csv/hparams.yaml holds the data's
    hyperparameters with the vocab size the tokenizer had (linked into the model); config.yaml only the spec."""
    import yaml

    for path, section in ((folder / "csv" / "hparams.yaml", None), (folder / "config.yaml", "data")):
        try:
            found = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if section and isinstance(found, dict):
            found = found.get(section)
        if isinstance(found, dict) and found.get("tokenizer") is not None:
            vocab = f" (vocab {found['vocab_size']})" if section is None and "vocab_size" in found else ""
            return f"{found['tokenizer']}{vocab}"
    return None


def choose_metric(runs: list[RunCurves], metric: str | None) -> tuple[str, str | None]:
    """The metric of the first panel ("loss" or "bpb") and, when tinylm chose it, the line that says why: nats per
    token compare runs of one tokenizer only (a char run's 1.9 nats and a BPE run's 4.8 are per different tokens),
    so runs whose tokenizers differ are drawn in bits per byte of raw text."""
    if metric is not None:
        return metric, None
    tokenizers = sorted({run.tokenizer for run in runs if run.tokenizer is not None})
    if len(tokenizers) < 2:
        return "loss", None
    return "bpb", (f"the runs' tokenizers differ ({'; '.join(tokenizers)}): plotting val/bpb, bits per byte of raw "
                   "text, which compares them (nats per token do not); --metric loss for nats/token")


def _read_rows(path: Path, curves: RunCurves, shift: int) -> None:
    """The rows of ``path`` into ``curves``, their steps plus ``shift``: Lightning's CSV numbers a row by the step
    being taken, from 0 (the first step's loss is at 0, the validation after 30 steps at 29); tinylm counts the steps
    done (`validation at step 30`, step-30.ckpt, a health line's step, `tinylm eval`'s rows), so Lightning's rows
    take 1 more and every step the plot names is the one the run said."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:  # damaged bytes: that cell is no number
        lines = f.read().splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines.pop()
    reader = csv.DictReader(lines)
    curves.columns = curves.columns or tuple(reader.fieldnames or ())
    for row in reader:
        step = _number(row.get("step"))
        if step is None:
            continue
        for key, text in row.items():
            value = _number(text)
            if value is None and key is not None and text and text.strip().lower().lstrip("+-") in ("nan", "inf"):
                curves.nonfinite.setdefault(key, []).append(int(step) + shift)
            if key in (None, "step", "epoch") or value is None:
                continue
            if key.startswith(HEALTH_PREFIX):
                curves.alerts.append((int(step) + shift, key[len(HEALTH_PREFIX):]))
            else:
                curves.series.setdefault(key, []).append((int(step) + shift, value))


def _number(text: str | None) -> float | None:
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def plot_runs(runs: list[RunCurves], out: str | Path, *, reference: float | None = None, metric: str = "loss") -> Path:
    """Draw the four panels for ``runs`` into the PNG ``out`` (`draw_runs`)."""
    from tinylm.studies.plots import figure_canvas, save_png

    evals = any(k.startswith("eval/") for run in runs for k in run.series)
    fig, canvas = figure_canvas(figsize=(16, 7) if evals else (11, 7))
    draw_runs(fig, runs, reference=reference, metric=metric)
    return save_png(canvas, out, drawn_by="plot")


def draw_runs(fig, runs: list[RunCurves], *, reference: float | None = None, metric: str = "loss") -> None:
    """The four panels for ``runs`` on ``fig`` (six with eval scores): one colour per run, train thin, validation
    dots, health alerts as dashed lines named in the first panel (red for one run; in the run's colour, with its name,
    for several). The first panel is ``metric``'s (METRICS): loss in nats/token, or bits per byte."""
    evals = _eval_panels(runs)
    tasks = sorted({_task(k) for _title, keys, _log in evals for k in keys})  # a task's marker in every panel
    axes = fig.subplots(2, 3 if evals else 2).ravel()
    colours = [f"C{i % 10}" for i in range(len(runs))]
    panels = ((*METRICS[metric], False), *PANELS[1:], *evals)
    for i, (ax, (title, keys, log_y)) in enumerate(zip(axes, panels)):
        for run, colour in zip(runs, colours):
            corpora = sorted(k for k in run.series if k.startswith(CORPUS_LOSS)) if i == 0 and metric == "loss" else []
            for key in (*keys, *corpora):
                points = run.series.get(key)
                if not points:
                    continue
                steps, values = zip(*points)
                if key.startswith("eval/"):  # the tasks of a panel told apart: a marker each (and a colour, one run)
                    j = tasks.index(_task(key))
                    ax.plot(steps, values, f"{_MARKERS[j % len(_MARKERS)]}-", lw=2, ms=4, label=f"{run.name} {key}",
                            color=f"C{j % 10}" if len(runs) == 1 else colour)
                elif key in corpora:  # a mixture's corpora: dashed, a marker each, in the run's colour
                    ax.plot(steps, values, f"{_MARKERS[(corpora.index(key) + 1) % len(_MARKERS)]}--", color=colour,
                            lw=1, ms=3, alpha=0.8, label=f"{run.name} {key}")
                elif key.startswith("val/"):
                    ax.plot(steps, values, "o-", color=colour, lw=2, ms=4, label=f"{run.name} {key}")
                else:  # (a marker for a lone point: a line of one point is not drawn at all)
                    ax.plot(steps, values, color=colour, lw=1, alpha=0.8 if len(keys) == 1 else 0.5,
                            ls="--" if key == MUON_LR else "-", label=f"{run.name} {key}",
                            marker="o" if len(points) == 1 else None, ms=4)
            _draw_marks(ax, run, keys, colour if len(runs) > 1 else None, named=i == 0)
        if reference is not None and i == 0:
            ax.axhline(reference, ls=":", c="gray", label=f"reference {reference}")
        if i == 0:
            _clip_outliers(ax, [v for run in runs for k in keys for _s, v in run.series.get(k, ())], reference)
        muon = MUON_LR in keys and any(run.series.get(MUON_LR) for run in runs)  # 20x AdamW's by default
        if (title.startswith("eval") or muon) and ax.lines:
            ax.legend(fontsize=6)
        if (log_y or muon) and any(run.series.get(k) for run in runs for k in keys):
            ax.set_yscale("log")
        if not ax.lines:
            ax.text(0.5, 0.5, "not logged yet", transform=ax.transAxes, ha="center", color="gray")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    handles, _labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[0].legend(fontsize=7)
    # wrapped between runs to the figure's width (about 12 characters an inch at this size): 3 runs' or more ran off
    # both sides (each run's headline kept whole: "\0" holds its spaces while textwrap breaks)
    headline = ", ".join(_headline(run, metric).replace(" ", "\0") for run in runs)
    fig.suptitle(textwrap.fill(headline, width=int(fig.get_figwidth() * 12), break_long_words=False)
                 .replace("\0", " "), fontsize=10)
    fig.tight_layout()


_MARKERS = "os^Dv<>PX*"


def _draw_marks(ax, run: RunCurves, keys: tuple, colour: str | None, *, named: bool) -> None:
    """A run's marks on a panel (``colour``: the run's, with several runs; else red and gray, unnamed): its NaN/inf
    steps of ``keys`` (a guard's skips, a divergence) as x's at the top, not a gap; its health alerts as dashed
    lines and its resumes (a resume may change the batch, the accumulation, the logging) as dotted ones, named in
    the first panel (``named``)."""
    for key in keys:
        if bad := run.nonfinite.get(key):
            ax.plot(bad, [0.97] * len(bad), "x", color=colour or "red", ms=6, transform=ax.get_xaxis_transform(),
                    label=f"{run.name} {key} NaN/inf")
    for marks, ls, default, top in ((run.alerts, "--", "red", True),
                                    ([(s, "resumed") for s in run.resumes], ":", "gray", False)):
        for step, kind in marks:
            ax.axvline(step, color=colour or default, ls=ls, lw=0.8 if top else 1, alpha=0.7 if top else 1)
            if named:
                ax.annotate(f"{run.name}: {kind}" if colour else kind, (step, 1 if top else 0), rotation=90,
                            xycoords=("data", "axes fraction"), va="top" if top else "bottom", ha="right",
                            fontsize=7, color=colour or default)


def _clip_outliers(ax, values: list[float], reference: float | None) -> None:
    """A loss panel whose few points lie far above the rest (a spike, a guard-skipped bad batch: 60 nats among
    2-4) ends at the rest's range, the points above marked as red triangles at its top and named in the legend:
    else they squash the whole curve into a flat line at the bottom. The top: the 99th percentile plus twice the
    1st-99th percentile range, so a run's first steps and a divergence (many points) stay drawn."""
    import numpy as np

    if len(values) < 20:
        return
    low, high = np.quantile(values, [0.01, 0.99])
    top = high + 2 * (high - low) if reference is None else max(high + 2 * (high - low), reference)
    above = [v for v in values if v > top]
    if not above:
        return
    lines = [line for line in ax.lines if line.get_transform() == ax.transData]  # (not the NaN x's, in axes units)
    # a run's opening descent (10 -> 1 in its first steps: the first points above the rest's range) is the curve
    if sum(next((k for k, y in enumerate(line.get_ydata()) if y <= top), len(line.get_ydata())) for line in lines) \
            >= len(above):
        return
    over = [x for line in lines for x, y in zip(*line.get_data(), strict=True) if y > top]
    bottom = min(min(values), top if reference is None else reference)
    ax.set_ylim(bottom - 0.05 * (top - bottom), top + 0.05 * (top - bottom))
    ax.plot(over, [top] * len(over), "^", color="red", ms=6, label=f"{len(above)} point(s) above, up to "
            f"{max(above):.4g}")


def _task(key: str) -> str:
    """The task of an eval metric: eval/hellaswag_acc_norm -> hellaswag."""
    return key[len("eval/"):].rsplit("_", 1)[0].removesuffix("_acc")


def _eval_panels(runs: list[RunCurves]) -> tuple:
    """`EVAL_PANELS` as PANELS rows for the tasks the runs scored (one key per task: acc_norm, else acc)."""
    keys = sorted({k for run in runs for k in run.series if k.startswith("eval/")})
    if not keys:
        return ()
    tasks = sorted({_task(k) for k in keys})
    panels = []
    for title, suffixes in EVAL_PANELS:
        chosen = [next((f"eval/{t}{s}" for s in suffixes if f"eval/{t}{s}" in keys), None) for t in tasks]
        panels.append((title, tuple(k for k in chosen if k), False))
    return tuple(panels)


def _headline(run: RunCurves, metric: str = "loss") -> str:
    val = run.series.get(f"val/{metric}")
    train = run.series.get(f"train/{metric}")
    if val:
        return f"{run.name}: val/{metric} {val[-1][1]:.3f} at step {val[-1][0]}"
    if train:
        return f"{run.name}: train/{metric} {train[-1][1]:.3f} at step {train[-1][0]} (no validation yet)"
    return f"{run.name}: nothing logged yet"
