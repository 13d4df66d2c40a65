"""The learning-rate range test (Smith 2017, "Cyclical learning rates"): train a few steps while the LR grows
exponentially, watch where the loss falls fastest. Lightning's `Tuner.lr_find` runs it and restores the weights and
optimizer afterwards; this module adds the size-based rule of thumb to compare with."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np

from tinylm.progress import bar

GPT2_SMALL_PARAMS = 124e6
GPT2_SMALL_LR = 6e-4  # GPT-3 paper's LR for its 125M model, nanoGPT's default


def rule_of_thumb_lr(params: int) -> float:
    """6e-4 x (124M / N)^0.5: GPT-2 small's LR scaled by the square root of the size ratio (larger models want
    smaller LRs; GPT-3's table falls roughly this way)."""
    return GPT2_SMALL_LR * math.sqrt(GPT2_SMALL_PARAMS / params)


MIN_POINTS = 3  # points of the curve a suggestion needs (past the skipped ones)
FEW_POINTS = 20  # a sweep shorter than this that finds no fall says to sweep longer, not wider
SMOOTHING = 0.98  # the beta of the running loss, Lightning's in its range test (_LRCallback)
DIVERGED = 4.0  # the sweep ends once its curve exceeds this many times its lowest point (Lightning's threshold)


def smoothed(losses: list[float]) -> list[float]:
    """The running average of ``losses`` (beta SMOOTHING), debiased as Adam is: divided by 1 - beta^k after k losses.

    Not Lightning's own curve: its range test averages the loss of each step's last micro-batch only (with
    accumulation, a sqrt(accumulation) times noisier curve than the step's loss), and debiases it by 1 -
    beta^(k+1), reading global_step after the step counted it: the first point came out at about half the true
    loss (for 65 characters ln 65 = 4.17 showed as 2.1) and the curve *rose* over the first ~50 LRs, which
    misplaced the steepest-descent suggestion (Lightning issue #14167 reports the symptom)."""
    avg, out = 0.0, []
    for k, loss in enumerate(losses, start=1):
        avg = SMOOTHING * avg + (1 - SMOOTHING) * loss
        out.append(avg / (1 - SMOOTHING ** k))
    return out


def diverged(losses: list[float]) -> bool:
    """Whether the sweep is over: its curve (`smoothed(losses)`) is past DIVERGED times its lowest point before, or
    not a number. Lightning's rule, on the curve tinylm reads: Lightning's range test judged its own (the last
    micro-batch's loss, debiased one step off: its first point was about half the loss, so it stopped at about 2x
    the loss the sweep started from, not 4x, and under accumulation on one micro-batch's noise); and a NaN never
    stopped it (every later step trained NaN weights)."""
    curve = smoothed(losses)
    return len(curve) > 1 and not (curve[-1] <= DIVERGED * min(curve[:-1]))


@dataclass(frozen=True)
class LRFind:
    lrs: list[float]
    losses: list[float]  # Lightning's smoothed training loss at each LR
    suggestion: float | None  # the LR of the steepest loss descent against log LR
    rule_of_thumb: float
    why_none: str = ""  # why there is no suggestion, and the fix


