"""One process per run folder: an exclusive lock on ``<run dir>/.lock`` for as long as a `tinylm fit` (or a scaling
rung) writes there, tested without being taken by the checks that run before the imports, and released with the
folder removed when the run wrote nothing."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from tinylm.errors import TinyLMError

_LOCKS: dict[str, Any] = {}  # run folder -> the open lock file of this process
_MADE: dict[str, Path | None] = {}  # run folder -> the topmost folder that locking it made (None: none)


def _drop_inherited_locks() -> None:
    """In a forked child (a DataLoader worker): close the run-folder lock files inherited from the parent. A child
    holding one kept the folder locked after the parent died (a worker outlives it by seconds), and the resume
    that followed was refused as "in use by another tinylm process"."""
    for f in _LOCKS.values():
        with contextlib.suppress(OSError):
            f.close()
    _LOCKS.clear()
    _MADE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_locks)


def lock_run_folder(run_dir: Path):
    """An exclusive lock on ``<run dir>/.lock`` until `release_run_folders` (or the process's end, even by kill -9):
    two `tinylm fit` in one folder would interleave their logs and overwrite each other's checkpoints."""
    key = str(run_dir.resolve())
    if key in _LOCKS:
        return _LOCKS[key]
    folder = Path(key)  # the topmost folder this makes (runs/ of a first run), removed with an empty run folder;
    # None: the run folder was there already (a resume's, or one a user made: never removed with what it holds)
    made = next((p for p in reversed([folder, *folder.parents]) if not p.exists()), None)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except FileNotFoundError as e:  # under /proc: one line naming the folder (a file on the way, a read-only disk:
        # one_line names those)
        raise TinyLMError(f"cannot make the run folder {run_dir} ({e.strerror or e}); pick a writable "
                          "--trainer.default_root_dir DIR") from None
    if (run_dir / ".lock").is_symlink():  # a shared folder's link: the pid written through it replaced the text of
        (run_dir / ".lock").unlink()  # the file it points to, outside the run folder
    try:
        f = open(run_dir / ".lock", "a+")  # noqa: SIM115 (held open, and locked, until the process ends)
    except FileNotFoundError:  # the folder removed since the mkdir (release_run_folders of a run that wrote nothing)
        return lock_run_folder(run_dir)  # again, from making it
    if not _lock_still_named(f, run_dir):
        _unlock(f)
        f.close()
        return lock_run_folder(run_dir)  # again, from making the folder
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}")
    f.flush()
    _LOCKS[key], _MADE[key] = f, made
    return f


def _lock_still_named(f, run_dir: Path) -> bool:
    """Lock the open ``.lock`` file ``f`` of ``run_dir`` (refused, naming its holder, when another process holds it),
    and say whether it is still the folder's ``.lock``: the holder before may have removed it (release_run_folders
    of a run that wrote nothing) between the open and this lock, and another process locked a new one; a lock on
    the removed file left two fits in one folder, the folder itself removed under the first."""
    import fcntl

    for attempt in range(_TRIES):
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == _TRIES - 1:
                f.seek(0)
                holder = f.read().strip()
                f.close()
                raise _in_use(run_dir, holder) from None
            # another `fit`'s early check (running_holder) holds it for a moment to test it: a resume started just
            # then was refused, naming the pid of the run's last, long finished, process
            time.sleep(0.05)
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(run_dir / ".lock"))
    except FileNotFoundError:
        return False


_TRIES = 10  # lock_run_folder's tries, 50 ms apart: a holder that is only testing the lock lets go within them


def _in_use(run_dir: Path, holder: str) -> TinyLMError:
    return TinyLMError(f"{run_dir} is in use by another tinylm process ({holder or 'another process'}); wait for it "
                       "to finish, or use another --run.name")


def check_not_in_use(run_dir: Path) -> None:
    """Refuse ``run_dir`` if another process holds its lock, without taking it or making anything (tinylm.cli.early:
    the refusal before the imports). Tested as `lock_run_folder` takes it, `_TRIES` times 50 ms apart: a fit that
    holds it only to be refused (a fresh fit over the run: ~70 ms) lets go within them."""
    for attempt in range(_TRIES):
        if (holder := running_holder(run_dir)) is None:
            return
        if attempt < _TRIES - 1:
            time.sleep(0.05)
    raise _in_use(run_dir, holder)


