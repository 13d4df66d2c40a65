"""What counts as a user's error: the CLI prints these as one line and exits non-zero; anything else is a bug in
tinylm (or a library) and keeps its traceback.

Raise `TinyLMError` (or a subclass) for anything a user can get wrong that is not naturally a ValueError or
OSError. ValueError / OSError / TypeError families raised by a `raise` statement inside tinylm itself count as user
errors too (they name the bad value and the fix, STYLE.md rule 7); the same exceptions raised deep inside torch or
numpy do not, because there they usually mean tinylm forgot to validate something.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST)
"""OSErrors of the local disk: full, not writable, or a file (a broken link) where a folder must be made. The CLI
names their path and the fix (tinylm.cli.errors), so one raised inside a library is passed on as it is, not
wrapped in a reason of the library's (a read-only data cache is no "check the network")."""


OUT_OF_MEMORY = ("can't allocate memory", "CUDA out of memory", "MPS backend out of memory", "Cannot allocate memory")
"""The texts of torch's RuntimeErrors for memory running out: its CPU allocator, CUDA's and MPS's, and a mapping
refused (errno 12: torch.load's mmap of a checkpoint under `ulimit -v`)."""


def where_written(e: OSError) -> str:
    """" writing FILE" for the file ``e`` (a full disk's error) was writing: a copy's or a move's destination (shutil
    names its source first: W&B's media copy named a file in /tmp, on a disk with room), else its one name; "" for
    none."""
    written = e.filename2 or e.filename
    return f" writing {written}" if written else ""


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is the memory running out (Python's MemoryError, torch's `OUT_OF_MEMORY` errors): nothing wrong
    with the file or the input being read."""
    return isinstance(e, MemoryError) or isinstance(e, RuntimeError) and any(m in str(e) for m in OUT_OF_MEMORY)


class TinyLMError(Exception):
    """An error the user can fix; its message names the bad value or file and the fix.

    What the CLI needs to report it, as attributes (tinylm.cli.main): ``exit_code`` (1, or 128 + N for a run stopped
    by signal N), ``every_rank`` (raised by every rank of a run together: rank 0 alone says it) and ``said`` (already
    said by the rank that ended first: nothing more to say)."""

    exit_code: int = 1
    every_rank: bool = False
    said: bool = False


class UnavailableError(TinyLMError, RuntimeError):
    """Something a run needs cannot be had here (no network and no cached copy, a download that does not verify,
    a torch too old for an option); the message says what to provide instead."""


@contextlib.contextmanager
def named_option(option: str) -> Iterator[None]:
    """Refusals of a checkpoint (FileNotFoundError, TinyLMError) naming ``option``, the flag that gave the file,
    where they say ``--ckpt_path`` (the commands' flag): ``--model.init_from``, ``samples.draft_ckpt_path``..."""
    try:
        yield
    except (FileNotFoundError, TinyLMError) as e:
        if option == "--ckpt_path" or "--ckpt_path" not in str(e):
            raise
        raise type(e)(str(e).replace("--ckpt_path", option)) from None
