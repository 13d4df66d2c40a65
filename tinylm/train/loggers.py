"""Loggers: a CSV file always (readable without any account), W&B as the primary dashboard when available.

W&B never blocks a run: with no credentials or no network (or ``WANDB_MODE=offline``) it logs offline into the run
folder (``$WANDB_DIR/wandb`` when set) and says so in one line; ``WANDB_MODE=disabled`` or
``run.wandb_project: null`` turns it off.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import sys
import time
from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from tinylm.errors import TinyLMError, where_written
from tinylm.net import reachable

log = logging.getLogger("tinylm")


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, minus deleting an existing ``metrics.csv``: it appends, keeping the header's columns,
    and widens the header by a rename."""

    def save(self) -> None:
        from tinylm.paths import writing

        with writing(self.metrics_file_path):  # (a full disk: the CLI's line names the file)
            super().save()

    def _check_log_dir_exists(self) -> None:
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                self.metrics_keys = next(csv.reader(f), [])

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        """Lightning's rewrite of the file under a wider header (a column's first value: the first val/loss, a health
        alert), into a temporary file renamed over it: in place, a full disk or a `kill -9` during it left the header
        alone and lost every row logged so far."""
        with open(self.metrics_file_path, newline="") as f:
            rows = list(csv.DictReader(f))
        _rewrite_csv(Path(self.metrics_file_path), fieldnames, rows)


class KeptCSVLogger(CSVLogger):
    """Lightning's CSVLogger, minus deleting a ``metrics.csv`` its folder already holds (Lightning warns, then deletes
    it when the first row is saved): a resumed run (``resume_step`` = the checkpoint's global step) keeps every row
    logged before the checkpoint and drops those logged after it (the steps about to be redone); a fresh run moves the
    old file aside to ``metrics.<time>.csv``. A user's own ``--trainer.logger CSVLogger`` with a fixed ``version``
    becomes one (`adopt`)."""

    def __init__(self, save_dir: str | Path, name: str | None = "lightning_logs", version: int | str | None = None,
                 prefix: str = "", flush_logs_every_n_steps: int = 100, *, resume_step: int | None = None,
                 run: str | None = None) -> None:
        super().__init__(save_dir=str(save_dir), name=name, version=version, prefix=prefix,
                         flush_logs_every_n_steps=flush_logs_every_n_steps)
        self._resume_step, self._run = resume_step, run

    @classmethod
    def adopt(cls, logger: Logger, resume_step: int | None, run: str | None = None) -> Logger:
        """A plain CSVLogger as a KeptCSVLogger with the same files; any other logger (a subclass too) as it is.
        ``run``: the run folder it logs for, kept beside its metrics.csv (`RUN_MARK`)."""
        if type(logger) is not CSVLogger:
            return logger
        # save_dir ~/x: Lightning's own writer expands the ~, and the run's mark beside metrics.csv went to ./~/x
        return cls(os.path.expanduser(logger._save_dir), logger._name, logger._version, logger._prefix,
                   logger._flush_logs_every_n_steps, resume_step=resume_step, run=run)

    @property
    @rank_zero_experiment  # as CSVLogger's own: under DDP only rank zero touches metrics.csv (others raced it)
    def experiment(self) -> ExperimentWriter:
        if self._experiment is not None:
            return self._experiment
        path, mark = Path(self.log_dir) / "metrics.csv", Path(self.log_dir) / RUN_MARK
        # a folder two runs log into (a user's CSVLogger with a fixed version): a resume of one cut the other's rows
        theirs = self._run is not None and mark.is_file() and mark.read_text(encoding="utf-8").strip() != self._run
        if path.is_file():
            if self._resume_step is None or theirs:
                aside = _free_name(path.with_name(f"metrics.{time.strftime('%Y%m%d-%H%M%S')}.csv"))
                path.rename(aside)  # (a name of its own: two in one second, and the rename replaced the first)
                hparams = path.with_name("hparams.yaml")  # the earlier run's settings go with its rows (this run
                if hparams.is_file():  # writes its own there)
                    hparams.rename(hparams.with_name(f"hparams.{aside.stem.removeprefix('metrics.')}.yaml"))
                if theirs:
                    log.warning("%s held the rows of another run (%s): moved aside to %s", path,
                                mark.read_text(encoding="utf-8").strip(), aside.name)
            else:
                _truncate_after(path, self._resume_step)
        self._experiment = _AppendingWriter(log_dir=self.log_dir)
        if self._run is not None:
            mark.write_text(self._run + "\n", encoding="utf-8")
        return self._experiment


