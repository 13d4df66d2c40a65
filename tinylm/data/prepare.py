"""Tokenize -> pack -> memmap: trained tokenizers and packed datasets, cached on disk and built atomically.

On disk (under `cache_dir`, see `TinyLMDataModule`):
    tokenizers/<spec>-<corpus>-<key>/     trained tokenizers, keyed by corpus fingerprint + spec + vocab_size
    datasets/<corpus>-<kind><V>-<key>/    keyed by corpus fingerprint + tokenizer fingerprint + split settings
        tokenizer/  train.bin  val.bin    flat little-endian token ids (uint16 when the vocab fits, else uint32)
        meta.json                         written last; a folder without it is an interrupted build and is rebuilt
Each folder is built as `<dir>.tmp-<host>-<pid>` and renamed into place, so readers never see half of one; the
temp folders of builds that were killed are removed by the next build once their process is gone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tinylm.data.corpus import Corpus
from tinylm.tokenize import STATE_FILE, TRAINED_SPECS, Tokenizer, build_tokenizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
DTYPES = ("uint16", "uint32")  # the id types a dataset may store (little-endian)
SCAN_TOKENS = 1 << 24  # ids checked per step when a dataset is opened (32-64 MB of memory)
PIECE_CHARS = 1 << 20  # documents longer than this are encoded in pieces (bounded memory, parallel batches)
BATCH_CHARS = 8 << 20  # text handed to one encode_batch call


def default_cache_dir() -> Path:
    """`$TINYLM_CACHE_DIR`, else `./data_cache`."""
    return Path(os.environ.get("TINYLM_CACHE_DIR") or "data_cache")


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.")[:40] or "corpus"


def _check_not_empty(corpus: Corpus) -> None:
    if next(iter(corpus.documents("train")), None) is None:
        raise ValueError(f"corpus {corpus.spec!r} is empty (no text in it); pass --data.corpus PATH to a corpus "
                         "with text")


_TMP = re.compile(r"\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)$")  # "<dir>.tmp-<host>-<pid>", or "<dir>.tmp-<pid>" (older)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, another user's
        pass
    return True


def _remove_stale_temps(parent: Path) -> None:
    """Remove temp folders left in `parent` by builds on this host whose process is gone (a killed `prepare`);
    those of live processes, or of other hosts sharing the folder, are left alone."""
    host = socket.gethostname()
    for entry in parent.iterdir():
        m = _TMP.search(entry.name)
        if m and entry.is_dir() and m["host"] in (None, host) and not _process_alive(int(m["pid"])):
            log.warning("removing %s: a temp folder of an interrupted build", entry)
            shutil.rmtree(entry, ignore_errors=True)


def _publish(final: Path, write: Callable[[Path], None], complete: str) -> None:
    """Build `final` through `write(tmp)` in a sibling temp folder, then rename it into place atomically.
    `complete` is the file whose presence marks a finished folder; a folder without it is rebuilt."""
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(final.parent)
    tmp = final.with_name(f"{final.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write(tmp)
        if final.exists() and not (final / complete).exists():
            log.warning("removing %s: it has no %s (an earlier build was interrupted)", final, complete)
            shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    except OSError:
        if not (final / complete).exists():
            raise  # a real failure, not another process (rank) having finished the same folder first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename happened


# ------------------------------------------------------------------------------------------------ preparing
def prepare_tokenizer(corpus: Corpus, spec: str, *, vocab_size: int, cache_dir: Path) -> Tokenizer:
    """The run's tokenizer: trained kinds are trained once per (corpus, spec, vocab_size) and cached."""
    if spec not in TRAINED_SPECS:
        return build_tokenizer(spec, vocab_size=vocab_size)
    size = None if spec == "char" else vocab_size
    final = Path(cache_dir) / "tokenizers" / f"{spec}-{_slug(corpus.name)}-{_key([corpus.fingerprint, spec, size])}"
    if not (final / STATE_FILE).is_file():
        _check_not_empty(corpus)
        log.info("training a %s tokenizer on %s", spec, corpus.spec)
        tok = build_tokenizer(spec, vocab_size=vocab_size, documents=lambda: corpus.documents("train"))
        _publish(final, tok.save, STATE_FILE)
    tok = Tokenizer.load(final)  # always the published copy, so concurrent ranks agree on one tokenizer
    tok.spec = spec
    return tok


def dataset_dir_for(corpus: Corpus, tokenizer: Tokenizer, *, val_fraction: float, cache_dir: Path) -> Path:
    """Where the dataset made from `corpus` by `tokenizer` with these split settings lives."""
    key = _key([FORMAT_VERSION, corpus.fingerprint, tokenizer.fingerprint, _split_settings(corpus, val_fraction)])
    return Path(cache_dir) / "datasets" / f"{_slug(corpus.name)}-{tokenizer.kind}{tokenizer.vocab_size}-{key}"


