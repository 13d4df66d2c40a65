"""Tokenize -> pack -> memmap: trained tokenizers and packed datasets, cached on disk and built atomically.

On disk (under `cache_dir`, see `TinyLMDataModule`):
    tokenizers/<spec>-<corpus>-<key>/     trained tokenizers, keyed by corpus fingerprint + spec + vocab_size (+ the
                                          text sample it read, and a char vocabulary's validation split)
    datasets/<corpus>-<kind><V>-<key>/    keyed by corpus fingerprint + tokenizer fingerprint + split settings
        tokenizer/  train.bin  val.bin    flat little-endian token ids (uint16 when the vocab fits, else uint32)
        meta.json                         written last; a folder without it is an interrupted build and is rebuilt
Each folder is built as `<dir>.tmp-<host>-<pid>` and renamed into place, so readers never see half of one; the
temp folders of builds that were killed are removed by the next build once their process is gone.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
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

try:
    import fcntl
except ImportError:  # Windows: no lock; concurrent builds still end in one complete folder (see _publish)
    fcntl = None  # type: ignore[assignment]

from tinylm.data.clean import CleanCorpus
from tinylm.data.corpus import LONG_READ, Corpus, CorpusChanged
from tinylm.data.mixture import Mixture
from tinylm.data.named import make_in_cache
from tinylm.data.pack import write_splits
from tinylm.data.source import memoized, process_alive, stamp
from tinylm.data.writer import PIECE_CHARS, Stopwatch, pieces, progress, rate, read_whole
from tinylm.progress import heartbeat
from tinylm.tokenize import STATE_FILE, TRAINED_SPECS, Tokenizer, build_tokenizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
TRAIN_STATS = "train_stats.json"  # beside a trained tokenizer: what its training read and how fast
DTYPES = ("uint16", "uint32")  # the id types a dataset may store (little-endian)
SCAN_TOKENS = 1 << 24  # ids checked per step when a dataset is opened (32-64 MB of memory)


def default_cache_dir() -> Path:
    """`$TINYLM_CACHE_DIR` (a leading ``~``, which a Dockerfile's ENV or a quoted value leaves as it is, is the home
    folder), else `./data_cache`."""
    return Path(os.environ.get("TINYLM_CACHE_DIR") or "data_cache").expanduser()


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.")[:40] or "corpus"


def _check_not_empty(corpus: Corpus) -> None:
    if isinstance(corpus, Mixture):  # each of its corpora, before a tokenizer learns from the others (raw text: a
        for part in corpus.parts:    # cleaned one would be decided out of order; cleaning refuses emptying one)
            _check_not_empty(getattr(part, "inner", part))
        return
    if next((doc for doc in corpus.documents("train") if doc and not doc.isspace()), None) is None:  # (blanks: 3 ids)
        held_out = getattr(corpus, "val_documents", None)
        if held_out and corpus.val_source == "held-out head" and next(iter(corpus.documents("validation")), None):
            raise ValueError(f"streamed corpus {corpus.spec!r} has no documents left for training: validation holds "
                             f"out its first {held_out:,} (val_fraction x max_documents), and that is all of it; "
                             "lower --data.max_documents to about the number of documents it has")
        raise ValueError(f"corpus {corpus.spec!r} is empty (no text in it); pass --data.corpus PATH to a corpus "
                         "with text")


_TMP = re.compile(r"\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)$")  # "<dir>.tmp-<host>-<pid>", or "<dir>.tmp-<pid>" (older)


def _remove_stale_temps(parent: Path, ours: str) -> None:
    """Remove temp folders left in `parent` by builds on this host whose process is gone (a killed `prepare`);
    those of live processes, or of other hosts sharing the folder, are left alone, and so are those whose folder's
    lock a build holds: a container with the host's name (`docker run --network host`) and its own pids had its
    running build's folder removed by another's, its pid not being one of this pid namespace's. (`ours`: the folder
    this process builds, holding its lock.)"""
    host = socket.gethostname()
    for entry in parent.iterdir():
        m = _TMP.search(entry.name)
        if m and entry.is_dir() and m["host"] in (None, host) and not process_alive(int(m["pid"])):
            target = entry.name[:m.start()]
            if target != ours and _lock_held(parent.parent / ".locks" / f"{parent.name}-{target}.lock"):
                continue
            log.warning("removing %s: a temp folder of an interrupted build", entry)
            shutil.rmtree(entry, ignore_errors=True)


def _lock_held(path: Path) -> bool:
    """Whether a process (of any pid namespace sharing this file system) holds the build lock at `path`."""
    if fcntl is None:
        return False
    try:
        with open(path) as lock:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no lock file: no build of that folder took one (an older tinylm's, or none)
        return False
    return False


def _publish(final: Path, write: Callable[[Path], None], complete: str) -> None:
    """Build `final` through `write(tmp)` in a sibling temp folder, then rename it into place atomically.
    `complete` is the file whose presence marks a finished folder; a folder without it is rebuilt."""
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(final.parent, final.name)
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


def _build_once(final: Path, write: Callable[[Path], None], complete: str, corpus: Corpus, what: str) -> None:
    """`_publish` unless `final` is complete, by one process at a time: under DDP (torchrun, SLURM: every rank
    starts at once and LightningCLI reads the vocab size at instantiation) the first process to take
    `CACHE/.locks/<kind>-<name>.lock` builds while the others wait for it, then find the folder complete and read it.
    The lock (flock) goes with its process, so a killed builder leaves the next one free to build."""
    if (final / complete).is_file():
        return
    locks = final.parent.parent / ".locks"  # CACHE/.locks: out of the folders that list what is cached
    make_in_cache(locks)
    with open(locks / f"{final.parent.name}-{final.name}.lock", "w") as lock:
        if fcntl is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("waiting for another process that is %s", what)
                fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / complete).is_file():
            _check_not_empty(corpus)
            log.info("%s", what)
            _publish(final, write, complete)


# ------------------------------------------------------------------------------------------------ preparing
def prepare_tokenizer(corpus: Corpus, spec: str, *, vocab_size: int, cache_dir: Path,
                      train_chars: int | None = None) -> Tokenizer:
    """The run's tokenizer: trained kinds are trained once per (corpus, spec, vocab_size, sample) and cached.
    BPE kinds learn from about `train_chars` characters of documents spread over the corpus (None: all of it);
    `char` always reads everything (a character it never saw could not be encoded)."""
    if spec not in TRAINED_SPECS:
        return build_tokenizer(spec, vocab_size=vocab_size)
    sample = _sample_chars(corpus, spec, train_chars)
    final = tokenizer_dir_for(corpus, spec, vocab_size=vocab_size, train_chars=train_chars, cache_dir=cache_dir)
    _build_once(final, lambda tmp: _train_tokenizer(tmp, corpus, spec, vocab_size, sample), STATE_FILE, corpus,
                f"training a {spec} tokenizer on {corpus.spec}")
    try:
        tok = Tokenizer.load(final)  # always the published copy, so concurrent ranks agree on one tokenizer
    except ValueError as e:
        cause = e.__cause__ or e
        reason = (str(cause).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"the cached tokenizer in {final} is damaged ({type(cause).__name__}: {reason}); delete "
                         "that folder and run again to retrain it") from e
    tok.spec = spec
    return tok


def checkpoint_tokenizer_dir(state: dict, cache_dir: str | Path) -> Path:
    """A folder holding the tokenizer a checkpoint carries (`CACHE/tokenizers/checkpoint-<fingerprint>`), written
    once: `tinylm validate` on another corpus evaluates with it, where training one on that corpus would make
    another tokenizer than the model's."""
    tok = Tokenizer.from_state_dict(state)
    final = Path(cache_dir) / "tokenizers" / f"checkpoint-{tok.fingerprint[:16]}"
    if not (final / STATE_FILE).is_file():
        _publish(final, tok.save, STATE_FILE)
    return final


