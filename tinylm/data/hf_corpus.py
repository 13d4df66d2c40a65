"""Hugging Face datasets as corpora: a hub dataset (`hf:NAME`), local dataset files (.jsonl, .json, .parquet, .csv,
or `hf:json` with `--data.data_files`), whole or streamed. `tinylm.data.corpus.open_corpus` makes them; each is a
`Corpus` whose fingerprint follows the contents of its local files (wherever they lie, whatever their mtime) or the
hub's revision."""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tinylm.data.local_files import below_run_folder, is_run_folder
from tinylm.data.named import sha256_of as _sha256
from tinylm.data.source import FINGERPRINTS, Corpus, CorpusChanged, check_unchanged, memoized, stamp
from tinylm.errors import DISK_ERRNOS
from tinylm.net import hub_offline, hub_unreachable
from tinylm.progress import datasets_bars


def _text(value: Any, path: str, column: str) -> str:
    """A row's document, checked: a column of numbers or lists is no text to train on."""
    if not isinstance(value, str):  # a bad input, not a bug: ValueError is the kind the CLI prints as one line
        raise ValueError(f"dataset {path!r}: column {column!r} holds {type(value).__name__} values (e.g. "  # noqa: TRY004
                         f"{str(value)[:40]!r}), not text; pass --data.text_column NAME of a column of text")
    return value


def _texts(values: Iterable[Any], spec: str, path: str, column: str, split: str, said: set | None,
           limit: int | None = None) -> Iterator[str]:
    """A split's documents from its `column` (its first `limit`; None: all): anything but text is refused; a row
    without it (None: a JSON line with other keys, or a null) is skipped and counted, and the count said once a pass
    has read them all, once a corpus and split (``said``: the splits said; a stream is read in several passes;
    None: say nothing). A pass its reader stops early (the check that a corpus is not empty reads one document)
    says nothing: its count would be of the few rows it read ("1 of the 2 rows read")."""
    missing = rows = kept = 0
    whole = False
    try:
        for value in values if limit != 0 else ():
            rows += 1
            if value is None:
                missing += 1
            elif text := _text(value, path, column):
                kept += 1
                yield text
                if kept == limit:
                    break
        whole = True
    finally:
        if whole and missing and said is not None and split not in said:
            said.add(split)
            warnings.warn(f"corpus {spec!r}: {missing:,} of the {rows:,} rows read of its {split} split have no "
                          f"{column!r} (missing or null) and were skipped; if the text is in another column, pass "
                          "--data.text_column NAME", stacklevel=2)