RUN_MARK = "tinylm-run.txt"
"""Beside a user's CSVLogger's metrics.csv: the run folder whose rows it holds (a resume of another run that logs
there moves the file aside instead of cutting it at its own step)."""


class RunCSVLogger(KeptCSVLogger):
    """One ``metrics.csv`` per run folder (``<run dir>/csv/metrics.csv``), continued across resumes.

    Lightning's CSVLogger deletes ``metrics.csv`` when its folder exists (or starts a new ``version_N``), so a resumed
    run's log is split or lost: see `KeptCSVLogger`.
    """

    def __init__(self, save_dir: str | Path, *, resume_step: int | None = None) -> None:
        super().__init__(save_dir, name="csv", version="", resume_step=resume_step)
        self._ahead: int | None = None  # the step of a row written ahead of Lightning's own log of it

    def log_ahead(self, metrics: dict, step: int) -> None:
        """Write the row of ``step`` now, ahead of its checkpoint (`PeriodicCheckpoint`); the log Lightning makes of
        the same row after the checkpoint is left out."""
        super().log_metrics(metrics, step)
        self._ahead = step

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        if step is not None and step == self._ahead:
            self._ahead = None
            return
        super().log_metrics(metrics, step)


def _free_name(path: Path) -> Path:
    """``path``, or ``NAME-1.csv``, ``NAME-2.csv``, ... where it is taken."""
    n = 0
    while (free := path.with_name(f"{path.stem}-{n}{path.suffix}") if n else path).exists():
        n += 1
    return free


def _truncate_after(path: Path, resume_step: int) -> None:
    """Keep the rows of ``path`` logged before ``resume_step`` optimizer steps were done (rows store step - 1).

    A last line without its newline is an append cut short by a crash: it is dropped, as is any row with fewer or
    more fields than the header; a file without a whole header line is removed (the logger starts a new one).
    """
    from tinylm.paths import utf8_text

    text = utf8_text(path, "move it aside (this run starts a new one) and run again")
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # for "a,b\n0,1\n0,2,3." this keeps "a,b\n0,1\n"
    reader = csv.DictReader(io.StringIO(text, newline=""))
    fields = reader.fieldnames
    if not fields:
        path.unlink()
        return
    whole = [r for r in reader if None not in r and None not in r.values()]
    if (bad := next((r["step"] for r in whole if not r.get("step", "0").isdigit() and r["step"] != ""), None)):
        raise ValueError(f"{path} has a row whose step is {bad!r}, not a whole number: the file was edited, or "
                         "another program saved it; fix that row, or move the file aside (this run starts a new "
                         "one), and run again")
    keep = [r for r in whole if r.get("step", "") == "" or int(r["step"]) < resume_step]
    _rewrite_csv(path, fields, keep)


def _rewrite_csv(path: Path, fieldnames: list[str], rows: list[dict]) -> None:
    """Replace the CSV file ``path`` by ``rows`` under ``fieldnames``, atomically (`replace_file`: a Ctrl+C or a full
    disk as it writes or renames leaves the old file whole and no ``.tmp`` behind, where one stayed in the run
    folder for good)."""
    from tinylm.paths import replace_file

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fieldnames)
            writer.writeheader()
            writer.writerows(rows)

    replace_file(path, write)


