"""The console: tinylm's log lines on stderr (rank 0 only), Lightning's filtered, warnings in one line, and what
the commands write to stdout."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from tinylm.cli.errors import STDOUT
from tinylm.train import stop_state

log = logging.getLogger("tinylm")


def setup() -> None:
    """tinylm's log lines on stderr, once: a handler on the "tinylm" logger, none on the root. (A root-logger
    basicConfig made every Lightning INFO line print twice: once by Lightning's own handler, once by the root's.)
    Imports nothing heavy: a command that needs Lightning calls `setup_lightning` when it is about to import it
    (`tinylm prepare` and a refusal before any work never do)."""
    stop_state.terminal_fds.update(fd for fd in (0, 1, 2) if _fd_isatty(fd))
    _MID_LINE[0] = False  # (an earlier command's open line, in a caller's process: ended when it stopped)
    for name in ("stdout", "stderr"):  # before Lightning's handler takes sys.stderr
        stream = getattr(sys, name)
        if stream is None:  # the descriptor was closed (`tinylm fit >&-`): Python made it None; what is said is dropped
            stream = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (held for the process's life)
            setattr(sys, name, stream)
        if not isinstance(stream, (_Terminal, _Output)):
            if _isatty(stream):
                setattr(sys, name, _Terminal(stream))
            elif name == "stdout":
                sys.stdout = _Output(stream)
    _utf8_stdout()
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    warnings.formatwarning = lambda message, category, *args, **kwargs: f"{category.__name__}: {message}\n"
    _drop_stray_ranks()
    # another rank of a run (from its environment; NODE_RANK: a node started by hand): rank 0 says the same
    if env_rank() != 0:
        log.setLevel(logging.ERROR)
        warnings.simplefilter("ignore")
    elif log.level == logging.ERROR:  # (a command of the same process as another rank's, a notebook's or a test's)
        log.setLevel(logging.INFO)
    # a rank that ddp_fork starts from this process learns its rank later: its handler asks at each line; a line
    # that a caller's root handler prints too is left to it
    for handler in log.handlers:
        if isinstance(handler, _Stderr) and not any(isinstance(f, _RankZero) for f in handler.filters):
            handler.addFilter(_RankZero())
            handler.addFilter(_NotSaidByRoot())
    # torch's line as ddp_fork ends the other training processes after one failed: the failure's line says it all
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    # Lightning's own deprecation noise about torch internals: nothing a tinylm user can act on
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")


def ignore_lightning_advice() -> None:
    """Lightning's warnings about what `fit` and `validate` do on purpose (each says why below)."""
    # args are always passed explicitly (main() strips --verbose first), which Lightning warns about
    warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python.*")
    # a resumed run's checkpoint folder is not empty, and validate needs no training callbacks: both expected
    warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
    warnings.filterwarnings("ignore", message="Be aware that when using `ckpt_path`, callbacks used to create")
    # a fresh run with a user's OnExceptionCheckpoint: Lightning looks for a "last" checkpoint to resume from (any
    # it would find is refused first: check_exception_checkpoints)
    warnings.filterwarnings("ignore", message=r"`\.fit\(ckpt_path=None\)` was called without a model")
    warnings.filterwarnings("ignore", message=r'\.fit\(ckpt_path="last"\) is set, but there is no last checkpoint')
    # a branch (a new run from another run's checkpoint) tracks its own best.ckpt in its own folder, as it should
    warnings.filterwarnings("ignore", message="The dirpath has changed from")
    # tinylm's epochs are notional (a small corpus makes short ones) and logging counts steps across them
    warnings.filterwarnings("ignore", message=r"The number of training batches \(\d+\) is smaller than the logging")
    # tinylm's loaders read their windows in the main process unless data.num_workers says otherwise, on purpose
    # (slicing a memmap is cheap; workers cost 30 % at GPT-2 124M on an H200: docs/data.md); Lightning's advice to
    # raise it to the CPUs' count - 1 (on any machine of 3 or more CPUs) knows nothing of that
    warnings.filterwarnings("ignore", message=r"The '(train|val)_dataloader' does not have many workers which may be")
    # 16-mixed: GradScaler skips the optimizer step of an fp16 overflow (its calibration overflows a run's first
    # steps), so torch says the LR scheduler stepped first: expected, and tinylm's guard leaves those steps to it
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step")