def _split_settings(corpus: Corpus, val_fraction: float) -> dict:
    if corpus.has_validation:
        return {"val_source": "validation split", "val_fraction": None}
    return {"val_source": "tail", "val_fraction": val_fraction}


def prepare_dataset(corpus: Corpus, tokenizer: Tokenizer, *, val_fraction: float, cache_dir: Path,
                    piece_chars: int = PIECE_CHARS) -> Path:
    """Build the packed dataset unless a complete one exists; return its folder."""
    final = dataset_dir_for(corpus, tokenizer, val_fraction=val_fraction, cache_dir=cache_dir)
    if not (final / "meta.json").is_file():
        _check_not_empty(corpus)
        _publish(final, lambda tmp: _write_dataset(tmp, corpus, tokenizer, val_fraction, piece_chars), "meta.json")
    return final


class _SplitWriter:
    """Appends documents' tokens to one .bin file, EOS after each complete document, encoding in batches."""

    def __init__(self, path: Path, tok: Tokenizer, dtype: np.dtype, piece_chars: int) -> None:
        self.file, self.tok, self.dtype, self.piece_chars = open(path, "wb"), tok, dtype, piece_chars
        self.eos = None if tok.eos_id is None else np.array([tok.eos_id], dtype=dtype)
        self.texts: list[str] = []
        self.ends: list[bool] = []
        self.pending = 0
        self.stats = {"tokens": 0, "documents": 0, "bytes": 0, "chars": 0}

    def add(self, text: str, *, ends_document: bool) -> None:
        """Add a document, or part of one (the two sides of the train/val cut)."""
        self.stats["documents"] += 1
        self.stats["chars"] += len(text)
        for piece in _pieces(text, self.piece_chars):
            self.texts.append(piece)
            self.ends.append(False)
            self.stats["bytes"] += len(piece.encode("utf-8"))
            self.pending += len(piece)
        self.ends[-1] = ends_document
        if self.pending >= BATCH_CHARS:
            self.flush()

    def flush(self) -> None:
        if not self.texts:
            return
        parts = []
        for ids, end in zip(self.tok.encode_batch(self.texts), self.ends):
            parts.append(np.asarray(ids, dtype=self.dtype))
            if end and self.eos is not None:
                parts.append(self.eos)
        tokens = np.concatenate(parts)
        self.file.write(tokens.tobytes())
        self.stats["tokens"] += len(tokens)
        self.texts, self.ends, self.pending = [], [], 0

    def close(self) -> dict:
        self.flush()
        self.file.close()
        return self.stats


def _pieces(text: str, max_chars: int) -> Iterator[str]:
    """Cut text longer than max_chars where no pre-token of the GPT-2 or cl100k patterns can span the cut, so
    the pieces encode to exactly the ids of the whole text: after a lone newline between two non-space
    characters, else before a space that follows a non-space character ("ab\\n\\ncd ef" -> "ab\\n\\ncd", " ef";
    a cut after the second newline would turn the whitespace run "\\n\\n" into one token).
    Text with neither (one giant word) is cut hard at max_chars."""
    start, n = 0, len(text)
    while n - start > max_chars:
        end = start + max_chars
        cut = end
        i = text.rfind("\n", start + 1, end - 1)
        while i > start and (text[i - 1].isspace() or text[i + 1].isspace()):
            i = text.rfind("\n", start + 1, i)
        if i > start:
            cut = i + 1
        else:
            j = text.rfind(" ", start + 1, end)
            while j > start and text[j - 1].isspace():
                j = text.rfind(" ", start + 1, j)
            if j > start:
                cut = j
        yield text[start:cut]
        start = cut
    if start < n:
        yield text[start:]