LOCAL_DATASET_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _dataset_name(spec: str, path: str, data_files: Any) -> str:
    """How messages name a dataset: its hub name, or for local files (hf:json with --data.data_files, a .jsonl)
    the files, not the loader that reads them ("dataset 'json' has no column 'text'")."""
    if path not in {*LOCAL_DATASET_BUILDERS.values(), "text"}:
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
    local = path in {*LOCAL_DATASET_BUILDERS.values(), "text"} or Path(path).expanduser().is_dir()
    return None if local else hub_unreachable()


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
    def sources(self) -> Any:
        return _sources(self.path, self.data_files)

    @property
    def files(self) -> Any:
        """`sources` with each local file's sha256 (see `_hash_files`), computed once."""
        if self._files is None:
            self._stamps = {path: stamp(path) for path in local_files(self.sources)}  # before their bytes are read
            # the hashes read every byte (a folder of parquet shards: minutes): once per file as it is
            memo = Path(self.cache_dir) / FINGERPRINTS if self.cache_dir is not None else None
            self._files = memoized(memo, ["data_files", self.sources], self._stamps,
                                   lambda: _hash_files(self.sources))
        return self._files

    def _load(self) -> Any:
        if self._dd is None:
            import datasets

            # `datasets` caches a local file's rows under its path and mtime: an edit that keeps the mtime (cp -p,
            # rsync -a, tar x) would load the old rows. Local files get an Arrow cache keyed by their contents.
            local = None
            if self.cache_dir is not None and local_files(self.sources):
                key = hashlib.sha256(json.dumps(self.files, sort_keys=True).encode()).hexdigest()[:16]
                local = str(Path(self.cache_dir) / "hf-local" / key)
            offline = _hub_unreachable(self.path)
            try:
                with hub_offline(offline is not None), datasets_bars(), _parse_errors_unlogged(self.path):
                    if not self.data_files and (Path(self.path).expanduser() / "state.json").is_file():
                        # one Dataset that `save_to_disk` wrote (load_dataset refuses it; a DatasetDict's it reads)
                        self._dd = datasets.DatasetDict({self.split: datasets.load_from_disk(self.path)})
                    else:
                        self._dd = datasets.load_dataset(_load_path(self.path), name=self.config,
                                                         data_files=self.data_files, revision=self.revision,
                                                         cache_dir=local)
            except (FileNotFoundError, ConnectionError, OSError) as e:
                if e.errno in DISK_ERRNOS:  # a read-only or full CACHE/hf-local: the CLI names it and the fix
                    raise
                if self.path in {*LOCAL_DATASET_BUILDERS.values(), "text"} and self.data_files \
                        and not local_files(self.data_files):
                    raise FileNotFoundError(f"--data.data_files {self.data_files!r} matches no file; check the paths "
                                            "and globs") from None
                if self.path in LOCAL_DATASET_BUILDERS.values() and local_files(self.data_files):
                    raise _unreadable(self.data_files, self.path, e) from e  # a damaged file, not the network
                raise type(e)(f"could not load Hugging Face dataset {self.path!r} ({offline or e}); check the name "
                              "and the network (HF_DATASETS_OFFLINE), or pass --data.corpus PATH to local files") from e
            except StopIteration:  # hf:json with data_files matching nothing (datasets finds no file to infer from)
                raise self._no_files() from None  # or only empty files
            except datasets.exceptions.DatasetsError as e:  # e.g. a malformed .jsonl: "An error occurred ..."
                raise _unreadable(self.data_files or self.path, self.path, e.__cause__ or e) from e
            except ValueError as e:  # 'Instruction "train" corresponds to no data!': files of blank lines
                _refuse_blank(self.spec, self.sources)
                if "corresponds to no data" not in str(e):
                    if self.path in LOCAL_DATASET_BUILDERS.values() and local_files(self.data_files):
                        # pyarrow's ArrowInvalid (a ValueError) from a .parquet cut short or not parquet at all
                        raise _unreadable(self.data_files, self.path, e) from e
                    raise
                raise self._no_rows(str(e)) from None
            try:  # rows read from files that changed since they were hashed: a cache whose key lies about them
                check_unchanged(getattr(self, "_stamps", {}))
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

    def _no_files(self) -> Exception:
        """`datasets`' StopIteration (it found no file to infer the rows' kind from), in words: the files are all
        empty, one split's file is, or --data.data_files matches none."""
        _refuse_blank(self.spec, self.sources)
        blank = [f for f in local_files(self.sources) if not f.read_bytes().strip()]
        if blank and not self.data_files:
            # hf:DIR whose train.jsonl is empty beside a validation.jsonl with rows (no --data.data_files)
            return ValueError(f"corpus {self.spec!r}: {blank[0]} has no rows (empty, or blank lines only); give it "
                              "rows, or remove it")
        return FileNotFoundError(f"--data.data_files {self.data_files!r} matches no file; check the paths and globs")

    def _no_rows(self, said: str) -> ValueError:
        """`datasets`' 'Instruction "validation" corresponds to no data!', in words naming the split."""
        empty = said.split('"')[1] if said.count('"') >= 2 else self.split
        if empty != self.split:  # (a train file with rows beside an empty validation file)
            return ValueError(f"corpus {self.spec!r} has no rows in its {empty!r} split (its files are empty, a "
                              "header or blank lines only); give them rows, or remove them (validation is then the "
                              "last --data.val_fraction of the train split)")
        return ValueError(f"corpus {self.spec!r} has no rows (a header or blank lines only); pass --data.corpus "
                          "PATH to a corpus with text")

    @property
    def has_validation(self) -> bool:  # type: ignore[override]
        return self.val_split in self._load() and self.val_split != self.split

    @property
    def size_bytes(self) -> int | None:  # type: ignore[override]
        dd = self._load()  # Arrow bytes of the text column of the splits read: close to the text's size (the whole
        # rows' bytes counted other columns too: a wide one made a tokenizer's sample a fraction of what was asked)
        return sum(dd[s].data.column(self.text_column).nbytes for s in {self.split, self.val_split}
                   if s in dd and self.text_column in dd[s].column_names) or None

    def _docs(self, split: str) -> Iterator[str]:
        name = self.split if split == "train" else self.val_split
        values = (v for batch in self._load()[name].iter(batch_size=1000) for v in batch[self.text_column])
        yield from _texts(values, self.spec, self.shown, self.text_column, name, self._said)

    def _fingerprint(self, *, by_datasets: bool = False) -> str:
        dd = self._load()
        key = {"path": self.path, "config": self.config, "revision": self.revision, "split": self.split,
               "val_split": self.val_split if self.has_validation else None, "column": self.text_column}
        if local_files(self.sources) and not by_datasets:  # local files: their contents, wherever they lie and
            key["contents"] = self.files  # whatever their mtime
        else:  # hub data: datasets' own fingerprint follows the resolved revision
            key["data"] = {k: getattr(dd[k], "_fingerprint", None) for k in sorted(dd)}
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def older_fingerprint(self) -> str | None:
        """The fingerprint an older tinylm gave `hf:DIR --data.data_files ...` (datasets' own, of the files' paths
        and mtimes: it looked for the data files in the current folder and found none), or None for any other
        dataset. A run trained on one then resumes on the same files (it was refused as other text)."""
        return self._fingerprint(by_datasets=True) if self.data_files and _local_folder(self.path) else None


