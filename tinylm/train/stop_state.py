"""How the last run's training ended, as plain values that tinylm.train.interrupt sets and the CLI's signal handlers
read (tinylm.cli.signals), and what a SIGHUP does to the terminal. Nothing but os is imported here: a handler runs
at any moment, also while torch is imported."""

from __future__ import annotations

import os

over = False
"""The last run's training has ended (complete, or stopped on a signal or an error): what is left of it is its
teardown and the command's exit."""

line: str | None = None
"""The line of the last run's stop on a signal (its RunInterrupted's), None if it did not stop on one: a Ctrl+C in
the teardown after the stop ends the command at once, which says it first."""


reader_gone = None
"""While a run trains: called with SIGPIPE when stdout's reader went away (`tinylm fit ... | head`), to stop the run at
a whole step and save as on SIGTERM (tinylm.train.interrupt); None otherwise."""


terminal_fds: set[int] = set()
"""The standard streams (0, 1, 2) found on a terminal as the command started (tinylm.cli.console): once the terminal
hangs up, isatty says no more."""


def leave_terminal() -> None:
    """On SIGHUP (the terminal closed, the ssh session dropped): the standard streams still on the terminal are
    pointed at /dev/null, since every write to a hung-up terminal fails (EIO), and the run's next progress line or
    log message would end it mid-step, unsaved. Streams redirected to a file or a pipe keep what is said."""
    null = None
    for fd in (0, 1, 2):
        try:
            if fd not in terminal_fds and not os.isatty(fd):
                continue
            null = os.open(os.devnull, os.O_RDWR) if null is None else null
            os.dup2(null, fd)
        except OSError:
            continue
    if null is not None and null > 2:
        os.close(null)
