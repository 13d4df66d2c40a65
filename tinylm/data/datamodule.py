"""The LightningDataModule: corpus -> tokenizer -> packed memmaps -> (x, y) batches of shape (B, T)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader

from tinylm.data.clean import REPORT_FILE, CleanOptions, clean_corpora, options_from
from tinylm.data.corpus import Corpus, Mixture, open_corpus
from tinylm.data.loader import (
    MixedTrainBatches,
    ResumableLoader,
    StoppingLoader,
    TrainBatches,
    ValBatches,
    worker_signals,
)
from tinylm.data.prepare import (
    TRAIN_STATS,
    dataset_dir_for,
    default_cache_dir,
    load_meta,
    prepare_dataset,
    prepare_tokenizer,
    tokenizer_dir_for,
)
from tinylm.ranges import check_ranges
from tinylm.tokenize import TRAINED_SPECS, Tokenizer
from tinylm.tokenize.tokenizer import EOS_NAMES

# the seed keys a uint64 hash (loader.TrainBatches) and torch.Generator.manual_seed; a trained vocabulary of 2**21
# ids is 8x the largest in use (256k), and a BPE trainer's memory grows with the target (2**31 asks for 283 GB)
RANGES = {
    "vocab_size": "[1, 2**21]", "block_size": "[1, inf)", "batch_size": "[1, inf)", "val_fraction": "(0, 1)",
    "val_batches": "[1, inf)", "num_workers": "[0, inf)", "seed": "[0, 2**64)", "tokenizer_train_chars": "[1, inf)",
    "max_documents": "[1, inf)",
}
"""Valid values of the data module's numeric options (interval notation, see tinylm.ranges)."""

log = logging.getLogger(__name__)


def other_data(before: str, after: str, fix: str) -> Exception:
    """The error of a resume that would draw other training data than its checkpoint's run."""
    from tinylm.checkpoint import CheckpointError

    return CheckpointError(f"the checkpoint was trained with {before} but this run has {after}, so the resumed run "
                           f"would draw different data; resume with {fix}, or start a new run")