def tokenizer_dir_for(corpus: Corpus, spec: str, *, vocab_size: int, train_chars: int | None,
                      cache_dir: Path) -> Path:
    """Where the tokenizer of kind `spec` (one of TRAINED_SPECS) trained on `corpus` lives."""
    sample = _sample_chars(corpus, spec, train_chars)
    key = [corpus.fingerprint, spec, None if spec == "char" else vocab_size] + ([sample] if sample else [])
    if spec == "char" and _own_validation(corpus):
        key.append("with validation")  # the char vocabulary has the validation split's characters too
    return _made_under_any_name(Path(cache_dir) / "tokenizers", f"{spec}-", _slug(corpus.name), f"-{_key(key)}",
                                STATE_FILE)


def _sample_chars(corpus: Corpus, spec: str, train_chars: int | None) -> int | None:
    """The sample a tokenizer trains on, None for all of the corpus (also when the corpus is smaller than the
    sample: it then keeps the cache key it had before sampling existed)."""
    if spec == "char" or train_chars is None or (corpus.size_bytes or 1 << 62) <= train_chars:
        return None
    return train_chars


def _train_tokenizer(out: Path, corpus: Corpus, spec: str, vocab_size: int, sample: int | None) -> None:
    clock, read, read_at = Stopwatch(), [0], [None]

    def documents() -> Iterator[str]:
        read[0] = 0
        # a sample is counted in characters (its size, unless a corpus of multibyte text holds fewer characters
        # than bytes and than the sample: _sample_chars compares the sample with the size in bytes)
        bar = progress(corpus.size_bytes, f"training {spec} on {corpus.name}") if sample is None else \
            progress(sample, f"training {spec} on a {sample:,}-character sample of {corpus.name}", unit="char")
        with bar:
            for doc in itertools.chain(_sample(corpus, sample), *(c.documents("validation") for c in
                                                                  (_own_validation(corpus) if spec == "char" else []))):
                n = len(doc.encode("utf-8"))
                read[0] += n
                bar.update(n if sample is None else len(doc))
                # bpe: in pieces, cut where no pre-token spans them (the same counts, the same tokenizer): `tokenizers`
                # held ~95 bytes a character of the text it was given whole (a 50 MB one-line file peaked at 4.9 GB).
                # Not char, which counts documents (more than one: an end-of-text id; `make train`'s one-document
                # tinyshakespeare, cut in two, got a 66th id and another val.bin)
                yield from pieces(doc, PIECE_CHARS) if spec == "bpe" else (doc,)
            read_whole(bar)
        read_at[0] = clock()

    def merging(_: float) -> str | None:  # (after the text is read, the trainer counts and merges, saying nothing)
        return None if read_at[0] is None else (f"training {spec}: merging pairs to {vocab_size:,} ids, "
                                                f"{clock() - read_at[0]:.0f} s since the text was read")

    with heartbeat(merging):
        tokenizer = build_tokenizer(spec, vocab_size=vocab_size, documents=documents)
    tokenizer.save(out)
    stats = {**rate(read[0], clock()), "sample_chars": sample}
    log.info("trained the %s tokenizer on %.1f MB in %.1f s", spec, stats["bytes"] / 1e6, stats["seconds"])
    (out / TRAIN_STATS).write_text(json.dumps(stats) + "\n", encoding="utf-8")


