"""What every corpus is (`Corpus`: documents and a fingerprint), and how a read notices its files changing under it
(`CorpusChanged`): the base of tinylm.data.corpus (text files) and tinylm.data.hf_corpus (datasets)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tinylm.errors import TinyLMError

try:
    import fcntl
except ImportError:  # (Windows)
    fcntl = None

RACY_NS = 2_000_000_000  # a file changed this recently may change again within its timestamps' granularity
MEMO_ENTRIES = 256  # a memo keeps this many newest entries
FINGERPRINTS = "fingerprints.json"  # in the cache folder: local corpora's hashes by their files' stamps


class Corpus:
    """A sequence of documents. Subclasses set `spec` and implement `_docs(split)` and `_fingerprint()`."""

    spec: str = ""
    has_validation: bool = False  # True when the source has its own validation split

    def documents(self, split: str = "train") -> Iterator[str]:
        """Stream the documents of `split` ("train", or "validation" when `has_validation`)."""
        if split != "train" and not self.has_validation:
            raise ValueError(f"corpus {self.spec!r} has no {split!r} split; the validation data is cut from the "
                             "tail of the train split instead (--data.val_fraction)")
        return self._docs(split)

    def __iter__(self) -> Iterator[str]:
        return self.documents("train")

    @property
    def fingerprint(self) -> str:
        """sha256 hex that changes whenever the corpus's text (or the selection of it) changes."""
        if not hasattr(self, "_fp"):
            self._fp = self._fingerprint()
        return self._fp

    @property
    def size_bytes(self) -> int | None:
        """About how many bytes of text the corpus holds (for progress bars and sampling), None when unknown."""
        return None

    @property
    def name(self) -> str:
        """Short readable name for folder names and summaries."""
        return Path(self.spec.rstrip("/")).name or self.spec

    def _docs(self, split: str) -> Iterator[str]:
        raise NotImplementedError

    def _fingerprint(self) -> str:
        raise NotImplementedError


class CorpusChanged(TinyLMError):
    """A corpus file changed between its fingerprint and the end of a read of it."""


def check_unchanged(stamps: dict[Path, tuple], paths: list[Path] | None = None, n_read: int | None = None) -> None:
    """Refuse a file read whole (``n_read`` bytes) that is not the one its fingerprint hashed (``stamps``: taken then;
    ``paths``: all of them): what is made of it would be stored under a key that lies about its text."""
    for path in stamps if paths is None else paths:
        taken = stamps.get(path)  # (none: a file never fingerprinted keys nothing)
        if taken and (n_read not in (None, taken[2]) or (stamp(path) if path.exists() else ()) != taken):
            raise CorpusChanged(f"corpus file {path} changed while it was read (something is writing to it); run "
                                "again when it is no longer written to")


