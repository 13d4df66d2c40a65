"""Where text comes from: local files, directories and globs, Hugging Face datasets, named corpora.

`open_corpus(spec, ...)` reads `--data.corpus`:
    tinyshakespeare        downloaded once into CACHE/corpora (sha256-checked); a verified copy is used offline
    PATH.txt (any file)    one document, or several when the file separates them with `<|endoftext|>`
    DIR                    every non-hidden file below DIR, sorted by path, one document per file (dataset
                           files of one kind, e.g. all .jsonl: one dataset of their rows)
    GLOB (has * ? [)       the matching files, sorted, one document per file (dataset files: as for DIR)
    PATH.jsonl/.json/.parquet/.csv   a local dataset file read by `datasets`; rows are documents
    hf:NAME                a Hugging Face dataset (hf:roneneldan/TinyStories; hf:json / hf:parquet with data_files)

A corpus streams documents as str (one at a time) and has a `fingerprint` that changes when its text does.
Each file is read once, however many links or glob matches lead to it. Only regular files are read: a FIFO,
device or socket named as the corpus is refused, and a file that looks binary (many undecodable or NUL bytes),
holds one absurdly long document, or changed since its fingerprint was taken is refused when it is read, naming it.
Datasets are tinylm.data.hf_corpus's; what every corpus is, tinylm.data.source's.
"""

from __future__ import annotations

import codecs
import hashlib
import logging
import os
import stat
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from tinylm.data.hf_corpus import LOCAL_DATASET_BUILDERS, HFDataset, HFStream, check_cache_outside, check_splits_apart
from tinylm.data.local_files import files_below, glob_files
from tinylm.data.named import NAMED, download_named
from tinylm.data.named import sha256_of as _sha256
from tinylm.data.source import FINGERPRINTS, Corpus, CorpusChanged, check_unchanged, gone, memoized, stamp
from tinylm.paths import missing_path
from tinylm.tokenize.patterns import EOT

__all__ = ["EOT", "Corpus", "CorpusChanged", "HFDataset", "HFStream", "TextFiles", "open_corpus"]

log = logging.getLogger(__name__)

_READ_BYTES = 1 << 20
BINARY_FRACTION = 0.1  # a file whose bad bytes (undecodable or NUL) pass this share of those read is refused
_BINARY_MIN_BAD = 32  # ... once it has this many: a few odd bytes in a short file only warn
LONG_READ = 1 << 30  # bytes from which reading files whole at a command's start is said first (~2 s a GB)
MAX_DOCUMENT_CHARS = 1 << 30  # one document must fit in memory several times over (text, pieces, token ids)


# Counts byte sequences that were not valid UTF-8 (each becomes U+FFFD), and NUL bytes (text has none: a binary file,
# or the hole a crash left in a log); the corpus warns once of each when it is non-zero.
_replaced, _nuls = [0], [0]


def _replace_and_count(err: UnicodeDecodeError) -> tuple[str, int]:
    _replaced[0] += 1
    return "\ufffd", err.end


codecs.register_error("tinylm.replace", _replace_and_count)