def _own_validation(corpus: Corpus) -> list[Corpus]:
    """The corpora (of a mixture: its parts) with a validation split of their own, which a char tokenizer also
    reads: a character only validation has could not be encoded otherwise."""
    return [c for c in (corpus.parts if isinstance(corpus, Mixture) else [corpus]) if c.has_validation]


def _sample(corpus: Corpus, max_chars: int | None) -> Iterator[str]:
    """About `max_chars` characters of the train documents, spread evenly over the corpus: a document is kept
    while the characters kept are below max_chars / size times the bytes read so far (size: `corpus.size_bytes`,
    so bytes on both sides of the ratio: a corpus of 2-byte characters gets max_chars too, not half); e.g.
    max_chars = size / 4 keeps one document in four. Without a known size it is the head of the corpus (of a
    mixture: of each of its corpora, `_sample_parts`)."""
    docs = corpus.documents("train")
    if max_chars is None:
        yield from docs
        return
    size = corpus.size_bytes
    if size is None and isinstance(corpus, Mixture):  # (streamed corpora): its head was its first corpus only
        yield from _sample_parts(corpus.parts, max_chars)
        return
    share = 1.0 if size is None else min(1.0, max_chars / max(size, 1))
    kept = seen = 0
    for doc in docs:
        seen += len(doc) if size is None else len(doc.encode("utf-8"))
        if kept < share * seen:
            doc = doc[: max_chars - kept]
            kept += len(doc)
            yield doc
        if kept >= max_chars:
            return


def _sample_parts(parts: list[Corpus], max_chars: int) -> Iterator[str]:
    """`_sample` of a mixture of unknown size (streamed corpora): each corpus an equal share of the characters the
    ones before it left (a corpus with fewer passes the rest on), sampled as `_sample` samples it alone. The head of
    the mixture was the head of its first corpus: a tokenizer that never saw the others' text."""
    left = max_chars
    for i, part in enumerate(parts):
        quota = left // (len(parts) - i)
        for doc in _sample(part, quota) if quota else ():
            left -= len(doc)
            yield doc


def dataset_dir_for(corpus: Corpus, tokenizer: Tokenizer, *, val_fraction: float, cache_dir: Path) -> Path:
    """Where the dataset made from `corpus` by `tokenizer` with these split settings lives."""
    key = _key([FORMAT_VERSION, corpus.fingerprint, tokenizer.fingerprint, _split_settings(corpus, val_fraction)])
    return _made_under_any_name(Path(cache_dir) / "datasets", "", _slug(corpus.name),
                                f"-{tokenizer.kind}{tokenizer.vocab_size}-{key}", "meta.json")


