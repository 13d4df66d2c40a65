"""Progress as a bar on a terminal, as plain lines anywhere else (a file, a pipe: SLURM's, nohup's or CI's log).

A tqdm bar redraws its line with a carriage return several times a second. On a terminal the line changes in place;
written to a file every drawing stays, and the log of a long run grew by megabytes of ``\\r`` frames that ``less``
and ``grep`` read as one endless line. Where the stream is no terminal, `Lines` stands in for the bar: the text tqdm
draws (description, percentage, count, elapsed<left, rate, postfix) without the bar and without a control character,
one line at a time, when its owner says (`Lines.emit`) or every `LINE_INTERVAL` seconds. tqdm's own ``TQDM_DISABLE``
turns bars and lines off alike.

`bar` makes one for the library's long loops (tokenizer training, packing, cleaning, evaluation, sample reports);
the training bar (`tinylm.train.progress_bar.ProgressBar`) emits its lines at optimizer steps; `datasets_bars` keeps
the `datasets` library's own bars out of a log.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tinylm import continued

LINE_INTERVAL = 30.0  # seconds between two lines of a loop's progress in a log: a long step shows it is alive
_ENV_OFF = ("", "0", "false", "no")


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a redrawn line stays one line there)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def draws_bars(stream: Any) -> bool:
    """Whether a bar written to ``stream`` redraws in place: a terminal, or a Jupyter kernel's output, where
    ``tqdm.auto`` draws a widget (its stream is no terminal)."""
    if is_terminal(stream):
        # a terminal of 0 columns or 0 rows (`script -c` or `docker run -t` in CI: a pty nobody sized): tqdm draws
        # nothing there, not even its numbers, and the run showed no progress at all: lines, as in a log
        return 0 not in _size(stream)
    import tqdm.auto  # noqa: F401 (imports tqdm.autonotebook without the warning that its notebook mode gives)
    from tqdm.autonotebook import tqdm as auto  # (tqdm.auto's own class is a subclass of it, whatever the place)
    from tqdm.std import tqdm as std

    return auto is not std


def _size(stream: Any) -> tuple[int, ...]:
    """(columns, rows) of the terminal ``stream`` is, as tqdm reads them (from the terminal itself); () if unknown."""
    try:
        return tuple(os.get_terminal_size(stream.fileno()))
    except (AttributeError, ValueError, OSError):
        return ()


def disabled_by_env() -> bool:
    """tqdm's ``TQDM_DISABLE`` set (to anything but 0/false/no): no bar, no lines."""
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in _ENV_OFF


def bar(iterable: Iterable | None = None, *, total: float | None = None, desc: str = "", enabled: bool = True,
        file: Any = None, **kwargs: Any) -> Any:
    """A tqdm bar over ``iterable`` (or updated by hand) where ``file`` (stderr by default) draws bars, `Lines`
    elsewhere (a line every `LINE_INTERVAL` seconds, and a last one at the end when any was written: a loop of
    seconds writes nothing), a silent one when not ``enabled`` or under ``TQDM_DISABLE``. ``kwargs``: tqdm's
    (``unit``, ``unit_scale``, ``initial``, ...); `Lines` takes those it shows and ignores the rest."""
    from tqdm.auto import tqdm

    if not enabled or disabled_by_env():
        return tqdm(iterable, total=total, disable=True)
    if draws_bars(file or sys.stderr):
        # disable=False as tinylm reads the switch: tqdm's own reading, bool("0"), turned TQDM_DISABLE=0 into "off"
        return on_monotonic_clock(tqdm(iterable, total=total, desc=desc, file=file, disable=False, **kwargs))
    return Lines(iterable, total=total, desc=desc, file=file, interval=LINE_INTERVAL, **kwargs)


def on_monotonic_clock(bar: Any) -> Any:
    """tqdm ``bar`` timed by the monotonic clock, as `Lines` are, not by tqdm's wall clock (time.time): a clock
    stepped back an hour (NTP, a VM restored from a snapshot, a clock set by hand) drew the training bar's
    "110/2000 [-59:59<-17:10:37, -0.03it/s]" to the run's end (its rate is the average since the start), and one
    stepped a day forward "720/2000 [24:01:01<42:41:48, 120.08s/it]"."""
    if not bar.disable:  # (a disabled tqdm has no clock)
        shift = time.monotonic() - bar._time()
        bar._time, bar.start_t, bar.last_print_t = time.monotonic, bar.start_t + shift, bar.last_print_t + shift
    return bar