class _SweepLines(logging.Filter):
    """Drops Lightning's info lines about the range test's own temporary checkpoint and its fit's end, and its
    "Detected KeyboardInterrupt, attempting graceful shutdown ..." on a Ctrl+C (the command's own line says it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return ".lr_find_" not in msg and not msg.startswith("`Trainer.fit` stopped: `max_steps=") and \
            "Detected KeyboardInterrupt" not in msg


@contextlib.contextmanager
def _sweep_bar() -> Iterator[None]:
    """Lightning's sweep draws its own tqdm bar on stderr whatever stderr is: in a log (`> lr.log 2>&1`, SLURM) every
    redrawing stayed, carriage returns and all; tinylm's bar is plain lines there, as the run's own. A sweep stopped
    (Ctrl+C, SIGTERM, an error) ends its bar's line before the command's: the line was glued to the bar's drawing,
    and the bar drawn again below it as the process exited."""
    from lightning.pytorch.tuner import lr_finder

    own_bar, drawn = lr_finder.tqdm, []
    lr_finder.tqdm = lambda *args, **kwargs: drawn.append(bar(*args, **kwargs)) or drawn[-1]
    try:
        yield
    except BaseException:
        for made in drawn:
            made.close()
        raise
    finally:
        lr_finder.tqdm = own_bar


def lr_find(trainer: L.Trainer, module: L.LightningModule, datamodule: L.LightningDataModule, *, params: int,
            min_lr: float, max_lr: float, num_training: int) -> LRFind:
    """Run the range test from ``min_lr`` to ``max_lr`` over ``num_training`` optimizer steps; the module's weights
    and the trainer are as they were afterwards (Lightning saves and restores a checkpoint around it).

    Lightning's range test sets every parameter group to the same LR, so with model.optimizer muon Muon would be
    swept at AdamW's LRs (33x below its own at the defaults: muon_lr 0.02, lr 6e-4) and the suggestion would mix
    the two optimizers. Here TinyLM's `muon_lr_ratio` keeps Muon's LR at muon_lr / lr times AdamW's at every step
    (as the schedule does in a run): the sweep is over model.lr with muon_lr moving with it. (A Lightning callback
    cannot do it: the range test runs with its own callback only.)"""
    from lightning.pytorch.tuner import Tuner

    hp = module.hparams
    if hp.get("optimizer") == "muon":
        module.muon_lr_ratio = hp.muon_lr / hp.lr
    module.lr_range_test, module.range_test_losses = True, []
    # Lightning's own save of the weights it restores says "`weights_only` was not set, defaulting to `False`": a
    # note about its temporary file, not the user's
    quiet = logging.getLogger("lightning.pytorch.trainer.connectors.checkpoint_connector")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    # and its lines about that file ("Restoring states from the checkpoint path at /tmp/.../.lr_find_<uuid>.ckpt",
    # "Restored all states ...") and about the sweep's end ("`Trainer.fit` stopped: `max_steps=<num_training>`"):
    # no file or fit of the user's
    said = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    sweep_lines = _SweepLines()
    said.addFilter(sweep_lines)
    try:
        with _sweep_bar():  # the module ends the sweep by tinylm's curve (`diverged`), not Lightning's callback
            finder = Tuner(trainer).lr_find(module, datamodule=datamodule, min_lr=min_lr, max_lr=max_lr,
                                            num_training=num_training, update_attr=False, early_stop_threshold=None)
    finally:
        module.muon_lr_ratio, module.lr_range_test = None, False
        quiet.setLevel(level)
        said.removeFilter(sweep_lines)
    # each step's loss: the mean over its micro-batches (Lightning's curve reads the last one's: `smoothed` says why)
    raw, module.range_test_losses = module.range_test_losses, []
    points = [(lr, loss) for lr, loss in zip(finder.results["lr"], smoothed(raw), strict=True) if math.isfinite(loss)]
    lrs, losses = [p[0] for p in points], [p[1] for p in points]
    suggestion, why = steepest_descent(lrs, losses), ""
    if suggestion is None:
        stopped = len(finder.results["lr"]) < num_training  # the curve went past 4x its lowest point (`diverged`)
        # (a short sweep's curve is noise: "raise --max_lr" was said of 4 points, already at an LR of 1)
        few = len(_trimmed(lrs)) < MIN_POINTS or len(lrs) < FEW_POINTS
        why = (f"the loss diverged after {len(finder.results['lr'])} steps, at LR {finder.results['lr'][-1]:.2e}: "
               "lower --min_lr" if stopped else
               f"too few points ({len(lrs)}): raise --num_training" if few else
               f"the loss did not fall between {min_lr:g} and {max_lr:g}: " +
               ("raise --max_lr (or check the data)" if max_lr < 1 else "check the data and the model"))
    return LRFind(lrs, losses, suggestion, rule_of_thumb_lr(params), why)


def _trimmed(points: list, skip_begin: int = 10, skip_end: int = 1) -> list:
    """The points a suggestion reads: without the first min(skip_begin, n/5) (the running loss still settling)
    and the last skip_end."""
    return points[min(skip_begin, len(points) // 5):len(points) - skip_end]


def steepest_descent(lrs: list[float], losses: list[float]) -> float | None:
    """The LR where the loss falls fastest per *decade* of LR (the slope against log LR, as Smith and fastai read
    the curve). Lightning's `suggestion()` differentiates against the LR itself, which on an exponential sweep
    favours the first points (their LRs are packed together, so any small drop there is a steep slope): on the
    laptop recipe it picked 7.9e-6, on the flat start of the curve, where the loss falls fastest near 3e-3.
    None with fewer than MIN_POINTS points past the skipped ones, or when the loss does not fall: no slope is
    below 0, or it never gets 1 % below where the sweep started (noise: its steepest point would mean nothing)."""
    lrs, losses = _trimmed(lrs), _trimmed(losses)
    if len(lrs) < MIN_POINTS:
        return None
    slopes = np.gradient(np.asarray(losses), np.log(np.asarray(lrs)))
    if slopes.min() >= 0 or min(losses) > losses[0] - 0.01 * abs(losses[0]):
        return None
    return float(lrs[int(np.argmin(slopes))])


def plot_lr_find(result: LRFind, out: str | Path, *, title: str = "", config_lr: float | None = None) -> Path:
    """Loss against LR (log x), the suggestion, the rule of thumb and the config's lr (``config_lr``, red) as
    vertical lines, into the PNG ``out``."""
    from tinylm.studies.plots import figure_canvas, save_png

    fig, canvas = figure_canvas(figsize=(7, 4))
    ax = fig.subplots()
    ax.plot(result.lrs, result.losses, lw=1.5, label="training loss (smoothed)")
    if result.suggestion:
        ax.axvline(result.suggestion, color="C1", ls="--", label=f"steepest descent: {result.suggestion:.2e}")
    ax.axvline(result.rule_of_thumb, color="C2", ls=":", label=f"6e-4·(124M/N)^0.5: {result.rule_of_thumb:.2e}")
    if config_lr:
        ax.axvline(config_lr, color="C3", ls="-", lw=1.5, label=f"this config's model.lr: {config_lr:.2e}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title or "LR range test", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_png(canvas, out)