def _made_under_any_name(folder: Path, prefix: str, name: str, key: str, done: str) -> Path:
    """``folder/PREFIX NAME KEY``, or a complete one (holding ``done``) with the same key under another name: the
    name is for reading, the key says what was made. The same text named two ways (`tinyshakespeare`, and the
    file of it that its error message says where to place, `CACHE/corpora/tinyshakespeare.txt`) is one dataset,
    not a second copy of it."""
    own = folder / f"{prefix}{name}{key}"
    if (own / done).is_file() or not folder.is_dir():
        return own
    return next((p for p in sorted(folder.glob(f"{glob.escape(prefix)}*{glob.escape(key)}"))
                 if (p / done).is_file()), own)


def _split_settings(corpus: Corpus, val_fraction: float) -> dict:
    if corpus.has_validation:
        return {"val_source": getattr(corpus, "val_source", "validation split"), "val_fraction": None}
    return {"val_source": "tail", "val_fraction": val_fraction}


def prepare_dataset(corpus: Corpus, tokenizer: Tokenizer, *, val_fraction: float, cache_dir: Path,
                    piece_chars: int = PIECE_CHARS) -> Path:
    """Build the packed dataset unless a complete one exists; return its folder."""
    final = dataset_dir_for(corpus, tokenizer, val_fraction=val_fraction, cache_dir=cache_dir)
    partial = final.with_name(final.name + ".partial")  # completed shards of an interrupted build (tinylm.data.pack)
    _build_once(final, lambda tmp: _write_dataset(tmp, partial, corpus, tokenizer, val_fraction, piece_chars),
                "meta.json", corpus, f"packing {corpus.spec} into {final}")
    shutil.rmtree(partial, ignore_errors=True)
    return final


def resumed_note(n_bytes: int) -> str:
    return f", going on after the {n_bytes / 1e6:,.1f} MB an interrupted build had tokenized" if n_bytes else ""


def _write_dataset(out: Path, partial: Path, corpus: Corpus, tok: Tokenizer, val_fraction: float,
                   piece_chars: int) -> None:
    dtype_name = "uint16" if tok.vocab_size <= 2**16 else "uint32"
    tok.save(out / "tokenizer")
    clock = Stopwatch()
    try:
        splits, resumed = write_splits(out, partial, corpus, tok, np.dtype(dtype_name).newbyteorder("<"),
                                       val_fraction=val_fraction, piece_chars=piece_chars)
    except CorpusChanged:  # the shards are keyed by text that is gone (no build resumes them), and may already hold
        # some of the changed text: dropped
        shutil.rmtree(partial, ignore_errors=True)
        raise
    except BaseException:  # a full disk, a signal: tokens of no complete shard are of no use to the next build, and
        if not any(partial.glob("[0-9]*.json")):  # on a full disk they kept it full
            shutil.rmtree(partial, ignore_errors=True)
        raise
    build = rate(sum(s["bytes"] for s in splits.values()) - resumed, clock())  # what this build encoded, timed
    if resumed:
        build["resumed_bytes"] = resumed
    log.info("tokenized %s: %.1f MB in %.1f s (%.2f MB/s)%s", corpus.spec, build["bytes"] / 1e6, build["seconds"],
             build["mb_per_s"], resumed_note(resumed))
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
        "settings": _split_settings(corpus, val_fraction),
        "build": build,
    }
    if isinstance(corpus, CleanCorpus):  # what was removed and why: counts here, examples in clean.json beside
        meta["clean"] = corpus.write_report(out)
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
    if tokenizer is not None and meta["tokenizer_fingerprint"] == tokenizer.fingerprint and \
            meta["eos_id"] != tokenizer.eos_id:  # packed by a tinylm that read the end-of-text token otherwise
        raise ValueError(f"dataset {dataset_dir} was packed with end-of-text id {meta['eos_id']}, but its tokenizer's "
                         f"is {tokenizer.eos_id} (an older tinylm packed it); {redo}")
    if tokenizer is not None and meta["tokenizer_fingerprint"] == tokenizer.fingerprint and \
            meta["vocab_size"] != tokenizer.vocab_size:  # one tokenizer has one size: meta.json was edited
        raise ValueError(f"{path} says vocab_size {meta['vocab_size']}, but the tokenizer that made the dataset has "
                         f"{tokenizer.vocab_size} ids (the file was edited); {redo}")
    if tokenizer is not None and meta["tokenizer_fingerprint"] != tokenizer.fingerprint:
        raise ValueError(f"dataset {dataset_dir} was built with tokenizer {meta['tokenizer_spec']!r} (fingerprint "
                         f"{meta['tokenizer_fingerprint'][:12]}), but this run's tokenizer {tokenizer.spec!r} has "
                         f"fingerprint {tokenizer.fingerprint[:12]}, which the folder is named for: its meta.json "
                         f"was edited or copied from another dataset; {redo}")
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
        _check_ids_once(bin_path, meta["dtype"], vocab)
    return meta