def _utf8_stdout() -> None:
    """Under LC_ALL=C (no UTF-8 mode) Python writes stdout as ASCII: a sample with a non-ASCII character ended
    `tinylm generate` with "UnicodeEncodeError: 'ascii' codec ...". Written as UTF-8 instead (file names Python
    decoded with surrogateescape come out as their own bytes), as Python's UTF-8 mode does in the C locale."""
    import codecs

    stream = getattr(sys.stdout, "_stream", sys.stdout)
    try:
        ascii_only = codecs.lookup(stream.encoding).name == "ascii"
    except (AttributeError, LookupError, TypeError):
        return
    if ascii_only and hasattr(stream, "reconfigure"):
        stream.reconfigure(encoding="utf-8", errors="surrogateescape")


def _drop_stray_ranks() -> None:
    """RANK / LOCAL_RANK left in the environment of a process that no launcher started (a shell that once ran
    torchrun; WORLD_SIZE unset or 1): read as this process's rank, they made a lone `tinylm fit` a silent "rank 1"
    that skipped the run folder's lock and its refusal to start over an existing run. Dropped, with a line."""
    world = os.environ.get("WORLD_SIZE", "").strip()
    if (world.isdigit() and int(world) > 1) or os.environ.get("TINYLM_RANK0_PID"):
        return
    names = [k for k in ("RANK", "LOCAL_RANK") if os.environ.get(k, "").strip() not in ("", "0")]
    # NODE_RANK too, where no MASTER_ADDR says where node 0 is (a node started by hand always has it: launch_checks):
    # left from such a run, it made a lone fit a silent "rank 1" just the same (env_rank)
    if not os.environ.get("MASTER_ADDR", "").strip() and os.environ.get("NODE_RANK", "").strip() not in ("", "0"):
        names.append("NODE_RANK")
    if names:
        stray = " ".join(f"{k}={os.environ.pop(k)}" for k in names)
        log.warning("ignoring %s: no launcher started this process (WORLD_SIZE is %s); it runs alone as rank 0 "
                    "(unset %s to silence this)", stray, world or "unset", " ".join(names))


