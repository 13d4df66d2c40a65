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
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import itertools
import json
import logging
import os
import shutil
import stat
import warnings
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

from tinylm.data.local_files import files_below, glob_files
from tinylm.data.named import NAMED, download_named
from tinylm.data.named import sha256_of as _sha256
from tinylm.errors import DISK_ERRNOS, TinyLMError
from tinylm.net import hub_offline, hub_unreachable
from tinylm.paths import missing_path
from tinylm.progress import datasets_bars
from tinylm.tokenize.patterns import EOT

log = logging.getLogger(__name__)

_READ_BYTES = 1 << 20
BINARY_FRACTION = 0.1  # a file whose bad bytes (undecodable or NUL) pass this share of those read is refused
_BINARY_MIN_BAD = 32  # ... once it has this many: a few odd bytes in a short file only warn
MAX_DOCUMENT_CHARS = 1 << 30  # one document must fit in memory several times over (text, pieces, token ids)


def _text(value: Any, path: str, column: str) -> str:
    """A row's document, checked: a column of numbers or lists is no text to train on."""
    if not isinstance(value, str):  # a bad input, not a bug: ValueError is the kind the CLI prints as one line
        raise ValueError(f"dataset {path!r}: column {column!r} holds {type(value).__name__} values (e.g. "  # noqa: TRY004
                         f"{str(value)[:40]!r}), not text; pass --data.text_column NAME of a column of text")
    return value


def _texts(values: Iterable[Any], spec: str, path: str, column: str, split: str, said: set) -> Iterator[str]:
    """A split's documents from its `column`: anything but text is refused; a row without it (None: a JSON line
    with other keys, or a null) is skipped and counted, and the count said when the split has been read, once a
    corpus and split (``said``: the splits said; a stream is read in several passes, some cut short)."""
    missing = rows = 0
    try:
        for value in values:
            rows += 1
            if value is None:
                missing += 1
            elif text := _text(value, path, column):
                yield text
    finally:  # (also when a stream's reader stops early: what was read so far)
        if missing and split not in said:
            said.add(split)
            warnings.warn(f"corpus {spec!r}: {missing:,} of the {rows:,} rows read of its {split} split have no "
                          f"{column!r} (missing or null) and were skipped; if the text is in another column, pass "
                          "--data.text_column NAME", stacklevel=2)


_LOCAL_DATASET_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _dataset_name(spec: str, path: str, data_files: Any) -> str:
    """How messages name a dataset: its hub name, or for local files (hf:json with --data.data_files, a .jsonl)
    the files, not the loader that reads them ("dataset 'json' has no column 'text'")."""
    if path not in {*_LOCAL_DATASET_BUILDERS.values(), "text"}:
        return path
    if not spec.startswith("hf:"):
        return spec
    files = [data_files] if isinstance(data_files, str) else data_files
    if isinstance(files, (list, tuple)) and files:
        return str(files[0]) + (f" (and {len(files) - 1} more)" if len(files) > 1 else "")
    return str(data_files) if data_files else path


def _hub_unreachable(path: str) -> str | None:
    """Why dataset ``path`` is loaded in Hugging Face's offline mode (`tinylm.net.hub_offline`: its cache, or a
    failure at once), or None: it is on the hub and the hub cannot be reached (`datasets` retried for ~26 s, a log
    line each time: `tinylm plan` of the tinystories recipe took 28 s offline)."""
    return None if path in {*_LOCAL_DATASET_BUILDERS.values(), "text"} else hub_unreachable()

# Counts byte sequences that were not valid UTF-8 (each becomes U+FFFD); the corpus warns once when it is non-zero.
_replaced = [0]


def _replace_and_count(err: UnicodeDecodeError) -> tuple[str, int]:
    _replaced[0] += 1
    return "\ufffd", err.end


codecs.register_error("tinylm.replace", _replace_and_count)


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


