"""The ranks of a DDP run as processes: which rank this is, watching the ones this process started (or
the rank 0 that started it), and the one line that says why a run lost a rank."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import sys
import threading
import time
import weakref

from tinylm.errors import TinyLMError

log = logging.getLogger("tinylm")


def rank() -> int:
    """This process's global rank in a run (0 outside one; read without importing Lightning: tinylm.cli.console)."""
    from tinylm.cli.console import env_rank

    return env_rank()


def rank_zero() -> bool:
    return rank() == 0


RANKS: list = []  # the rank processes that DDP's launcher started from this one (rank 0), as subprocess.Popen
STUCK_S = 20.0  # this process still training this long after a rank ended waits for it in a call that never returns
RANK0_PID = "TINYLM_RANK0_PID"  # rank 0 (DDP's launcher) tells the ranks it starts its pid, in their environment
_RANK0: int | None = None  # in a rank that rank 0 started: rank 0's pid, watched by `watch_rank0`
_ORPHAN_S = 5.0  # a rank still in training this long after rank 0 was gone waits for it in a call that never returns
COMMAND: list = ["fit"]  # the command this process runs and its arguments (no --verbose): what the lines name


def _go_on() -> str:
    """How to go on after a run stopped: resume a fit, run any other command (validate) again. The hint is spelled
    out with this process's own command and arguments by `tinylm.cli.errors.error_line`."""
    hint = "`tinylm fit --config ... --ckpt_path last`"
    return f"resume with {hint}" if COMMAND[0] == "fit" else f"run the same {hint} again"


def rank0_pid() -> int | None:
    """In a rank that DDP's launcher (rank 0) started: rank 0's pid; else None."""
    pid = os.environ.get(RANK0_PID, "")
    return int(pid) if pid.isdigit() and int(pid) != os.getpid() else None


def watch_rank0(pid: int, trainer: weakref.ref) -> None:
    """Watch rank 0 from a rank it started. A `kill -9` of rank 0 (the command itself, or the out-of-memory killer)
    left this rank to fail on its next collective with a gloo traceback after the shell's prompt, or, while the ranks
    still connected, waiting for it for good (torch's rendezvous timeout, 30 min)."""
    global _RANK0
    _RANK0 = pid
    threading.Thread(target=_watch_for_rank0, args=(pid, trainer), daemon=True, name="tinylm-rank0-watch").start()


def _watch_for_rank0(pid: int, trainer: weakref.ref, every: float = 0.5) -> None:
    import signal

    from lightning.pytorch.trainer.states import TrainerStatus

    while os.getppid() == pid:  # rank 0 started this process: another parent means rank 0 is gone
        time.sleep(every)
    # Rank 0 ends the ranks it started before it ends on an error (end_ranks); gone without that, it was killed.
    # This rank then fails on its next collective with it, and says so (main: lost_rank); unless it waits for rank 0
    # in a call that never returns (the ranks' connecting, an NCCL collective): then it is ended here, with its line.
    deadline = time.monotonic() + _ORPHAN_S
    while time.monotonic() < deadline:
        if (t := trainer()) is None or t.state.status not in (TrainerStatus.INITIALIZING, TrainerStatus.RUNNING):
            return  # it stopped (on that error, or at the end): it ends on its own
        time.sleep(0.05)
    from tinylm.cli.errors import error_line

    sys.stderr.write(error_line(COMMAND[0], str(lost_rank(wait=0)), COMMAND[1:], rank()))
    sys.stderr.flush()
    for child in multiprocessing.active_children():  # its loader's workers: not left behind
        with contextlib.suppress(OSError):
            os.kill(child.pid, signal.SIGKILL)
    os._exit(1)


def watch_ranks(ranks: list, trainer: weakref.ref) -> None:
    """Watch the ranks DDP's launcher started, in place of Lightning's watch, which SIGKILLed this process within
    5 s of a rank's error, wordless (exit 137), also while it was saving or saying why it stopped."""
    RANKS[:] = ranks
    threading.Thread(target=_watch, args=(ranks, trainer), daemon=True, name="tinylm-rank-watch").start()


