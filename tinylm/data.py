"""Tokenize -> pack -> memmap, and the LightningDataModule that serves (B, T) windows from it.

On disk (under `cache_dir`, see `TinyLMDataModule`):
    tokenizers/<spec>-<corpus>-<key>/     trained tokenizers, keyed by corpus fingerprint + spec + vocab_size
    datasets/<corpus>-<kind><V>-<key>/    keyed by corpus fingerprint + tokenizer fingerprint + split settings
        tokenizer/  train.bin  val.bin    flat little-endian token ids (uint16 when the vocab fits, else uint32)
        meta.json                         written last; a folder without it is an interrupted build and is rebuilt
Each folder is built as `<dir>.tmp-<pid>` and renamed into place, so readers never see half of one.

Letters in shape comments: B = batch size, T = block size (context length in tokens).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from tinylm.corpus import Corpus, open_corpus
from tinylm.tokenizer import STATE_FILE, TRAINED_SPECS, Tokenizer, build_tokenizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
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


def _publish(final: Path, write: Callable[[Path], None], complete: str) -> None:
    """Build `final` through `write(tmp)` in a sibling temp folder, then rename it into place atomically.
    `complete` is the file whose presence marks a finished folder; a folder without it is rebuilt."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
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
    meta = json.loads(path.read_text(encoding="utf-8"))
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{dataset_dir} has dataset format {meta.get('format_version')!r}, this tinylm reads "
                         f"{FORMAT_VERSION}; delete the folder and run `tinylm prepare` again")
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
        size = (dataset_dir / f"{split}.bin").stat().st_size
        if size != stats["tokens"] * itemsize:
            raise ValueError(f"{dataset_dir / f'{split}.bin'} has {size} bytes, meta.json says "
                             f"{stats['tokens']} tokens x {itemsize}; the file is damaged: delete the folder and "
                             "run `tinylm prepare` again")
    return meta


