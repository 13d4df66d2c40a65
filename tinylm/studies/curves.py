"""The four charts to watch on every run (loss, learning rate, gradient norm, tokens/s) with the training-health
alerts marked, read back from runs' ``csv/metrics.csv``: no W&B account needed. Several runs share one figure."""

from __future__ import annotations

import csv
import math
import re
import textwrap
import warnings
from array import array
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
_DRAWN = frozenset(k for _title, keys, *_log in (*PANELS, *METRICS.values()) for k in keys)


class Points:
    """One metric's [(step, value), ...], kept as two arrays: 16 bytes a point, where a list of tuples took ~110 (a
    200,000-step run's 800,000 points: 87 MB). Reads as that list: index, iterate, len, ==, append, sort."""

    __slots__ = ("steps", "values")

    def __init__(self, points=()) -> None:
        self.steps, self.values = array("q"), array("d")
        for point in points:
            self.append(point)

    def append(self, point: tuple[int, float]) -> None:
        self.steps.append(point[0])
        self.values.append(point[1])

    def sort(self) -> None:
        ordered = sorted(self)
        self.steps, self.values = array("q", [s for s, _ in ordered]), array("d", [v for _, v in ordered])

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i: int) -> tuple[int, float]:
        return self.steps[i], self.values[i]

    def __iter__(self):
        return zip(self.steps, self.values)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (Points, list, tuple)) else NotImplemented

    def __repr__(self) -> str:
        return f"Points({list(self)!r})"


@dataclass
class RunCurves:
    """One run's logged series: metric -> [(step, value)], and its health alerts [(step, kind)]."""

    name: str
    series: dict[str, Points | list[tuple[int, float]]] = field(default_factory=dict)  # (read_run's: Points)
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
    """The numbers of the run's metrics.csv that the plot draws (`drawn`), with its health alerts and NaN/inf steps.
    A last line without its newline is being written (a run in progress) or was cut by a crash: it is left out, as a
    resume drops it ("2." may be the start of "2.5")."""
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
    take 1 more and every step the plot names is the one the run said. Read a line at a time, keeping the columns
    the plot draws (`drawn`) and the health alerts, into arrays (`Points`): a 200,000-step run's CSV read whole, a
    dict a row and a list of tuples for every column (train/skipped_steps, a callback's own) took 2.4x the CPU and
    6x the memory."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:  # damaged bytes: that cell is no number
        reader = csv.reader(whole_lines(f))
        header = next(reader, [])
        curves.columns = curves.columns or tuple(header)
        index = {key: i for i, key in enumerate(header)}  # (a name twice: its last column, as csv.DictReader's)
        if (at := index.get("step")) is None:  # (not a metrics.csv: check_drawable says so)
            return
        kept = [(key, i, key.startswith(HEALTH_PREFIX)) for key, i in index.items()
                if key not in ("step", "epoch") and (key.startswith(HEALTH_PREFIX) or drawn(key))]
        for row in reader:
            if at >= len(row) or (step := _number(row[at])) is None:
                continue
            step = int(step) + shift  # (one int for the row's points)
            for key, i, health in kept:
                if i >= len(row) or not (text := row[i]):
                    continue
                value = _number(text)
                if value is None:
                    if text.strip().lower().lstrip("+-") in ("nan", "inf"):
                        curves.nonfinite.setdefault(key, []).append(step)
                elif health:
                    curves.alerts.append((step, key[len(HEALTH_PREFIX):]))
                else:  # (the arrays' own appends: a call of Points.append a point took 40 % longer)
                    points = curves.series.get(key) or curves.series.setdefault(key, Points())
                    points.steps.append(step)
                    points.values.append(value)


def whole_lines(f):
    """The lines of ``f`` but a last one without its newline: being written (a run in progress) or cut by a crash."""
    for line in f:
        if not line.endswith(("\n", "\r")):
            return
        yield line


def drawn(key: str) -> bool:
    """Whether the plot draws the metric ``key`` (in a panel, the first panel of either --metric, an eval panel)."""
    return key in _DRAWN or key.startswith((CORPUS_LOSS, "eval/"))


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
    with warnings.catch_warnings():  # matplotlib's, when placing a legend took 1 s (a long run's): nothing to act on
        warnings.filterwarnings("ignore", message='Creating legend with loc="best" can be slow')
        draw_runs(fig, runs, reference=reference, metric=metric)
        return save_png(canvas, out, drawn_by="plot")


def draw_runs(fig, runs: list[RunCurves], *, reference: float | None = None, metric: str = "loss") -> None:
    """The four panels for ``runs`` on ``fig`` (six with eval scores): one colour per run, train thin, validation
    dots, health alerts as dashed lines named in the first panel (red for one run; in the run's colour, with its name,
    for several). The first panel is ``metric``'s (METRICS): loss in nats/token, or bits per byte."""
    evals = _eval_panels(runs)
    tasks = sorted({_task(k) for _title, keys, _log in evals for k in keys})  # a task's marker in every panel
    axes = fig.subplots(2, 3 if evals else 2).ravel()
    colours = _colours(len(runs))
    panels = ((*METRICS[metric], False), *PANELS[1:], *evals)
    for i, (ax, (title, keys, log_y)) in enumerate(zip(axes, panels)):
        for run, colour in zip(runs, colours):
            corpora = sorted(k for k in run.series if k.startswith(CORPUS_LOSS)) if i == 0 and metric == "loss" else []
            for key in (*keys, *corpora):
                points = run.series.get(key)
                if not points:
                    continue
                steps, values = _arrays(points)
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
        _x_steps(ax)
        ax.grid(alpha=0.3)
    beside = _legend(fig, axes[0], runs, colours)
    # wrapped between runs to the figure's width (about 12 characters an inch at this size): 3 runs' or more ran off
    # both sides (each run's headline kept whole: "\0" holds its spaces while textwrap breaks, at no hyphen either:
    # "lr-" ended a line and "sweep-3" began the next)
    headline = ", ".join(_headline(run, metric).replace(" ", "\0") for run in runs)
    fig.suptitle(textwrap.fill(headline, width=int(fig.get_figwidth() * 12), break_long_words=False,
                               break_on_hyphens=False).replace("\0", " "), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - beside, 1))