class TextFiles(Corpus):
    """Local text files in the given order; each is one document unless it contains `<|endoftext|>` separators,
    in which case it is split there and each piece is stripped of surrounding whitespace (empty pieces dropped).
    Bytes that are not UTF-8 become U+FFFD, with one warning per corpus."""

    def __init__(self, spec: str, files: list[Path], memo: Path | None = None) -> None:
        self.spec, self.files = spec, files
        self.memo = memo  # where fingerprints are remembered by the files' stamps (None: hashed every time)
        self._warned: set[str] = set()

    def _docs(self, split: str) -> Iterator[str]:
        for path in self.files:
            before, nuls = _replaced[0], _nuls[0]
            n_read = yield from _read_documents(path)
            check_unchanged(getattr(self, "_stamps", {}), [path], n_read)
            if _nuls[0] != nuls and "nul" not in self._warned:
                self._warned.add("nul")
                warnings.warn(f"corpus {self.spec!r}: {path} holds {_nuls[0] - nuls} NUL byte(s), which text has none "
                              "of (a binary file, or a hole a crash left?); they are trained on as a character: remove "
                              "them (tr -d '\\000'), or the file from the corpus", stacklevel=2)
            if _replaced[0] != before and "utf-8" not in self._warned:
                self._warned.add("utf-8")
                warnings.warn(f"corpus {self.spec!r}: {path} is not valid UTF-8; {_replaced[0] - before} bad byte "
                              "sequence(s) were replaced by U+FFFD (re-encode the file as UTF-8 to keep them)",
                              stacklevel=2)

    @property
    def size_bytes(self) -> int:  # type: ignore[override]
        return sum(stamp(path)[2] for path in self.files)

    def _fingerprint(self) -> str:
        self._stamps = {path: stamp(path) for path in self.files}  # taken before the bytes are read
        return memoized(self.memo, "text", self._stamps, self._hash)

    def _hash(self) -> str:
        """The sha256 of every file's size and bytes, in order (~2 s a GB: read once per file as it is, `memoized`)."""
        h = hashlib.sha256(b"tinylm.corpus.files.v1")
        if (size := sum(s[2] for s in self._stamps.values())) >= LONG_READ:  # (a 45 GB corpus, ~100 s)
            log.info("reading corpus %r (%.1f GB) to find its tokenizer and dataset ...", self.spec, size / 1e9)
        for path in self.files:
            h.update(f"\0{self._stamps[path][2]}\0".encode())
            _sha256(path, h)
        return h.hexdigest()


_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
"""The first bytes of compressed files (a corpus downloaded as .txt.gz): named, with the fix, not "binary". (Not
zip's: a .ckpt, .pt, .docx or .npz is one, and unzipping gives no text.)"""