def quiet_stdout() -> None:
    """Point stdout at /dev/null: its reader is gone, and later writes and Python's exit flush must not fail again."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)


@contextlib.contextmanager
def kept_to_the_end(on: bool) -> Iterator[None]:
    """(``on``: validate's command) A reader gone before the command's end (`tinylm validate ... | less` quit before the
    result, minutes of validation on a large model; `| true`) sends stdout to /dev/null and the command goes on to
    its end, then exits 141 (main's BrokenPipeError): it met the reader gone at Lightning's table of the metrics,
    printed before validate records them in validate/metrics.csv, and ended there, the result lost."""
    if not on or stop_state.reader_gone is not None:
        yield
        return
    gone: list[int] = []
    stop_state.reader_gone, over, stop_state.over = gone.append, stop_state.over, False  # (a notebook's last fit's)
    try:
        yield
    finally:
        stop_state.reader_gone, stop_state.over = None, over
    if gone:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def setup_lightning() -> None:
    """Import Lightning (seconds), filter its console handler's advertising lines, and have it write above a drawn
    progress bar."""
    import lightning.pytorch  # noqa: F401  (installs Lightning's console handler, which the filter goes on)

    for handler in logging.getLogger("lightning.pytorch").handlers:
        if not any(isinstance(f, _NoTips) for f in handler.filters):
            handler.addFilter(_NoTips())
        if type(handler) is logging.StreamHandler:  # (the same handler, its writing only: as a subclass's instance)
            handler.__class__ = AboveBars
    # a root handler there at Lightning's import (a caller's basicConfig): Lightning leaves its modules' loggers
    # without handlers, and their lines reach the "lightning" package's console handler and the root's both
    for handler in logging.getLogger("lightning").handlers:
        if not any(isinstance(f, _NotSaidByRoot) for f in handler.filters):
            handler.addFilter(_NotSaidByRoot())


_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")  # Lightning's, in its order


def env_rank() -> int:
    """This process's rank in a run: Lightning's (``rank_zero_only.rank``, which the Trainer sets) once Lightning is
    imported, else what Lightning would read from the environment (a process it has not started as a rank is 0)."""
    rank_zero = sys.modules.get("lightning.fabric.utilities.rank_zero")  # (lightning.pytorch's is the same)
    if rank_zero is not None:
        here = getattr(rank_zero.rank_zero_only, "rank", 0)
    else:
        value = next((os.environ[k] for k in _RANK_VARIABLES if os.environ.get(k)), "0")
        here = int(value) if value.isdigit() else 0
    # A node started by hand (MASTER_ADDR, NODE_RANK 1, ...) is no rank 0 either, before its Trainer sets its rank:
    # Lightning reads 0 from an environment without RANK, and node 1 took the run folder's lock, refusing node 0's
    # run ("in use by another tinylm process"). (Its first rank's number needs the devices per node: not 0 is all
    # that is asked.)
    node = os.environ.get("NODE_RANK", "")
    return int(node) if here == 0 and node.isdigit() and int(node) > 0 else here


def _fd_isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class _Terminal:
    """stdout or stderr on a terminal, which may hang up (closed, its ssh session dropped): every write to it then
    fails (EIO), before the SIGHUP that says so is handled, and a progress bar's or log line's write ended the run
    mid-step, unsaved (exit 1). Such a write goes to /dev/null instead, as everything after it does
    (stop_state.leave_terminal); the SIGHUP then stops the run at a whole step (tinylm.train.interrupt)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            stop_state.leave_terminal()
            return self._stream.write(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            stop_state.leave_terminal()
            self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _Output:
    """stdout redirected to a file (`tinylm generate ... > samples.txt`): a full disk there raised an OSError
    without a file name, said as "no space left on the disk" with the fixes for runs and datasets; it now names the
    standard output (tinylm.cli.errors.one_line says to send it to another disk)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def _full(self, e: OSError) -> OSError:
        if e.errno in (errno.ENOSPC, errno.EDQUOT) and not e.filename:
            return OSError(e.errno, e.strerror, STDOUT)
        return e

    def _reader_gone(self) -> bool:
        """`tinylm fit ... | head`: the reader went away mid-run. stdout goes to /dev/null and the run stops at a
        whole step and saves, as on SIGTERM (it ended at once with 141, unsaved and without a word)."""
        if stop_state.reader_gone is None or stop_state.over:
            return False
        quiet_stdout()
        stop_state.reader_gone(signal.SIGPIPE)
        return True

    def _log_full(self, e: OSError) -> bool:
        """`tinylm fit ... > /home/me/train.log` whose disk (or quota) filled mid-run: the next progress line ended
        the run at once, unsaved (exit 1), though its checkpoints go elsewhere. The log is not the run's result (the
        run folder is): stdout goes to /dev/null, one line says so, and the run goes on."""
        if e.errno not in (errno.ENOSPC, errno.EDQUOT) or stop_state.reader_gone is None or stop_state.over:
            return False
        quiet_stdout()
        log.warning("the standard output's disk is full (%s): what the command prints is dropped from here (the "
                    "run's progress lines; scaling's table: its .json keeps it); the run goes on (its csv/metrics.csv "
                    "keeps every metric)", os.strerror(e.errno))
        return True

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            if not self._reader_gone():
                raise
            return len(text)
        except OSError as e:
            if not self._log_full(e):
                raise self._full(e) from None
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            if not self._reader_gone():
                raise
            self._stream.flush()
        except OSError as e:
            if not self._log_full(e):
                raise self._full(e) from None
            self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class AboveBars(logging.StreamHandler):
    """A console handler that writes, on a terminal where a progress bar is drawn, above the bar: a line mid-run
    (tinylm's guard or health monitor, Lightning's "min_steps has not been met" or "Time limit reached") was written
    at the end of the bar's drawing, and the bar drawn again after it. Lightning's own console handler becomes one
    (`setup_lightning`)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            bars = _drawn_bars()
        except Exception:  # noqa: BLE001 (a bar made or closed meanwhile by another thread: written as ever)
            bars = []
        if not bars or not _isatty(self.stream):
            super().emit(record)
            return
        try:
            # the bars cleared, the line, the bars again below it (a leading newline, which starts a line after a
            # bar's drawing elsewhere, would leave an empty line where the bar was)
            sys.modules["tqdm.std"].tqdm.write(self.format(record).lstrip("\n"), file=self.stream)
            self.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 (as logging's own emit: a line that cannot be written is no crash)
            self.handleError(record)


class _Stderr(AboveBars):
    """A handler writing to whatever ``sys.stderr`` is now (not the one it was created with)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _NotSaidByRoot(logging.Filter):
    """Drops a line that a console handler of the root logger prints too (`_root_says_it`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _root_says_it(record)


def _root_says_it(record: logging.LogRecord) -> bool:
    """Whether a console handler of the root logger (a script's or notebook's `logging.basicConfig`, before or
    after tinylm's setup) writes ``record`` as well: tinylm's lines reach it through the "tinylm" logger's
    propagation, and every one of them ("CPU threads: ...", each warning and refusal) was printed twice, and so was
    each of Lightning's. The root's handler says it then, in the caller's own format, as Lightning leaves its lines
    to a root handler it finds at its import."""
    logger = logging.getLogger(record.name)
    while logger.propagate and logger.parent is not None:  # (a logger that does not propagate ends the way)
        logger = logger.parent
    if logger is not logging.root:
        return False
    console = {id(stream) for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    console |= {id(getattr(stream, "_stream", None)) for stream in (sys.stdout, sys.stderr)} - {id(None)}
    return any(isinstance(h, logging.StreamHandler) and id(getattr(h, "stream", None)) in console
               and record.levelno >= h.level and h.filter(record) for h in logging.getLogger().handlers)


def _drawn_bars() -> list:
    """The tqdm bars drawn on a terminal now (none before tqdm is imported; a log's plain lines are no bars)."""
    std = sys.modules.get("tqdm.std")
    bars = list(getattr(getattr(std, "tqdm", None), "_instances", ()))
    return [bar for bar in bars if not getattr(bar, "disable", True) and _isatty(getattr(bar, "fp", None))]


class _RankZero(logging.Filter):
    """Drops the info and warning lines of a rank other than 0: rank 0 says the same."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or env_rank() == 0


class _NoTips(logging.Filter):
    """Drops Lightning's advertising lines ("💡 Tip: ... try installing litlogger"), its note that tinylm's own
    model summary (tinylm.train.run.FlopsSummary) stands in for its default one, and its "attempting graceful
    shutdown" on a run's stop that tinylm says in its own line (a second Ctrl+C's: nothing graceful follows).
    Also its "TPU available: False, using: 0 TPU cores" (tinylm trains on CPUs and GPUs: trainer_checks refuses
    the XLA strategies) and "`Trainer.fit` stopped: `max_steps=N` reached." (the run's summary, "run NAME done:
    step N", follows it; a run stopped before max_steps says why in its own line: RunConfig.on_fit_end)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        said = stop_state.line is not None and "Detected KeyboardInterrupt" in msg
        banner = msg.startswith(("TPU available: ", "`Trainer.fit` stopped: `max_steps="))
        return "Tip:" not in msg and "Skipping setting a default `ModelSummary`" not in msg and not said and not banner


def format_validate(row: dict, path: Path | None) -> str:
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k.startswith("val/"))
    scored = f" (over {row['val_bytes']:,} bytes of text)" if row.get("val_bytes") is not None else ""
    return f"step {row['step']}: {metrics}{scored}" + (f"\n(appended to {path})" if path is not None else "")


_MID_LINE = [False]  # the last text written to stdout did not end its line


def write(text: str) -> None:
    """Write ``text`` to stdout now (a streamed sample), remembering whether it ended its line."""
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()
        _MID_LINE[0] = not text.endswith("\n")


def end_line() -> None:
    """End the line a streamed sample left open on stdout, if one is (an error's line then starts on a line of its
    own). Once: the next command of the process (a notebook's, after a generate stopped mid-line) has none open."""
    if _MID_LINE[0]:
        _MID_LINE[0] = False
        sys.stdout.write("\n")
        sys.stdout.flush()