class TinyLMDataModule(L.LightningDataModule):
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
                 val_fraction: float = 0.1, val_batches: int | None = None, cache_dir: str | None = None,
                 num_workers: int = 0,
                 seed: int = 1337, split: str = "train", val_split: str = "validation", text_column: str = "text",
                 data_files: str | list[str] | dict[str, str | list[str]] | None = None,
                 hf_config: str | None = None, hf_revision: str | None = None, streaming: bool = False,
                 max_documents: int | None = None, clean: CleanOptions = CleanOptions()) -> None:  # noqa: B008 (frozen)
        super().__init__()
        check_ranges("data", locals(), RANGES)  # locals(): every argument by name
        # `vocab_size` here is the *target* for trained tokenizers; the model logs the real one under the same name
        self.save_hyperparameters(ignore=["vocab_size"], frame=inspect.currentframe())  # as in TinyLM.__init__
        self.hparams["target_vocab_size"] = vocab_size  # for `tinylm validate` without --config (not logged twice)
        self.clean = options_from(clean)
        self.hparams["clean"] = dataclasses.asdict(self.clean)  # plain values: checkpoints load with weights_only
        self.corpus_specs = [corpus] if isinstance(corpus, str) else list(corpus)
        _check_mixture(self.corpus_specs, weights)
        self.corpus_spec = corpus if isinstance(corpus, str) else " + ".join(self.corpus_specs)
        self.weights = weights
        self.tokenizer_spec, self.target_vocab_size = tokenizer, vocab_size
        self.tokenizer_train_chars = tokenizer_train_chars
        self.block_size, self.batch_size, self.val_fraction, self.val_batches = (block_size, batch_size,
                                                                                 val_fraction, val_batches)
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
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
        self._train_loader: ResumableLoader | None = None
        self._resume_batches = 0

    # ---- lazy pieces: LightningCLI reads vocab_size right after __init__, before prepare_data
    @property
    def corpora(self) -> list[Corpus]:
        """The corpora of `data.corpus`, one per list entry."""
        if self._corpora is None:
            self._corpora = clean_corpora([open_corpus(spec, cache_dir=self.cache_dir, **self._hf)
                                           for spec in self.corpus_specs], self.clean, val_fraction=self.val_fraction)
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
        return self._metas

    @property
    def meta(self) -> dict:
        """The dataset's meta.json (the first corpus's, for a mixture)."""
        return self.metas[0]

    @property
    def val_names(self) -> list[str]:
        """One name per corpus, as in val/loss/NAME: the corpus's file or dataset name, numbered when repeated."""
        names = [_metric_name(c.name) for c in self.corpora]
        return [f"{n}_{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]

    # ---- Lightning hooks
    def prepare_data(self) -> None:
        """Train/load the tokenizer and build the datasets (Lightning runs this on one process per node)."""
        self._metas = None
        _ = self.metas

    def setup(self, stage: str | None = None) -> None:
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

    def _split(self, i: int, name: str) -> dict:
        meta = self.metas[i]
        return {"path": self.dataset_dirs[i] / f"{name}.bin", "dtype": meta["dtype"],
                "n_tokens": meta["splits"][name]["tokens"], "block_size": self.block_size,
                "batch_size": self.batch_size}

    def train_dataloader(self) -> ResumableLoader:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)
        parts = [TrainBatches(**self._split(i, "train"), seed=self.seed, rank=rank, world_size=world)
                 for i in range(len(self.corpora))]
        dataset = parts[0] if len(parts) == 1 else MixedTrainBatches(parts, self.weights or
                                                                      [p.n_tokens for p in parts])
        # a notional epoch of whole optimizer steps: Lightning ends an epoch with an optimizer step, so an epoch of
        # batches not a multiple of accumulate_grad_batches stepped on a partial accumulation, and validations
        # every N batches (counted over epochs) fell inside steps after it
        accumulate = getattr(self.trainer, "accumulate_grad_batches", 1) if self.trainer is not None else 1
        epoch_length = max(1, dataset.n_tokens // (self.batch_size * self.block_size))
        epoch_length = max(accumulate, epoch_length - epoch_length % accumulate)
        self._train_loader = ResumableLoader(dataset, epoch_length=epoch_length, start=self._resume_batches,
                                             num_workers=self.num_workers, pin_memory=torch.cuda.is_available(),
                                             seed=self.seed)
        return self._train_loader

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """One loader, or for a mixture one per corpus (the module logs val/loss/NAME for each); under several ranks
        each evaluates its share of the batches."""
        ranks = {"rank": self.trainer.global_rank, "world_size": self.trainer.world_size} \
            if self.trainer is not None else {}
        loaders = [StoppingLoader(ValBatches(**self._split(i, "val"), limit=self.val_batches, **ranks), batch_size=None,
                              shuffle=False, num_workers=self.num_workers, pin_memory=torch.cuda.is_available(),
                              persistent_workers=self.num_workers > 0,
                              worker_init_fn=worker_signals if self.num_workers else None,
                              # every iteration draws a base seed from `generator`, from the global RNG without
                              # one: validation would shift the training's dropout stream (exact resume)
                              generator=torch.Generator().manual_seed(self.seed)) for i in range(len(self.corpora))]
        return loaders[0] if len(loaders) == 1 else loaders

    # ---- the sampler position travels in checkpoints (restored before train_dataloader() is called); Lightning's
    # loop state holds the same count again (ResumableLoader.state_dict), loaded into the loader after this
    def _world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    def state_dict(self) -> dict:
        done = self._train_loader.batches_yielded if self._train_loader is not None else self._resume_batches
        state = {"train_batches_yielded": done, "batch_size": self.batch_size, "world_size": self._world_size(),
                 "seed": self.seed, "block_size": self.block_size, "weights": self.weights,
                 "clean": self.clean.key()}
        if self._metas is not None:  # what the training windows were drawn from: each corpus's text and split
            state.update(corpus_specs=list(self.corpus_specs),
                         corpus_fingerprints=[m["corpus_fingerprint"] for m in self._metas],
                         split_settings=[m["settings"] for m in self._metas], val_fraction=self.val_fraction)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        fitting = self.trainer is not None and self.trainer.state.fn == TrainerFn.FITTING
        if fitting:  # validating or testing from a checkpoint draws no training data: any batch size will do
            self._check_same_data(state_dict)
        elif self.trainer is not None:
            self._check_held_out(state_dict)
        self._resume_batches = int(state_dict.get("train_batches_yielded", 0))
        if self._train_loader is not None:
            self._train_loader.load_state_dict({"batches_yielded": self._resume_batches})

    def _check_same_data(self, saved: dict) -> None:
        """Refuse a resume that would draw other training data than the checkpoint's run (checkpoints from before
        these keys were saved are not checked). Batch k holds global samples k * B * W ... (k + 1) * B * W - 1, keyed
        by the seed (loader.TrainBatches), so what must match is the *global* batch B x W and the seed, not B and W
        one by one: that keeps the door open to an elastic resume onto another device count."""
        from tinylm.checkpoint import CheckpointError

        if "batch_size" not in saved:
            return
        world, n = self._world_size(), saved["world_size"]
        was, now = saved["batch_size"] * n, self.batch_size * world
        diffs = [(f"data.{k}={saved[k]}", f"data.{k}={getattr(self, k)}", f"--data.{k} {saved[k]}")
                 for k in ("seed", "block_size", "weights") if k in saved and not _same(k, saved[k], getattr(self, k))]
        if was != now:
            fix = (f"--data.batch_size {was // world}" if was % world == 0
                   else f"--data.batch_size {saved['batch_size']} on {n} device(s)")
            diffs.insert(0, ((f"a global batch of {was} windows (data.batch_size={saved['batch_size']} x {n} "
                              f"device(s))"), f"{now} (data.batch_size={self.batch_size} x {world})", fix))
        if saved.get("split_settings") not in (None, [m["settings"] for m in self.metas]):
            diffs.append((f"data.val_fraction={saved['val_fraction']}", f"data.val_fraction={self.val_fraction}",
                          f"--data.val_fraction {saved['val_fraction']}"))
        if "clean" in saved and saved["clean"] != self.clean.key():
            diffs.append(_clean_diff(saved["clean"], self.clean.key()))
        if diffs:
            raise other_data(*diffs[0])
        was_fps, now_fps = saved.get("corpus_fingerprints"), [m["corpus_fingerprint"] for m in self.metas]
        if was_fps is not None and was_fps != now_fps:
            changed = next((s for s, a, b in zip(self.corpus_specs, was_fps, now_fps) if a != b), self.corpus_spec)
            raise CheckpointError(f"the checkpoint was trained on other text than data.corpus {changed!r} holds now "
                                  "(its fingerprint changed: the files were edited or replaced), so the resumed run "
                                  "would draw different data; resume with the text it was trained on, or start a "
                                  "new run from its weights (--model.init_from CHECKPOINT)")

    def _check_held_out(self, saved: dict) -> None:
        """Name an evaluation whose validation split may hold text the checkpoint trained on: a val_fraction larger
        than the run's (the split is the corpus's tail, so it reaches back into the run's training text), or the
        run's own corpus holding other text now."""
        was_fps, now_fps = saved.get("corpus_fingerprints"), [m["corpus_fingerprint"] for m in self.metas]
        if was_fps is None:
            return
        if was_fps != now_fps:  # another corpus, evaluated as such; or the run's own, edited since
            if saved.get("corpus_specs") == list(self.corpus_specs):
                log.warning("data.corpus %s holds other text than when the checkpoint trained on it (its fingerprint "
                            "changed: the files were edited or replaced): the validation split may hold text the "
                            "model trained on", self.corpus_spec)
            return
        tail = any((s or {}).get("val_source") == "tail" for s in saved.get("split_settings") or [])
        was = saved.get("val_fraction")
        if tail and was is not None and self.val_fraction > was:
            log.warning("data.val_fraction %s is larger than the %s the checkpoint trained with: the split is the "
                        "corpus's tail, so %.0f%% of it is text the model trained on and val/loss comes out low; "
                        "pass --data.val_fraction %s or smaller", self.val_fraction, was,
                        100 * (self.val_fraction - was) / self.val_fraction, was)

    @staticmethod
    def check_split_before_preparing(saved: dict, val_fraction: float) -> None:
        """Refuse a resume with another val_fraction from the checkpoint's datamodule state alone: the restore
        refuses it too (`_check_same_data`), but only after the data was prepared, which builds a new dataset for
        nothing (the split settings are part of a dataset's key)."""
        cut_by_fraction = any((s or {}).get("val_source") == "tail" for s in saved.get("split_settings") or [])
        if cut_by_fraction and saved.get("val_fraction") != val_fraction:
            raise other_data(f"data.val_fraction={saved['val_fraction']}", f"data.val_fraction={val_fraction}",
                             f"--data.val_fraction {saved['val_fraction']}")

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
            parts.append(f"tokenized {n / 1e6:,.1f} MB in {secs:,.1f} s ({n / 1e6 / max(secs, 1e-9):.2f} MB/s)")
        return "; ".join(parts) or "nothing was timed (folders made by an older tinylm)"


def _same(key: str, was: Any, now: Any) -> bool:
    """Whether a saved data setting draws the same training windows as the current one: weights are shares
    (normalised), so [7, 3] is [0.7, 0.3]."""
    if key != "weights" or was is None or now is None or len(was) != len(now):
        return was == now
    return all(math.isclose(a / sum(was), b / sum(now), rel_tol=1e-12) for a, b in zip(was, now))


def _clean_diff(was: dict, now: dict) -> tuple[str, str, str]:
    """(before, after, fix) for `other_data`: the first data.clean option that differs between two `key()`s (an
    option missing from one is off there, or unused)."""
    name = next(k for k in sorted({*was, *now}) if was.get(k) != now.get(k))
    shown = lambda key: f"data.clean.{name}={key[name]}" if name in key else f"data.clean.{name} off"
    fix = f"--data.clean.{name} {json.dumps(was[name])}" if name in was else f"data.clean.{name} at its default"
    return shown(was), shown(now), fix


def _check_mixture(specs: list[str], weights: list[float] | None) -> None:
    if not specs:
        raise ValueError("data.corpus is an empty list; name at least one corpus")
    if weights is None:
        return
    if len(weights) != len(specs):
        raise ValueError(f"data.weights has {len(weights)} entries but data.corpus names {len(specs)} corpora; give "
                         "one weight per corpus, in the same order (or leave data.weights unset)")
    if not all(w > 0 and math.isfinite(w) for w in weights):
        raise ValueError(f"data.weights must all be positive finite numbers, got {weights}")


def _metric_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "corpus"