class TextFiles(Corpus):
    """Local text files in the given order; each is one document unless it contains `<|endoftext|>` separators,
    in which case it is split there and each piece is stripped of surrounding whitespace (empty pieces dropped).
    Bytes that are not UTF-8 become U+FFFD, with one warning per corpus."""

    def __init__(self, spec: str, files: list[Path]) -> None:
        self.spec, self.files = spec, files
        self._warned = False

    def _docs(self, split: str) -> Iterator[str]:
        for path in self.files:
            before = _replaced[0]
            n_read = yield from _read_documents(path)
            _check_unchanged(getattr(self, "_stamps", {}), [path], n_read)
            if _replaced[0] != before and not self._warned:
                self._warned = True
                warnings.warn(f"corpus {self.spec!r}: {path} is not valid UTF-8; {_replaced[0] - before} bad byte "
                              "sequence(s) were replaced by U+FFFD (re-encode the file as UTF-8 to keep them)",
                              stacklevel=2)

    @property
    def size_bytes(self) -> int:  # type: ignore[override]
        return sum(_stamp(path)[2] for path in self.files)

    def _fingerprint(self) -> str:
        h = hashlib.sha256(b"tinylm.corpus.files.v1")
        self._stamps = {path: _stamp(path) for path in self.files}  # taken before the bytes are read
        for path in self.files:
            h.update(f"\0{self._stamps[path][2]}\0".encode())
            _sha256(path, h)
        return h.hexdigest()


_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
"""The first bytes of compressed files (a corpus downloaded as .txt.gz): named, with the fix, not "binary". (Not
zip's: a .ckpt, .pt, .docx or .npz is one, and unzipping gives no text.)"""


def _binary(path: Path, why: str) -> str:
    with open(path, "rb") as f:
        head = f.read(6)
    kind = next((name for magic, name in _COMPRESSED.items() if head.startswith(magic)), None)
    return f"corpus file {path} {why}" if kind is None else (
        f"corpus file {path} is {kind}-compressed, not text: tinylm reads plain text; decompress it first (e.g. "
        f"{kind} -dk {path}) and pass --data.corpus PATH to the text")


class CorpusChanged(TinyLMError):
    """A corpus file changed between its fingerprint and the end of a read of it."""


def _check_unchanged(stamps: dict[Path, tuple], paths: list[Path] | None = None, n_read: int | None = None) -> None:
    """Refuse a file read whole (``n_read`` bytes) that is not the one its fingerprint hashed (``stamps``: taken then;
    ``paths``: all of them): what is made of it would be stored under a key that lies about its text."""
    for path in stamps if paths is None else paths:
        stamp = stamps.get(path)  # (none: a file never fingerprinted keys nothing)
        if stamp and (n_read not in (None, stamp[2]) or (_stamp(path) if path.exists() else ()) != stamp):
            raise CorpusChanged(f"corpus file {path} changed while it was read (something is writing to it); run "
                                "again when it is no longer written to")


def _stamp(path: Path) -> tuple[int, ...]:
    """What changes with a file's bytes: inode (a file renamed over it), size, mtime, ctime (set by every write)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise _gone(path) from None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _gone(path: Path) -> CorpusChanged:
    """A corpus file listed (or fingerprinted) and then removed or renamed before it was read."""
    return CorpusChanged(f"corpus file {path} was removed (or renamed) while the corpus was read; run again when "
                         "nothing is moving its files, or leave it out of --data.corpus")


def _read_documents(path: Path) -> Generator[str, None, int]:
    """Stream `path` as text, yielding its `<|endoftext|>`-separated documents (or the whole file if none); return
    the number of bytes read."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="tinylm.replace")
    buf, scan_from, split = "", 0, False
    n_read = n_bad = 0
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed by the with below)
    except FileNotFoundError:
        raise _gone(path) from None
    with f:
        while True:
            chunk = f.read(_READ_BYTES)
            before = _replaced[0]
            buf += decoder.decode(chunk, final=not chunk)
            n_read, n_bad = n_read + len(chunk), n_bad + _replaced[0] - before + chunk.count(0)
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


