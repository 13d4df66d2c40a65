"""The ranks of a run connecting (torch's rendezvous at MASTER_ADDR:MASTER_PORT) and meeting before setup (the
"pre_setup" barrier, while rank 0 prepares the data): waits inside torch's C++, which retries a wait that a signal
interrupts and never returns to Python until the other ranks come or 30 minutes pass. A SIGTERM, SIGHUP or Ctrl+C
sent meanwhile ran no handler: a node started by hand for a peer that never came ignored them for 30 minutes (only
kill -9 ended it). Here a thread hears the signal (Python's wakeup fd) and, the wait still going on a moment later,
ends the process with its one line, and the ranks it started with it."""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from tinylm.cli import ranks

GRACE_S = 2.0  # a signal's handler that ran ends the wait by then (it raised); one that could not, the wait goes on
NOTE_S = 15.0  # a wait this long is said once (torch says nothing until its 30-minute timeout)
_SIGNALS = {signal.SIGTERM: "terminated by SIGTERM", signal.SIGHUP: "terminated by SIGHUP",
            signal.SIGINT: "interrupted by Ctrl+C"}


def watch_waits(strategy: Any, start: tuple | None = None) -> None:
    """Watch ``strategy``'s rendezvous (setup_environment) and its "pre_setup" barrier, in this process and in the
    ones it starts (ddp_fork's copies of the strategy). ``start``: (the checkpoint step this rank starts from or None,
    its run folder, the command), which the connected ranks check is the same on every rank (launch_checks)."""
    setup, barrier = strategy.setup_environment, strategy.barrier

    @functools.wraps(setup)
    def setup_environment(*args: Any, **kwargs: Any) -> Any:
        with waiting(f"connecting to the other ranks at {_address(strategy)}"):
            done = setup(*args, **kwargs)
        if start is not None:
            from tinylm.cli.launch_checks import check_same_start

            check_same_start(strategy, *start)
        return done

    @functools.wraps(barrier)
    def barrier_before_setup(name: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if name != "pre_setup":  # the others (a save's, the end's) wait for ranks that finish a step, as a stop does
            return barrier(name, *args, **kwargs)
        with waiting("waiting for the other ranks (rank 0 prepares the data meanwhile)"):
            return barrier(name, *args, **kwargs)

    strategy.setup_environment, strategy.barrier = setup_environment, barrier_before_setup


def _address(strategy: Any) -> str:
    environment = getattr(strategy, "cluster_environment", None)
    with contextlib.suppress(Exception):
        return f"{environment.main_address}:{environment.main_port}"
    return f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '?')}"


@contextlib.contextmanager
def waiting(what: str) -> Iterator[None]:
    """While the main thread waits in torch's C++ (``what``): a signal that it does not act on within GRACE_S ends
    the process, with 128 + the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)  # (Python's signal handler writes it)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    if previous != -1:  # another's (an event loop's): left alone
        signal.set_wakeup_fd(previous)
        os.close(read), os.close(write)
        yield
        return
    over = threading.Event()
    # the signals go to another thread than this one (the watch, which unblocks them): torch's C++ took one here
    # as an interrupted connect, and said so in a warning with its C++ stack (~15 lines) before the line
    kept = signal.pthread_sigmask(signal.SIG_BLOCK, set(_SIGNALS))
    threading.Thread(target=_watch, args=(read, over, what), daemon=True, name="tinylm-rendezvous-watch").start()
    try:
        yield
    finally:
        over.set()
        signal.pthread_sigmask(signal.SIG_SETMASK, kept)  # (one that came meanwhile is handled here now)
        signal.set_wakeup_fd(-1)
        os.close(write)  # the watch reads the end of its pipe, and closes it


def _speaks() -> bool:
    """Whether this process says the line: each machine's first rank (a node started by hand, torchrun's local rank
    0, srun's task 0 of a node: it sets SLURM_LOCALID, no LOCAL_RANK; the ranks that rank 0 started are quiet: it
    says it)."""
    return os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")) == "0" and ranks.rank0_pid() is None


def _watch(read: int, over: threading.Event, what: str) -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_SIGNALS))  # (blocked in the thread that started it)
    started, noted = time.monotonic(), False
    with os.fdopen(read, "rb", buffering=0) as pipe:
        while True:
            ready, _, _ = select.select([pipe], [], [], 1.0)
            if over.is_set():
                return
            if not ready:
                if not noted and time.monotonic() - started > NOTE_S and _speaks():
                    noted = True
                    sys.stderr.write(f"tinylm: still {what} ({time.monotonic() - started:.0f} s; torch waits for every "
                                     "rank up to the process group's timeout, 30 min unless the strategy sets one; "
                                     "Ctrl+C stops)\n")
                    sys.stderr.flush()
                continue
            got = pipe.read(64)
            if not got:
                return
            signum = next((s for s in got if s in _SIGNALS), None)
            if signum is not None and not over.wait(GRACE_S):
                _end(signal.Signals(signum), what)


def _end(signum: signal.Signals, what: str) -> None:
    """End this process (and the ranks it started) as its handler would have, had it run."""
    from tinylm.cli.errors import error_line

    for proc in ranks.RANKS:  # stuck as this one is: each ends on it alike, quietly
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signum)
    if _speaks() and ranks.REPORTING.acquire(blocking=False):
        line = f"{_SIGNALS[signum]} while {what}; run the same `tinylm {ranks.COMMAND[0]}` again"
        with contextlib.suppress(Exception):
            sys.stderr.write(error_line(ranks.COMMAND[0], line, ranks.COMMAND[1:], ranks.rank()))
            sys.stderr.flush()
    os._exit(128 + signum)
