"""Which step each checkpoint of a folder holds (`checkpoints_by_step`): what `--ckpt_path last`, a cut save's
repair, the stability guard's rollback and a second Ctrl+C choose by, reading as little of each file as it can."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from tinylm.checkpoint import CheckpointError, is_sharded_checkpoint, load_checkpoint, load_sharded

STEP_NAME = re.compile(r"step-(\d+)\.ckpt")  # the periodic checkpoints' name (tinylm.train.run): its global_step


def checkpoints_by_step(folder: Path) -> tuple[list[tuple[int, bool, Path]], list[str]]:
    """A checkpoints folder's readable checkpoints as (step, is last.ckpt, path), and the names of the unreadable
    ones. A ``step-N.ckpt`` is at step N when it is a whole zip archive (torch.save's format, its index at the end:
    a file cut short is not); the others' metadata is read (mmap). Reading every step-N.ckpt's too took a resume of
    a run keeping all of them (run.keep_checkpoints -1) ~80 ms a file, twice: minutes for a long run's thousands."""
    found, broken = [], []
    for path in sorted(folder.glob("*.ckpt")) if folder.is_dir() else []:
        try:
            if (named := STEP_NAME.fullmatch(path.name)) and zipfile.is_zipfile(path):
                found.append((int(named[1]), False, path))
                continue
            found.append((_saved_step(path), path.name == "last.ckpt", path))
        except FileNotFoundError:  # removed since the listing: a running fit rotating its step-N.ckpt files
            continue
        except CheckpointError:
            broken.append(path.name)
    return found, broken


_STEPS: dict[tuple, int] = {}  # a checkpoint file's global_step, by its path, inode, size and times (a save renamed
# over it is another key): a resume asked it of last.ckpt and best.ckpt three times each, ~0.1 s a load


def _saved_step(path: Path) -> int:
    st = path.stat()
    key = (str(path.absolute()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _STEPS:  # a sharded checkpoint's (FSDP2's folder) from its meta.pt alone: read whole, its weights
        # took ~3 s a GB at every listing (a 1.5B run keeping 3 steps: ~90 s and 6 GB of memory per resume)
        ckpt = load_sharded(path, weights=False) if is_sharded_checkpoint(path) else load_checkpoint(path, mmap=True)
        _STEPS[key] = int(ckpt.get("global_step", 0))
    return _STEPS[key]