class HFDataset(Corpus):
    """A Hugging Face dataset; each row's `text_column` is one document. Loaded (and cached as Arrow, memory-
    mapped) by `datasets.load_dataset`; also reads local json/parquet/csv/text files through `data_files`."""

    def __init__(self, spec: str, path: str, *, split: str = "train", val_split: str = "validation",
                 text_column: str = "text", data_files: Any = None, config: str | None = None,
                 revision: str | None = None, cache_dir: str | Path | None = None) -> None:
        self.spec, self.path, self.split, self.val_split = spec, path, split, val_split
        self.text_column, self.data_files, self.config, self.revision = text_column, data_files, config, revision
        self.cache_dir = cache_dir
        self._dd: Any = None
        self._said: set = set()  # the splits whose rows without text were counted in a warning
        self._files: Any = None

    @property
    def shown(self) -> str:
        return _dataset_name(self.spec, self.path, self.data_files)

    @property
    def files(self) -> Any:
        """`data_files` with each local file's sha256 (see `_hash_files`), computed once."""
        if self._files is None:
            self._stamps = {path: _stamp(path) for path in _local_files(self.data_files)}  # before their bytes are read
            self._files = _hash_files(self.data_files)
        return self._files

    def _load(self) -> Any:
        if self._dd is None:
            import datasets

            # `datasets` caches a local file's rows under its path and mtime: an edit that keeps the mtime (cp -p,
            # rsync -a, tar x) would load the old rows. Local files get an Arrow cache keyed by their contents.
            local = None
            if self.cache_dir is not None and _local_files(self.data_files):
                key = hashlib.sha256(json.dumps(self.files, sort_keys=True).encode()).hexdigest()[:16]
                local = str(Path(self.cache_dir) / "hf-local" / key)
            offline = _hub_unreachable(self.path)
            try:
                with hub_offline(offline is not None), datasets_bars():
                    self._dd = datasets.load_dataset(self.path, name=self.config, data_files=self.data_files,
                                                     revision=self.revision, cache_dir=local)
            except (FileNotFoundError, ConnectionError, OSError) as e:
                if e.errno in DISK_ERRNOS:  # a read-only or full CACHE/hf-local: the CLI names it and the fix
                    raise
                if self.path in {*_LOCAL_DATASET_BUILDERS.values(), "text"} and self.data_files \
                        and not _local_files(self.data_files):
                    raise FileNotFoundError(f"--data.data_files {self.data_files!r} matches no file; check the paths "
                                            "and globs") from None
                raise type(e)(f"could not load Hugging Face dataset {self.path!r} ({offline or e}); check the name "
                              "and the network (HF_DATASETS_OFFLINE), or pass --data.corpus PATH to local files") from e
            except StopIteration:  # hf:json with data_files matching nothing (datasets finds no file to infer from)
                _refuse_blank(self.spec, self.data_files)  # or only empty files
                raise FileNotFoundError(f"--data.data_files {self.data_files!r} matches no file; check the paths "
                                        "and globs") from None
            except datasets.exceptions.DatasetsError as e:  # e.g. a malformed .jsonl: "An error occurred ..."
                cause = e.__cause__ or e
                raise ValueError(f"could not read {self.data_files or self.path!r} as a {self.path} dataset "
                                 f"({type(cause).__name__}: {str(cause).strip()[:300]}); fix the file, or pass "
                                 "--data.corpus PATH to plain text files") from e
            except ValueError as e:  # 'Instruction "train" corresponds to no data!': files of blank lines
                _refuse_blank(self.spec, self.data_files)
                if "corresponds to no data" not in str(e):
                    raise
                raise ValueError(f"corpus {self.spec!r} has no rows (a header or blank lines only); pass "
                                 "--data.corpus PATH to a corpus with text") from None
            try:  # rows read from files that changed since they were hashed: a cache whose key lies about them
                _check_unchanged(getattr(self, "_stamps", {}))
            except CorpusChanged:
                if local:
                    shutil.rmtree(local, ignore_errors=True)
                raise
            if self.split not in self._dd:
                raise ValueError(f"dataset {self.shown!r} has no split {self.split!r}; it has {list(self._dd)} "
                                 "(--data.split)")
            columns = self._dd[self.split].column_names
            if self.text_column not in columns:
                raise ValueError(f"dataset {self.shown!r} has no column {self.text_column!r}; its columns are "
                                 f"{columns} (--data.text_column)")
        return self._dd

    @property
    def has_validation(self) -> bool:  # type: ignore[override]
        return self.val_split in self._load() and self.val_split != self.split

    @property
    def size_bytes(self) -> int | None:  # type: ignore[override]
        dd = self._load()  # Arrow bytes of the splits read: close to the text's size
        return sum(dd[s].data.nbytes for s in {self.split, self.val_split} if s in dd) or None

    def _docs(self, split: str) -> Iterator[str]:
        name = self.split if split == "train" else self.val_split
        values = (v for batch in self._load()[name].iter(batch_size=1000) for v in batch[self.text_column])
        yield from _texts(values, self.spec, self.shown, self.text_column, name, self._said)

    def _fingerprint(self) -> str:
        dd = self._load()
        key = {"path": self.path, "config": self.config, "revision": self.revision, "split": self.split,
               "val_split": self.val_split if self.has_validation else None, "column": self.text_column}
        if _local_files(self.data_files):  # local files: their contents, wherever they lie and whatever their mtime
            key["contents"] = self.files
        else:  # hub data: datasets' own fingerprint follows the resolved revision
            key["data"] = {k: getattr(dd[k], "_fingerprint", None) for k in sorted(dd)}
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


