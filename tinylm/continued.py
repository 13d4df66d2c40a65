"""Whether this process was stopped and continued since a moment: Ctrl+Z then ``fg``/``bg``, ``kill -STOP`` then
``-CONT``, SLURM's ``scontrol suspend``/``resume`` and gang scheduling (SIGSTOP, then SIGCONT). The wall time of an
interval with such a stop in it is no measure of the work done in it: a 20 s stop logged ``train/tokens_per_sec``
126 for ~9,000 in the rows of the 10-step window it fell in, and a log's progress line said 37 s left where 8 s
were. Those measures leave the interval out (`tinylm.train.callbacks.SpeedMonitor`, `tinylm.progress.Lines`,
`tinylm.train.progress_bar.ProgressBar`).

A machine's sleep (a laptop's lid) sends no SIGCONT; the monotonic clocks that tokens/sec, a log's lines and the bars
on a terminal read (`tinylm.progress.on_monotonic_clock`) stand still through it on Linux and macOS."""

from __future__ import annotations

import signal
import threading

_COUNT = [0]  # SIGCONTs this process received since `watch` (the handler only counts: it may run at any bytecode)


def _on_continue(signum: int, frame: object) -> None:
    _COUNT[0] += 1


def watch() -> None:
    """Count this process's continues from now on (a SIGCONT handler). Only from the main thread, where Python
    takes handlers, and only over SIGCONT's default (a program's own handler is kept: its continues are not
    counted). System calls it interrupts are restarted, as without a handler."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGCONT"):
        return
    try:
        if signal.getsignal(signal.SIGCONT) != signal.SIG_DFL:  # ours already, or the program's own
            return
        signal.signal(signal.SIGCONT, _on_continue)
        signal.siginterrupt(signal.SIGCONT, False)
    except (OSError, ValueError):  # (an interpreter without handlers for it)
        return


def continues() -> int:
    """How many times this process was continued since `watch` (compare two reads: a stop in between)."""
    return _COUNT[0]


class Stops:
    """Whether this process was stopped and continued between two looks (`since`), counting from when it was made
    (it starts the count: `watch`)."""

    def __init__(self) -> None:
        watch()
        self._seen = continues()

    def since(self) -> bool:
        """Whether it was continued since the last look (or since it was made)."""
        seen = continues()
        stopped, self._seen = seen != self._seen, seen
        return stopped
