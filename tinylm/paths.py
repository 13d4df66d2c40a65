"""Output paths checked before any work: a command that trains or samples for minutes must not fail at the end
because its `--out` could never be written."""

from __future__ import annotations

import json
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
