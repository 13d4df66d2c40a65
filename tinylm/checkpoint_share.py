"""One step's checkpoint files sharing their bytes on disk, where that is safe.

At a step where validation finds a new best and the periodic save falls, a run writes ``best.ckpt``,
``step-N.ckpt`` and ``last.ckpt`` one after the other: three files of the same state (371 MB for a 5-step run of
the GPU recipe), which differ only in the checkpoint callbacks' bookkeeping (which files exist, the best score).
Each file is still written whole and atomically (`tinylm.checkpoint.atomic_write`); when the one just written
holds the same state as the one before it at that step, the earlier names are then replaced (atomically, one by one)
by a copy of it that shares its bytes:

- a **reflink** (``ioctl(FICLONE)``: btrfs, XFS, bcachefs, ZFS 2.2+) where the filesystem makes one: a copy-on-write
  copy, a file of its own for every purpose (writing into one never changes the other), sharing blocks on disk;
- else a **hard link made read-only** (no write bit), for a user who is not root on a POSIX system: ``cp x
  last.ckpt`` or ``torch.save(..., "last.ckpt")`` then fails with "Permission denied" instead of writing into the
  step's other names too; ``cp -f``, ``mv``, ``rm`` and tinylm's own saves (a rename) replace or remove one name only;
- else (root, whom file modes do not stop; Windows; another filesystem) **separate copies**, as before.

A symbolic link (Lightning's ``save_last="link"``) is not used: ``cp x last.ckpt`` writes through it into
``step-N.ckpt``, and removing the step's file leaves ``last.ckpt`` dangling. Only files this process wrote at this
step, unchanged since, are ever replaced. FSDP2's checkpoints (folders) are written elsewhere and never shared.
Where tinylm takes a name from a read-only hard-linked file (a later save over ``last.ckpt``, keep_checkpoints
trimming ``step-N.ckpt``) and leaves it one name, that name is made writable again (`one_name_left_writable`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int), "clone all of the source's blocks into the target"


def clone_file(src: Path, dst: Path) -> bool:
    """Make ``dst`` a copy-on-write copy of ``src`` (a reflink); False, with no ``dst`` left, where the filesystem
    (or the system) cannot."""
    try:
        import fcntl
    except ImportError:  # Windows
        return False
    try:
        with open(src, "rb") as source, open(dst, "wb") as target:
            fcntl.ioctl(target.fileno(), FICLONE, source.fileno())
            os.fsync(target.fileno())
        return True
    except OSError:  # EOPNOTSUPP/EINVAL/ENOTTY (ext4, tmpfs, overlayfs), EXDEV
        dst.unlink(missing_ok=True)
        return False


def hard_links_are_safe() -> bool:
    """Whether a read-only hard link protects the step's other names: file modes stop an in-place write by anyone
    but root (who writes into a read-only file as into any other); Windows cannot delete a read-only file."""
    return os.name == "posix" and os.geteuid() != 0


def _memcmp() -> Callable[[int, int, int], int] | None:
    """The C library's memcmp (ctypes releases the GIL while it runs), or None where there is none to load."""
    try:
        libc = ctypes.CDLL(None) if os.name == "posix" else ctypes.cdll.msvcrt
        memcmp = libc.memcmp
    except (AttributeError, OSError):
        return None
    memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    memcmp.restype = ctypes.c_int
    return memcmp


_MEMCMP = _memcmp()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one dtype and shape hold the same bits (a NaN equals itself, -0.0 is not 0.0): one
    memcmp of their bytes, at memory speed and on no thread pool (torch.equal of byte views took 7.6 s for a GPT-2
    124M checkpoint on 2 busy cores, half as long as its save; memcmp 0.7 s: benchmarks/bench_checkpoint_share.py)."""
    a, b = (t.detach().cpu().resolve_conj().resolve_neg().contiguous() for t in (a, b))
    size = a.numel() * a.element_size()
    if size == 0:
        return True
    if _MEMCMP is not None:
        return _MEMCMP(a.data_ptr(), b.data_ptr(), size) == 0
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and same_bits(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _bookkeeping(state: Any) -> bool:
    """A ModelCheckpoint's own state: which files it wrote and their scores (it changes from one save to the next
    at one step; a resume reads it from whichever of the step's files it starts from)."""
    return isinstance(state, dict) and "best_model_path" in state and "last_model_path" in state