WANDB_MODES = ("", "online", "offline", "disabled", "dryrun", "run", "shared")
"""The values wandb takes for WANDB_MODE ('' : unset), lower case (wandb's own check is case-sensitive)."""
_went_offline: str | None = None  # why wandb_mode set WANDB_MODE=offline itself (None: it did not)


def wandb_mode() -> str:
    """``online``, ``offline`` or ``disabled``: what W&B can do here, decided without the network or a prompt.

    Credentials are looked up without calling into wandb (``WANDB_API_KEY``, or the ``~/.netrc`` entry that
    ``wandb login`` writes): probing with ``wandb.login()`` initialises wandb's global settings as online, after which
    an offline ``wandb.init`` in the same process still asks for a key. With a key, one TCP connection (3 s at
    most) tells whether the server can be reached. Without credentials or network this sets ``WANDB_MODE=offline``
    for the process before wandb starts.
    """
    if not os.environ.get("HOME") and not os.environ.get("XDG_CACHE_HOME") \
            and os.path.isabs(home := os.path.expanduser("~")):  # (Python's: from the password database)
        # wandb's service (Go) finds its cache and log folder from these two only: without either, it printed ~20
        # lines of its own log to stderr and made a .wandb_cache folder wherever the command ran (a cron job's)
        os.environ["XDG_CACHE_HOME"] = os.path.join(home, ".cache")
    given = os.environ.get("WANDB_MODE", "")
    mode = given.lower()
    if mode not in WANDB_MODES:  # (wandb.init failed with pydantic's traceback, with credentials; without, unsaid)
        raise TinyLMError(f"WANDB_MODE={given}: W&B takes online, offline or disabled (or dryrun, run, shared); "
                          "set one of them, or unset it")
    if mode != given:  # wandb refuses WANDB_MODE=Offline with a traceback
        os.environ["WANDB_MODE"] = mode
    if mode in ("disabled", "offline"):
        return mode
    if mode == "dryrun":
        return "offline"
    import importlib.util

    if importlib.util.find_spec("wandb") is None:  # not `import wandb`: 0.5 s and 20 MB for a yes/no answer
        return "disabled"
    if not _has_wandb_key():
        why = "no W&B credentials: set WANDB_API_KEY or run `wandb login`"
    elif not reachable(_base_url()):
        why = f"{_base_url()} cannot be reached"
    else:
        return "online"
    global _went_offline
    os.environ["WANDB_MODE"], _went_offline = "offline", why
    return "offline"


def _offline_reason() -> str:
    """Why W&B logs offline: what `wandb_mode` found, or the user's WANDB_MODE."""
    mode = os.environ.get("WANDB_MODE", "")
    return _went_offline if mode == "offline" and _went_offline else f"WANDB_MODE={mode}"


WANDB_HOSTS = ("api.wandb.ai", "api.forge.coreweave.com")
"""Where `wandb login` stores its key in ~/.netrc: W&B's API host (wandb < 0.31), CoreWeave Forge's (0.31's
default base URL); WANDB_BASE_URL's host instead when it is set."""


def _has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc
    from urllib.parse import urlparse

    base = os.environ.get("WANDB_BASE_URL")
    hosts = [urlparse(base).hostname] if base else WANDB_HOSTS
    try:
        stored = netrc.netrc(os.environ.get("NETRC"))
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return any(host and stored.authenticators(host) is not None for host in hosts)


def _base_url() -> str:
    """The server wandb talks to: WANDB_BASE_URL, else its default (CoreWeave Forge's API from wandb 0.31 on)."""
    if base := os.environ.get("WANDB_BASE_URL"):
        return base
    from importlib.metadata import version

    major_minor = tuple(int(part) for part in version("wandb").split(".")[:2])
    return "https://api.forge.coreweave.com" if major_minor >= (0, 31) else "https://api.wandb.ai"