def held_out(val_fraction: float, max_documents: int) -> int:
    """The documents a stream of ``max_documents`` holds out at its head for validation (where it has no split of its
    own): val_fraction of them, at least one."""
    return max(1, int(val_fraction * max_documents))


class HFStream(Corpus):
    """A Hugging Face dataset read with `streaming=True`: rows arrive as they are downloaded and only the tokens
    are kept. Training takes `max_documents` documents of `split` (None: all). Validation is the dataset's own
    `val_split` when it has one (its first `val_documents`), else a held-out head: the first `val_documents`
    documents of `split`, which training then skips (taking the `max_documents` after them)."""

    has_validation = True

    def __init__(self, spec: str, path: str, *, split: str, val_split: str, text_column: str, data_files: Any,
                 config: str | None, revision: str | None, max_documents: int | None,
                 val_fraction: float, cache_dir: str | Path | None = None) -> None:
        self.spec, self.path, self.split, self.val_split = spec, path, split, val_split
        self.cache_dir = cache_dir  # (its fingerprints.json: local files hashed once while they keep their stamps)
        self.text_column, self.data_files, self.config, self.revision = text_column, data_files, config, revision
        self.max_documents = max_documents
        self.val_documents = None if max_documents is None else held_out(val_fraction, max_documents)
        self._dd: Any = None
        self._said: set = set()  # the splits whose rows without text were counted in a warning

    def _load(self) -> Any:
        if self._dd is None:
            import datasets

            offline = _hub_unreachable(self.path)
            try:
                with hub_offline(offline is not None), datasets_bars(), _parse_errors_unlogged(self.path):
                    if not self.data_files and (Path(self.path).expanduser() / "state.json").is_file():
                        # one Dataset that `save_to_disk` wrote, as HFDataset reads it (load_dataset refuses it, "use
                        # load_from_disk", which no option reaches), its rows streamed
                        self._dd = datasets.IterableDatasetDict(
                            {self.split: datasets.load_from_disk(self.path).to_iterable_dataset()})
                    else:
                        self._dd = datasets.load_dataset(_load_path(self.path), name=self.config,
                                                         data_files=self.data_files, revision=self.revision,
                                                         streaming=True)
            except ValueError as e:  # pyarrow's ArrowInvalid: a .parquet cut short, or not parquet at all
                if self.path in LOCAL_DATASET_BUILDERS.values() and local_files(self.data_files):
                    raise _unreadable(self.data_files, self.path, e) from e
                raise
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
    def sources(self) -> Any:
        return _sources(self.path, self.data_files)

    @property
    def val_source(self) -> str:
        """"validation split" (the dataset's own) or "held-out head" (the first documents of the train split)."""
        return "validation split" if self.val_split in self._load() and self.val_split != self.split \
            else "held-out head"

    def _rows(self, split: str, limit: int | None = None, say: bool = True) -> Iterator[str]:
        return _texts(self._values(split), self.spec, self.shown, self.text_column, split,
                      self._said if say else None, limit)

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
        start = self.val_documents if head and split == "train" else 0
        stop = self.val_documents if split != "train" else None if self.max_documents is None else \
            start + self.max_documents
        # (a held-out head's pass reads the train split's first rows: the training pass counts them, and the rest)
        yield from itertools.islice(self._rows(self.split if head or split == "train" else self.val_split, stop,
                                               say=not head or split == "train"), start, None)
        check_unchanged(getattr(self, "_stamps", {}))  # (a local file rewritten as it was read: refused)

    def _fingerprint(self) -> str:
        # a stream cannot be hashed without reading it: local files are hashed, hub data is named by its revision
        # (pin --data.hf_revision to make it reproducible)
        sources = self.sources  # (hf:DIR streamed: its files, as read whole)
        self._stamps = {path: stamp(path) for path in local_files(sources)}  # before their bytes are read
        key = {"path": self.path, "config": self.config, "revision": self.revision, "split": self.split,
               "val_split": self.val_split, "column": self.text_column, "max_documents": self.max_documents,
               "val_documents": self.val_documents, "val_source": self.val_source,
               "files": memoized(Path(self.cache_dir) / FINGERPRINTS if self.cache_dir is not None else None,
                                 ["data_files", sources], self._stamps, lambda: _hash_files(sources))}
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def _local_folder(path: str) -> Path | None:
    """The local folder `hf:PATH` names (read as `datasets` reads a hub dataset's files), or None: a hub name, or a
    builder (`hf:json`), which `datasets` takes for its own even beside a folder ./json."""
    folder = Path(path).expanduser()
    return folder if path not in {*LOCAL_DATASET_BUILDERS.values(), "text", "arrow"} and folder.is_dir() else None


