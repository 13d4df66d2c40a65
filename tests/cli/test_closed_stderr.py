import importlib
import signal
import sys

import pytest

from tinylm.cli.errors import Terminated

cli_main = importlib.import_module("tinylm.cli.main")  # (tinylm.cli.main is also the function)


class _ReaderGone:
    """stderr a pipe whose reader went away (`tinylm fit ... 2>&1 | tee log`, tee ended by the same signal)."""

    def __init__(self, path):
        self._file = open(path, "w")  # noqa: SIM115

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    flush = write

    def fileno(self):
        return self._file.fileno()

    def isatty(self):
        return False


class _DiskFull(_ReaderGone):
    """stderr a file on a full disk (`tinylm fit ... > train.log 2>&1`: the run went on past the full disk)."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    flush = write


@pytest.mark.parametrize("stderr", [_ReaderGone, _DiskFull])
@pytest.mark.parametrize("stop, status", [
    (Terminated("terminated by SIGTERM before it finished; run the same tinylm plot again", signal.SIGTERM), 143),
    (KeyboardInterrupt(), 130),
])
def test_a_stop_into_a_closed_or_full_stderr_keeps_its_exit_status(tmp_path, monkeypatch, stderr, stop, status):
    """Catches `tinylm fit ... 2>&1 | tee log` stopped by SIGTERM or Ctrl+C (which end tee too), or `fit > train.log
    2>&1` on a disk that filled mid-run (the run trains on, stdout dropped) then stopped by a scheduler's SIGTERM,
    exiting 1: writing the stop's line raised a BrokenPipeError (an OSError) in place of the 143/130 a script reads."""
    def stopped(*args):
        raise stop

    monkeypatch.setattr(cli_main, "_run", stopped)
    monkeypatch.setattr(sys, "stderr", stderr(tmp_path / "stderr"))
    with pytest.raises(SystemExit) as e:
        cli_main.main(["plot", str(tmp_path)])
    assert e.value.code == status