class HFStream(Corpus):
    """A Hugging Face dataset read with `streaming=True`: rows arrive as they are downloaded and only the tokens
    are kept. Training takes `max_documents` documents of `split` (None: all). Validation is the dataset's own
    `val_split` when it has one (its first `val_documents`), else a held-out head: the first `val_documents`
    documents of `split`, which training then skips (taking the `max_documents` after them)."""

    has_validation = True

    def __init__(self, spec: str, path: str, *, split: str, val_split: str, text_column: str, data_files: Any,
                 config: str | None, revision: str | None, max_documents: int | None,
                 val_fraction: float) -> None:
        self.spec, self.path, self.split, self.val_split = spec, path, split, val_split
        self.text_column, self.data_files, self.config, self.revision = text_column, data_files, config, revision
        self.max_documents = max_documents
        self.val_documents = None if max_documents is None else max(1, int(val_fraction * max_documents))
        self._dd: Any = None
        self._said: set = set()  # the splits whose rows without text were counted in a warning

    def _load(self) -> Any:
        if self._dd is None:
            import datasets

            offline = _hub_unreachable(self.path)
            try:
                with hub_offline(offline is not None), datasets_bars():
                    self._dd = datasets.load_dataset(self.path, name=self.config, data_files=self.data_files,
                                                     revision=self.revision, streaming=True)
            except (FileNotFoundError, ConnectionError, OSError, datasets.exceptions.DatasetsError) as e:
                why = offline or f"{type(e).__name__}: {e}"
                raise ValueError(f"could not stream Hugging Face dataset {self.path!r} ({why}); check the name, the "
                                 "network and --data.data_files") from e
            except StopIteration:  # no file with a row to infer the columns from
                _refuse_blank(self.spec, self.data_files)
                raise FileNotFoundError(f"--data.data_files {self.data_files!r} matches no file; check the paths "
                                        "and globs") from None
            if self.split not in self._dd:
                raise ValueError(f"dataset {self.shown!r} has no split {self.split!r}; it has {list(self._dd)} "
                                 "(--data.split)")
            columns = getattr(self._dd[self.split], "column_names", None)  # (None: not known before reading)
            if columns and self.text_column not in columns:  # (it read as an empty corpus)
                raise ValueError(f"dataset {self.shown!r} has no column {self.text_column!r}; its columns are "
                                 f"{columns} (--data.text_column)")
            if self.val_source == "held-out head" and self.max_documents is None:
                raise ValueError(f"streamed dataset {self.shown!r} has no {self.val_split!r} split, so validation "
                                 "is a held-out head of the train split, and its size needs --data.max_documents N "
                                 "(val is the first val_fraction x N documents)")
        return self._dd

    @property
    def shown(self) -> str:
        return _dataset_name(self.spec, self.path, self.data_files)

    @property
    def val_source(self) -> str:
        """"validation split" (the dataset's own) or "held-out head" (the first documents of the train split)."""
        return "validation split" if self.val_split in self._load() and self.val_split != self.split \
            else "held-out head"

    def _rows(self, split: str) -> Iterator[str]:
        return _texts(self._values(split), self.spec, self.shown, self.text_column, split, self._said)

    def _values(self, split: str) -> Iterator[Any]:
        import datasets

        rows = self._load()[split]  # (its own refusals stay as they are)
        try:
            for row in rows:
                yield row.get(self.text_column)
        except (ValueError, datasets.exceptions.DatasetsError) as e:  # rows `datasets` cannot read as it streams
            # (a validation file with other columns than train's: CastError, a traceback; read whole: one line)
            raise ValueError(f"could not read the {split} rows of {self.shown!r} as a {self.path} dataset "
                             f"({type(e).__name__}: {str(e).strip().splitlines()[0][:200]}); give every file the "
                             "same columns, or fix the file") from e

    def _docs(self, split: str) -> Iterator[str]:
        head = self.val_source == "held-out head"
        if split == "train":
            start = self.val_documents if head else 0
            stop = None if self.max_documents is None else start + self.max_documents
            return itertools.islice(self._rows(self.split), start, stop)
        return itertools.islice(self._rows(self.split if head else self.val_split), self.val_documents)

    def _fingerprint(self) -> str:
        # a stream cannot be hashed without reading it: local files are hashed, hub data is named by its revision
        # (pin --data.hf_revision to make it reproducible)
        key = {"path": self.path, "config": self.config, "revision": self.revision, "split": self.split,
               "val_split": self.val_split, "column": self.text_column, "max_documents": self.max_documents,
               "val_documents": self.val_documents, "val_source": self.val_source,
               "files": _hash_files(self.data_files)}
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def _hash_files(data_files: Any) -> Any:
    """`data_files` (a path or glob, a list, or {split: path(s)}) with each local file replaced by "sha256:<hex>" of
    its contents, in path order: a corpus moved, copied or named by another path is the same text. A name that
    matches no local file (a hub dataset's) stays as given."""
    if isinstance(data_files, dict):
        return {k: _hash_files(v) for k, v in sorted(data_files.items())}
    if isinstance(data_files, (list, tuple)):
        return [_hash_files(v) for v in data_files]
    if isinstance(data_files, str):
        return [f"sha256:{_sha256(Path(p))}" for p in sorted(glob.glob(data_files, recursive=True))
                if Path(p).is_file()] or data_files
    return data_files