def make_loggers(
    run_dir: str | Path, name: str, wandb_project: str | None, *, wandb_id: str | None = None,
    resume_step: int | None = None, project_flag: bool = False, run_project: str | None = None
) -> list[Logger]:
    """CSV logger (``<run_dir>/csv/metrics.csv``) plus a W&B logger when a project is set and W&B is usable.

    When resuming, pass the checkpoint's ``resume_step``, ``wandb_id`` and ``run_project`` (the W&B project the run
    logged to) so both logs continue instead of restarting; `wandb_project_for` says which project is used. W&B's
    files go to ``<run_dir>/wandb``, or ``$WANDB_DIR/wandb`` (`wandb_root`).
    """
    run_dir = Path(run_dir)
    loggers: list[Logger] = [RunCSVLogger(run_dir, resume_step=resume_step)]
    if wandb_project is None:
        return loggers
    mode = wandb_mode()
    if mode == "disabled":
        log.info("W&B disabled (WANDB_MODE=disabled or wandb not installed); metrics go to %s", run_dir / "csv")
        return loggers
    from lightning.pytorch.loggers import WandbLogger

    wandb_project = wandb_project_for(wandb_project, run_project, project_flag)
    root = wandb_root(run_dir)
    if mode == "offline":
        log.info("W&B logs offline to %s (%s; upload later with `wandb sync`)", root / "wandb", _offline_reason())
    # offline, wandb's own ~30 lines (its "set WANDB_MODE=online to enable cloud syncing" too, where credentials or
    # the network were what lacked) say what tinylm's line above and the run's end (`wandb sync PATH`) say
    quiet = {"settings": _quiet_settings()} if mode == "offline" else {}
    wandb = WandbLogger(project=wandb_project, name=name, save_dir=str(run_dir), offline=mode == "offline",
                        id=wandb_id, resume="allow", **quiet)
    # W&B's files alone: its save_dir (trainer.log_dir: profiler traces, a ModelCheckpoint without a dirpath) stays the
    # run folder. Absolute: the wandb service a process started first keeps that one's working folder, and a second
    # run after an os.chdir (a notebook's, a test's) had its .wandb file written into the first one's folder
    wandb._wandb_init["dir"] = os.path.abspath(root)
    # Lightning always passes anonymous=None, which recent wandb answers with a deprecation warning on every run
    if getattr(wandb, "_wandb_init", {}).get("anonymous", False) is None:
        del wandb._wandb_init["anonymous"]
    loggers.insert(0, wandb)
    return loggers


def _quiet_settings():
    import wandb

    return wandb.Settings(silent=True)


def offline_wandb_run(wandb_dir: Path, wandb_id: str | None) -> Path | None:
    """What `wandb sync` uploads of W&B run ``wandb_id`` when parts of it were logged offline, else None: their folder
    in ``wandb_dir``'s wandb/ folder (the ``dir`` a WandbLogger gave wandb: the run folder, $WANDB_DIR, which other
    runs share, or a user's logger's ``save_dir``), or, when resumes logged offline parts of their own, a pattern of
    them all (``offline-run-*-ID``: the shell lists them oldest first, as they are to be uploaded)."""
    root = Path(wandb_dir) / "wandb"
    if not wandb_id or not root.is_dir():
        return None
    runs = [p for p in root.glob(f"*run-*-{wandb_id}") if p.is_dir()
            and p.name.startswith(("offline-run-", "run-"))]  # (named run-TIME-ID or offline-run-TIME-ID)
    # the parts logged offline and not uploaded yet (`wandb sync` leaves a .synced file beside a part's log)
    offline = [p for p in runs if p.name.startswith("offline-run-") and not any(p.glob("*.wandb.synced"))]
    if not offline:
        return None
    return offline[0] if len(offline) == 1 else root / f"offline-run-*-{wandb_id}"


