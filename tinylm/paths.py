"""Output paths checked before any work: a command that trains or samples for minutes must not fail at the end
because its `--out` could never be written."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path


def check_output_path(out: str | Path, option: str = "--out", *, folder: bool = False) -> Path:
    """`out` as a Path tinylm can write a file (or, with `folder`, a folder) at: not a folder where a file is wanted
    nor a file where a folder is, under no file posing as a folder, and in a place where files can be created.
    Raises ValueError naming the option, the path and the fix; creates nothing."""
    if not str(out).strip():  # Path("") is "." : the working folder, which the user did not name
        raise ValueError(f"{option} is empty; pass a {'folder' if folder else 'file'} path")
    path = Path(out)
    if folder and path.exists() and not path.is_dir():
        raise ValueError(f"{option} {str(out)!r} is a file; pass a folder path (it is created if missing)")
    if not folder and path.is_dir():
        raise ValueError(f"{option} {str(out)!r} is a folder; pass a file path")
    ancestor = path if folder and path.is_dir() else next((p for p in path.parents if p.exists()), Path("."))
    if not ancestor.is_dir():
        raise ValueError(f"{option} {str(out)!r} lies under {ancestor}, which is a file, not a folder; pick another "
                         "path")
    try:
        with tempfile.TemporaryFile(dir=ancestor):  # the one test of writability that holds for root too
            pass
    except OSError as e:
        raise ValueError(f"{option} {str(out)!r}: nothing can be written in {ancestor} ({e.strerror or e}); pick "
                         "another path") from None
    return path


def check_json_beside(png: str | Path, key: str, command: str, option: str = "--out") -> Path:
    """The .json that `command` writes beside its PNG (``lr.png`` -> ``lr.json``), checked before any work: it may
    replace that command's own earlier numbers (a JSON object with ``key``), never another file (an exported
    model's config.json beside ``--out config.png``). Raises ValueError naming both paths and the fix."""
    beside = Path(png).with_suffix(".json")
    if not beside.exists():
        return beside
    try:
        ours = key in json.loads(beside.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):  # unreadable, not JSON, or a JSON number
        ours = False
    if not ours:
        raise ValueError(f"{option} {str(png)!r} would write its numbers to {beside}, which holds another file (not "
                         f"a `tinylm {command}` result); pick another {option}, or move that file away")
    return beside


def follow_umask(folder: Path) -> None:
    """Give every file under ``folder`` the permissions a new file gets (0666 less the umask), every folder 0777
    less it: a writer that makes its file private (safetensors' model.safetensors came out 0600) is overruled, so an
    export reads for whoever the user's other files read for."""
    mask = os.umask(0o022)
    os.umask(mask)
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


ASIDE = ".tinylm-swap.old"  # where swap_in_folder puts the earlier folder when it cannot exchange the two


def missing_path(path: str | Path) -> str:
    """Why a path that does not exist as such is not there, in words for an error line: "not found", "is a link to
    nothing" (a dangling symbolic link), "is a loop of symbolic links", "cannot be reached (permission denied on a
    folder above it)"."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a loop of symbolic links (each link names another; fix the links)"
        if e.errno == errno.EACCES:
            return "cannot be reached (permission denied on a folder on its way)"
        if os.path.islink(path):
            return f"is a link to nothing ({os.readlink(path)!r} does not exist)"
        return "not found"
    return "exists"


def swap_in_folder(new: Path, target: Path, *, event: str) -> None:
    """Put the folder ``new`` (written whole, beside ``target`` in the same parent) in place of ``target`` so that at
    every instant ``target`` is either the earlier folder or the new one, whole: one atomic exchange of the two
    (Linux's renameat2 RENAME_EXCHANGE), then the earlier one, now at ``new``, is removed. ``target`` missing or
    empty: one rename. Where the file system cannot exchange, ``target`` is renamed aside, ``new`` into its place,
    and the earlier one removed: a kill in between leaves it aside, as ``.NAME.tinylm-swap.old``.

    ``new`` takes ``target``'s permissions. ``sys.audit(event, new, target)`` is raised just before the swap (the point
    a kill test stops the process at)."""
    if target.is_dir() and not target.is_symlink():
        os.chmod(new, stat.S_IMODE(target.stat().st_mode))
    sys.audit(event, str(new), str(target))
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        os.rename(new, target)  # a rename replaces an empty folder at once
        return
    if _exchange(new, target):
        shutil.rmtree(new)  # the earlier folder, now aside
        return
    aside = target.parent / f".{target.name}{ASIDE}"
    shutil.rmtree(aside, ignore_errors=True)
    os.rename(target, aside)
    os.rename(new, target)
    shutil.rmtree(aside)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (renameat2 RENAME_EXCHANGE); False where the system or file system has no such
    call (macOS, older kernels, some network file systems)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # a C library without it (glibc < 2.28, musl)
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))
