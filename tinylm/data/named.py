"""The corpora tinylm knows by name (`--data.corpus tinyshakespeare`): downloaded once into the data cache, their
sha256 checked on every use; and the sha256 of a file, which corpora are keyed by."""

from __future__ import annotations

import hashlib
import logging
import urllib.request
from pathlib import Path
from typing import Any

from tinylm.errors import TinyLMError, UnavailableError

try:
    import fcntl
except ImportError:  # (Windows): no lock; ranks that download at once may collide
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

_READ_BYTES = 1 << 20

NAMED = {
    "tinyshakespeare": {
        "url": "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        "sha256": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        "file": "tinyshakespeare.txt",
    },
}


def download_named(name: str, cache_dir: str | Path) -> Path:
    """Path of the named corpus in `cache_dir/corpora`, downloading it once; the sha256 is checked either way."""
    info = NAMED[name]
    target = Path(cache_dir) / "corpora" / info["file"]
    if target.is_file() and sha256_of(target) == info["sha256"]:
        return target
    make_in_cache(target.parent)
    # one download at a time: every rank that torchrun or SLURM starts opens the corpus at once, and their downloads
    # into one temp file truncated each other's (the second to finish found none); the others find it downloaded
    locks = Path(cache_dir) / ".locks"
    make_in_cache(locks)
    with open(locks / f"corpora-{info['file']}.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file() and sha256_of(target) == info["sha256"]:
            return target
        return _download(name, info, target)


def make_in_cache(folder: Path) -> None:
    """Make `folder`, one of the data cache's (CACHE/corpora, CACHE/.locks), with the folders above it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileNotFoundError as e:  # under /proc (a file on the way, a read-only disk: the CLI names those)
        raise TinyLMError(f"cannot make the data cache folder {folder.parent} ({e.strerror or e}); pick a writable "
                          "--data.cache_dir DIR (or $TINYLM_CACHE_DIR)") from None


def _download(name: str, info: dict, target: Path) -> Path:
    """Download named corpus ``name`` (its NAMED entry ``info``) to ``target``, checking its sha256."""
    tmp = target.with_name(target.name + ".part")
    log.info("downloading %s from %s", name, info["url"])
    try:
        with urllib.request.urlopen(info["url"], timeout=30) as r, open(tmp, "wb") as f:
            while chunk := r.read(_READ_BYTES):
                f.write(chunk)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        # a copy placed there that is not the text (another version, other line endings) is named as such: "no
        # verified copy" sent the user who had placed it to place it again
        placed = (f"the copy at {target} is not the expected text (sha256 {sha256_of(target)[:12]}, expected "
                  f"{info['sha256'][:12]}: another version, or changed line endings); replace it with the file from "
                  "that address" if target.is_file() else f"no verified copy is at {target}; download it there "
                  "yourself")
        raise UnavailableError(f"could not download corpus {name!r} from {info['url']} ({e}) and {placed}, or pass "
                               "--data.corpus PATH to a local text file") from e
    got = sha256_of(tmp)
    if got != info["sha256"]:
        tmp.unlink(missing_ok=True)
        raise UnavailableError(f"downloaded {name!r} has sha256 {got}, expected {info['sha256']}; the file changed "
                           "upstream or the download was corrupted. Pass --data.corpus PATH to a copy you trust")
    tmp.replace(target)
    return target


def sha256_of(path: Path, h: Any = None) -> str:
    """The sha256 of `path`'s bytes; with `h`, a hash that they update."""
    h = h or hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            h.update(chunk)
    return h.hexdigest()