def _write_dataset(out: Path, corpus: Corpus, tok: Tokenizer, val_fraction: float, piece_chars: int) -> None:
    from tqdm.auto import tqdm

    dtype_name = "uint16" if tok.vocab_size <= 2**16 else "uint32"
    dtype = np.dtype(dtype_name).newbyteorder("<")
    tok.save(out / "tokenizer")
    writers = {s: _SplitWriter(out / f"{s}.bin", tok, dtype, piece_chars) for s in ("train", "val")}
    settings = _split_settings(corpus, val_fraction)
    if corpus.has_validation:
        for split, name in (("train", "train"), ("validation", "val")):
            for doc in tqdm(corpus.documents(split), desc=f"tokenizing {split}", unit="doc", disable=None):
                writers[name].add(doc, ends_document=True)
    else:
        # The tail by characters, exactly like nanoGPT's data[:int(n * 0.9)]; cut inside the straddling document.
        total = sum(len(doc) for doc in corpus.documents("train"))
        cut = int(total * (1 - val_fraction))
        seen = 0
        bar = tqdm(total=total, desc=f"tokenizing {corpus.name}", unit="char", unit_scale=True, disable=None)
        for doc in corpus.documents("train"):
            if seen + len(doc) <= cut:
                writers["train"].add(doc, ends_document=True)
            elif seen >= cut:
                writers["val"].add(doc, ends_document=True)
            else:
                writers["train"].add(doc[: cut - seen], ends_document=False)
                writers["val"].add(doc[cut - seen:], ends_document=True)
            seen += len(doc)
            bar.update(len(doc))
        bar.close()
    splits = {name: w.close() for name, w in writers.items()}
    meta = {
        "format_version": FORMAT_VERSION,
        "dtype": dtype_name,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "special_tokens": tok.special_tokens,
        "splits": splits,
        "tokenizer_spec": tok.spec,
        "tokenizer_fingerprint": tok.fingerprint,
        "corpus_spec": corpus.spec,
        "corpus_fingerprint": corpus.fingerprint,
        "settings": settings,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def load_meta(dataset_dir: str | Path, tokenizer: Tokenizer | None = None) -> dict:
    """Read and check a dataset's meta.json: complete, this format, made by `tokenizer`, ids fit the dtype."""
    dataset_dir = Path(dataset_dir)
    path = dataset_dir / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{dataset_dir} is not a prepared dataset (no meta.json: its build did not finish); "
                                "delete it and run `tinylm prepare` again")
    redo = "delete the folder and run `tinylm prepare` again"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict):
            raise TypeError(f"expected a JSON object, got {type(meta).__name__}")
        if meta.get("format_version") == FORMAT_VERSION:
            _check_meta_fields(meta)
    except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path} is damaged or not a tinylm dataset's meta.json ({type(e).__name__}: {e}); "
                         f"{redo}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{dataset_dir} has dataset format {meta.get('format_version')!r}, this tinylm reads "
                         f"{FORMAT_VERSION}; {redo}")
    if tokenizer is not None and meta["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise ValueError(f"dataset {dataset_dir} was built with tokenizer {meta['tokenizer_spec']!r} (fingerprint "
                         f"{meta['tokenizer_fingerprint'][:12]}), but this run's tokenizer {tokenizer.spec!r} has "
                         f"fingerprint {tokenizer.fingerprint[:12]}; prepare the dataset with this tokenizer "
                         "(`tinylm prepare`) or run with the tokenizer the dataset was made with")
    vocab = max(meta["vocab_size"], tokenizer.vocab_size if tokenizer is not None else 0)
    if meta["dtype"] == "uint16" and vocab > 2**16:
        raise ValueError(f"dataset {dataset_dir} stores uint16 ids but the vocabulary has {vocab} ids (more than "
                         "65,536 need uint32); delete the folder and run `tinylm prepare` again")
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split, stats in meta["splits"].items():
        bin_path = dataset_dir / f"{split}.bin"
        if not bin_path.is_file():
            raise FileNotFoundError(f"{bin_path} is missing from the dataset; {redo}")
        size = bin_path.stat().st_size
        if size != stats["tokens"] * itemsize:
            raise ValueError(f"{bin_path} has {size} bytes, meta.json says "
                             f"{stats['tokens']} tokens x {itemsize}; the file is damaged: {redo}")
        _check_ids(bin_path, meta["dtype"], vocab)
    return meta


def _check_meta_fields(meta: dict) -> None:
    """Raise (KeyError/TypeError/ValueError) unless `meta` has the fields and types `load_meta` relies on."""
    for key in ("format_version", "dtype", "vocab_size", "splits", "tokenizer_spec", "tokenizer_fingerprint"):
        if key not in meta:
            raise KeyError(key)
    if meta["dtype"] not in DTYPES:
        raise ValueError(f"dtype {meta['dtype']!r} is not one tinylm stores ({', '.join(DTYPES)})")
    if not isinstance(meta["vocab_size"], int) or not all(isinstance(s.get("tokens"), int)
                                                          for s in meta["splits"].values()):
        raise TypeError("vocab_size and each split's tokens must be integers")


def _check_ids(path: Path, dtype: str, vocab_size: int) -> None:
    """Refuse a .bin holding an id outside 0..vocab_size-1 now, not when a batch happens to draw it (an index
    error deep inside the embedding, or on GPU a device-side assert). Reads SCAN_TOKENS ids at a time."""
    if path.stat().st_size == 0:
        return
    data = np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")
    for start in range(0, len(data), SCAN_TOKENS):
        chunk = data[start : start + SCAN_TOKENS]
        if int(chunk.max()) >= vocab_size:
            at = start + int(np.argmax(chunk >= vocab_size))
            raise ValueError(f"{path} holds token id {int(data[at])} at position {at}, outside the vocabulary of "
                             f"{vocab_size} ids; it was made by another tokenizer or is damaged: delete the "
                             "folder and run `tinylm prepare` again")
