"""The data side without Lightning: the data module's options (its `--data.*`), the corpora, the tokenizer and the
prepared datasets, built and checked, and the summary `tinylm prepare` prints. `tinylm prepare` runs this alone (no
torch, no Lightning: seconds of imports saved); tinylm.data.datamodule adds the batches and their resume state."""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import re
import unicodedata
from pathlib import Path
from typing import Any

from tinylm.data.clean import REPORT_FILE, CleanOptions, clean_corpora, options_from
from tinylm.data.corpus import Corpus
from tinylm.data.mixture import Mixture, open_corpora
from tinylm.data.prepare import (
    TRAIN_STATS,
    dataset_dir_for,
    default_cache_dir,
    load_meta,
    prepare_dataset,
    prepare_tokenizer,
    resumed_note,
    tokenizer_dir_for,
)
from tinylm.paths import not_utf8
from tinylm.ranges import check_ranges
from tinylm.tokenize import TRAINED_SPECS, Tokenizer
from tinylm.tokenize.tokenizer import EOS_NAMES, build_tokenizer

# the seed keys a uint64 hash (loader.TrainBatches) and torch.Generator.manual_seed; a trained vocabulary of 2**21
# ids is 8x the largest in use (256k), and a BPE trainer's memory grows with the target (2**31 asks for 283 GB)
RANGES = {
    "vocab_size": "[1, 2**21]", "block_size": "[1, inf)", "batch_size": "[1, inf)", "val_fraction": "(0, 1)",
    "val_batches": "[1, inf)", "num_workers": "[0, inf)", "seed": "[0, 2**64)", "tokenizer_train_chars": "[1, inf)",
    "max_documents": "[1, inf)",
}
"""Valid values of the data module's numeric options (interval notation, see tinylm.ranges)."""

VAL_FRACTION = 0.1  # data.val_fraction's default: nanoGPT's data[:int(n * 0.9)]
log = logging.getLogger(__name__)