def running_holder(run_dir: Path) -> str | None:
    """Who holds ``run_dir``'s lock ("pid N": a `tinylm fit` running there) when another process does, else None;
    takes nothing."""
    import fcntl

    if str(run_dir.resolve()) in _LOCKS:  # this process's own run (a caller's main([...]) again): its check's
        return None
    try:
        f = open(run_dir / ".lock")  # noqa: SIM115 (closed below, which drops the lock taken to test it)
    except OSError:  # no lock file (no run, or one never started): nothing holds the folder
        return None
    with f:
        try:  # (shared: two processes testing at once do not take each other for the holder)
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "another process"
        except OSError:  # a file system without locks: the full check says what is wrong
            return None
    return None


def release_run_folder(run_dir: Path) -> None:
    """Release this process's lock on ``run_dir`` (taken by `lock_run_folder`), if it holds one."""
    _MADE.pop(str(run_dir.resolve()), None)
    lock = _LOCKS.pop(str(run_dir.resolve()), None)
    if lock is not None:
        _unlock(lock)
        lock.close()


def _unlock(f) -> None:
    """Release the flock of an open lock file. Closing it is not enough while a forked child still holds a copy of
    the descriptor (a DataLoader worker between its fork and its `_drop_inherited_locks`): the lock belongs to the
    open file, which outlives this process's close; an unlock releases it for every copy."""
    import fcntl

    with contextlib.suppress(OSError):
        fcntl.flock(f, fcntl.LOCK_UN)


def release_run_folders(*, failed: bool = False) -> None:
    """Release this process's run-folder locks; a folder left holding nothing but its lock and empty folders (the
    run failed before writing anything: a config error, a corpus too short) is removed, so a typo leaves no empty
    run behind. ``failed``: the command failed; a folder it made that holds no result yet (only its config record,
    the loggers' empty start and W&B's offline files: refused after its data was prepared, for a prompt its
    tokenizer cannot encode) goes too."""
    while _LOCKS:
        key, f = _LOCKS.popitem()
        folder = Path(key)
        made = _MADE.pop(key, None)
        inside = sorted(folder.rglob("*"), reverse=True) if folder.is_dir() else []  # deepest first
        lock = folder / ".lock"
        empty = lock in inside and all(p.is_dir() for p in inside if p != lock)  # no file but the lock
        # this process made the run folder: all it holds is this command's
        unstarted = failed and made is not None and not empty and lock in inside and _no_results(folder, inside)
        if empty or unstarted:
            if unstarted:  # (the lock kept: it goes last, as for an empty folder)
                for path in inside:
                    if path != lock and (path.is_symlink() or not path.is_dir()):  # (W&B's latest-run: a link)
                        path.unlink()
            lock.unlink()  # while still locked: no other process holds this file
        _unlock(f)
        f.close()
        if empty or unstarted:
            with contextlib.suppress(OSError):  # another process came in meanwhile: the folder is theirs
                for sub in inside:
                    if sub.is_dir() and not sub.is_symlink():
                        sub.rmdir()
                folder.rmdir()
                while made is not None and made in folder.parents:  # and the empty folders above it that it made
                    folder = folder.parent
                    folder.rmdir()


def _no_results(folder: Path, inside: list[Path]) -> bool:
    """Whether the files of run folder ``folder`` (``inside``: all it holds) are only what a run writes before its
    first step: its config record(s), the CSV logger's hyperparameters and a metrics.csv of no row, W&B's files."""
    for path in inside:
        rel = path.relative_to(folder)
        record = len(rel.parts) == 1 and rel.name.startswith("config") and rel.suffix == ".yaml"
        if path.is_dir() and not path.is_symlink() or rel.parts[0] in (".lock", "wandb") or record \
                or rel.as_posix() == "csv/hparams.yaml":
            continue
        if rel.as_posix() == "csv/metrics.csv" and len(path.read_bytes().splitlines()) <= 1:
            continue
        return False
    return True