_META_FIELDS = {"format_version": int, "dtype": str, "vocab_size": int, "eos_id": (int, type(None)), "splits": dict,
                "tokenizer_spec": str, "tokenizer_fingerprint": str, "corpus_spec": str, "corpus_fingerprint": str,
                "settings": dict}
"""The fields of meta.json that tinylm reads, with their types (a split's counts: `_SPLIT_COUNTS`)."""
_SPLIT_COUNTS = ("tokens", "documents", "bytes")  # "chars" and "eos" are optional: older datasets lack them


def _check_meta_fields(meta: dict) -> None:
    """Raise (KeyError/TypeError/ValueError) unless `meta` has the fields and types `load_meta` and its readers rely
    on: a meta.json edited by hand failed later with an AttributeError or a KeyError, or printed `vocab_size True`."""
    for key, kind in _META_FIELDS.items():
        if not isinstance(meta[key], kind) or isinstance(meta[key], bool):  # bool: True == 1, but no count
            raise TypeError(f"{key} is {meta[key]!r}, not {getattr(kind, '__name__', 'an int or null')}")
    if meta["dtype"] not in DTYPES:
        raise ValueError(f"dtype {meta['dtype']!r} is not one tinylm stores ({', '.join(DTYPES)})")
    if sorted(meta["splits"]) != ["train", "val"] or not isinstance(meta["settings"].get("val_source"), str):
        raise ValueError(f"splits must be train and val (got {sorted(meta['splits'])}), and settings must name a "
                         "val_source")
    if meta["vocab_size"] < 1:
        raise ValueError(f"vocab_size is {meta['vocab_size']}, not a positive number of ids")
    for name, split in meta["splits"].items():
        keys = _SPLIT_COUNTS + tuple(k for k in ("chars", "eos") if k in split) if isinstance(split, dict) else ()
        if not keys or not all(type(split.get(k)) is int and split[k] >= 0 for k in keys):
            raise ValueError(f"splits.{name} must hold the counts {', '.join(_SPLIT_COUNTS)} (and chars, eos) as "
                             f"integers >= 0, got {split!r}")


IDS_CHECKED = "ids_checked.json"
"""Beside meta.json: the .bin files whose ids were checked, each by its stamp then (device, inode, size, times)."""


def _check_ids_once(path: Path, dtype: str, vocab_size: int) -> None:
    """`_check_ids`, skipped for a file checked before and unchanged since: the check reads the whole file (20 GB
    for a 10-billion-token dataset) at every start of every command, on every rank."""
    # (dtype in the key: the same bytes read as uint32 are other ids)
    memoized(path.with_name(IDS_CHECKED), ["ids", dtype, vocab_size], {path: stamp(path)},
             lambda: _check_ids(path, dtype, vocab_size) or True)


def _check_ids(path: Path, dtype: str, vocab_size: int) -> None:
    """Refuse a .bin holding an id outside 0..vocab_size-1 now, not when a batch happens to draw it (an index
    error deep inside the embedding, or on GPU a device-side assert). Reads SCAN_TOKENS ids at a time."""
    # read, not memory-mapped: a memmap kept every page it had scanned resident, the size of the file (9 GB of RSS
    # opening a 5-billion-token dataset, in each rank)
    if (size := path.stat().st_size) >= LONG_READ:  # (~20 s for 10 billion tokens from the page cache: said)
        log.info("checking the token ids of %s (%.1f GB) ...", path, size / 1e9)
    start = 0
    with open(path, "rb") as f:
        while len(chunk := np.fromfile(f, dtype=np.dtype(dtype).newbyteorder("<"), count=SCAN_TOKENS)):
            if int(chunk.max()) >= vocab_size:
                at = int(np.argmax(chunk >= vocab_size))
                raise ValueError(f"{path} holds token id {int(chunk[at])} at position {start + at}, outside the "
                                 f"vocabulary of {vocab_size} ids; it was made by another tokenizer or is damaged: "
                                 "delete the folder and run `tinylm prepare` again")
            start += len(chunk)
