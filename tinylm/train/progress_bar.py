"""The training progress bar: one bar of the run's optimizer steps on a terminal, plain lines in a log."""

from __future__ import annotations

import math
import sys
import time
from typing import ClassVar

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar, Timer, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from tinylm import continued
from tinylm.progress import Lines, disabled_by_env, draws_bars, on_monotonic_clock


def steps_between_lines(max_steps: int, log_every_n_steps: int, max_lines: int) -> int:
    """Optimizer steps between two progress lines in a log: a multiple of ``log_every_n_steps`` (the steps whose
    metrics are logged, so each line's loss is that step's), the smallest that writes at most ``max_lines`` over
    ``max_steps``. 2,000 steps logged every 10, at most 100 lines: every 20 steps; 300 steps: every 10 (30 lines)."""
    every = max(1, log_every_n_steps)
    return every * max(1, math.ceil(max_steps / (every * max_lines)))


class ProgressBar(TQDMProgressBar):
    """One bar for the whole run: optimizer steps of ``trainer.max_steps`` (a resumed run's bar starts at its step),
    with loss, val loss, learning rate and tokens/sec, and tqdm's ETA to the run's end (``max_time``'s end where it
    comes first at the pace so far: "0% 193/100000 [00:05<46:12]" was drawn as a run of 5 s stopped).

    Lightning's bar counts the batches of a notional epoch ("Epoch 0: 100% 1307/1307" at 65% of a 2,000-step run)
    and its ETA is the epoch's end. Redrawn at most every ``min_interval`` seconds during training: Lightning redraws
    it (and formats its metrics) after every batch, which cost ~1.6% of the laptop recipe's run on a 2-core CPU.
    Without ``max_steps`` (Lightning's bar, for code that builds a Trainer by hand) it counts epochs' batches.

    Where stdout (Lightning's bars' stream) is no terminal (``tinylm fit ... > log``, SLURM, nohup, CI) the run's
    progress is plain lines instead (`tinylm.progress.Lines`): the bar's text, every `steps_between_lines` steps
    (at most ``max_lines`` lines a run) and at the last, and a line with the val loss after each validation; under
    ``max_time``, also at the first logged step after ``max_time / max_lines`` seconds without a line (a run that
    max_time ended long before max_steps wrote none until its end). The validation and sanity-check bars write
    nothing. ``TQDM_DISABLE`` turns the bar off, as ``--trainer.enable_progress_bar false`` does.
    """

    _SHORT: ClassVar[dict[str, str]] = {"train/loss": "loss", "val/loss": "val", "train/lr": "lr",
                                        "train/tokens_per_sec": "tok/s"}
    max_lines: ClassVar[int] = 100  # progress lines a run writes to a log, at most (validation's aside)

    def __init__(self, *, min_interval: float = 0.25, **kwargs) -> None:
        super().__init__(**kwargs)
        self.min_interval = min_interval
        self._drawn = 0.0
        self._every = 1  # steps between two lines (where they are lines)
        self._seconds: float | None = None  # under max_time: the most seconds without a line (where they are lines)
        self._line_t = 0.0  # when the last line was written
        self._timer: Timer | None = None  # Lightning's, under max_time
        self._stops = continued.Stops()  # stopped and continued since the last drawing (made again at the start)

    @property
    def is_enabled(self) -> bool:
        return super().is_enabled and not disabled_by_env()

    @staticmethod
    def _by_steps(trainer: L.Trainer) -> bool:
        return trainer.max_steps > 0

    @staticmethod
    def _lines() -> bool:
        return not draws_bars(sys.stdout)  # (where Lightning draws its bars)

    def init_train_tqdm(self):
        if self.is_disabled or not self._lines():
            return on_monotonic_clock(super().init_train_tqdm())
        return Lines(desc=self.train_description, file=sys.stdout)

    # the other bars draw nothing in a log: a validation's line comes when it ends (on_validation_end)
    def init_sanity_tqdm(self):
        return Tqdm(disable=True) if self._lines() else on_monotonic_clock(super().init_sanity_tqdm())

    def init_validation_tqdm(self):
        return Tqdm(disable=True) if self._lines() else on_monotonic_clock(super().init_validation_tqdm())

    def init_test_tqdm(self):
        return Tqdm(disable=True) if self._lines() else super().init_test_tqdm()

    def init_predict_tqdm(self):
        return Tqdm(disable=True) if self._lines() else super().init_predict_tqdm()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if self._by_steps(trainer):
            bar = self.train_progress_bar
            self._timer = next((cb for cb in trainer.callbacks if isinstance(cb, Timer)), None)
            if isinstance(bar, Lines):  # lines at steps (on_train_batch_end), not every so many seconds
                bar.interval = None
                self._every = steps_between_lines(trainer.max_steps, trainer.log_every_n_steps, self.max_lines)
                left = self._timer.time_remaining() if self._timer else None  # (a resume's: what max_time leaves)
                self._seconds, self._line_t = None if left is None else left / self.max_lines, time.monotonic()
            bar.reset(total=trainer.max_steps)
            bar.initial = bar.n = trainer.global_step  # a resume: the ETA counts the steps left, at this run's pace
            bar.set_description("steps")
            bar.refresh()
        self._stops = continued.Stops()

    def on_train_epoch_start(self, trainer: L.Trainer, *args) -> None:
        if not self._by_steps(trainer):  # epochs are notional: the run's bar goes on across them
            super().on_train_epoch_start(trainer, *args)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        bar = self.train_progress_bar
        if bar.disable:
            return
        drawn = self._by_steps(trainer) and not isinstance(bar, Lines)
        if drawn:
            bar.n = trainer.global_step  # (a stop between two drawings: the step it stopped at)
        bar.set_postfix(self.get_metrics(trainer, pl_module))  # (the bar stays open)
        # (a stop before trainer.min_steps goes on training: Lightning's own test)
        stops = trainer.should_stop and getattr(trainer.fit_loop, "_can_stop_early", True)
        if drawn and (trainer.global_step >= trainer.max_steps or stops):
            bar.close()  # its line ended now: Lightning's "`Trainer.fit` stopped" comes next, and was glued to it

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if not self._by_steps(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        bar, step = self.train_progress_bar, trainer.global_step
        if isinstance(bar, Lines):
            due = step % self._every == 0 or step >= trainer.max_steps or trainer.should_stop or (
                self._seconds is not None and step % max(1, trainer.log_every_n_steps) == 0
                and time.monotonic() - self._line_t >= self._seconds)
            if due and bar.n != step:
                self._emit(trainer, pl_module)
            return
        now = time.perf_counter()
        last = step >= trainer.max_steps
        if bar.disable or (now - self._drawn < self.min_interval and not last) or bar.n == step:
            return  # the next drawing sets the bar's count to the true position
        if self._stops.since():  # stopped since the last drawing (Ctrl+Z, then fg): tqdm's rate (Lightning's: the
            # average since the start) and time left leave the time since it out, and its elapsed time with them;
            # counted, a 15 s stop with 12 s to go said 46 s left, and later ones too
            if self._drawn:  # (none yet: the bar's start is this run's)
                # (and its last print with it: one before its start is none to tqdm, which then ended no line at
                # close, and the run's summary was glued to the bar)
                bar.start_t, bar.last_print_t = bar.start_t + now - self._drawn, bar.last_print_t + now - self._drawn
        self._drawn = now
        bar.n = step
        if self._timer is not None:
            left = self._time_left(bar)
            bar.bar_format = self.BAR_FORMAT if left is None else \
                self.BAR_FORMAT.replace("{remaining}", bar.format_interval(left))
        bar.set_postfix(self.get_metrics(trainer, pl_module))  # (redraws)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        bar = self._train_progress_bar
        if isinstance(bar, Lines) and not trainer.sanity_checking and trainer.state.fn == "fit":
            shown = [f"{k}={v}" for k, v in self.get_metrics(trainer, pl_module).items() if _is_val(k)]
            of = f"/{trainer.max_steps}" if self._by_steps(trainer) else ""
            if shown:
                bar.write(f"validation at step {trainer.global_step}{of}: {', '.join(shown)}")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if isinstance(self._train_progress_bar, Lines) and self._by_steps(trainer) \
                and self.train_progress_bar.n != trainer.global_step:
            self._emit(trainer, pl_module)  # a stop that no batch's end saw
        super().on_train_end(trainer, pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # a run ended by an error or a signal: the bar's line is ended, so the line that says why starts on its own
        # (written to a file, the bar's last drawing had no newline and the error's line was appended to it); in a
        # log, the last line written stays the last (the step it names is the last one it knows the loss of)
        for bar in (self._train_progress_bar, self._val_progress_bar):
            if bar is not None and not bar.disable:
                bar.close()

    def _emit(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """One line of the run's progress in a log, at this step: the bar's fields but the val loss (its own line
        says it when it is new)."""
        bar = self.train_progress_bar
        bar.n = trainer.global_step
        bar.left = self._time_left(bar)
        bar.set_postfix({k: v for k, v in self.get_metrics(trainer, pl_module).items() if not _is_val(k)})
        bar.emit()
        self._line_t = time.monotonic()

    def _time_left(self, bar) -> float | None:
        """Seconds max_time leaves the run where they are fewer than tqdm's time left (to max_steps, at the pace so
        far); None without max_time, or where max_steps comes first."""
        left = self._timer.time_remaining() if self._timer is not None else None
        done, elapsed = bar.n - bar.initial, time.monotonic() - bar.start_t  # (both bars on the monotonic clock)
        if left is None or done <= 0 or left >= (bar.total - bar.n) * elapsed / done:
            return None
        return max(0.0, left)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        out = {}
        for key, value in items.items():
            name = self._SHORT.get(key, key)
            if key == "train/lr":
                out[name] = f"{float(value):.2e}"
            elif key == "train/tokens_per_sec":
                out[name] = f"{float(value):,.0f}"
            elif isinstance(value, float):
                out[name] = f"{value:.4f}"
            else:
                out[name] = value
        return out


def without_epoch_total(callbacks: list) -> None:
    """A user's RichProgressBar (`--trainer.callbacks+=RichProgressBar`) says "Epoch 0", as Lightning's tqdm bar
    does: under max_steps Lightning's max_epochs is -1 (no limit), and Lightning 2.6's rich bar wrote it as a total
    less one, "Epoch 0/-2" (Lightning-AI/pytorch-lightning#21925). (The bar, its drawing only, becomes a
    `_RichBar`; a subclass of the user's own is left as it is.)"""
    for bar in callbacks:
        if type(bar) is RichProgressBar:
            bar.__class__ = _RichBar


class _RichBar(RichProgressBar):
    """Lightning's RichProgressBar, whose training bar of no epoch limit names no total (`without_epoch_total`)."""

    def _get_train_description(self, current_epoch: int) -> str:
        text, epochs = super()._get_train_description(current_epoch), self.trainer.max_epochs
        if epochs is None or epochs >= 0:
            return text
        said = f"Epoch {current_epoch}/{epochs - 1}"  # (its padding kept: the validation bar's width)
        return text.replace(said, f"Epoch {current_epoch}".ljust(len(said)))


def _is_val(name: str) -> bool:
    """A validation metric, by its name on the bar ("val", or "val/..." for those without a short name)."""
    return name == "val" or name.startswith("val/")