def stamp(path: Path) -> tuple[int, ...]:
    """What changes with a file's bytes: inode (a file renamed over it), size, mtime, ctime (set by every write)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise gone(path) from None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def gone(path: Path) -> CorpusChanged:
    """A corpus file listed (or fingerprinted) and then removed or renamed before it was read."""
    return CorpusChanged(f"corpus file {path} was removed (or renamed) while the corpus was read; run again when "
                         "nothing is moving its files, or leave it out of --data.corpus")


__all__ = ["FINGERPRINTS", "Corpus", "CorpusChanged", "check_unchanged", "gone", "held_for_writing", "memoized",
           "process_alive", "recalled", "remember", "stamp"]


def memoized(memo: Path | None, what: Any, stamps: dict[Path, tuple], compute: Callable[[], Any]) -> Any:
    """``compute()``: work that reads the files of ``stamps`` (their stamps taken before) whole, at every start of
    every command on every rank (a corpus's hash, a dataset's id check), remembered in the JSON file ``memo`` by
    ``what`` and those stamps, so that it is done once per file as it is (None: done every time). Not remembered for
    a file whose stamp changed while it was read (what was read is not what the stamp names)."""
    if memo is None or not stamps:
        return compute()
    # (hashed: the list itself is ~120 bytes a file, and a memo keeps MEMO_ENTRIES of them: a folder of a million
    # files made each entry ~120 MB, read and written whole at every start)
    key = hashlib.sha256(json.dumps([what, [[str(p.resolve()), *s] for p, s in stamps.items()]], sort_keys=True,
                                    default=str).encode()).hexdigest()
    if (known := recalled(memo, key)) is not None:
        return known
    value = compute()
    with contextlib.suppress(CorpusChanged):  # (a file removed meanwhile: a read says so)
        if all(stamp(p) == s for p, s in stamps.items()):
            remember(memo, key, value, list(stamps.values()), list(stamps))
    return value


def recalled(memo: Path, key: str) -> Any:
    """The value `remember` stored under ``key`` in the JSON file ``memo``, or None (no file, another key, a file
    damaged or written by something else)."""
    try:
        entries = json.loads(memo.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # (RecursionError: JSON nested deeper than Python recurses)
        return None
    return entries.get(key) if isinstance(entries, dict) else None


def held_for_writing(path: Path) -> bool:
    """Whether a process holds ``path`` open for writing, on Linux (a read lease is refused then); False where that
    cannot be told. A writable memory map kept open (np.memmap mode "r+" in a notebook) is such a holder, and its
    writes after a page's first keep the file's stamp: what is read now may not be what the stamp names later."""
    if not hasattr(fcntl, "F_SETLEASE") or not hasattr(fcntl, "F_SETSIG"):  # (Linux only)
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:  # (a writer opening it meanwhile breaks the lease with F_SETSIG's signal: SIGURG is ignored, SIGIO kills)
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError as e:  # EAGAIN: open for writing; EACCES (another user's file), EINVAL (NFS): cannot be told
        return e.errno in (errno.EAGAIN, errno.EBUSY)
    finally:
        os.close(fd)
    return False


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs: a zombie (killed, not yet reaped by its parent) does not, though
    a signal to it still succeeds (its temp folder was left behind by the build that took over)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, another user's
        pass
    try:  # Linux: the state after the command's closing parenthesis in /proc/PID/stat
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS): alive as far as can be told
        return True


def _remove_stale_memo_temps(memo: Path) -> None:
    """Remove ``<memo>.tmp-<host>-<pid>`` files that a process of this host killed between writing and renaming
    left behind (a `kill -9` there left one for good in the cache: nothing else removes a file of that name)."""
    prefix = f"{memo.name}.tmp-{socket.gethostname()}-"
    for stale in memo.parent.glob(f"{memo.name}.tmp-*"):
        pid = stale.name[len(prefix):] if stale.name.startswith(prefix) else ""
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            with contextlib.suppress(OSError):
                stale.unlink()


def remember(memo: Path, key: str, value: Any, stamps: list[tuple], paths: list[Path] = ()) -> None:
    """Store ``value`` under ``key`` (which names the files by their ``stamps``) in ``memo``, unless a file changed
    in the last RACY_NS (a change within its timestamps' granularity would keep its stamp: "racy git") or the folder
    cannot be written (a read-only dataset or cache: the work is done again next time). Atomic; several processes
    writing at once keep one of their versions."""
    if any(time.time_ns() - max(s[-2], s[-1]) < RACY_NS for s in stamps):  # (mtime_ns, ctime_ns)
        return
    if any(held_for_writing(path) for path in paths):  # (``paths``: the files of ``stamps``)
        return
    try:
        entries = json.loads(memo.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        entries = {}
    entries = entries if isinstance(entries, dict) else {}
    entries.pop(key, None)
    entries = dict(list(entries.items())[-(MEMO_ENTRIES - 1):] + [(key, value)])  # newest last
    tmp = memo.with_name(f"{memo.name}.tmp-{socket.gethostname()}-{os.getpid()}")  # (hosts sharing a cache)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entries) + "\n", encoding="utf-8")
        os.replace(tmp, memo)
        _remove_stale_memo_temps(memo)
    except OSError:
        with contextlib.suppress(OSError):  # (on a read-only mount unlink says EROFS, not that there is no tmp)
            tmp.unlink(missing_ok=True)