def wandb_root(run_dir: Path) -> Path:
    """The folder wandb makes its ``wandb/`` folder in, made: ``WANDB_DIR`` when set (as wandb documents it: its runs'
    files go to ``$WANDB_DIR/wandb``; one it cannot write is refused), else the run folder. Lightning's WandbLogger
    passes its ``save_dir`` to wandb.init as ``dir``, which overrides WANDB_DIR, so the variable is read here."""
    where = os.environ.get("WANDB_DIR")
    root = Path(os.path.abspath(os.path.expanduser(where))) if where else run_dir  # (abspath: wandb's, cwd now)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # (wandb itself fell back to a temporary folder, with a warning)
        if not where:
            raise
        raise TinyLMError(f"WANDB_DIR={where}: cannot make that folder for W&B's files ({e.strerror or e}); set "
                          "WANDB_DIR to a writable folder, or unset it to keep them in the run folder") from None
    if where and not os.access(root, os.W_OK | os.R_OK | os.X_OK):  # wandb's own check (read and write): it logged
        # the run into the system's temporary folder, its warning among the run's, the end offering no `wandb sync`
        raise TinyLMError(f"WANDB_DIR={where}: that folder cannot be written (no permission, or a read-only disk); "
                          "set WANDB_DIR to a writable folder, or unset it to keep W&B's files in the run folder")
    return root


def wandb_project_for(wandb_project: str, run_project: str | None, project_flag: bool) -> str:
    """The W&B project a run logs to: ``--run.wandb_project NAME`` on the command line (``project_flag``); else, on a
    resume, the run's own (``run_project``, recorded in its checkpoint: a run started with ``WANDB_PROJECT=foo`` stays
    in foo when resumed without it); else ``WANDB_PROJECT``; else the config's ``run.wandb_project``.

    W&B's own rule is that wandb.init's arguments override its environment variables, so passing tinylm's default
    (or a recipe's ``tinylm``) on silently sent a user's runs to another project than the one their environment
    names. A flag naming another project than the run's applies, with a warning, as a resume's other changed
    settings do (tinylm.cli.resume): the run's W&B id starts a second W&B run there."""
    env_project = os.environ.get("WANDB_PROJECT")
    if project_flag:
        if run_project and run_project != wandb_project:
            log.warning("W&B project %s (--run.wandb_project), not the run's %s: the resumed steps log to a W&B run "
                        "in %s, apart from the run's curve", wandb_project, run_project, wandb_project)
        return wandb_project
    if run_project:
        if run_project != (env_project or wandb_project):
            what = f"WANDB_PROJECT {env_project}" if env_project else f"run.wandb_project {wandb_project}"
            log.info("W&B project %s, the run's own, from its checkpoint (not %s; --run.wandb_project NAME overrides "
                     "it)", run_project, what)
        return run_project
    if env_project and env_project != wandb_project:
        log.info("W&B project %s, from WANDB_PROJECT (not %s; --run.wandb_project NAME overrides it)", env_project,
                 wandb_project)
        return env_project
    return wandb_project


def wandb_project_of(logger) -> str | None:
    """The project a WandbLogger logs to: its run's, once started (a user's logger without ``project`` logs to
    WANDB_PROJECT's, or wandb's own default), else the one it was given."""
    return getattr(logger._experiment, "project", None) or logger._project


