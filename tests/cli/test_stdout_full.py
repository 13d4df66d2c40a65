import errno

import pytest

from tinylm.cli import console
from tinylm.train import stop_state


class _Full:
    """A file on a full disk (or over its quota): every write fails."""

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    flush = write


def test_a_full_log_disk_mid_run_drops_the_lines_and_trains_on(monkeypatch, caplog):
    """Catches `tinylm fit ... > /home/me/train.log` on a disk (a quota) that fills mid-run ending the run at its next
    progress line, unsaved (exit 1): the log is not the run's result. Outside a run (generate's text) it stays the
    one-line error naming the standard output."""
    quieted = []
    monkeypatch.setattr(console, "quiet_stdout", lambda: quieted.append(True))
    out = console._Output(_Full())
    monkeypatch.setattr(stop_state, "over", False)
    monkeypatch.setattr(stop_state, "reader_gone", lambda signum: None)  # a run is training
    assert out.write("steps:  1% 20/2000\n") == len("steps:  1% 20/2000\n")
    assert quieted and "disk is full" in caplog.text
    monkeypatch.setattr(stop_state, "reader_gone", None)  # no run: the output is the result
    with pytest.raises(OSError, match="standard output"):
        out.write("ROMEO:")