def same_state(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether two checkpoints hold the same state (weights, optimizer, loops, RNG, hyperparameters, ...), the
    checkpoint callbacks' bookkeeping aside."""
    def kept(ckpt: dict[str, Any]) -> dict[str, Any]:
        callbacks = {k: v for k, v in ckpt.get("callbacks", {}).items() if not _bookkeeping(v)}
        return {**ckpt, "callbacks": callbacks}
    return _equal(kept(new), kept(old))


def _stat(path: Path) -> tuple[int, ...] | None:
    try:
        s = path.stat()
    except OSError:
        return None
    return s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns


class StepFiles:
    """The checkpoint files of one state that this process wrote last (names and what each was when written), and
    how the folder shares bytes (found at the first try, then kept: a filesystem that cannot reflink is not asked
    again, and on one where nothing is shared the states are not compared)."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.files: dict[Path, tuple[int, ...] | None] = {}
        self.methods: dict[Path, str] = {}  # folder -> "reflink" | "link" | "copy"

    def earlier(self, checkpoint: dict[str, Any], path: Path,
                load: Callable[[Path], dict[str, Any]]) -> list[Path]:
        """Before ``checkpoint`` is written to ``path``: the files this process wrote at its step, unchanged since,
        that hold the same state (then to share its bytes once written), or none (a new state starts)."""
        step = checkpoint.get("global_step")
        earlier = [p for p, stat in self.files.items()
                   if p != path and p.parent == path.parent and _stat(p) == stat] if step == self.step else []
        if not earlier or self.methods.get(path.parent) == "copy":
            self.step, self.files = step, {}
            return []
        try:
            same = same_state(checkpoint, load(earlier[0]))
        except Exception:  # a file that cannot be read back is not shared, whatever the reason
            same = False
        if not same:
            self.step, self.files = step, {}
        return earlier if same else []

    def written(self, path: Path, earlier: list[Path]) -> None:
        """After ``path`` is written: the ``earlier`` names of its state replaced by copies sharing its bytes."""
        method = self.methods.get(path.parent) or ("reflink" if earlier else None)
        for name in earlier:
            method = _share(path, name, method)
        if method is not None:
            self.methods[path.parent] = method
        self.files.update({p: _stat(p) for p in [*earlier, path]})


@contextlib.contextmanager
def one_name_left_writable(path: Path) -> Iterator[None]:
    """Around a change that takes the name ``path`` from its file (a rename over it, a removal): where that file is
    a read-only hard link (`_share`'s) and is left with one name, that name gets its write bits back (the umask's),
    since a write into it changes no other checkpoint any more, and a read-only file is one that ``rm`` asks about
    ("remove write-protected regular file?") and a user's own ``torch.save`` fails on. The file is held open through
    the change (a name can be gone by then); a kill in between leaves it read-only, as before."""
    try:
        s = os.lstat(path)
        shared = stat.S_ISREG(s.st_mode) and s.st_nlink > 1 and not s.st_mode & 0o222 and hasattr(os, "fchmod")
        fd = os.open(path, os.O_RDONLY) if shared else None
    except OSError:
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            try:
                s = os.fstat(fd)
                if s.st_nlink == 1:
                    mask = os.umask(0o022)
                    os.umask(mask)
                    os.fchmod(fd, stat.S_IMODE(s.st_mode) | (0o222 & ~mask))
            except OSError:  # a file system that refuses: it stays read-only, as it was
                pass
            finally:
                os.close(fd)


def _share(path: Path, name: Path, method: str) -> str:
    """Replace ``name`` by a copy of ``path`` that shares its bytes, atomically (through ``<name>.tmp``, which a
    later save removes if a kill leaves it); the method that worked."""
    tmp = name.with_name(name.name + ".tmp")
    tmp.unlink(missing_ok=True)
    if method == "reflink" and clone_file(path, tmp):
        with one_name_left_writable(name):
            os.replace(tmp, name)
        return method
    if method in ("reflink", "link") and hard_links_are_safe():
        mode = path.stat().st_mode
        try:
            path.chmod(mode & ~0o222)  # read-only before it has a second name
        except OSError:  # another user's file (a run folder a group shares): only its owner may; a copy
            return "copy"
        try:
            os.link(path, tmp)
        except OSError:  # a filesystem without hard links (FAT, some network shares): copies, as they were
            path.chmod(mode)
            return "copy"
        with one_name_left_writable(name):
            os.replace(tmp, name)
        return "link"
    return "copy"


def share_copy(path: Path, name: Path) -> bool:
    """Make ``name`` a copy of the checkpoint ``path`` that shares its bytes (`_share`: atomically, a reflink or a
    read-only hard link) where that is safe; False, with nothing written, where it is not (a full copy is then
    the caller's)."""
    return _share(path, name, "reflink") != "copy"
