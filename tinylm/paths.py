"""Output paths checked before any work: a command that trains or samples for minutes must not fail at the end
because its `--out` could never be written."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
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
        if Path(png).exists():  # a picture of the user's own, or another command's (`tinylm plot`'s plot.png)
            raise ValueError(f"{option} {str(png)!r} already exists, without the {beside.name} a `tinylm {command}` "
                             f"writes beside its picture: it is another file; pick another {option}, or move it away")
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
    """Put the folder ``new`` (written whole, beside ``target`` in the same parent) in place of ``target`` by
    `swap_in`, a kill leaving an earlier folder aside as ``.NAME.tinylm-swap.old``. ``new`` takes ``target``'s
    permissions."""
    if target.is_dir() and not target.is_symlink():
        os.chmod(new, stat.S_IMODE(target.stat().st_mode))
    swap_in(new, target, aside=target.parent / f".{target.name}{ASIDE}", event=event)


def swap_in(new: Path, target: Path, *, aside: Path, event: str | None = None) -> None:
    """Put ``new`` (a file or a folder, written whole in ``target``'s folder) in place of ``target`` (a file, a
    folder, a link or nothing) so that at every instant ``target`` is the earlier one or the new one, whole:

    - nothing there, an empty folder that a folder replaces, or a file that a file replaces: one rename;
    - else one atomic exchange of the two (Linux's renameat2 RENAME_EXCHANGE, which swaps a folder and a file too),
      then the earlier one, now at ``new``, removed: a kill mid-removal leaves part of it under ``new``'s name, for
      the caller's next write to clear;
    - where the file system cannot exchange, ``target`` renamed to ``aside``, ``new`` into its place and ``aside``
      removed: a kill between the two renames leaves no ``target``, the earlier one whole at ``aside``.

    The renames are flushed to disk before the earlier one is removed. ``sys.audit(event, new, target)`` is raised
    just before the swap (the point a kill test stops the process at)."""
    if event:
        sys.audit(event, str(new), str(target))
    if not os.path.lexists(target) or (not new.is_dir() and not target.is_dir()) or \
            (new.is_dir() and target.is_dir() and not target.is_symlink() and not any(target.iterdir())):
        os.replace(new, target)  # atomic: a rename replaces a file, or an empty folder, at once
        fsync_folder(target.parent)
        return
    if exchange(new, target):
        earlier = new
    else:
        if os.path.lexists(aside):  # left by a killed swap
            remove_path(aside)
        os.rename(target, aside)
        os.rename(new, target)
        earlier = aside
    fsync_folder(target.parent)
    remove_path(earlier)


def replace_file(path: str | Path, write) -> None:
    """Write the file ``path`` by ``write(tmp)`` into ``<path>.tmp`` renamed over it: a full disk leaves the earlier
    file whole and no empty or half-written one (which the next run's `check_json_beside` took for another file);
    its error names ``path``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with writing(path):
            write(tmp)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def is_utf8(text: str | os.PathLike) -> bool:
    """Whether ``text`` (a name, a path) is UTF-8 text: Python keeps the bytes of a name it could not decode (Latin-1
    bytes, or UTF-8 read under the C locale) as lone surrogates, which no UTF-8 writer, YAML, JSON or torch's
    reader takes."""
    try:
        str(text).encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def not_utf8(text: str, fix: str) -> str | None:
    """Why ``text`` (a name from the command line) is no UTF-8 text, and the fix (``fix`` where its bytes are in
    another encoding), or None when it is text: Python keeps the bytes of a name it could not decode as lone
    surrogates, which open the file but fail in every YAML and JSON record of a run (meta.json's write was a
    UnicodeEncodeError traceback)."""
    if is_utf8(text):
        return None
    try:
        raw = os.fsencode(text)
        raw.decode("utf-8")
    except UnicodeEncodeError:  # (a surrogate no decoding made: a config's "\\ud800")
        return "holds a lone surrogate, which is no text; write the name itself"
    except UnicodeDecodeError:
        return f"its bytes {raw!r} are not UTF-8 (a name in another encoding, such as Latin-1); {fix}"
    return (f"Python read its UTF-8 bytes as {sys.getfilesystemencoding()} (the C or POSIX locale without UTF-8 "
            "mode); run tinylm with PYTHONUTF8=1 (or LC_ALL=C.UTF-8)")


def utf8_text(path: Path, fix: str) -> str:
    """The text of a file tinylm wrote and reads back (a run's CSV): one that another program saved otherwise is a
    ValueError naming it, its first bad byte and ``fix`` (it was a UnicodeDecodeError traceback)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at {e.start:,}): it is "
                         f"damaged, or another program saved it; {fix}") from None


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """A write of the file ``path``: an OSError of it that names no file (a full disk fails a small write at close)
    names ``path`` (`naming`), so the CLI's line says which file."""
    try:
        yield
    except OSError as e:
        if (named := naming(e, path)) is not e:
            raise named from None
        raise


def naming(error: BaseException, path: str | Path) -> BaseException:
    """``error`` with ``path`` as its file name where it is an OSError of a write that named none (a file object's
    write or close on a full disk): the CLI's line then says which file."""
    if isinstance(error, OSError) and error.errno and not error.filename:
        return OSError(error.errno, error.strerror, str(path))
    return error


def remove_path(path: Path) -> None:
    """Delete a file or a folder; nothing if it is not there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def fsync_folder(folder: Path) -> None:
    """Flush ``folder`` itself to disk: the renames in it become durable."""
    try:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # some filesystems (and Windows) cannot fsync a directory
        pass


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (renameat2 RENAME_EXCHANGE; a file and a folder too); False where the system or
    file system has no such call (macOS, older kernels, some network file systems). Raises the audit event
    ``tinylm.exchange`` (a, b) just before the call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # a C library without it (glibc < 2.28, musl)
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    sys.audit("tinylm.exchange", str(a), str(b))  # a call through ctypes raises no audit event of its own
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def refuse_model_folder(path: Path) -> None:
    """A Hugging Face model's folder (an export) where a tinylm checkpoint is read (`validate`, `fit --ckpt_path`;
    `generate` and `eval` read one): one line saying what reads it. It said "is a folder; pass a .ckpt written by
    `tinylm fit`", which the user of an export may not have."""
    if path.is_dir() and (path / "config.json").is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} is a Hugging Face model's folder (such as `tinylm export` "
                                "writes), not a tinylm checkpoint; load it with transformers' AutoModelForCausalLM, "
                                f"or start a new run from its weights: tinylm fit --model.init_from {path}")
    weights = [name for name in _WEIGHT_FILES if (path / name).is_file()]
    if weights:  # (it said "is a folder; pass a .ckpt", silent on what the folder lacked)
        raise FileNotFoundError(f"checkpoint {str(path)!r} holds a model's weights ({weights[0]}) but no config.json, "
                                "which a Hugging Face model's folder needs beside them: copy it from where the weights "
                                "came from, or pass --ckpt_path PATH to a .ckpt written by `tinylm fit`")


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
