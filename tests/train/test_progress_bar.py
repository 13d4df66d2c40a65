"""The training progress bar: one bar of the run's optimizer steps on a terminal, plain lines in a log."""

import contextlib
import fcntl
import os
import re
import select
import struct
import sys
import termios
import threading
import tty
import types

import lightning as L
import pytest

from tinylm.cli.fit import lightning_main
from tinylm.train.progress_bar import ProgressBar, steps_between_lines


class Terminal:
    """A real pseudo-terminal (200 columns, raw: no newline translation), read all along (so that its buffer never
    fills); `shown` is what it showed so far, every byte written before it was called included: it reads what the
    reader has not yet read itself (a reader a moment behind, on a loaded machine, left the end of one run's
    drawings to be taken for the start of the next one's)."""

    def __init__(self) -> None:
        self.master, slave = os.openpty()
        tty.setraw(slave)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
        self.file = open(slave, "w", encoding="utf-8")  # noqa: SIM115 (closed by `close`)
        self._shown = bytearray()
        self._lock = threading.Lock()  # one reader at a time: no chunk is ever read and not yet kept
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _drain(self, wait: float) -> None:
        with contextlib.suppress(OSError):  # EIO once the other side is closed
            while select.select([self.master], [], [], wait)[0]:
                self._shown.extend(os.read(self.master, 65536))

    def _read(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                self._drain(0)
            self._closed.wait(0.01)

    def shown(self) -> str:
        self.file.flush()
        with self._lock:
            self._drain(0.05)
            return self._shown.decode("utf-8", "replace")

    def close(self) -> None:
        self.file.close()
        self._closed.set()
        self._reader.join(timeout=5)
        os.close(self.master)


@pytest.fixture
def terminal():
    """A `Terminal`; a test points sys.stdout at its ``file`` in its body (pytest's capture sets sys.stdout again
    as each phase of a test starts)."""
    term = Terminal()
    yield term
    term.close()


def _bar_lines(text: str) -> list[str]:
    """The bar's drawings, each up to its "[" (elapsed, rate and postfix vary)."""
    lines = text.replace("\r", "\n").splitlines()
    return [line.split("[")[0].strip() for line in lines if line.startswith(("steps", "Epoch"))]


def test_the_bar_counts_the_runs_steps_and_a_resume_starts_at_its_step(run_config, terminal, monkeypatch):
    """One bar for the run, on a terminal: optimizer steps of max_steps (not a notional epoch's batches, which showed
    "Epoch 0: 100% 1307/1307" at 65% of a 2,000-step run, with the ETA of that epoch), a resumed run's bar starting
    at its step (its ETA then counts the steps left), loss, val loss, tokens/sec and lr beside it; redrawn with
    carriage returns, not written as lines as in a log."""
    config = run_config(trainer={"max_steps": 3, "accumulate_grad_batches": 2, "val_check_interval": 2,
                                 "enable_progress_bar": True})
    monkeypatch.setattr(sys, "stdout", terminal.file)  # where Lightning draws its bars
    seen = [0]

    def bar_of(cli):
        bar = next(cb for cb in cli.trainer.callbacks if isinstance(cb, ProgressBar)).train_progress_bar
        text = terminal.shown()
        text, seen[0] = text[seen[0]:], len(text)
        assert "\r" in text and "validation at step" not in text  # drawn, not logged
        return bar, dict(item.split("=") for item in bar.postfix.split(", ")), _bar_lines(text)

    bar, postfix, lines = bar_of(lightning_main(["fit", "--config", str(config)]))
    assert (bar.total, bar.initial, bar.n) == (3, 0, 3)
    assert {"loss", "val", "tok/s", "lr"} <= set(postfix), postfix
    assert re.fullmatch(r"steps: 100%\|█+\| 3/3", lines[-1]), lines
    assert not any(line.startswith("Epoch") for line in lines)
    bar, postfix, lines = bar_of(lightning_main(["fit", "--config", str(config), "--ckpt_path", "last",
                                                 "--trainer.max_steps", "5"]))
    assert (bar.total, bar.initial, bar.n) == (5, 3, 5)
    assert lines[0].startswith("steps:  60%") and re.fullmatch(r"steps: 100%\|█+\| 5/5", lines[-1]), lines
    assert {"loss", "val", "tok/s", "lr"} <= set(postfix), postfix


def test_a_rich_bar_names_no_epoch_total_under_max_steps(run_config, terminal, monkeypatch):
    """Catches `--trainer.callbacks+=RichProgressBar` drawing "Epoch 0/-2": a run driven by max_steps has no epoch
    limit (Lightning's max_epochs -1), which Lightning 2.6's rich bar wrote as the total less one."""
    config = run_config(trainer={"max_steps": 3, "enable_progress_bar": True,
                                 "callbacks": [{"class_path": "lightning.pytorch.callbacks.RichProgressBar"}]})
    monkeypatch.setattr(sys, "stdout", terminal.file)
    lightning_main(["fit", "--config", str(config)])
    shown = terminal.shown()
    assert "Epoch 0" in shown and "/-" not in shown, shown[-500:]


class _StopAt2(L.Callback):
    """Asks the run to stop at optimizer step 2 (as EarlyStopping would), every batch after."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= 2:
            trainer.should_stop = True


def test_a_stop_before_min_steps_leaves_the_bar_going(run_config, terminal, monkeypatch):
    """Catches the bar closed at a stop that trainer.min_steps overrides (EarlyStopping, max_time) when a notional
    epoch ended there: Lightning trains on to min_steps, and the bar stood still at the step of the stop."""
    config = run_config(trainer={"max_steps": 6, "min_steps": 4, "enable_progress_bar": True,
                                 "callbacks": [{"class_path": "test_progress_bar._StopAt2"}]},
                        data={"batch_size": 400})  # a notional epoch of 2 steps: one ends at the stop

    monkeypatch.setattr(sys, "stdout", terminal.file)
    cli = lightning_main(["fit", "--config", str(config)])
    assert cli.trainer.global_step == 4
    last = _bar_lines(terminal.shown())[-1]  # (its blocks end in a partial one: ▎, ▋, ...)
    assert last.startswith("steps:  67%|") and last.endswith("| 4/6"), _bar_lines(terminal.shown())


def test_lightnings_stop_line_starts_after_the_bars_line(run_config, terminal, monkeypatch):
    """Catches "`Trainer.fit` stopped: `max_steps=3` reached." (Lightning's, after the last validation) written on a
    terminal at the end of the bar's last drawing, the bar drawn again below it by its close."""
    import lightning.pytorch.loops.fit_loop as fit_loop

    config = run_config(trainer={"max_steps": 3, "enable_progress_bar": True})
    monkeypatch.setattr(sys, "stdout", terminal.file)
    said, info = [], fit_loop.rank_zero_info

    def shown_when(message, *args, **kwargs):  # what the terminal shows as Lightning writes its line
        said.append((message, terminal.shown()))
        return info(message, *args, **kwargs)

    monkeypatch.setattr(fit_loop, "rank_zero_info", shown_when)
    lightning_main(["fit", "--config", str(config)])
    message, shown = said[-1]
    assert message == "`Trainer.fit` stopped: `max_steps=3` reached." and "val=" in shown, said
    assert shown.endswith("\n") and _bar_lines(shown)[-1].startswith("steps: 100%"), shown[-200:]
    assert terminal.shown() == shown  # not drawn again


@pytest.mark.parametrize("where", ["terminal", "log"])
def test_a_run_ended_by_an_error_ends_the_bars_line(run_config, capsys, monkeypatch, terminal, where):
    """Catches the bar's last drawing left without its newline when a run ends by an error or a signal: the line
    saying why was appended to the bar's line. In a log, its lines are whole lines all along."""
    from tinylm.train.module import TinyLM

    config = run_config(trainer={"max_steps": 4, "enable_progress_bar": True})
    step = TinyLM.training_step

    def failing(self, batch, batch_idx):
        if self.trainer.global_step == 2:
            raise RuntimeError("boom")
        return step(self, batch, batch_idx)

    monkeypatch.setattr(TinyLM, "training_step", failing)
    if where == "terminal":
        monkeypatch.setattr(sys, "stdout", terminal.file)
    with pytest.raises(RuntimeError, match="boom"):
        lightning_main(["fit", "--config", str(config)])
    out = terminal.shown() if where == "terminal" else capsys.readouterr().out
    assert "steps:" in out and out.endswith("\n"), out[-200:]
    assert ("\r" in out) == (where == "terminal"), out[-200:]


def test_a_log_gets_lines_every_so_many_steps_and_after_each_validation(run_config, capsys, monkeypatch):
    """Catches the bar's redrawings written into a log (`tinylm fit ... > log`, SLURM, nohup, CI; pytest's capture
    is such a file): a line every few seconds of a long run, each drawing kept with its carriage return, and
    `less`/`grep` reading megabytes of them as one line. In a log: plain lines at steps (at most
    ProgressBar.max_lines of them), one after each validation with its val loss; no validation bar."""
    monkeypatch.setattr(ProgressBar, "max_lines", 2)  # 8 steps logged every 2: a line every 4 steps
    config = run_config(trainer={"max_steps": 8, "log_every_n_steps": 2, "val_check_interval": 4,
                                 "num_sanity_val_steps": 1, "enable_progress_bar": True})
    lightning_main(["fit", "--config", str(config)])
    out = capsys.readouterr().out
    assert "\r" not in out and "\x1b" not in out, out[:500]
    steps = [line for line in out.splitlines() if line.startswith("steps:")]
    assert len(steps) == 2, out
    assert re.fullmatch(r"steps:  50% 4/8 \[\d\d:\d\d<\d\d:\d\d, .*loss=\d\.\d{4}.*tok/s=[\d,]+.*\]", steps[0]), steps
    assert steps[1].startswith("steps: 100% 8/8 [") and "val=" not in steps[1], steps
    vals = [line for line in out.splitlines() if line.startswith("validation at step")]
    assert [v.split(":")[0] for v in vals] == ["validation at step 4/8", "validation at step 8/8"], out
    assert all(re.search(r"val=\d\.\d{4}$", v) for v in vals), vals
    assert "Validation" not in out and "Sanity" not in out, out


def test_a_progress_bar_turned_off_writes_no_lines(run_config, capsys, monkeypatch):
    """Catches `--trainer.enable_progress_bar false` (Lightning's switch) or tqdm's TQDM_DISABLE=1 leaving lines in
    a log: no bar, no lines."""
    config = run_config(trainer={"enable_progress_bar": False})
    lightning_main(["fit", "--config", str(config)])
    out = capsys.readouterr().out
    assert "steps" not in out and "validation at step" not in out, out
    assert ProgressBar().is_enabled
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert not ProgressBar().is_enabled  # (its bars and lines are made only when it is enabled)


@pytest.mark.parametrize(("max_steps", "log_every", "max_lines", "every"),
                         [(2000, 10, 100, 20), (300, 10, 100, 10), (8, 2, 2, 4), (19073, 1, 100, 191),
                          (50, 100, 100, 100), (100, 3, 100, 3)])
def test_lines_come_at_logged_steps_and_are_bounded(max_steps, log_every, max_lines, every):
    """Catches a log holding a line per step (thousands for a 2,000-step run) or lines at steps whose loss was not
    logged (the loss shown being an older step's): a multiple of log_every_n_steps, at most max_lines a run."""
    assert steps_between_lines(max_steps, log_every, max_lines) == every
    assert every % log_every == 0 and max_steps // every <= max_lines


def _logged_above_a_bar(terminal, logger, message: str, *, done: int) -> None:
    """Log ``message`` while a bar of 10 steps at ``done`` is drawn on ``terminal``: the bar's line is cleared first,
    then the message written (less a leading newline), then the bar drawn again below it."""
    from tqdm.std import tqdm

    bar = tqdm(total=10, desc="steps", file=sys.stdout, mininterval=0)
    bar.update(done)
    before = len(terminal.shown())
    logger.info(message)
    shown = terminal.shown()[before:]
    cleared, _, after = shown.partition(message.lstrip("\n") + "\n")
    assert "\r" in cleared and cleared.strip(" \r") == "", repr(shown)
    assert after.lstrip("\r").startswith(f"steps:  {10 * done}%"), repr(shown)
    bar.close()


def test_a_log_line_mid_run_goes_above_the_bar_on_a_terminal(terminal, monkeypatch):
    """Catches tinylm's lines mid-run (the guard's skips, the health monitor's alerts, the samples) written at the end
    of the bar's drawing on a terminal, the bar drawn again after them on the same line; in a log they are lines as
    ever (a bar that draws nowhere, or a stderr that is a file)."""
    import io
    import logging

    from tqdm.std import tqdm

    from tinylm.cli.console import _Stderr

    logger = logging.getLogger("tinylm.test_bar_lines")
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "propagate", False)
    monkeypatch.setattr(logger, "level", logging.INFO)
    try:
        monkeypatch.setattr(sys, "stdout", terminal.file)
        monkeypatch.setattr(sys, "stderr", terminal.file)
        _logged_above_a_bar(terminal, logger, "\ntinylm guard: 1 step(s) skipped", done=3)
        log = io.StringIO()
        monkeypatch.setattr(sys, "stderr", log)  # stderr a file: as ever
        bar = tqdm(total=10, desc="steps", file=sys.stdout, mininterval=0)
        logger.info("\nin a log")
        bar.close()
        assert log.getvalue() == "\nin a log\n"
        # Lightning's console handler ("min_steps has not been met", "Time limit reached") writes above it too
        from tinylm.cli.console import AboveBars, setup_lightning

        setup_lightning()
        if not logging.getLogger("lightning.pytorch").handlers:  # Lightning adds its console handler only under a
            # root logger without handlers: imported first inside pytest's log capture (not at pytest's start, for
            # pyproject's filterwarnings), it added none, and this test failed by the order of imports
            monkeypatch.setattr(logging.getLogger("lightning.pytorch"), "handlers", [logging.StreamHandler()])
            setup_lightning()
        kinds = [type(h) for h in logging.getLogger("lightning.pytorch").handlers]
        assert AboveBars in kinds and logging.StreamHandler not in kinds, kinds
        monkeypatch.setattr(sys, "stderr", terminal.file)
        lightnings = AboveBars(terminal.file)  # (Lightning's writes to the stderr of its import)
        logger.removeHandler(handler)
        logger.addHandler(lightnings)
        _logged_above_a_bar(terminal, logger, "Trainer was signaled to stop but the required `min_steps=4` has not "
                            "been met", done=5)
        logger.removeHandler(lightnings)
    finally:
        logger.removeHandler(handler)


def test_the_bars_times_do_not_follow_the_wall_clocks_steps(monkeypatch):
    """Catches the bar on a terminal timed by the wall clock (tqdm's time.time): a clock stepped back an hour mid-run
    (NTP, a VM restored from a snapshot, a clock set by hand) drew "110/2000 [-59:59<-17:10:37, -0.03it/s]" to the
    run's end (its rate is the average since the start), and one stepped a day forward "[24:01:01<42:41:48,
    120.08s/it]"."""
    import tqdm.std

    from tinylm import progress

    wall, steady = [1.8e9], [100.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: wall[0])  # (what a tqdm made now reads)
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: steady[0]))
    monkeypatch.setattr(ProgressBar, "_lines", staticmethod(lambda: False))  # (a terminal)
    bar = ProgressBar().init_train_tqdm()
    try:
        bar.reset(total=2000)
        for step, jump in ((100, 0), (110, -3600), (710, 0), (720, 86400)):
            wall[0] += 10 + jump
            steady[0] += 10
            bar.n = step
            shown = bar.format_dict
            assert 0 < shown["elapsed"] <= 40 and "-" not in str(bar), (step, str(bar))
    finally:
        bar.close()


