"""Names and records of eval scores: ``eval/<task>_<metric>`` (``eval/hellaswag_acc_norm``) in the run's CSV and
W&B during training, and the same columns in ``runs/NAME/eval/metrics.csv``, one row per `tinylm eval`; the rows of
that file and of ``runs/NAME/validate/metrics.csv`` appended by one writer (`append_row`)."""

from __future__ import annotations

import contextlib
import csv
import io
import os
from datetime import datetime
from pathlib import Path

from tinylm.paths import is_utf8

PREFIX = "eval/"


def flat(results: dict[str, dict[str, float]], *, leave_out: tuple[str, ...] = ("items", "random")) -> dict[str, float]:
    """``{"hellaswag": {"acc": 0.3, "items": 40.0}}`` -> ``{"eval/hellaswag_acc": 0.3}``: the scores, less the
    entries named in ``leave_out`` (by default each task's items scored and its random-guess acc)."""
    return {f"{PREFIX}{task}_{name}": value for task, scores in results.items() for name, value in scores.items()
            if name not in leave_out}


def local_time() -> str:
    """Now, for a row's ``time``: the local time with its UTC offset, ``2026-10-25 02:30:00+01:00`` (ISO 8601). A
    bare local time told neither the hour a DST change repeats apart nor rows appended on machines in other time
    zones (a run trained in Kolkata and validated in Los Angeles: its later row read 11 hours earlier)."""
    return datetime.now().astimezone().isoformat(sep=" ", timespec="seconds")


def append_row(path: Path, row: dict) -> None:
    """Append ``row`` to the CSV ``path``; a row with columns the header lacks widens it (the file is rewritten
    into a temporary file renamed over it, so a crash leaves the old file whole). Two commands appending at once
    (two `tinylm validate` of one run's checkpoints) take turns: neither writes a second header or loses the
    other's row to its rewrite."""
    row = {key: _text(value) for key, value in row.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with _folder_locked(path.parent):
        _append(path, row)


def _text(value: object) -> object:
    """``value`` as UTF-8 text where it is a name Python read in bytes that are not (a checkpoint named
    `caf\\xe9.ckpt`, kept as `caf\\udce9.ckpt`): its bytes, those that are no UTF-8 written `\\xe9`; a UTF-8 name
    read under the C locale is itself again. Such a name made the row a UnicodeEncodeError ("could not append the
    result"): `tinylm validate` and `tinylm eval` recorded nothing."""
    if not isinstance(value, str) or is_utf8(value):
        return value
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # (a lone surrogate no decoding made)
        raw = value.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace")


@contextlib.contextmanager
def _folder_locked(folder: Path):
    """An exclusive lock on ``folder`` itself (flock on its descriptor: no lock file left beside the CSV, and it
    outlives the rename of a rewrite, which a lock on the CSV's own inode would not)."""
    try:
        import fcntl
    except ImportError:  # (no flock: Windows)
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing releases the lock)


def _append(path: Path, row: dict) -> None:
    rows, fields = [], list(row)
    if path.is_file():
        from tinylm.paths import utf8_text

        _drop_cut_row(path)  # (before the row goes after it, or the file is rewritten with it)
        reader = csv.DictReader(io.StringIO(utf8_text(path, "move it aside (a new one is started)"), newline=""))
        old = list(reader.fieldnames or [])
        if old and set(row) <= set(old):
            _append_whole(path, lambda out: csv.DictWriter(out, fieldnames=old, extrasaction="ignore").writerow(row))
            return
        rows = list(reader)
        fields = old + [k for k in row if k not in old]
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows + [row])
        os.replace(tmp, path)
    except BaseException:  # a full disk: no metrics.csv.tmp left beside the file
        tmp.unlink(missing_ok=True)
        raise


def _drop_cut_row(path: Path) -> None:
    """Drop a last line without its newline (a command killed mid-append): the next row was appended onto it, and a
    rewrite for a new column kept it as a row (`2,3.` for a loss of 3.4)."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(max(0, size - 65536))
            tail = f.read()
            if not tail.endswith(b"\n") and b"\n" in tail:
                f.truncate(size - (len(tail) - tail.rfind(b"\n") - 1))


def _append_whole(path: Path, write) -> None:
    """Append one row to ``path`` by ``write(f)``, whole or not at all: a full disk cut the row after some of its
    bytes, and the next command's row was appended onto that half row (a row of shifted columns)."""
    size = path.stat().st_size
    try:
        with open(path, "a", newline="", encoding="utf-8") as out:
            write(out)
    except BaseException:
        os.truncate(path, size)
        raise