def _watch(ranks: list, trainer: weakref.ref, every: float = 1.0) -> None:
    import signal

    import torch.distributed as dist
    from lightning.pytorch.trainer.states import TrainerStatus

    while not any(p.poll() for p in ranks):
        if all(p.returncode == 0 for p in ranks):
            return
        time.sleep(every)
    # A rank ended with an error. This process then ends too, on its own (a collective with the lost rank fails at
    # once; a stop on a signal or a health check ends every rank), and its own ending (a save, W&B's upload) takes
    # what it takes; unless it waits for that rank in a call that never returns: the ranks' connecting (30 min), an
    # NCCL collective. Then it is ended here, with its line.
    if dist.is_available() and dist.is_initialized():
        deadline = time.monotonic() + STUCK_S
        while time.monotonic() < deadline:
            if (t := trainer()) is not None and t.state.status != TrainerStatus.RUNNING:
                return  # it stopped training (an error's handling, or the end): it ends on its own
            time.sleep(every)
    from tinylm.cli.errors import error_line

    lost = lost_rank()
    if not REPORTING.acquire(blocking=False):  # this process is ending on its error already (main's line; its
        return  # end_ranks then SIGKILLs a rank slow to end, which is no rank lost to report: a second line)
    try:  # holding REPORTING, it ends the process whatever happens here (main waits for it: an EIO of a closed
        # terminal raised here left main waiting for good)
        for p in ranks:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        if not lost.said:
            sys.stderr.write(error_line(COMMAND[0], str(lost), COMMAND[1:]))
            sys.stderr.flush()
    finally:
        os._exit(lost.exit_code)


REPORTING = threading.Lock()
"""Held by whoever says why this process ends (main ending on an error, or the watch of the ranks it started):
one of them, once."""

# what a collective says when the other end went away (gloo's two, NCCL's): that rank is ending, if slowly
_PEER_GONE = ("closed by peer", "reset by peer", "remote process exit")


def lost_rank(wait: float = 2.0, raised: BaseException | None = None) -> TinyLMError | None:
    """Why a rank that DDP's launcher started from this process ended before it: the error this process reports
    instead of the failed collective's traceback. A signal's (the rank had no chance to say so itself); or, when
    the rank ended with an error of its own, which it said, one with ``said`` set, ending this process with the
    rank's exit status and no word. None when every rank is alive. ``raised``, this process's error, saying that a
    peer closed its connection, waits up to 30 s: a rank closes its connections as it ends, and on a loaded machine
    its end (its line, its exit hooks) took more than ``wait``, and the collective's traceback followed its line."""
    import signal

    if raised is not None and any(words in str(raised) for words in _PEER_GONE):
        wait = max(wait, 30.0)

    if _RANK0 is not None:  # a rank that rank 0 started: rank 0 gone is what ended it
        deadline = time.monotonic() + wait  # rank 0's connections close before it is gone (this one reparented)
        while os.getppid() == _RANK0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.getppid() == _RANK0:
            return None
        error = TinyLMError(f"rank 0 (pid {_RANK0}), the command that started this rank, ended without a word (killed: "
                            "kill -9, or the kernel's out-of-memory killer); the other ranks cannot go on without it, "
                            f"so the run stopped; {_go_on()}")
        error.exit_code, error.said = 1, False
        return error
    deadline = time.monotonic() + wait  # a rank killed a moment ago closes its connections before it can be reaped
    while RANKS and not any(p.poll() for p in RANKS) and time.monotonic() < deadline:
        time.sleep(0.05)
    first = int(os.environ.get("NODE_RANK", "0")) * (len(RANKS) + 1)  # this machine's rank 0 (num_nodes > 1)
    for rank, proc in enumerate(RANKS, start=first + 1):
        code = proc.poll()
        by = -code if code is not None and code < 0 else code - 128 if code in (129, 130, 143) else None
        if by in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a stop asked of the run that the rank could not
            # agree on with this one (it was starting; or this one was): what one process says
            error = TinyLMError(f"terminated by {signal.Signals(by).name} before it finished; run the same `tinylm "
                                f"{COMMAND[0]}` again")
            error.exit_code, error.said = 128 + by, False
            return error
        if by is not None:
            name = signal.Signals(by).name if by in set(signal.Signals) else f"signal {by}"
            oom = " (also what the kernel's out-of-memory killer sends)" if by == signal.SIGKILL else ""
            error = TinyLMError(f"rank {rank} (pid {proc.pid}) was killed by {name}{oom}; the other ranks cannot go "
                                f"on without it, so the run stopped; {_go_on()}")
            error.exit_code, error.said = 1, False
            return error
    for rank, proc in enumerate(RANKS, start=first + 1):
        if proc.returncode:  # its own error, in a line of its own ("(rank 1) OSError: no space left ...")
            error = TinyLMError(f"rank {rank} (pid {proc.pid}) stopped on an error, which it said")
            error.exit_code, error.said = proc.returncode, True
            return error
    return None


def end_ranks(wait: float = 3.0) -> None:
    """End the ranks DDP's launcher started from this process as it ends on an error: one waiting for it in a
    collective would otherwise fail as it leaves, with a traceback after the command ended (or, on NCCL, wait on).
    A rank ending on its own error meanwhile (every rank raised it) says it first: 1 s was short on a loaded
    machine, and its line was lost."""
    deadline = time.monotonic() + wait  # (a rank stopping with this one, on a signal or a health check, ends first)
    while any(p.poll() is None for p in RANKS) and time.monotonic() < deadline:
        time.sleep(0.05)
    for proc in RANKS:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