class Lines:
    """The part of tqdm's interface that tinylm's bars use (and Lightning's progress bar calls), writing lines
    instead of redrawing one: ``update``, ``n``, ``total``, ``initial``, ``set_postfix``, ``set_description``,
    ``reset``, ``refresh``, ``write``, ``close``, iteration and ``with``.

    A line is written by `emit`, by ``update``/``refresh`` once ``interval`` seconds passed since the last (None:
    only by `emit`), and by ``close`` when the count moved since the last line written (a loop that wrote none
    stays silent: its caller says what it did).
    """

    disable = False

    def __init__(self, iterable: Iterable | None = None, *, total: float | None = None, desc: str = "",
                 initial: float = 0, unit: str = "it", unit_scale: bool = False, unit_divisor: int = 1000,
                 file: Any = None, interval: float | None = LINE_INTERVAL, **tqdm_only: Any) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.total, self.desc = iterable, total, desc
        self.initial = self.n = initial
        self.unit, self.unit_scale, self.unit_divisor = unit, unit_scale, unit_divisor
        self.file, self.interval = file, interval
        self.postfix = ""
        self.left: float | None = None  # seconds left, where the owner knows them better than the rate (max_time)
        self.start_t = self._written_t = time.monotonic()
        self._written_n: float | None = None  # the count at the last line written
        self._closed = False
        self._stops = continued.Stops()
        self._left_out = (0.0, 0.0)  # (seconds, count) left out of the rate: intervals with a stop in them

    # ---- tqdm's interface --------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        self.refresh()

    def refresh(self, *args: Any, **kwargs: Any) -> None:
        if self.interval is not None and time.monotonic() - self._written_t >= self.interval:
            self.emit()

    def reset(self, total: float | None = None) -> None:
        self.n, self.total, self.start_t = 0, total, time.monotonic()
        self._left_out = (0.0, 0.0)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        from tqdm.std import tqdm

        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={tqdm.format_num(v) if isinstance(v, (int, float)) else v}"
                                 for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def write(self, s: str, file: Any = None, end: str = "\n", nolock: bool = False) -> None:
        self._out(s + end, file)

    def close(self) -> None:
        if not self._closed and self._written_n is not None and self._written_n != self.n:
            self.emit()
        self._closed = True

    # ---- lines ---------------------------------------------------------------------------------------------------
    def emit(self) -> None:
        """Write the progress now, as one line. An interval since the last line in which the process was stopped
        (Ctrl+Z, kill -STOP, SLURM's suspend: `tinylm.continued`) is left out of the rate and the time left: counted,
        a 20 s stop of a run with 8 s to go said 37 s left, and a long run's lines overstated the time left long
        after."""
        now = time.monotonic()
        if self._stops.since():
            since = self.initial if self._written_n is None else self._written_n
            self._left_out = (self._left_out[0] + now - self._written_t, self._left_out[1] + self.n - since)
        self._written_n, self._written_t = self.n, now
        self._out(str(self) + "\n")

    def __str__(self) -> str:
        from tqdm.std import tqdm

        known = bool(self.total)  # (without a total, tqdm's own form: count, elapsed, rate)
        # the share done rounded down: tqdm's rounding wrote "steps: 100% 590/592" into a log, 2 steps before the end
        form = (("{desc}: " if self.desc else "") + "{done:3d}% {n_fmt}/{total_fmt} "
                "[{elapsed}<{remaining}, {rate_fmt}{postfix}]") if known else None
        elapsed = time.monotonic() - self.start_t
        counted = (elapsed - self._left_out[0], self.n - self.initial - self._left_out[1])  # (time, count) of rate
        rate = counted[1] / counted[0] if self._left_out[0] and min(counted) > 0 else None  # (None: tqdm's own)
        left = {} if self.left is None else {"remaining": tqdm.format_interval(self.left)}  # (tqdm's: from the rate)
        return tqdm.format_meter(self.n, self.total, elapsed, rate=rate, prefix=self.desc,
                                 unit=self.unit, unit_scale=self.unit_scale, unit_divisor=self.unit_divisor,
                                 initial=self.initial, postfix=self.postfix or None, bar_format=form,
                                 done=int(100 * self.n // self.total) if known else 0, **left)

    def _out(self, text: str, file: Any = None) -> None:
        stream = file or self.file or sys.stderr  # (what it is now, as tqdm: stderr may have been replaced)
        stream.write(text)
        stream.flush()


@contextlib.contextmanager
def heartbeat(say: Callable[[float], str | None], interval: float | None = None) -> Iterator[None]:
    """In a log (where bars are not drawn), a line on stderr every ``interval`` seconds (`LINE_INTERVAL`) while the
    block runs, the text ``say(seconds since it began)`` gives (None: nothing that time): a long step that reports
    no progress of its own (a BPE trainer merging pairs) shows it is alive. Nothing on a terminal, where the library
    draws its own bars, or under ``TQDM_DISABLE``."""
    if disabled_by_env() or draws_bars(sys.stderr):
        yield
        return
    import threading

    stop, start = threading.Event(), time.monotonic()

    def beat() -> None:
        while not stop.wait(LINE_INTERVAL if interval is None else interval):
            if text := say(time.monotonic() - start):
                sys.stderr.write(text + "\n")
                sys.stderr.flush()

    thread = threading.Thread(target=beat, name="tinylm-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def datasets_bars() -> Iterator[None]:
    """`datasets`' own bars ("Generating train split") where tinylm's draw one: in a log (a file, a pipe) their
    redraws would stay as lines of carriage returns; tinylm's lines say what is read."""
    import datasets

    if draws_bars(sys.stderr) or datasets.are_progress_bars_disabled():
        yield
        return
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.enable_progress_bars()