def adopt_users_loggers(theirs: list, wandb_project: str | None, *, wandb_id: str | None,
                        resume_step: int | None, run_dir: Path | None = None) -> tuple[list, str | None]:
    """The user's own loggers (``--trainer.logger``), made to keep what earlier runs logged, and the W&B project left
    to tinylm's own logger (None when theirs logs to W&B).

    A plain CSVLogger becomes a `KeptCSVLogger` (``resume_step``: where a resume in the same run folder continues its
    file). A WandbLogger of the user's logs the run in place of tinylm's: beside it, both logged every row into
    the one W&B run wandb allows a process (twice, the user's project and folder ignored). Without credentials it
    logs offline too, never prompting, and a resume continues the run folder's W&B run (``wandb_id``) unless it names
    its own. WANDB_DIR places its files unless it was given a ``save_dir`` (Lightning's default ``.`` counts as
    none)."""
    run = str(Path(run_dir).resolve()) if run_dir is not None else None
    kept = [KeptCSVLogger.adopt(lg, resume_step, run) for lg in theirs]
    users = wandb_loggers(kept)
    if not users:
        return kept, wandb_project
    if wandb_project is not None:
        log.info("W&B: your --trainer.logger %s logs the run (project %s), in place of tinylm's own (run.wandb_project "
                 "%s)", type(users[0]).__name__, users[0]._project, wandb_project)
    offline_quietly(users)  # offline without credentials or network (WANDB_MODE for the process), as tinylm's own
    for lg in users:
        if lg._wandb_init.get("anonymous", False) is None:  # as tinylm's own: wandb's deprecation warning
            del lg._wandb_init["anonymous"]
        if wandb_id and not lg._wandb_init.get("id"):
            lg._wandb_init["id"] = lg._id = wandb_id
        if lg._wandb_init.get("dir") == "." and os.environ.get("WANDB_DIR"):  # Lightning's default save_dir: unset
            lg._wandb_init["dir"] = str(wandb_root(Path(".")))  # (it overrode WANDB_DIR; save_dir stays, as ours)
        if lg._wandb_init.get("dir"):  # absolute, as tinylm's own (the wandb service's working folder is another's)
            lg._wandb_init["dir"] = os.path.abspath(os.path.expanduser(lg._wandb_init["dir"]))
    return kept, None


def offline_quietly(users: list) -> str:
    """WANDB_MODE for a user's own WandbLoggers (`wandb_mode`): offline without credentials or network, said in
    tinylm's one line, with wandb's own ~30 lines off (one said "set WANDB_MODE=online" where a key was what lacked;
    LightningCLI passes settings=None, so None is replaced). Fit's and validate's."""
    mode = wandb_mode()
    if mode == "offline":
        for lg in users:
            if lg._wandb_init.get("settings") is None:
                lg._wandb_init["settings"] = _quiet_settings()
        log.info("W&B logs offline to %s (%s; upload later with `wandb sync`)", wandb_dir(users[0]) / "wandb",
                 _offline_reason())
    return mode


def wandb_dir(logger) -> Path:
    """The folder a WandbLogger has wandb keep its ``wandb/`` folder in (tinylm's: the run folder or $WANDB_DIR; a
    user's: its ``save_dir``, Lightning's default ``.`` the working folder)."""
    return Path(logger._wandb_init.get("dir") or logger.save_dir or ".")


def wandb_loggers(loggers) -> list:
    """The W&B loggers among a trainer's ``loggers`` (tinylm's, or a user's own WandbLogger or a subclass)."""
    from lightning.pytorch.loggers import WandbLogger

    return [lg for lg in loggers if isinstance(lg, WandbLogger)]


def exit_status(e: BaseException) -> int:
    """The exit status of the command that ``e`` ends (tinylm.cli.main's): 128 + N for a run stopped by signal N (its
    ``exit_code``: SIGTERM's 143, a Ctrl+C's 130), else 1. W&B records it as the run's: a run stopped by SIGTERM, saved,
    was recorded as exit code 1, as a crash."""
    if isinstance(e, KeyboardInterrupt) or isinstance(e, SystemExit) and isinstance(e.__context__, KeyboardInterrupt):
        return 130
    code = getattr(e, "exit_code", 1)
    return code if isinstance(code, int) and not isinstance(code, bool) else 1


def finish_forked_wandb(trainer) -> None:
    from lightning.pytorch.trainer.states import TrainerStatus

    finish_wandb(exit_code=0 if trainer.state.status == TrainerStatus.FINISHED else 1)