def _load_path(path: str) -> str:
    """``path`` as `datasets.load_dataset` is given it: a local folder by its absolute path (`datasets` names the
    dataset after the folder's last part, and `hf:.` or `hf:./` has none: "dataset_name should be specified but got
    None", a traceback), anything else (a hub name, a builder) as it is."""
    folder = _local_folder(path)
    return path if folder is None else str(folder.resolve())


def check_cache_outside(spec: str, path: str, data_files: Any, cache_dir: str | Path) -> None:
    """Refuse `hf:DIR` (its files found by `datasets`) around tinylm's data cache: `datasets` would read the
    cache's train.bin, Arrow caches and JSON files as the dataset's rows, and the cache's fingerprints.json, rewritten
    by each run, changed the folder's fingerprint ("corpus file .../fingerprints.json changed while it was read")."""
    folder = _local_folder(path)
    if data_files or folder is None:
        return
    cache, root = os.path.realpath(cache_dir), os.path.realpath(folder)
    if cache == root or cache.startswith(root.rstrip(os.sep) + os.sep):
        raise ValueError(f"corpus {spec!r} is a folder that holds the data cache {cache_dir} (--data.cache_dir, "
                         "else $TINYLM_CACHE_DIR or ./data_cache): `datasets` would read tinylm's own files there as "
                         f"the dataset's rows; pass --data.cache_dir PATH outside {root}")


def _sources(path: str, data_files: Any) -> Any:
    """The local files a dataset is read from: `data_files`, or every file below a local folder named as the
    dataset (`hf:DIR`: its train.jsonl and validation.jsonl, a `save_to_disk` folder), or None (the hub's). An
    `hf:DIR`'s `data_files` are paths in it, as `datasets` reads them (they were looked for in the current folder,
    found nowhere, and the dataset keyed by `datasets`' own fingerprint: their paths and mtimes)."""
    if (folder := _local_folder(path)) is None:
        return data_files
    return _in_folder(glob.escape(str(folder)), data_files) if data_files else os.path.join(
        glob.escape(str(folder)), "**", "*")


def _in_folder(folder: str, data_files: Any) -> Any:
    """`data_files` (a path or glob, a list, or {split: path(s)}) with each relative path taken in ``folder``."""
    if isinstance(data_files, dict):
        return {k: _in_folder(folder, v) for k, v in data_files.items()}
    if isinstance(data_files, (list, tuple)):
        return [_in_folder(folder, v) for v in data_files]
    return os.path.join(folder, data_files) if isinstance(data_files, str) else data_files


def _hash_files(data_files: Any) -> Any:
    """`data_files` (a path or glob, a list, or {split: path(s)}) with each local file replaced by "sha256:<hex>" of
    its contents, in path order: a corpus moved, copied or named by another path is the same text. A name that
    matches no local file (a hub dataset's) stays as given."""
    if isinstance(data_files, dict):
        return {k: _hash_files(v) for k, v in sorted(data_files.items())}
    if isinstance(data_files, (list, tuple)):
        return [_hash_files(v) for v in data_files]
    if isinstance(data_files, str):
        run_folder = functools.cache(is_run_folder)  # (one look per folder)
        return [f"sha256:{_sha256(Path(p))}" for p in sorted(glob.glob(data_files, recursive=True))
                if Path(p).is_file() and not below_run_folder(p, run_folder)] or data_files
    return data_files