def test_a_stop_and_continue_is_left_out_of_the_bars_rate_and_time_left(monkeypatch):
    """Catches the bar on a terminal counting the time the run was stopped (Ctrl+Z, then fg; kill -STOP/-CONT) as
    training time: its rate is Lightning's (the average since the start), so a 15 s stop with 12 s to go drew
    "124/400 [00:21<00:46, 5.90it/s]" after fg (22 it/s before), and the time left stayed overstated to the end."""
    import io
    import signal
    import time

    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(L.pytorch.callbacks.TQDMProgressBar, "on_train_start", lambda *a: None)
    progress = ProgressBar()
    out = io.StringIO()
    bar = Tqdm(total=1, file=out, smoothing=0, ncols=120)  # (Lightning's: smoothing 0)
    bar._time = lambda: clock[0]
    progress._train_progress_bar = bar
    monkeypatch.setattr(progress, "get_metrics", lambda trainer, pl_module: {})
    trainer = types.SimpleNamespace(global_step=0, max_steps=400, should_stop=False, callbacks=[])
    try:
        progress.on_train_start(trainer, None)
        for step in range(1, 301):
            clock[0] += 0.04  # 25 steps a second
            if step == 125:
                clock[0] += 15.0  # stopped mid-step, then continued
                os.kill(os.getpid(), signal.SIGCONT)
            trainer.global_step = step
            progress.on_train_batch_end(trainer, None, None, None, step)
    finally:
        signal.signal(signal.SIGCONT, signal.SIG_DFL)
    rate = bar.format_dict["n"] / bar.format_dict["elapsed"]
    assert bar.n == 300 and rate == pytest.approx(25, rel=0.05), (bar.n, rate)
    bar.close()
    assert out.getvalue().endswith("\n"), repr(out.getvalue()[-200:])  # the bar's line ended: the summary's is its own