class PreparedData:
    """Corpus -> tokenizer -> packed memmaps -> (x, y) batches of shape (batch_size, block_size).

    Args:
        corpus: where the text comes from: `tinyshakespeare`, a text file, a directory or glob of text files,
            a local .jsonl/.json/.parquet/.csv file, or `hf:NAME` for a Hugging Face dataset; or a list of these
            to train on a mixture (see `weights`).
        weights: with a list of corpora, the share of training windows drawn from each (normalised to sum to 1;
            None: in proportion to their train tokens, as if concatenated). Each corpus is prepared on its own,
            all with one tokenizer trained on all of them, and validation logs val/loss/NAME for each corpus
            beside val/loss over all of them.
        tokenizer: `char`, `bpe` (trained with HF tokenizers), `scratch-bpe` (tinylm.tokenize.bpe), `tiktoken:NAME`,
            `tiktoken:PATH.tiktoken`, or a path to a tokenizer.json / saved tokenizer directory.
        vocab_size: target vocabulary size (ids, special tokens included) of trained BPE tokenizers. The model
            gets the tokenizer's real size, which may be smaller.
        tokenizer_train_chars: trained BPE tokenizers learn from about this many characters of documents spread
            evenly over a larger corpus (None: the whole corpus). The default trains in minutes on 2 cores and
            costs well under 1% of compression (docs/benchmarks.md).
        block_size: context length in tokens of each training/validation window.
        batch_size: windows per batch on each device.
        val_fraction: share of the corpus's characters, taken from its end, that forms the validation split;
            unused when the corpus has its own validation split.
        val_batches: evaluate only the first N validation batches (None: all of the split), over all devices.
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
        streaming: read an `hf:` dataset (or a local .jsonl/.parquet/.csv file) with `streaming=True`: nothing is
            downloaded whole, tokens are written as documents arrive. Validation is the dataset's own `val_split`
            when it has one, else the first val_fraction x max_documents documents of the train split (held out).
        max_documents: with `streaming`, train on N documents of the stream (None: all of it): its first N, or
            the N after the held-out head when validation is one (needed then, to size it).
        clean: cleaning applied document by document before packing: exact and near-duplicate removal, quality
            filters, decontamination of validation (`--data.clean.*`, each off by default; tinylm.data.clean).
            Another setting makes another dataset; `tinylm prepare` prints what each rule removed.
    """

    def __init__(self, *, corpus: str | list[str] = "tinyshakespeare", weights: list[float] | None = None,
                 tokenizer: str = "char", vocab_size: int = 8192,
                 tokenizer_train_chars: int | None = 250_000_000, block_size: int = 256, batch_size: int = 64,
                 val_fraction: float = VAL_FRACTION, val_batches: int | None = None, cache_dir: str | None = None,
                 num_workers: int = 0,
                 seed: int = 1337, split: str = "train", val_split: str = "validation", text_column: str = "text",
                 data_files: str | list[str] | dict[str, str | list[str]] | None = None,
                 hf_config: str | None = None, hf_revision: str | None = None, streaming: bool = False,
                 max_documents: int | None = None, clean: CleanOptions = CleanOptions()) -> None:  # noqa: B008 (frozen)
        super().__init__()
        check_data_ranges(locals())  # locals(): every argument by name
        self.clean = options_from(clean)
        if not tokenizer.strip():
            build_tokenizer(tokenizer)  # its one line, before anything is read
        if why := not_utf8(tokenizer, "rename it in UTF-8 (mv) and pass --data.tokenizer NEW_NAME"):  # (as data.corpus)
            raise ValueError(f"data.tokenizer {tokenizer!r} is no UTF-8 text: {why}")
        corpus = _corpus_specs(corpus)  # (rebound: the hyperparameters record strings, never a Path)
        self.corpus_specs = [corpus] if isinstance(corpus, str) else list(corpus)
        _check_mixture(self.corpus_specs, weights)
        self.corpus_spec = corpus if isinstance(corpus, str) else " + ".join(self.corpus_specs)
        self.weights = weights
        self.tokenizer_spec, self.target_vocab_size = tokenizer, vocab_size
        self.tokenizer_train_chars = tokenizer_train_chars
        self.block_size, self.batch_size, self.val_fraction, self.val_batches = (block_size, batch_size,
                                                                                 val_fraction, val_batches)
        if cache_dir is not None and not str(cache_dir).strip():  # (it fell back to the default without a word)
            raise ValueError("data.cache_dir is empty (an unset shell variable?); pass a folder, or leave it out for "
                             "$TINYLM_CACHE_DIR or ./data_cache")
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        if self.cache_dir.exists() and not self.cache_dir.is_dir() and not cache_dir and \
                (env := os.environ.get("TINYLM_CACHE_DIR")):  # (the user set no data.cache_dir: name what they set)
            raise NotADirectoryError(f"$TINYLM_CACHE_DIR {env!r} (the data cache, with no --data.cache_dir) is a "
                                     "file, not a folder; set TINYLM_CACHE_DIR to a folder, or pass "
                                     "--data.cache_dir DIR")
        if self.cache_dir.exists() and not self.cache_dir.is_dir():
            raise NotADirectoryError(f"data.cache_dir {str(self.cache_dir)!r} is a file, not a folder; pass "
                                     "--data.cache_dir DIR (or set $TINYLM_CACHE_DIR) to a folder")
        self.num_workers, self.seed = num_workers, seed
        self._hf = {"split": split, "val_split": val_split, "text_column": text_column, "data_files": data_files,
                        "hf_config": hf_config, "hf_revision": hf_revision, "streaming": streaming,
                        "max_documents": max_documents, "val_fraction": val_fraction}
        self._corpora: list[Corpus] | None = None
        self._tokenizer: Tokenizer | None = None
        self._metas: list[dict] | None = None
        self.record_hyperparameters(inspect.currentframe())

    def record_hyperparameters(self, frame) -> None:
        """Where a LightningDataModule saves the arguments of ``__init__`` (``frame``): TinyLMDataModule. Nothing
        here: preparing data keeps no hyperparameters."""

    # ---- lazy pieces: LightningCLI reads vocab_size right after __init__, before prepare_data
    @property
    def corpora(self) -> list[Corpus]:
        """The corpora of `data.corpus`, one per list entry."""
        if self._corpora is None:
            self._corpora = clean_corpora(open_corpora(self.corpus_specs, cache_dir=self.cache_dir, **self._hf),
                                          self.clean, val_fraction=self.val_fraction)
        return self._corpora

    @property
    def corpus(self) -> Corpus:
        """The corpus, or for a mixture all of its corpora one after the other (what the tokenizer learns from)."""
        return self.corpora[0] if len(self.corpora) == 1 else Mixture(self.corpora)

    @property
    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer (trained or loaded on first use, then cached on disk)."""
        if self._tokenizer is None:
            self._tokenizer = prepare_tokenizer(self.corpus, self.tokenizer_spec, vocab_size=self.target_vocab_size,
                                                train_chars=self.tokenizer_train_chars, cache_dir=self.cache_dir)
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
    def dataset_dirs(self) -> list[Path]:
        """The prepared datasets' folders, one per corpus (they may not be built yet)."""
        return [dataset_dir_for(c, self.tokenizer, val_fraction=self.val_fraction, cache_dir=self.cache_dir)
                for c in self.corpora]

    @property
    def dataset_dir(self) -> Path:
        """The prepared dataset's folder (the first corpus's, for a mixture)."""
        return self.dataset_dirs[0]

    @property
    def metas(self) -> list[dict]:
        """Each dataset's meta.json, checked against the tokenizer (datasets are built if missing)."""
        if self._metas is None:
            self._metas = [load_meta(prepare_dataset(c, self.tokenizer, val_fraction=self.val_fraction,
                                                     cache_dir=self.cache_dir), self.tokenizer) for c in self.corpora]
            for corpus, meta in zip(self.corpora, self._metas):
                # a document cut between the splits counts in both
                documents = max(split["documents"] for split in meta["splits"].values())
                if self.tokenizer.eos_id is None and documents > 1:
                    log.warning("tokenizer %s has no end-of-text token (none of %s): the documents of %s are packed "
                                "with nothing between them, and generation has no token to end a text at; add one "
                                "of these to the tokenizer's special tokens", self.tokenizer.spec,
                                ", ".join(EOS_NAMES), corpus.spec)
            for corpus, meta in zip(self.corpora, self._metas):
                wanted, got = getattr(corpus, "max_documents", None), meta["splits"]["train"]["documents"]
                if wanted is not None and got < wanted:  # a stream that ran out (the held-out head came first)
                    log.warning("streamed corpus %s ran out after %s training documents of the %s of "
                                "--data.max_documents%s", corpus.spec, f"{got:,}", f"{wanted:,}",
                                f" (validation held out its first {corpus.val_documents:,})"
                                if corpus.val_source == "held-out head" else "")
            own = [c.spec for c, m in zip(self.corpora, self._metas)  # validation read whole from its own split
                   if m["settings"].get("val_fraction") is None and getattr(c, "val_documents", None) is None]
            if self.val_fraction != VAL_FRACTION and len(own) == len(self.corpora):
                log.warning("data.val_fraction=%s does nothing here: %s %s its own validation split (%r), read "
                            "whole; drop it, or pass --data.val_split %s to cut validation from the tail of the train "
                            "split instead", self.val_fraction, ", ".join(own), "has" if len(own) == 1 else "have",
                            self._hf["val_split"], self._hf["split"])
        return self._metas

    @property
    def meta(self) -> dict:
        """The dataset's meta.json (the first corpus's, for a mixture)."""
        return self.metas[0]

    @property
    def val_names(self) -> list[str]:
        """One name per corpus, as in val/loss/NAME: the corpus's file or dataset name, numbered when repeated. Each
        is unique: `a/x.txt`, `b/x.txt` and a file `x.txt_1` logged two corpora under one key (which Lightning
        averaged: neither corpus's loss), had the number not grown until it named no other corpus."""
        names = [_metric_name(_readable_name(c)) for c in self.corpora]
        unique: list[str] = []
        for i, n in enumerate(names):
            name = f"{n}_{i}" if names.count(n) > 1 else n
            while name in unique or (name != n and name in names):
                name += f"_{i}"
            unique.append(name)
        return unique

    # ---- Lightning's hooks (their names), which `tinylm prepare` runs without Lightning
    def prepare_data(self) -> None:
        """Train/load the tokenizer and build the datasets (Lightning runs this on one process per node)."""
        self._metas = None
        _ = self.metas

    def setup(self, stage: str | None = None) -> None:
        self.check_splits(stage)

    def check_splits(self, stage: str | None) -> None:
        """Refuse a split too short for one window of what ``stage`` reads (fit: both; validate: val)."""
        splits = {"fit": ("train", "val"), "validate": ("val",), None: ("train", "val")}.get(stage, ())
        for split in splits:
            for spec, meta in zip(self.corpus_specs, self.metas):
                n = meta["splits"][split]["tokens"]
                if n < self.block_size + 1:
                    raise ValueError(
                        f"the {split} split{f' of {spec}' if len(self.metas) > 1 else ''} has {n} tokens, but one "
                        "window needs block_size + 1 = "
                        f"{self.block_size + 1}; use a smaller --data.block_size, a "
                        f"{'larger' if split == 'val' else 'smaller'} --data.val_fraction (now {self.val_fraction}), "
                        "or a bigger corpus")

    def summary(self) -> dict:
        """What `tinylm prepare` prints (totals over the corpora of a mixture)."""
        m, metas = self.meta, self.metas
        split = lambda s, k: sum(x["splits"][s][k] for x in metas)
        out = {
            "dataset": ", ".join(map(str, self.dataset_dirs)),
            "corpus": self.corpus_spec,
            "tokenizer": f"{self.tokenizer_spec} ({self.tokenizer.kind})",
            "vocab_size": m["vocab_size"],
            "eos_id": m["eos_id"],
            "dtype": m["dtype"],
            "train_tokens": split("train", "tokens"),
            "val_tokens": split("val", "tokens"),
            "train_documents": split("train", "documents"),
            "val_documents": split("val", "documents"),
            "val_source": m["settings"]["val_source"],
            # per token of text: the end-of-text ids stand for no bytes (datasets before the count: documents)
            "bytes_per_token": (split("train", "bytes") + split("val", "bytes"))
            / max(1, sum(split(s, "tokens") - self._eos_count(s) for s in ("train", "val"))),
            # the figure val/bpb divides by; a trained tokenizer has read the val tail too (docs/data.md)
            "val_bytes_per_token": split("val", "bytes") / max(1, split("val", "tokens") - self._eos_count("val")),
        }
        if len(metas) > 1:
            weights = self.weights or [x["splits"]["train"]["tokens"] for x in metas]
            out["mixture"] = ", ".join(f"{n} {w / sum(weights):.3f}" for n, w in zip(self.val_names, weights))
        out["measured"] = self._measured()
        if self.clean.active:
            out.update(self._cleaned())
        return out

    def _cleaned(self) -> dict:
        """What cleaning removed, rule by rule (totals over the corpora), with the start of one example each."""
        reports = [json.loads(Path(d, REPORT_FILE).read_text(encoding="utf-8")) for d in self.dataset_dirs
                   if Path(d, REPORT_FILE).is_file()]
        if not reports:
            return {}
        total = lambda key, what: sum(r[key][what] for r in reports)
        out = {"cleaned": f"kept {total('kept', 'documents'):,} of {total('read', 'documents'):,} documents "
                          f"({total('kept', 'bytes') / 1e6:,.1f} of {total('read', 'bytes') / 1e6:,.1f} MB); "
                          f"report: {', '.join(str(Path(d, REPORT_FILE)) for d in self.dataset_dirs)}"}
        for rule in self.clean.rules:
            docs = sum(r["removed"][rule]["documents"] for r in reports)
            n_bytes = sum(r["removed"][rule]["bytes"] for r in reports)
            example = next((x for r in reports for x in r["removed"][rule]["examples"]), None)
            shown = "" if example is None else f", e.g. {' '.join(example.split())[:60]!r}"
            out[f"removed by {rule}"] = f"{docs:,} documents ({n_bytes / 1e6:,.2f} MB){shown}"
        return out

    def _eos_count(self, split: str) -> int:
        if self.meta["eos_id"] is None:
            return 0
        return sum(x["splits"][split].get("eos", x["splits"][split]["documents"]) for x in self.metas)

    def _measured(self) -> str:
        """How fast the tokenizer trained and the corpus was tokenized, when they were built (on this machine or
        wherever the cached folders were made)."""
        parts = []
        if self.tokenizer_spec in TRAINED_SPECS:
            stats = Path(tokenizer_dir_for(self.corpus, self.tokenizer_spec, vocab_size=self.target_vocab_size,
                                           train_chars=self.tokenizer_train_chars, cache_dir=self.cache_dir),
                         TRAIN_STATS)
            if stats.is_file():
                t = json.loads(stats.read_text(encoding="utf-8"))
                parts.append(f"tokenizer trained on {t['bytes'] / 1e6:,.1f} MB in {t['seconds']:,.1f} s "
                             f"({t['mb_per_s']:.2f} MB/s)")
        builds = [x["build"] for x in self.metas if "build" in x]
        if builds:
            n, secs = sum(b["bytes"] for b in builds), sum(b["seconds"] for b in builds)
            parts.append(f"tokenized {n / 1e6:,.1f} MB in {secs:,.1f} s ({n / 1e6 / max(secs, 1e-9):.2f} MB/s)"
                         + resumed_note(sum(b.get("resumed_bytes", 0) for b in builds)))
        return "when built: " + "; ".join(parts) if parts else "nothing was timed (folders made by an older tinylm)"