def _check_splits_apart(data_files: Any, split: str, val_split: str) -> None:
    """Refuse `data_files` giving train and validation one file (val/loss scored training text) or a split unread."""
    if unread := [str(k) for k in data_files if k not in (split, val_split)] if isinstance(data_files, dict) else []:
        raise ValueError(f"--data.data_files names the split {unread[0]!r}, which neither --data.split {split!r} nor "
                         f"--data.val_split {val_split!r} reads, so its files would never be read; pass --data.val_split"
                         f" {unread[0]} (or --data.split), or leave it out")
    if not isinstance(data_files, dict) or split == val_split:
        return
    real = lambda name: {os.path.realpath(p) for p in _local_files(data_files.get(name))}
    if shared := sorted(real(split) & real(val_split)):
        raise ValueError(f"--data.data_files gives the {split!r} and {val_split!r} splits the same file {shared[0]}: "
                         "validation would score text the model trains on; give validation files of its own, or "
                         f"leave {val_split!r} out (the last --data.val_fraction of {split!r} is then validation)")


def _local_files(data_files: Any) -> list[Path]:
    """The local files `data_files` (a path or glob, a list, or {split: path(s)}) names."""
    if isinstance(data_files, dict):
        return [p for v in data_files.values() for p in _local_files(v)]
    if isinstance(data_files, (list, tuple)):
        return [p for v in data_files for p in _local_files(v)]
    if isinstance(data_files, str):
        return [Path(p) for p in glob.glob(data_files, recursive=True) if Path(p).is_file()]
    return []


