"""Which files a local corpus (a folder, or a glob) reads: every non-hidden regular file below it, never what tinylm
wrote there itself: its data cache's folders (token ids, tokenizers, Arrow caches, downloads) and its run folders
(checkpoints, metrics, config records, samples.txt). `--data.corpus .` in a folder of texts where `runs/` and
`data_cache/` live read the previous run's checkpoints and logs as corpus files (and `'**/*.txt'` its samples)."""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Callable
from pathlib import Path

from tinylm.data.source import FINGERPRINTS


def made_by_tinylm(cache_dir: str | Path) -> list[str]:
    """The cache's own folders and files (real paths): never part of a corpus such as `--data.corpus .` (its
    fingerprints.json, rewritten by the run that read it, made the next `--data.corpus .` a corpus of .txt and .json
    files, refused as mixing kinds)."""
    names = ("datasets", "tokenizers", "hf-local", "corpora", FINGERPRINTS)
    return [os.path.realpath(Path(cache_dir, name)) for name in names]


def is_run_folder(folder: str | Path) -> bool:
    """Whether ``folder`` is a tinylm run folder (runs/NAME: its lock, and its checkpoints or config record)."""
    return os.path.isfile(os.path.join(folder, ".lock")) and (
        os.path.isdir(os.path.join(folder, "checkpoints")) or os.path.isfile(os.path.join(folder, "config.yaml")))


def files_below(root: Path, *, cache_dir: str | Path) -> list[Path]:
    """Every non-hidden file below `root`, sorted by path, leaving out what tinylm made (above). Symlinked
    folders are entered, each real folder once (a loop, dir/loop -> dir, is not walked again: a `**` glob reads
    them too, and `corpus/wiki -> /data/wiki` was left out without a word); a folder that cannot be read is an
    error, not a gap."""
    def unreadable(err: OSError) -> None:
        raise PermissionError(err.errno, f"corpus directory {str(root)!r}: cannot read {err.filename} "
                              f"({err.strerror}); make it readable (chmod), or name only the files to use "
                              "(--data.corpus 'DIR/**/*.txt')", err.filename)

    skip = made_by_tinylm(cache_dir)
    found: list[Path] = []
    walked: set[str] = set()
    for folder, dirs, names in os.walk(root, onerror=unreadable, followlinks=True):
        if is_run_folder(folder) or os.path.realpath(folder) in walked:
            dirs[:] = []
            continue
        walked.add(os.path.realpath(folder))
        dirs[:] = [d for d in dirs if not d.startswith(".") and os.path.realpath(os.path.join(folder, d)) not in skip]
        found += [Path(folder, name) for name in names if not name.startswith(".")
                  and not _made(os.path.realpath(os.path.join(folder, name)), skip)]
    return sorted(p for p in found if p.is_file())


def glob_files(pattern: str, *, cache_dir: str | Path) -> list[Path]:
    """The regular files ``pattern`` matches (``**`` recursive), sorted, leaving out what tinylm made (above:
    anything below a run folder, at any depth: runs/NAME/wandb/offline-run-*/logs/debug.log is 4 folders down)."""
    made = made_by_tinylm(cache_dir)
    run_folder = functools.cache(is_run_folder)  # one look per folder, not one per file below it
    return sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file()
                  and not _made(os.path.realpath(p), made) and not below_run_folder(p, run_folder))


def below_run_folder(path: str | Path, run_folder: Callable[[Path], bool] = is_run_folder) -> bool:
    """Whether ``path`` lies below a tinylm run folder (its checkpoints, logs, samples: written by each run);
    ``run_folder``: `is_run_folder`, or a cache of it for many files of one folder."""
    return any(run_folder(a) for a in Path(path).parents)


def _made(real: str, made: list[str]) -> bool:
    """Whether the file at real path ``real`` is (or lies below) one of `made_by_tinylm`'s ``made``: its real path
    worked out once, not once per entry of ``made`` (each a system call per folder of the path: a folder of 20,000
    files took 1.7 s of CPU at every command's start, 0.3 s once)."""
    return any(_is_below(real, m) for m in made)


def _is_below(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` (or a temp copy of it that is written, `NAME.tmp-<host>-<pid>`) or lies below."""
    return path == folder or path.startswith((folder.rstrip(os.sep) + os.sep, f"{folder}.tmp-"))