_MARKERS = "os^Dv<>PX*"


def _x_steps(ax) -> None:
    """The x axis's label, and from 100,000 steps its ticks as 25k, 1.5M: "100000125000150000" ran together."""
    ax.set_xlabel("step")
    if ax.get_xlim()[1] >= 1e5:
        from matplotlib.ticker import FuncFormatter

        ax.xaxis.set_major_formatter(FuncFormatter(_thousands))


def _thousands(x: float, _pos: int | None = None) -> str:
    """A step as the x axis names it from 100,000 steps on: 0, 25k, 1.25M."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:g}{unit}"
    return f"{x:g}"


LEGEND_ENTRIES = 12
"""The most entries the loss panel's legend holds in the panel: 7 runs' train and val loss ran over the panel below."""


def _colours(n: int) -> list:
    """One colour per run: matplotlib's ten (C0-C9), then from 11 runs tab20's lighter ten for runs 11-20 (the 11th run
    was drawn in the first's colour, the 20th in the 10th's)."""
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    from matplotlib import colormaps

    tab20 = colormaps["tab20"].colors  # (its even ten are C0-C9)
    return [tab20[2 * (i % 10) + (i // 10) % 2] for i in range(n)]


def _legend(fig, ax, runs: list[RunCurves], colours: list) -> float:
    """The loss panel's legend: in the panel (matplotlib's best place) up to LEGEND_ENTRIES entries; else beside the
    panels, one entry per run (its name in its colour) and one per kind of curve (its style, gray), as 20 runs' 40
    entries squashed every panel to a sliver. Returns the figure's width it takes (0: in the panel)."""
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) <= LEGEND_ENTRIES:
        if handles:
            ax.legend(fontsize=7)
        return 0.0
    from matplotlib.lines import Line2D

    names, kinds, others = {run.name for run in runs}, {}, []
    for handle, label in zip(handles, labels, strict=True):
        name, _, key = label.rpartition(" ")
        if name in names and "/" in key:  # "RUN train/loss": a run's curve, its kind's style once
            kinds.setdefault(key, Line2D([], [], color="gray", ls=handle.get_linestyle(), lw=handle.get_linewidth(),
                                         marker=handle.get_marker(), ms=handle.get_markersize(), label=key))
        else:  # the reference, points above the panel, a run's NaN/inf steps: as they are
            others.append(handle)
    entries = [Line2D([], [], color=c, lw=2, label=run.name) for run, c in zip(runs, colours)] + [*kinds.values(),
                                                                                                    *others]
    legend = fig.legend(handles=entries, loc="center right", fontsize=7, ncol=math.ceil(len(entries) / 40))
    return legend.get_window_extent().width / (fig.get_figwidth() * fig.dpi) + 0.01


def _arrays(points: Points | list[tuple[int, float]]):
    """The steps and values of ``points`` as two float arrays, the numbers matplotlib draws: zip(*points) took 1 s a
    200,000-point series, most of it the garbage collector's, 5-10x this."""
    import itertools

    import numpy as np

    if isinstance(points, Points):
        return np.asarray(points.steps, dtype=float), np.asarray(points.values, dtype=float)
    xy = np.fromiter(itertools.chain.from_iterable(points), float, 2 * len(points)).reshape(-1, 2)
    return xy[:, 0], xy[:, 1]


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