WANDB_UNFINISHED: list[str] = []
"""Why this process's last W&B run's files may be cut short: it could not be ended (finish_wandb), or a write of its
files failed (`wandb_write_failed`); the run's summary offers no `wandb sync` of them as whole."""
_WANDB_WRITES_FAILED: list[str] = []  # this run's failed writes of W&B's files (wandb_write_failed), till its end


def wandb_write_failed(e: OSError) -> None:
    """A write of W&B's own files in this process failed (the samples table it copies into its media folder, on a
    full WANDB_DIR): said once, and the run goes on. W&B is the dashboard: the run raised it as its error, at the
    first samples after the disk filled, and lost its steps since the last checkpoint, although the run folder (another
    disk) had room; metrics.csv and samples.txt hold what W&B lacks."""
    if not _WANDB_WRITES_FAILED:
        log.warning("W&B: %s%s; the run goes on, and W&B's record of it may be cut short (csv/metrics.csv and "
                    "samples.txt have it all): free some space, or set WANDB_DIR to another disk for the next run",
                    e.strerror or e, where_written(e))
    _WANDB_WRITES_FAILED.append(f"a write failed ({type(e).__name__}: {e.strerror or e})")


def finish_wandb(exit_code: int) -> None:
    """End this process's W&B run. Lightning's WandbLogger leaves it open, and a WandbLogger made later in the same
    process (the next rung of `tinylm scaling`, a notebook's second fit) reuses an open run: every rung logged into
    the first rung's W&B run."""
    wandb = sys.modules.get("wandb")  # not imported: no run was started
    run = getattr(wandb, "run", None) if wandb is not None else None
    if run is None:
        return
    WANDB_UNFINISHED[:] = _WANDB_WRITES_FAILED[:1]
    _WANDB_WRITES_FAILED.clear()
    try:
        empty = _empty_part(run)
        wandb.finish(exit_code=exit_code)
    except Exception as e:  # noqa: BLE001 (the run's own result or error is what the user needs to see)
        log.warning("W&B: could not end the run cleanly (%s: %s); its local files are in the run folder",
                    type(e).__name__, e)
        WANDB_UNFINISHED.insert(0, f"not ended ({type(e).__name__}: {e})")
        return
    if empty is not None:
        _remove_offline_run(empty)


def _empty_part(run) -> Path | None:
    """The folder of an offline W&B run that logged no step and continues a run with earlier parts beside it (a
    resume refused as it started: another corpus, an edited checkpoint): nothing to upload, and `wandb sync` of the
    run's folders sent it as the run's last part. A run's only part is kept, empty too (its logs say why it
    failed)."""
    if not run.offline or run.step != 0:
        return None
    folder = Path(run.dir).parent  # (offline-run-TIME-ID/files)
    part = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run.id)}(-\d+)?")  # ("-1": a second in one second)
    earlier = [p for p in folder.parent.iterdir() if part.fullmatch(p.name) and p.is_dir() and p != folder]
    return folder if folder.name.startswith("offline-run-") and earlier else None


def _remove_offline_run(folder: Path) -> None:
    """Remove an offline W&B run's folder, and point wandb's links beside it (``latest-run``, ``debug.log``,
    ``debug-internal.log``) back at the newest run left, or remove them when none is."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    root = folder.parent
    left = sorted((p for p in root.glob("*run-*") if p.is_dir() and not p.is_symlink()),
                  key=lambda p: p.name.removeprefix("offline-").removeprefix("run-"))
    for link, inside in (("latest-run", ""), ("debug.log", "logs/debug.log"),
                         ("debug-internal.log", "logs/debug-internal.log")):
        path = root / link
        if not path.is_symlink() or Path(os.readlink(path)).parts[:1] != (folder.name,):
            continue  # (another run's since, or not wandb's link)
        path.unlink()
        if left:
            path.symlink_to(Path(left[-1].name, inside))