def _refuse_blank(spec: str, data_files: Any) -> None:
    """An empty corpus, when `data_files` names local files that hold nothing but whitespace: `datasets` finds no
    row in them and says so in its own words (a StopIteration, "Instruction "train" corresponds to no data!")."""
    files = _local_files(data_files)  # (read only once loading failed)
    if files and not any(f.read_bytes().strip() for f in files):
        raise ValueError(f"corpus {spec!r} is empty (no text in it); pass --data.corpus PATH to a corpus with text")


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
    if spec.startswith("hf:") and not spec[3:].strip(" /"):
        raise ValueError(f"--data.corpus {spec!r} names no dataset (an unset shell variable?); pass hf:NAME, e.g. "
                         "hf:roneneldan/TinyStories")
    if spec[3:] in {*_LOCAL_DATASET_BUILDERS.values(), "text"} and spec.startswith("hf:") and not data_files:
        raise ValueError(f"--data.corpus {spec} reads local files and needs --data.data_files PATH (a path or glob, a "
                         "list, or {train: ..., validation: ...}); without it `datasets` reads every data file of the "
                         "current folder. Or pass --data.corpus FILE (.jsonl, .parquet, .csv, .txt)")
    _check_splits_apart(data_files, split, val_split)
    if streaming:
        builder = _LOCAL_DATASET_BUILDERS.get(Path(spec).suffix.lower())
        if spec.startswith("hf:"):
            path = spec[3:]
        elif builder and Path(spec).is_file():
            path, hf["data_files"] = builder, spec
        else:
            raise ValueError(f"--data.streaming reads hf:NAME or a local .jsonl/.json/.parquet/.csv dataset file, "
                             f"not {spec!r} (text files are read as a stream already); drop --data.streaming")
        return HFStream(spec, path, **hf, max_documents=max_documents, val_fraction=val_fraction)
    if spec in NAMED:
        return TextFiles(spec, [download_named(spec, cache_dir)])
    if spec.startswith("hf:"):
        return HFDataset(spec, spec[3:], **hf, cache_dir=cache_dir)
    path = Path(spec).expanduser()
    if path.is_dir():
        files = _unique_files(files_below(path, cache_dir=cache_dir))
        if not files:
            raise ValueError(f"corpus directory {spec!r} holds no files; put text files in it or pass "
                             "--data.corpus PATH")
        return _files_corpus(spec, files, hf, cache_dir)
    if path.exists() and not path.is_file():
        raise ValueError(f"corpus {spec!r} is a {_file_kind(path)}, not a regular file: it could be read forever; "
                         "save the text to a file first and pass --data.corpus PATH to it")
    if path.is_file():
        builder = _LOCAL_DATASET_BUILDERS.get(path.suffix.lower())
        if builder:
            return HFDataset(spec, builder, **{**hf, "data_files": str(path)}, cache_dir=cache_dir)
        return TextFiles(spec, [path])
    if any(c in spec for c in "*?["):
        files = _unique_files(glob_files(str(path), cache_dir=cache_dir))
        if not files:
            raise FileNotFoundError(f"corpus glob {spec!r} matches no files; pass --data.corpus PATH")
        return _files_corpus(spec, files, hf, cache_dir)
    if (why := missing_path(path)) != "not found":  # a link loop or a dangling link is not a missing file
        raise FileNotFoundError(f"corpus {spec!r} {why}; pass --data.corpus PATH")
    raise FileNotFoundError(f"corpus {spec!r} not found (no such file or directory, not a named corpus "
                            f"{sorted(NAMED)}, not hf:NAME); pass --data.corpus PATH")


def _files_corpus(spec: str, files: list[Path], hf: dict, cache_dir: str | Path) -> Corpus:
    """Text files as text; dataset files (.jsonl, .parquet, ...) of one kind as one dataset of all of them."""
    builders = {_LOCAL_DATASET_BUILDERS.get(p.suffix.lower()) for p in files}
    if builders == {None}:
        return TextFiles(spec, files)
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