def check_data_ranges(options: dict[str, Any]) -> None:
    """ValueError naming the first numeric data option of ``options`` out of its range (RANGES; counts whole), and
    of ``clean`` given as a dict (a config's, checked before the unused-option warnings: its refusal is said
    alone)."""
    check_ranges("data", options, RANGES, whole=set(RANGES) - {"val_fraction"})
    if isinstance(clean := options.get("clean"), dict):
        options_from(clean)


def _corpus_specs(corpus: Any) -> str | list[str]:
    """data.corpus as str specs: a path object is its path; anything else than str, path or a list of them is
    named."""
    def one(spec: Any) -> str:
        if isinstance(spec, os.PathLike):
            return os.fspath(spec)
        if not isinstance(spec, str):
            raise TypeError(f"data.corpus takes a path, a dataset name or a list of them; got {type(spec).__name__} "
                            f"{spec!r:.60}")
        if why := not_utf8(spec, "rename the file or folder in UTF-8 (convmv -f latin1 -t utf8 --notest NAME, or mv) "
                                 "and pass --data.corpus NEW_NAME"):  # (meta.json and config.yaml cannot hold it)
            raise ValueError(f"data.corpus {spec!r} is no UTF-8 text: {why}")
        return spec
    return [one(c) for c in corpus] if isinstance(corpus, (list, tuple)) else one(corpus)