def test_a_log_gets_lines_of_a_run_that_max_time_ends(run_config, capsys, monkeypatch):
    """Catches a run under --trainer.max_time with a max_steps it never reaches (train for so long) writing no
    progress line into a log until its end: lines every 1% of max_steps, which it never got to. A line at the first
    logged step after max_time / max_lines seconds without one (here 3 s / 3); its time left is max_time's, not the
    time to max_steps ("0% 64/100000 [00:03<1:32:19" as it stopped)."""
    monkeypatch.setattr(ProgressBar, "max_lines", 3)
    config = run_config(trainer={"max_steps": 100_000, "max_time": "00:00:00:03", "val_check_interval": 10_000,
                                 "enable_progress_bar": True})
    lightning_main(["fit", "--config", str(config)])
    steps = [line for line in capsys.readouterr().out.splitlines() if line.startswith("steps:")]
    assert 2 <= len(steps) <= 4, steps  # (and the last, at the stop)
    assert all(re.match(r"steps:   0% \d+/100000 \[00:0\d<00:0[0-3], .*loss=", line) for line in steps), steps


def test_the_bars_time_left_is_max_times_where_it_ends_the_run(run_config, terminal, monkeypatch):
    """Catches the bar of a run that --trainer.max_time ends long before max_steps drawing tqdm's time to max_steps
    ("0% 193/100000 [00:05<46:12]" as a run of 5 s stopped): the time max_time leaves, where it is the sooner end."""
    config = run_config(trainer={"max_steps": 100_000, "max_time": "00:00:00:03", "val_check_interval": 10_000,
                                 "enable_progress_bar": True})
    monkeypatch.setattr(sys, "stdout", terminal.file)
    lightning_main(["fit", "--config", str(config)])
    drawn = re.findall(r"steps:   0%\|\s*\| \d+/100000 \[\d\d:\d\d<([^,]+),", terminal.shown())
    left = [t for t in drawn if t != "?"]  # (the drawing at the start has no pace yet)
    assert left and all(re.fullmatch(r"00:0[0-3]", t) for t in left), drawn