# ------------------------------------------------------------------------------------------------ reading
_M1, _M2, _M3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A bijective 64-bit mix (splitmix64's finalizer): consecutive inputs give unrelated outputs."""
    x = x + _M1
    x = (x ^ (x >> np.uint64(30))) * _M2
    x = (x ^ (x >> np.uint64(27))) * _M3
    return x ^ (x >> np.uint64(31))


class _TokenWindows(Dataset):
    """Reads windows of T + 1 tokens from a .bin file, memory-mapped lazily in whichever process reads
    (an open memmap is never pickled into DataLoader workers)."""

    def __init__(self, path: str | Path, *, dtype: str, n_tokens: int, block_size: int, batch_size: int) -> None:
        self.path, self.dtype, self.n_tokens = str(path), dtype, n_tokens
        self.block_size, self.batch_size = block_size, batch_size
        self._data: np.memmap | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_data": None}

    def windows(self, offsets: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.dtype(self.dtype).newbyteorder("<"), mode="r")
        idx = offsets[:, None] + np.arange(self.block_size + 1)  # (B, T + 1): the target needs the next token too
        buf = torch.from_numpy(self._data[idx].astype(np.int64))  # (B, T + 1)
        return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()  # x, y: (B, T) each


class TrainBatches(_TokenWindows):
    """Batch k (of this rank) is B windows at random offsets that are a pure function of (seed, sample index),
    where rank r's batch k holds samples (k * world_size + r) * B ... + B - 1. So resuming at batch k needs only
    k, ranks never share windows, and 1 device x batch 2B draws the same windows as 2 devices x batch B."""

    def __init__(self, path: str | Path, *, dtype: str, n_tokens: int, block_size: int, batch_size: int,
                 seed: int, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(path, dtype=dtype, n_tokens=n_tokens, block_size=block_size, batch_size=batch_size)
        if n_tokens < block_size + 1:
            raise ValueError(f"train split has {n_tokens} tokens, fewer than block_size + 1 = {block_size + 1}")
        self.seed, self.rank, self.world_size = seed, rank, world_size

    def offsets(self, k: int) -> np.ndarray:
        first = (k * self.world_size + self.rank) * self.batch_size
        samples = np.arange(first, first + self.batch_size, dtype=np.uint64)
        key = _splitmix64(np.array([self.seed], dtype=np.uint64))
        high = np.uint64(self.n_tokens - self.block_size)  # offsets 0 .. n - T - 1 leave room for the target
        return (_splitmix64(samples ^ key) % high).astype(np.int64)  # (B,)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.windows(self.offsets(k))


class ValBatches(_TokenWindows):
    """Non-overlapping windows tiling the whole split in order (the last batch may be smaller); `limit` keeps the
    first batches only. The same on every call and every rank."""

    def __init__(self, path: str | Path, *, dtype: str, n_tokens: int, block_size: int, batch_size: int,
                 limit: int | None = None) -> None:
        super().__init__(path, dtype=dtype, n_tokens=n_tokens, block_size=block_size, batch_size=batch_size)
        self.n_windows = (n_tokens - 1) // block_size
        n = -(-self.n_windows // batch_size)
        self.n_batches = n if limit is None else min(n, limit)

    def __len__(self) -> int:
        return self.n_batches

    def __getitem__(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= j < self.n_batches:
            raise IndexError(j)
        w = np.arange(j * self.batch_size, min((j + 1) * self.batch_size, self.n_windows), dtype=np.int64)
        return self.windows(w * self.block_size)


class _EpochSampler(Sampler[int]):
    """Global batch ids from `start` to the end of its notional epoch (ids keep counting across epochs)."""

    def __init__(self, epoch_length: int) -> None:
        self.epoch_length, self.start = epoch_length, 0

    def __len__(self) -> int:
        return self.epoch_length

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, (self.start // self.epoch_length + 1) * self.epoch_length))


class ResumableLoader(DataLoader):
    """A DataLoader over `TrainBatches` that counts the batches it has yielded. Lightning saves `state_dict()` in
    checkpoints (it does so only for loaders that have one) and after `load_state_dict` iteration resumes at that
    batch. Its own `generator` keeps iteration from drawing on the global RNG (resumed dropout stays exact)."""

    def __init__(self, dataset: TrainBatches, *, epoch_length: int, start: int = 0, num_workers: int = 0,
                 pin_memory: bool = False, seed: int = 0) -> None:
        self.epoch_length, self.batches_yielded = epoch_length, start
        self._positions = _EpochSampler(epoch_length)
        super().__init__(dataset, batch_size=None, sampler=self._positions, num_workers=num_workers,
                         pin_memory=pin_memory, generator=torch.Generator().manual_seed(seed))

    def __iter__(self) -> Iterator[Any]:
        self._positions.start = self.batches_yielded
        for batch in super().__iter__():
            self.batches_yielded += 1  # before yielding: a checkpoint taken while this batch trains counts it
            yield batch

    def state_dict(self) -> dict:
        return {"batches_yielded": self.batches_yielded}

    def load_state_dict(self, state: dict) -> None:
        self.batches_yielded = int(state["batches_yielded"])


# ------------------------------------------------------------------------------------------------ datamodule
class TinyLMDataModule(L.LightningDataModule):
    """Corpus -> tokenizer -> packed memmaps -> (x, y) batches of shape (batch_size, block_size).

    Args:
        corpus: where the text comes from: `tinyshakespeare`, a text file, a directory or glob of text files,
            a local .jsonl/.json/.parquet/.csv file, or `hf:NAME` for a Hugging Face dataset.
        tokenizer: `char`, `bpe` (trained with HF tokenizers), `scratch-bpe` (tinylm.bpe), `tiktoken:NAME`,
            `tiktoken:PATH.tiktoken`, or a path to a tokenizer.json / saved tokenizer directory.
        vocab_size: target vocabulary size (ids, special tokens included) of trained BPE tokenizers. The model
            gets the tokenizer's real size, which may be smaller.
        block_size: context length in tokens of each training/validation window.
        batch_size: windows per batch on each device.
        val_fraction: share of the corpus's characters, taken from its end, that forms the validation split;
            unused when the corpus has its own validation split.
        val_batches: evaluate only the first N validation batches (None: all of the split).
        cache_dir: folder for downloads, tokenizers and datasets (None: $TINYLM_CACHE_DIR, else ./data_cache).
        num_workers: DataLoader worker processes (0: load in the main process).
        seed: seed of the training windows' random offsets.
        split: dataset split used for training (hf: and local dataset files).
        val_split: dataset split used for validation when the dataset has it (hf: and local dataset files).
        text_column: dataset column holding the text (hf: and local dataset files).
        data_files: files for `hf:json` / `hf:parquet` / `hf:csv` / `hf:text`: a path, a list, or a dict
            {split: path(s)}.
        hf_config: dataset configuration name (the `name` argument of `datasets.load_dataset`).
        hf_revision: dataset revision (git tag, branch or commit) to pin.
    """

    def __init__(self, *, corpus: str = "tinyshakespeare", tokenizer: str = "char", vocab_size: int = 8192,
                 block_size: int = 256, batch_size: int = 64, val_fraction: float = 0.1,
                 val_batches: int | None = None, cache_dir: str | None = None, num_workers: int = 0,
                 seed: int = 1337, split: str = "train", val_split: str = "validation", text_column: str = "text",
                 data_files: str | list[str] | dict[str, str | list[str]] | None = None,
                 hf_config: str | None = None, hf_revision: str | None = None) -> None:
        super().__init__()
        for name, value in (("block_size", block_size), ("batch_size", batch_size)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}; 0.1 keeps the last 10% for "
                             "validation")
        if val_batches is not None and val_batches < 1:
            raise ValueError(f"val_batches must be >= 1 or None (all), got {val_batches}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        # `vocab_size` here is the *target* for trained tokenizers; the model logs the real one under the same name
        self.save_hyperparameters(ignore=["vocab_size"])
        self.corpus_spec, self.tokenizer_spec, self.target_vocab_size = corpus, tokenizer, vocab_size
        self.block_size, self.batch_size, self.val_fraction, self.val_batches = (block_size, batch_size,
                                                                                 val_fraction, val_batches)
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.num_workers, self.seed = num_workers, seed
        self._hf = dict(split=split, val_split=val_split, text_column=text_column, data_files=data_files,
                        hf_config=hf_config, hf_revision=hf_revision)
        self._corpus: Corpus | None = None
        self._tokenizer: Tokenizer | None = None
        self._meta: dict | None = None
        self._train_loader: ResumableLoader | None = None
        self._resume_batches = 0

    # ---- lazy pieces: LightningCLI reads vocab_size right after __init__, before prepare_data
    @property
    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = open_corpus(self.corpus_spec, cache_dir=self.cache_dir, **self._hf)
        return self._corpus

    @property
    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer (trained or loaded on first use, then cached on disk)."""
        if self._tokenizer is None:
            self._tokenizer = prepare_tokenizer(self.corpus, self.tokenizer_spec, vocab_size=self.target_vocab_size,
                                                cache_dir=self.cache_dir)
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """The tokenizer's real vocabulary size (linked into the model)."""
        return self.tokenizer.vocab_size

    @property
    def eos_id(self) -> int | None:
        """Id of the document separator, or None (char tokenizer on a single-document corpus)."""
        return self.tokenizer.eos_id

    @property
    def dataset_dir(self) -> Path:
        """The prepared dataset's folder (it may not be built yet)."""
        return dataset_dir_for(self.corpus, self.tokenizer, val_fraction=self.val_fraction, cache_dir=self.cache_dir)

    @property
    def meta(self) -> dict:
        """The dataset's meta.json, checked against the tokenizer (the dataset is built if missing)."""
        if self._meta is None:
            path = prepare_dataset(self.corpus, self.tokenizer, val_fraction=self.val_fraction,
                                   cache_dir=self.cache_dir)
            self._meta = load_meta(path, self.tokenizer)
        return self._meta

    @property
    def val_bytes_per_token(self) -> float:
        """UTF-8 bytes of raw text per validation token; val/bpb = loss / ln 2 / this."""
        val = self.meta["splits"]["val"]
        return val["bytes"] / max(1, val["tokens"])

    # ---- Lightning hooks
    def prepare_data(self) -> None:
        """Train/load the tokenizer and build the dataset (Lightning runs this on one process per node)."""
        self._meta = None
        _ = self.meta

    def setup(self, stage: str | None = None) -> None:
        splits = {"fit": ("train", "val"), "validate": ("val",), None: ("train", "val")}.get(stage, ())
        for split in splits:
            n = self.meta["splits"][split]["tokens"]
            if n < self.block_size + 1:
                raise ValueError(
                    f"the {split} split has {n} tokens, but one window needs block_size + 1 = {self.block_size + 1}; "
                    f"use a smaller --data.block_size, a {'larger' if split == 'val' else 'smaller'} "
                    f"--data.val_fraction (now {self.val_fraction}), or a bigger corpus")

    def _split(self, name: str) -> dict:
        return {"path": self.dataset_dir / f"{name}.bin", "dtype": self.meta["dtype"],
                "n_tokens": self.meta["splits"][name]["tokens"], "block_size": self.block_size,
                "batch_size": self.batch_size}

    def train_dataloader(self) -> ResumableLoader:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)
        dataset = TrainBatches(**self._split("train"), seed=self.seed, rank=rank, world_size=world)
        epoch_length = max(1, dataset.n_tokens // (self.batch_size * self.block_size))
        self._train_loader = ResumableLoader(dataset, epoch_length=epoch_length, start=self._resume_batches,
                                             num_workers=self.num_workers, pin_memory=torch.cuda.is_available(),
                                             seed=self.seed)
        return self._train_loader

    def val_dataloader(self) -> DataLoader:
        dataset = ValBatches(**self._split("val"), limit=self.val_batches)
        return DataLoader(dataset, batch_size=None, shuffle=False, num_workers=self.num_workers,
                          pin_memory=torch.cuda.is_available(), persistent_workers=self.num_workers > 0,
                          generator=torch.Generator().manual_seed(self.seed))

    # ---- the sampler position travels in checkpoints (restored before train_dataloader() is called)
    def state_dict(self) -> dict:
        done = self._train_loader.batches_yielded if self._train_loader is not None else self._resume_batches
        return {"train_batches_yielded": done}

    def load_state_dict(self, state_dict: dict) -> None:
        self._resume_batches = int(state_dict.get("train_batches_yielded", 0))
        if self._train_loader is not None:
            self._train_loader.load_state_dict({"batches_yielded": self._resume_batches})

    def summary(self) -> dict:
        """What `tinylm prepare` prints."""
        m = self.meta
        train, val = m["splits"]["train"], m["splits"]["val"]
        return {
            "dataset": str(self.dataset_dir),
            "corpus": self.corpus_spec,
            "tokenizer": f"{self.tokenizer_spec} ({self.tokenizer.kind})",
            "vocab_size": m["vocab_size"],
            "eos_id": m["eos_id"],
            "dtype": m["dtype"],
            "train_tokens": train["tokens"],
            "val_tokens": val["tokens"],
            "train_documents": train["documents"],
            "val_documents": val["documents"],
            "val_source": m["settings"]["val_source"],
            "bytes_per_token": (train["bytes"] + val["bytes"]) / max(1, train["tokens"] + val["tokens"]),
        }