def _check_mixture(specs: list[str], weights: list[float] | None) -> None:
    if not specs:
        raise ValueError("data.corpus is an empty list; name at least one corpus")
    if weights is None:
        return
    if len(weights) != len(specs):
        raise ValueError(f"data.weights has {len(weights)} entries but data.corpus names {len(specs)} corpora; give "
                         "one weight per corpus, in the same order (or leave data.weights unset: --data.weights null)")
    if not all(w > 0 and math.isfinite(w) for w in weights):
        raise ValueError(f"data.weights must all be positive finite numbers, got {weights}")
    if not math.isfinite(sum(weights)):  # each share is a weight over the sum: inf made every share 0 or NaN
        raise ValueError(f"data.weights sum to more than the largest float ({weights}); they are only shares, so "
                         "give them on a smaller scale (e.g. [1, 3])")


def _readable_name(corpus: Corpus) -> str:
    """The corpus's name, or for a glob (named by its pattern: `data/en/*.txt` and `data/de/*.txt` logged
    val/loss/.txt_0 and val/loss/.txt_1) the name of the nearest folder of the spec that is no pattern (`en`)."""
    if not any(c in corpus.name for c in "*?[") or Path(corpus.spec).expanduser().exists():  # (`notes[1].txt`)
        return corpus.name
    folders = [p for p in Path(corpus.spec).parent.parts if not any(c in p for c in "*?[") and p not in ("/", ".")]
    return folders[-1] if folders else corpus.name


def _metric_name(name: str) -> str:
    """``name`` with letters and digits of any script kept (NFC: a macOS name's é is one letter): `théâtre.txt`
    and `日本語.txt` were logged as val/loss/th_tre.txt and val/loss/.txt, two such names told apart by number."""
    kept = "".join(c if c.isalnum() or c in "_.-" or unicodedata.category(c).startswith("M") else "\0"
                   for c in unicodedata.normalize("NFC", name))  # (marks too: हिन्दी's vowel signs, น้ำ's tone mark)
    return re.sub("\0+", "_", kept).strip("_") or "corpus"
