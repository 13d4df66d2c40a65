"""Signals outside fit's training loop (which tinylm.train.interrupt handles): SIGTERM, SIGHUP (unless the command
was started to ignore it, as under nohup), Ctrl+C and SIGUSR1/SIGUSR2 (unless handled or ignored) end a command with
its cleanup and one line (128 + the signal), and pass on to the training processes it started."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator

from tinylm.cli import ranks
from tinylm.cli.errors import Interrupted, Terminated, TrainingProcessTerminated, error_line
from tinylm.train import stop_state

log = logging.getLogger("tinylm")


def end_at_once_on_ctrl_c() -> None:
    """From here on, as the command ends (saying why, waiting for the ranks it started, its exit hooks: the loader's
    workers joined, W&B's upload, ddp_fork's training processes), a Ctrl+C ends it at once, quietly, with 130: it
    raised KeyboardInterrupt wherever it landed ("Exception ignored in atexit callback ... KeyboardInterrupt" and a
    traceback, or a traceback in place of the line saying why the run stopped). A command started with Ctrl+C
    ignored (a script's `&` job) keeps ignoring it: its Ctrl+C handler, reset to the default as Python finalizes,
    let a Ctrl+C in its last moments kill it (status -2, though the run had ended well)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _end_saying_the_stop)


SAID = [False]
"""The command's ending line is written (main's error line, or its `tinylm: interrupted`)."""


def _end_saying_the_stop(signum: int, frame: object) -> None:
    """`end_now`, saying the run's stop line first when the command had not said it yet: a second Ctrl+C that landed
    while it waited for the ranks it started to end, before its line, ended it without a word (the checkpoint
    saved, and nothing naming it)."""
    if stop_state.line is not None and not SAID[0] and not ranks.rank() and ranks.COMMAND:
        with contextlib.suppress(Exception):
            _say_in_handler(error_line(ranks.COMMAND[0], stop_state.line, list(ranks.COMMAND[1:])))
    end_now(signum, frame)


def _say_in_handler(text: str) -> None:
    """Write ``text`` on stderr from a signal handler, which runs inside whatever this thread was doing: a write of
    its own to stderr that blocked (a full pipe, a terminal paused by Ctrl+S or slow over ssh) holds the stream's
    lock, and writing through the stream raised "RuntimeError: reentrant call inside <_io.BufferedWriter
    name='<stderr>'>" there: the line was lost (the process then ended at once, without a word). It then goes
    straight to the stream's file descriptor."""
    stream = sys.stderr
    try:
        stream.write(text)
        stream.flush()
    except RuntimeError:  # the reentrant call (the stream dropped the text)
        data = text.encode(getattr(stream, "encoding", None) or "utf-8", "backslashreplace")
        fd = stream.fileno()
        while data:
            data = data[os.write(fd, data):]


def end_now(signum: int, frame: object) -> None:
    """End this process at once, and every process it started (nothing left running), with 128 + the signal."""
    started = [p.pid for p in ranks.RANKS if p.poll() is None]
    for pid in started + [child.pid for child in multiprocessing.active_children()]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for stream in (sys.stdout, sys.stderr):  # what was said stays said (a pipe's buffer)
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + signum)


def _torch_spawn_wrapper(frame: object) -> tuple[object, object] | None:
    """(torch's wrapper of a training process that ddp_fork or ddp_spawn started, the frame it called) on the stack
    of ``frame``; None outside such a process."""
    inner = None
    for outer in _stack(frame):
        if _runs(outer, "_wrap", "spawn.py"):
            return outer, inner
        inner = outer
    return None


def _stack(frame: object) -> Iterator[object]:
    """``frame`` and its callers, innermost first."""
    while frame is not None:
        yield frame
        frame = frame.f_back


def _runs(frame: object, function: str, module: str) -> bool:
    """Whether ``frame`` runs ``function`` of multiprocessing's ``module`` file."""
    code = frame.f_code
    return code.co_name == function and code.co_filename.endswith(os.path.join("multiprocessing", module))


