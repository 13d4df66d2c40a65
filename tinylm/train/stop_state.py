"""How the last run's training ended, as plain values that tinylm.train.interrupt sets and the CLI's signal handlers
read (tinylm.cli.signals). Nothing is imported here: a handler runs at any moment, also while torch is imported."""

from __future__ import annotations

over = False
"""The last run's training has ended (complete, or stopped on a signal or an error): what is left of it is its
teardown and the command's exit."""

line: str | None = None
"""The line of the last run's stop on a signal (its RunInterrupted's), None if it did not stop on one: a Ctrl+C in
the teardown after the stop ends the command at once, which says it first."""