def check_splits_apart(data_files: Any, split: str, val_split: str, path: str = "") -> None:
    """Refuse `data_files` giving train and validation one file (val/loss scored training text) or a split unread
    (``path``: the dataset `hf:PATH` names, whose folder an `hf:DIR`'s data_files are paths in)."""
    data_files = _sources(path, data_files) if data_files and path else data_files
    if not isinstance(data_files, dict) or split == val_split:  # (the same: validation is cut from split's tail)
        return
    if val_split not in data_files and (unread := [str(k) for k in data_files if k != split]):
        raise ValueError(f"--data.data_files names the split {unread[0]!r} and no {val_split!r} (--data.val_split), "
                         f"so its files would never be read and validation would be cut from the tail of {split!r}; "
                         f"pass --data.val_split {unread[0]}, or leave it out")
    real = lambda name: {os.path.realpath(p) for p in local_files(data_files.get(name))}
    if shared := sorted(real(split) & real(val_split)):
        raise ValueError(f"--data.data_files gives the {split!r} and {val_split!r} splits the same file {shared[0]}: "
                         "validation would score text the model trains on; give validation files of its own, or "
                         f"leave {val_split!r} out (the last --data.val_fraction of {split!r} is then validation)")


def local_files(data_files: Any) -> list[Path]:
    """The local files `data_files` (a path or glob, a list, or {split: path(s)}) names."""
    if isinstance(data_files, dict):
        return [p for v in data_files.values() for p in local_files(v)]
    if isinstance(data_files, (list, tuple)):
        return [p for v in data_files for p in local_files(v)]
    if isinstance(data_files, str):  # (not what a run wrote: `hf:DIR` around runs/ changed with each checkpoint)
        run_folder = functools.cache(is_run_folder)  # (one look per folder)
        return [Path(p) for p in glob.glob(data_files, recursive=True)
                if Path(p).is_file() and not below_run_folder(p, run_folder)]
    return []


@contextlib.contextmanager
def _parse_errors_unlogged(builder: str) -> Iterator[None]:
    """`datasets`' json and parquet loaders log "Failed to load JSON from file ..." before they raise: a second
    line beside the one `_unreadable` makes of the same error."""
    logger = logging.getLogger(f"datasets.packaged_modules.{builder}.{builder}")
    was = logger.disabled
    logger.disabled = builder in LOCAL_DATASET_BUILDERS.values()
    try:
        yield
    finally:
        logger.disabled = was


_COMPRESSION_PACKAGES = {"zstd": "zstandard", "lz4": "lz4", "snappy": "python-snappy"}
"""What fsspec (under `datasets`) needs to read files compressed so (.jsonl.zst: SlimPajama's, Dolma's shards)."""


def _unreadable(files: Any, builder: str, cause: BaseException) -> ValueError:
    """A local dataset file that `datasets` (or pyarrow under it) could not parse: named, with the fix."""
    m = re.fullmatch(r"Compression type (\w+) not supported", str(cause).strip())
    if m and isinstance(cause, ValueError):
        package = _COMPRESSION_PACKAGES.get(m[1], m[1])  # (fsspec's words: the file is fine, a package is missing)
        return ValueError(f"could not read {files!r}: it is {m[1]}-compressed, and `datasets` reads that with the "
                          f"{package} package, which is not installed; pip install {package}, or decompress the "
                          "files first")
    return ValueError(f"could not read {files!r} as a {builder} dataset ({type(cause).__name__}: "
                      f"{str(cause).strip()[:300]}); fix the file, or pass --data.corpus PATH to plain text files")


def _refuse_blank(spec: str, data_files: Any) -> None:
    """An empty corpus, when `data_files` names local files that hold nothing but whitespace: `datasets` finds no
    row in them and says so in its own words (a StopIteration, "Instruction "train" corresponds to no data!")."""
    files = local_files(data_files)  # (read only once loading failed)
    if files and not any(f.read_bytes().strip() for f in files):
        raise ValueError(f"corpus {spec!r} is empty (no text in it); pass --data.corpus PATH to a corpus with text")
