"""A library's log file on a full disk: one line of tinylm's, not a traceback per record."""
import subprocess
import sys

SCRIPT = r'''
import errno, io, logging, sys
from tinylm.cli.main import main

class Full(io.StringIO):
    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")

log = logging.getLogger("wandb")  # as W&B's debug.log handler in a run folder on a full disk
log.addHandler(logging.StreamHandler(Full()))
log.setLevel(logging.INFO)
sys.argv = ["tinylm", "--version"]
try:
    main()
except SystemExit:
    pass
for i in range(3):
    log.info("config_cb %d", i)
'''


def test_a_library_log_file_on_a_full_disk_prints_no_tracebacks():
    """Catches W&B offline in a run folder on a full disk printing ~95 '--- Logging error ---' tracebacks
    (8,000 lines) from its debug.log handler."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert "Logging error" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