def _in_torch_spawn(frame: object) -> bool:
    """Whether ``frame`` runs in a training process that ddp_fork (or ddp_spawn) started. A stop raised there is an
    Exception (TrainingProcessTerminated): torch's wrapper passes only those on to the launching process, which says
    the first failure (a BaseException's traceback was printed there). Any other process of multiprocessing's (a
    user's Pool) gets Terminated, which no ``except Exception`` takes for its own failure."""
    return _torch_spawn_wrapper(frame) is not None


def _writing_down_its_error(frame: object) -> bool:
    """In a training process that ddp_fork started: torch's wrapper of it is writing down the error it ended on,
    for the launching process, which ends the other training processes with a SIGTERM as soon as one has failed (a
    rank that failed in a collective with the first, gone). The signal, raised as an error there, added that
    rank's traceback (two, chained) to the first failure's line."""
    if sys.exc_info()[1] is None:
        return False
    if (found := _torch_spawn_wrapper(frame)) is None:
        return isinstance(sys.exc_info()[1], SystemExit) and _exiting_from_torch_spawn(frame)
    inner = found[1]  # outside the training function it calls (Lightning's), in its `except`
    return inner is None or inner.f_code.co_name != "_wrapping_function"


def _exiting_from_torch_spawn(frame: object) -> bool:
    """Whether ``frame`` runs in multiprocessing's exit function (its finalizers) of a process that torch's wrapper
    ended (sys.exit(1), its error written down): the launching process's SIGTERM came a moment later there, and
    added a traceback ("During handling of ... SystemExit: 1") to the first failure's line."""
    exiting = False
    for outer in _stack(frame):
        if _runs(outer, "_exit_function", "util.py"):
            exiting = True
        elif _runs(outer, "_bootstrap", "process.py"):
            target = getattr(outer.f_locals.get("self"), "_target", None)
            return exiting and getattr(target, "__module__", None) == "torch.multiprocessing.spawn"
    return False


_HELD: list[int] | None = None
"""The signals that arrived while `held` imports ran (None: not holding)."""
_HOLDER: tuple[str, bool] = ("", False)
"""The command `held` holds them for, and whether this process is that command (not a caller's main([...]))."""


@contextlib.contextmanager
def held(command: str, program: bool) -> Iterator[None]:
    """Hold SIGTERM, SIGHUP and Ctrl+C (`terminate_cleanly`'s) until the imports inside are done, then act on the
    first: raised in the middle of an import, its exception could leave a module half made, and what followed was
    another error (numpy's lazy submodules recursed without end: a RecursionError's 50-line traceback in place of
    the command's line, exit 1). A second signal meanwhile ends the command at once (an import that hangs), when
    this process is the command (``program``): a caller's (a notebook's kernel) is never ended, only told later."""
    global _HELD, _HOLDER
    if _HELD is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    _HELD, _HOLDER = [], (command, program)
    try:
        yield
    finally:
        got, _HELD = _HELD, None
        if got:
            signal.raise_signal(got[0])  # its handler runs now, between two statements


def _holding(signum: int) -> bool:
    """Whether `held` keeps ``signum`` for later (the second one ends a command that is this process at once)."""
    if _HELD is None:
        return False
    command, program = _HOLDER
    if _HELD and program:
        with contextlib.suppress(Exception):
            name = "Ctrl+C" if signum == signal.SIGINT else signal.Signals(signum).name
            _say_in_handler(error_line(command, f"{name} during the imports, after an earlier signal: ended at once",
                                      []))
        end_now(signum, None)
    _HELD.append(signum)
    return True


@contextlib.contextmanager
def _warnings_until_a_run(on_sigterm, command: str = "") -> Iterator[None]:
    """A scheduler's pre-emption warning left at its default (SLURM's requeue signal SIGUSR1, `timeout -s USR1`, LSF's
    SIGUSR2) ends the command as ``on_sigterm`` does until fit's run takes it (tinylm.train.interrupt, which reads this
    handler as the default it stands for): while a tokenizer trained, a corpus was packed or the ranks connected, it
    killed the command by the default action, without a word (status -10)."""
    if not callable(on_sigterm):
        yield
        return

    def on_warning(signum: int, frame: object) -> None:
        on_sigterm(signum, frame)

    on_warning.until_a_run = True
    warnings = [s for s in (signal.SIGUSR1, signal.SIGUSR2) if signal.getsignal(s) == signal.SIG_DFL]
    if command == "validate" and "SLURM_NTASKS" in os.environ and \
            os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive"):  # (SLURMEnvironment.detect)
        warnings.remove(signal.SIGUSR1)  # Lightning's auto-requeue handler takes it (it finds none there): requeued
    for s in warnings:
        signal.signal(s, on_warning)
    try:
        yield
    finally:
        for s in warnings:  # (a run stopped on SLURM's requeue signal leaves it ignored: see usr_signals_kept)
            if signal.getsignal(s) is on_warning:
                signal.signal(s, signal.SIG_DFL)