def _utf16(head: bytes, path: Path) -> bool:
    """Whether a file that starts with `head` is UTF-16 text: a byte-order mark (never UTF-8), whole code units."""
    if not head.startswith((b"\xff\xfe", b"\xfe\xff")) or path.stat().st_size % 2:
        return False
    try:
        head[2 : len(head) // 2 * 2].decode("utf-16-le" if head[0] == 0xFF else "utf-16-be")
    except UnicodeDecodeError:
        return False
    return True


def _compressed(head: bytes) -> bool:
    """Whether `head` starts a compressed file (bzip2's "BZh" in full, "BZh91AY&SY": a text may start "BZh")."""
    return any(head.startswith(magic) for magic in _COMPRESSED if magic != b"BZh") or \
        head[:3] == b"BZh" and head[3:4].isdigit() and head[4:10] == b"1AY&SY"


def _binary(path: Path, why: str) -> str:
    with open(path, "rb") as f:
        head = f.read(6)
    if _utf16(head, path):  # Windows' "Unicode" (Notepad's, PowerShell's >): text, in UTF-16
        return (f"corpus file {path} is UTF-16 text (it starts with a UTF-16 byte-order mark), not UTF-8: tinylm "
                f"reads UTF-8; re-encode it (e.g. iconv -f UTF-16 -t UTF-8 {path} > {path}.utf8) and pass "
                "--data.corpus PATH to that")
    kind = next((name for magic, name in _COMPRESSED.items() if head.startswith(magic)), None)
    builder = LOCAL_DATASET_BUILDERS.get(Path(path.stem).suffix.lower())  # (data.jsonl.gz: rows, compressed)
    rows = f", or read its rows as they are: --data.corpus hf:{builder} --data.data_files {path}" if builder else ""
    return f"corpus file {path} {why}" if kind is None else (
        f"corpus file {path} is {kind}-compressed, not text: tinylm reads plain text; decompress it first (e.g. "
        f"{kind} -dk {path}) and pass --data.corpus PATH to the text{rows}")


def _read_documents(path: Path) -> Generator[str, None, int]:
    """Stream `path` as text, yielding its `<|endoftext|>`-separated documents (or the whole file if none); return
    the number of bytes read."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="tinylm.replace")  # (a BOM is no text: dropped)
    buf, scan_from, split = "", 0, False
    n_read = n_bad = 0
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed by the with below)
    except FileNotFoundError:
        raise gone(path) from None
    with f:
        while True:
            chunk = f.read(_READ_BYTES)
            if not n_read and (_utf16(chunk, path) or _compressed(chunk)):  # (a small one has too few bad bytes to
                raise ValueError(_binary(path, "is not UTF-8 text"))        # be refused as binary below)
            before = _replaced[0]
            buf += decoder.decode(chunk, final=not chunk)
            _nuls[0] += (nuls := chunk.count(0))
            n_read, n_bad = n_read + len(chunk), n_bad + _replaced[0] - before + nuls
            if n_bad >= _BINARY_MIN_BAD and n_bad > BINARY_FRACTION * n_read:
                raise ValueError(_binary(path, f"looks binary, not text: {n_bad} of its first {n_read} bytes are "
                                         "undecodable as UTF-8 or NUL; remove it from the corpus or name only the text "
                                         "files (e.g. --data.corpus 'DIR/**/*.txt'), or re-encode it as UTF-8 if it "
                                         "is text"))
            if buf.find(EOT, scan_from) >= 0:  # one split per read, not one copy of the rest per document
                split = True
                *docs, buf = buf.split(EOT)
                for doc in docs:
                    if doc := doc.strip():
                        yield doc
            scan_from = max(0, len(buf) - len(EOT) + 1)  # a separator may straddle two reads
            if len(buf) > MAX_DOCUMENT_CHARS:
                raise ValueError(f"corpus file {path} holds a document of more than {MAX_DOCUMENT_CHARS:,} "
                                 f"characters; separate its documents with {EOT} or split it into several files")
            if not chunk:
                break
    if split:
        buf = buf.strip()
    if buf:
        yield buf
    return n_read


def _check_dataset_name(spec: str) -> None:
    """Refuse a `hf:` corpus that names no dataset (`hf:$DS`, DS unset: `datasets`' IndexError traceback), or one
    with a revision in its name (`hf:org/ds@main`, as `--ckpt_path gpt2@main` takes one: `datasets` said "Couldn't
    reach 'org/ds@main' on the Hub ...; check the name and the network")."""
    if not spec[3:].strip(" /"):
        raise ValueError(f"--data.corpus {spec!r} names no dataset (an unset shell variable?); pass hf:NAME, e.g. "
                         "hf:roneneldan/TinyStories")
    if "@" in spec[3:] and not os.path.exists(spec[3:]):
        name, _, revision = spec[3:].partition("@")
        raise ValueError(f"--data.corpus {spec!r} names a revision in the dataset's name, which `datasets` takes "
                         f"apart: pass --data.corpus hf:{name} --data.hf_revision {revision or 'REVISION'}")


def open_corpus(spec: str, *, cache_dir: str | Path, split: str = "train", val_split: str = "validation",
                text_column: str = "text", data_files: Any = None, hf_config: str | None = None,
                hf_revision: str | None = None, streaming: bool = False, max_documents: int | None = None,
                val_fraction: float = 0.1) -> Corpus:
    """Resolve `--data.corpus` (see the module docstring); the other arguments apply to datasets only
    (`streaming`, `max_documents`, `val_fraction`: to streamed ones, see `HFStream`)."""
    hf = {"split": split, "val_split": val_split, "text_column": text_column, "data_files": data_files,
          "config": hf_config, "revision": hf_revision}
    if not spec.strip():
        raise ValueError(f"--data.corpus is empty ({spec!r}: an unset shell variable?); pass --data.corpus PATH, "
                         "a named corpus or hf:NAME")
    if spec.startswith("hf:"):
        _check_dataset_name(spec)
    if spec[3:] in {*LOCAL_DATASET_BUILDERS.values(), "text"} and spec.startswith("hf:") and not data_files:
        raise ValueError(f"--data.corpus {spec} reads local files and needs --data.data_files PATH (a path or glob, a "
                         "list, or {train: ..., validation: ...}); without it `datasets` reads every data file of the "
                         "current folder. Or pass --data.corpus FILE (.jsonl, .parquet, .csv, .txt)")
    check_splits_apart(data_files, split, val_split, spec[3:] if spec.startswith("hf:") else "")
    if spec.startswith("hf:"):
        check_cache_outside(spec, spec[3:], data_files, cache_dir)
    if streaming:
        builder = LOCAL_DATASET_BUILDERS.get(Path(spec).suffix.lower())
        if spec.startswith("hf:"):
            path = spec[3:]
        elif builder and Path(spec).is_file():
            path, hf["data_files"] = builder, spec
        else:
            raise ValueError(f"--data.streaming reads hf:NAME or a local .jsonl/.json/.parquet/.csv dataset file, "
                             f"not {spec!r} (text files are read as a stream already); drop --data.streaming")
        return HFStream(spec, path, **hf, max_documents=max_documents, val_fraction=val_fraction, cache_dir=cache_dir)
    if spec in NAMED:
        return TextFiles(spec, [download_named(spec, cache_dir)], memo=Path(cache_dir) / FINGERPRINTS)
    if spec.startswith("hf:"):
        return HFDataset(spec, spec[3:], **hf, cache_dir=cache_dir)
    path = Path(spec).expanduser()
    if path.is_dir():
        if any((path / name).is_file() for name in ("dataset_dict.json", "state.json")):  # (its Arrow is no text)
            raise ValueError(f"corpus {spec!r} is a folder `datasets` saved (save_to_disk); pass --data.corpus "
                             f"hf:{spec} to read its rows")
        files = _unique_files(files_below(path, cache_dir=cache_dir))
        if not files:
            raise ValueError(f"corpus directory {spec!r} holds no files; put text files in it or pass "
                             "--data.corpus PATH")
        return _files_corpus(spec, files, hf, cache_dir)
    if path.exists() and not path.is_file():
        raise ValueError(f"corpus {spec!r} is a {_file_kind(path)}, not a regular file: it could be read forever; "
                         "save the text to a file first and pass --data.corpus PATH to it")
    if path.is_file():
        builder = LOCAL_DATASET_BUILDERS.get(path.suffix.lower())
        if builder:
            return HFDataset(spec, builder, **{**hf, "data_files": str(path)}, cache_dir=cache_dir)
        return TextFiles(spec, [path], memo=Path(cache_dir) / FINGERPRINTS)
    if any(c in spec for c in "*?["):
        files = _unique_files(glob_files(str(path), cache_dir=cache_dir))
        if not files:
            raise FileNotFoundError(f"corpus glob {spec!r} matches no files; pass --data.corpus PATH")
        return _files_corpus(spec, files, hf, cache_dir)
    raise _not_found(spec, path)


def _not_found(spec: str, path: Path) -> FileNotFoundError:
    """The error for a corpus ``spec`` that names nothing here; a relative one says the folder it was looked for in."""
    if (why := missing_path(path)) != "not found":  # a link loop or a dangling link is not a missing file
        return FileNotFoundError(f"corpus {spec!r} {why}; pass --data.corpus PATH")
    where = "" if path.is_absolute() else f" in the current folder, {os.getcwd()}, where a relative path is read from"
    return FileNotFoundError(f"corpus {spec!r} not found (no such file or directory{where}; not a named corpus "
                             f"{sorted(NAMED)}, not hf:NAME); pass --data.corpus PATH")


def _files_corpus(spec: str, files: list[Path], hf: dict, cache_dir: str | Path) -> Corpus:
    """Text files as text; dataset files (.jsonl, .parquet, ...) of one kind as one dataset of all of them."""
    builders = {LOCAL_DATASET_BUILDERS.get(p.suffix.lower()) for p in files}
    if builders == {None}:
        return TextFiles(spec, files, memo=Path(cache_dir) / FINGERPRINTS)
    if len(builders) == 1:
        builder = builders.pop()
        return HFDataset(spec, builder, **{**hf, "data_files": [str(p) for p in files]}, cache_dir=cache_dir)
    kinds = sorted({p.suffix.lower() or "(no suffix)" for p in files})
    raise ValueError(f"corpus {spec!r} mixes files of different kinds ({', '.join(kinds)}): text and dataset "
                     "files, or datasets of two formats, cannot be read as one; name one kind, e.g. --data.corpus "
                     "'DIR/**/*.txt' or 'DIR/**/*.jsonl'")


def _unique_files(files: list[Path]) -> list[Path]:
    """`files` without repeats of one file: a symlink loop under a `**` glob (dir/loop -> dir) or a link beside
    its target would otherwise put the same text in the corpus many times, in both train and val."""
    first: dict[str, Path] = {}
    for path in files:
        first.setdefault(os.path.realpath(path), path)
    return list(first.values())


def _file_kind(path: Path) -> str:
    mode = path.stat().st_mode
    kinds = ((stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISCHR, "character device"),
             (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))
    return next((name for test, name in kinds if test(mode)), "special file")