@contextlib.contextmanager
def usr_signals_kept(program: bool, command: str = "") -> Iterator[None]:
    """SIGUSR1 and SIGUSR2 as they were after the command, unless this process is the command (``program``): a run
    stopped on SLURM's requeue signal leaves it ignored (tinylm.train.interrupt), so that the signal reaching a rank
    late, after the rank stopped on another's, does not kill it as it exits (status -10 for a saved run). Meanwhile,
    `_warnings_until_a_run` with the SIGTERM handler of `terminate_cleanly` (entered just before)."""
    main = threading.current_thread() is threading.main_thread()  # (elsewhere: a ValueError)
    previous = {s: h for s in (signal.SIGUSR1, signal.SIGUSR2)
                if main and not program and (h := signal.getsignal(s)) is not None}
    try:
        with _warnings_until_a_run(signal.getsignal(signal.SIGTERM) if main else None, command):  # terminate_cleanly's
            yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def terminate_cleanly(command: str, program: bool = False) -> Iterator[None]:
    def on_sigterm(signum: int, frame: object) -> None:
        if _holding(signum):
            return
        if _writing_down_its_error(frame):
            return  # it exits in a moment, with its error (its traceback beside the first failure's line, if raised)
        if signum == signal.SIGHUP:
            stop_state.leave_terminal()
        children = multiprocessing.active_children()  # ddp_fork's training processes (or loader workers)
        # ddp's ranks started by this process too: they stop on it as this one does (before training, it ends them)
        for child in children + ranks.RANKS:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)
        name = signal.Signals(signum).name
        if children and command == "fit":  # this process only waits for the ones that train; it exits after them
            raise Terminated(f"terminated by {name}, passed on to the training processes: they finish their step "
                             "and save last.ckpt; resume with `tinylm fit --config ... --ckpt_path last`", signum)
        stopped = TrainingProcessTerminated if _in_torch_spawn(frame) else Terminated  # (_in_torch_spawn: why)
        raise stopped(f"terminated by {name} before it finished; run the same `tinylm {command}` again", signum)

    def on_sigint(signum: int, frame: object) -> None:
        # ddp_fork's training processes (not daemonic, as loader workers are): a Ctrl+C to this process alone (a
        # notebook's Interrupt, `kill -INT`) left them training to the end. They get a SIGTERM: beside a terminal's
        # own Ctrl+C to them it is one request, where a second SIGINT would stop them at once, unsaved.
        if _holding(signum):
            return
        forked = [child for child in multiprocessing.active_children() if not child.daemon]
        if not forked:
            if program and command == "fit" and stop_state.over:
                # the run stopped (or ended) and is being torn down: it is exiting, and says why first (a stop's
                # line: the checkpoint is saved by now)
                _end_saying_the_stop(signum, frame)
            raise KeyboardInterrupt
        for child in forked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
        again = "resume with `tinylm fit --config ... --ckpt_path last`" if command == "fit" else \
            f"run the same `tinylm {command}` again"
        raise Interrupted(f"interrupted by Ctrl+C, passed on to the training processes: they finish their step and "
                          f"save last.ckpt; {again}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    previous_hup = signal.getsignal(signal.SIGHUP)  # one ignored (nohup) stays ignored
    if previous_hup is not signal.SIG_IGN and previous_hup is not None:
        signal.signal(signal.SIGHUP, on_sigterm)
    # only where Python's own Ctrl+C handler is in place (a caller's is left alone)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if previous_hup is not signal.SIG_IGN and previous_hup is not None:
            signal.signal(signal.SIGHUP, previous_hup)
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)
