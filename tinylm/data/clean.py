"""Cleaning a corpus document by document before it is packed: quality filters, exact and near-duplicate removal,
and decontamination of the validation split (`--data.clean.*`, all off by default).

The steps of a pretraining data pipeline, in order, for each document:
    1. quality rules of the Gopher / C4 kind (`quality_rule`): too few or too many words, odd mean word length,
       many `#` or ellipses, few lines ending in punctuation, repeated lines, repeated word 5-grams;
    2. exact duplicates: the same text after lowercasing and collapsing whitespace as an earlier kept document;
    3. near duplicates: MinHash of the word n-grams (`shingle_words`) of the document, looked up in an LSH index of
       the kept ones (datasketch): a document whose estimated Jaccard similarity with an earlier kept one reaches
       `near_threshold` is dropped;
    4. decontamination: no training document near-duplicates a validation document.

"Earlier" is an order over everything a run reads: the validation splits the corpora have of their own come
first (they are the reference, kept whole but for duplicates within them), then each corpus's documents in turn,
so duplicates are found across the corpora of a mixture. Of two duplicates the later is dropped. A corpus whose
validation split is cut from its tail (`data.val_fraction`) is cleaned before the cut, so a tail document that
duplicates a training one is the one dropped; with `decontaminate` alone, a tail document near-duplicating a
training document is left out of validation once the cut is known (the cut does not move).

The decisions are made while documents stream past (one pass, no text kept: memory is the hash set and the LSH
index of the kept documents, a few KB each, plus a byte per document), and replayed for later passes in the same
process. The options and the corpora they depend on are part of the corpus fingerprint: another option is another
dataset (and another tokenizer), and `fit` refuses to resume across it. What was removed and why is counted in
`clean.json` beside the dataset's meta.json.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinylm.data.corpus import Corpus
from tinylm.data.writer import progress, read_whole
from tinylm.errors import UnavailableError
from tinylm.ranges import check_ranges

REPORT_FILE = "clean.json"
EXAMPLE_CHARS = 300  # characters of each example document kept in the report
TERMINAL = (".", "!", "?", '"', "'", "\u201d", "\u2019", "\u2026")  # C4's line endings, and closing quotes
DUPLICATE_NGRAM = 5  # the n of Gopher's duplicate n-gram rule (its strictest, 5: 15% of characters)
SEED = 1  # of the MinHash permutations: one seed, so a corpus cleaned twice gives the same decisions
TRAIN, VAL, PENDING = 0, 1, 2  # a kept document's side of the split; PENDING: a tail-split corpus's, until its cut

RANGES = {
    "near_threshold": "(0, 1]", "shingle_words": "[1, 64]", "num_perm": "[16, 1024]", "examples": "[0, 100]",
    "min_words": "[0, inf)", "max_words": "[1, inf)", "min_mean_word_length": "[0, inf)",
    "max_mean_word_length": "(0, inf)", "max_symbol_ratio": "[0, inf)", "min_punctuated_lines": "[0, 1]",
    "max_duplicate_lines": "[0, 1]", "max_duplicate_ngrams": "[0, 1]",
}
"""Valid values of the options (interval notation, see tinylm.ranges)."""


@dataclass(frozen=True)
class CleanOptions:
    """Cleaning applied document by document before packing (all off by default; see tinylm.data.clean).

    Args:
        exact: drop a document whose text, lowercased with whitespace collapsed, equals an earlier one's.
        near: drop a document whose MinHash Jaccard similarity with an earlier kept document reaches
            near_threshold (MinHash LSH, datasketch).
        near_threshold: Jaccard similarity of word n-gram sets at which two documents are near-duplicates
            (0.8: about 2% of the words changed, with 5-word shingles). LSH finds a pair right at the threshold
            40% of the time, at 0.9 93%, at 0.95 99.8% (128 permutations); pairs below it rarely.
        shingle_words: n of the word n-grams (shingles) compared by near and decontaminate.
        num_perm: MinHash permutations per document: more estimate similarity closer, at more time and memory.
        decontaminate: drop training documents that near-duplicate (near_threshold) a validation document.
        min_words: drop documents of fewer words (whitespace-separated; Gopher: 50).
        max_words: drop documents of more words (Gopher: 100,000).
        min_mean_word_length: drop documents whose mean word length in characters is below this (Gopher: 3).
        max_mean_word_length: drop documents whose mean word length in characters is above this (Gopher: 10).
        max_symbol_ratio: drop documents with more `#` and ellipses (`...`, `…`) per word than this (Gopher: 0.1).
        min_punctuated_lines: drop documents whose share of non-empty lines ending in . ! ? ' " (or a closing
            quote, …) is below this (after C4's rule, which keeps only such lines).
        max_duplicate_lines: drop documents whose share of non-empty lines repeating an earlier line of the same
            document is above this (Gopher: 0.3).
        max_duplicate_ngrams: drop documents whose share of word characters inside word 5-grams that occur more
            than once in the document is above this (Gopher: 0.15).
        examples: documents kept in the report (clean.json) as examples of each rule.
    """

    exact: bool = False
    near: bool = False
    near_threshold: float = 0.8
    shingle_words: int = 5
    num_perm: int = 128
    decontaminate: bool = False
    min_words: int | None = None
    max_words: int | None = None
    min_mean_word_length: float | None = None
    max_mean_word_length: float | None = None
    max_symbol_ratio: float | None = None
    min_punctuated_lines: float | None = None
    max_duplicate_lines: float | None = None
    max_duplicate_ngrams: float | None = None
    examples: int = 3

    def __post_init__(self) -> None:
        check_ranges("data.clean", dataclasses.asdict(self), RANGES,
                     whole={"shingle_words", "num_perm", "examples", "min_words", "max_words"})
        for low, high in (("min_words", "max_words"), ("min_mean_word_length", "max_mean_word_length")):
            lo, hi = getattr(self, low), getattr(self, high)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"data.clean.{low} {lo} is above data.clean.{high} {hi}: no document could pass; "
                                 f"lower {low} or raise {high}")

    @property
    def rules(self) -> list[str]:
        """The rules turned on, in the order they are applied."""
        # (`is`, not `in (None, False)`: a threshold of 0 is the strictest, and `0 == False` turned it off)
        return [r for r in RULES if getattr(self, r) is not None and getattr(self, r) is not False]

    @property
    def active(self) -> bool:
        return bool(self.rules)

    def key(self) -> dict:
        """What the decisions depend on: the rules turned on and the settings they read (examples do not count)."""
        fields = dataclasses.asdict(self)
        uses_minhash = self.near or self.decontaminate
        return {k: v for k, v in fields.items() if k in self.rules or
                (uses_minhash and k in ("near_threshold", "shingle_words", "num_perm"))}


QUALITY = ("min_words", "max_words", "min_mean_word_length", "max_mean_word_length", "max_symbol_ratio",
           "min_punctuated_lines", "max_duplicate_lines", "max_duplicate_ngrams")
RULES = (*QUALITY, "exact", "near", "decontaminate")  # each a CleanOptions field; a document is dropped by the first


def options_from(value: CleanOptions | dict | None) -> CleanOptions:
    """`data.clean` as given: the options, a dict of them (a checkpoint's hyperparameters), or None (none)."""
    if value is None:
        return CleanOptions()
    if isinstance(value, dict):
        unknown = sorted(set(value) - {f.name for f in dataclasses.fields(CleanOptions)})
        if unknown:
            raise ValueError(f"data.clean has no option {', '.join(unknown)}; `tinylm prepare --help` lists them")
        return CleanOptions(**value)
    return value


# ------------------------------------------------------------------------------------------------ the rules
def quality_rule(text: str, o: CleanOptions) -> str | None:
    """The first quality rule of `o` that `text` breaks, or None."""
    words = text.split()
    n = len(words)
    if o.min_words is not None and n < o.min_words:
        return "min_words"
    if o.max_words is not None and n > o.max_words:
        return "max_words"
    mean = sum(map(len, words)) / n if n else 0.0
    if o.min_mean_word_length is not None and mean < o.min_mean_word_length:
        return "min_mean_word_length"
    if o.max_mean_word_length is not None and mean > o.max_mean_word_length:
        return "max_mean_word_length"
    if o.max_symbol_ratio is not None:
        symbols = text.count("#") + text.count("...") + text.count("\u2026")
        if symbols > o.max_symbol_ratio * n:
            return "max_symbol_ratio"
    if o.min_punctuated_lines is not None or o.max_duplicate_lines is not None:
        lines = [line for line in (raw.strip() for raw in text.splitlines()) if line]
        if o.min_punctuated_lines is not None and \
                sum(line.endswith(TERMINAL) for line in lines) < o.min_punctuated_lines * len(lines):
            return "min_punctuated_lines"
        if o.max_duplicate_lines is not None and len(lines) - len(set(lines)) > o.max_duplicate_lines * len(lines):
            return "max_duplicate_lines"
    if o.max_duplicate_ngrams is not None and duplicate_ngram_share(words) > o.max_duplicate_ngrams:
        return "max_duplicate_ngrams"
    return None


def duplicate_ngram_share(words: list[str], n: int = DUPLICATE_NGRAM) -> float:
    """Share of the words' characters inside word n-grams that occur more than once (Gopher's "duplicate n-gram
    character fraction"): for "a b c d e a b c d e" with n=5 every word is inside a repeated 5-gram, so 1.0."""
    if len(words) < n:
        return 0.0
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    counts = Counter(grams)
    covered = bytearray(len(words))
    for i, gram in enumerate(grams):
        if counts[gram] > 1:
            covered[i : i + n] = b"\1" * n
    return sum(len(w) for w, c in zip(words, covered) if c) / max(1, sum(map(len, words)))


_WORD = re.compile(r"\w+")


def exact_key(text: str) -> int:
    """128-bit hash of the text lowercased with runs of whitespace as one space: "A  b\\n" and "a b" are equal."""
    import xxhash

    return xxhash.xxh3_128_intdigest(" ".join(text.lower().split()).encode("utf-8"))


def shingles(text: str, n: int) -> list[bytes]:
    """The word n-grams of the lowercased text (words: runs of letters and digits), or all of its words as one
    when it has fewer than n."""
    words = _WORD.findall(text.lower())
    return [" ".join(words[i : i + n]).encode("utf-8") for i in range(max(1, len(words) - n + 1))]


# ------------------------------------------------------------------------------------------------ the report
class Report:
    """Documents and bytes read, and removed per rule with a few examples: one per part of a pass."""

    def __init__(self, examples: int) -> None:
        self.examples = examples
        self.documents = self.bytes = 0
        self.removed: dict[str, dict] = {}

    def add(self, rule: str | None, text: str, n_bytes: int, *, read: bool = True) -> None:
        if read:
            self.documents, self.bytes = self.documents + 1, self.bytes + n_bytes
        if rule is None:
            return
        entry = self.removed.setdefault(rule, {"documents": 0, "bytes": 0, "examples": []})
        entry["documents"] += 1
        entry["bytes"] += n_bytes
        if len(entry["examples"]) < self.examples:
            entry["examples"].append(text[:EXAMPLE_CHARS])

    @staticmethod
    def merge(reports: list[Report], rules: list[str]) -> dict:
        """One JSON-able report: totals read, removed per rule (in the order applied), kept."""
        out: dict[str, Any] = {"read": {"documents": sum(r.documents for r in reports),
                                        "bytes": sum(r.bytes for r in reports)}, "removed": {}}
        for rule in rules:
            entries = [r.removed[rule] for r in reports if rule in r.removed]
            out["removed"][rule] = {"documents": sum(e["documents"] for e in entries),
                                    "bytes": sum(e["bytes"] for e in entries),
                                    "examples": [x for e in entries for x in e["examples"]][: reports[0].examples
                                                                                              if reports else 0]}
        gone = out["removed"].values()
        out["kept"] = {"documents": out["read"]["documents"] - sum(v["documents"] for v in gone),
                       "bytes": out["read"]["bytes"] - sum(v["bytes"] for v in gone)}
        return out


# ------------------------------------------------------------------------------------------------ the decisions
Unit = tuple[str, int]  # (split, part): "validation" (a corpus's own) or "train" (its documents), of corpus `part`


class Cleaner:
    """The decisions for the corpora of one run (a mixture's, or one), made in one order over all of them (see the
    module docstring) and shared by their `CleanCorpus` views. A unit (a corpus's own validation split, or its
    documents) is decided by its first complete pass and replayed by the next ones; a pass left unfinished (a
    reader that stopped early) is undone, so the next one decides afresh."""

    def __init__(self, parts: list[Corpus], options: CleanOptions, val_fraction: float) -> None:
        self.parts, self.options, self.val_fraction = parts, options, val_fraction
        self.units: list[Unit] = [("validation", p) for p, c in enumerate(parts) if c.has_validation]
        self.units += [("train", p) for p in range(len(parts))]
        self.masks: dict[Unit, bytearray] = {}  # per document read: 0 kept, else 1 + the index of its rule in RULES
        self.reports: dict[Unit, Report] = {}
        self.left_out: dict[int, set[int]] = {}  # part -> its kept documents left out of its tail validation split
        self.seen: set[int] = set()  # exact keys of the kept documents
        self.side = bytearray()  # per kept document (its id in the LSH index): TRAIN, VAL or PENDING
        self.lsh: Any = None
        if options.near or options.decontaminate:
            import xxhash

            try:
                from datasketch import MinHash, MinHashLSH
            except ImportError as e:
                raise UnavailableError("data.clean.near and data.clean.decontaminate need the datasketch package "
                                       "(MinHash LSH); install it: pip install 'tinylm[clean]'") from e
            # band keys hashed to 8 bytes: the index stores b keys per document (b bands of r values)
            self.lsh = MinHashLSH(threshold=options.near_threshold, num_perm=options.num_perm,
                                  hashfunc=xxhash.xxh64_digest)
            self._base = MinHash(num_perm=options.num_perm, seed=SEED)  # its permutations, made once

    def documents(self, split: str, p: int) -> Iterator[str]:
        """The kept documents of corpus `p`'s `split`, deciding the units before it first."""
        unit = (split, p)
        for before in self.units[: self.units.index(unit)]:
            if before not in self.masks:
                for _ in self._decide(before):
                    pass
        if unit in self.masks:
            mask = self.masks[unit]
            yield from (doc for doc, drop in zip(self.parts[p].documents(split), mask) if not drop)
        else:
            yield from self._decide(unit)

    def _decide(self, unit: Unit) -> Iterator[str]:
        split, p = unit
        corpus, o = self.parts[p], self.options
        tail = split == "train" and not corpus.has_validation
        side = PENDING if tail else VAL if split == "validation" else TRAIN
        first_id, n_seen = len(self.side), len(self.seen)
        added: list[int] = []  # exact keys this pass added (undone with it)
        mask, report, lengths = bytearray(), Report(o.examples), array("q")
        matches: dict[int, int] = {}  # see _judge
        self.reports[unit] = report
        finished = False
        try:
            with progress(corpus.size_bytes if split == "train" else None,
                          f"cleaning {corpus.name}{' (validation)' if split != 'train' else ''}") as bar:
                for doc in corpus.documents(split):
                    n_bytes = len(doc.encode("utf-8"))
                    bar.update(n_bytes)
                    rule = self._judge(doc, side, matches, len(lengths), added)
                    mask.append(0 if rule is None else 1 + RULES.index(rule))
                    report.add(rule, doc, n_bytes)
                    if rule is None:
                        lengths.append(len(doc))
                        yield doc
                read_whole(bar)
            finished = True
        finally:
            if not finished:  # undo what this pass added to the shared state
                for i in range(first_id, len(self.side)):
                    if self.lsh is not None:
                        self.lsh.remove(i)
                del self.side[first_id:]
                self.seen.difference_update(added)
                assert len(self.seen) == n_seen
        if split == "train" and report.documents and not lengths:
            removed = ", ".join(f"{rule} {entry['documents']:,}" for rule, entry in report.removed.items())
            raise ValueError(f"data.clean removed every document of corpus {corpus.spec!r} ({removed}); loosen "
                             "those rules (`tinylm prepare --help` lists them) or check the corpus")
        self.masks[unit] = mask
        if tail:
            self._cut(p, first_id, lengths, matches)

    def _judge(self, doc: str, side: int, matches: dict[int, int], k: int, added: list[int]) -> str | None:
        """The rule that drops `doc` (None: kept, and entered in the indexes as document k of its pass). For a
        tail-split corpus with `decontaminate` alone, `matches[k]` notes the earliest kept document it
        near-duplicates (-1: a training one of an earlier corpus), for `_cut` to judge once the sides are known."""
        o = self.options
        if rule := quality_rule(doc, o):
            return rule
        key = exact_key(doc) if o.exact else None
        if key is not None and key in self.seen:
            return "exact"
        if self.lsh is not None:
            m = self._minhash(doc)
            similar = self.lsh.query(m)
            if similar and o.near:
                return "near"
            if similar:  # decontaminate alone: a near-duplicate matters only across the split
                sides = {self.side[i] for i in similar}
                if side != VAL and VAL in sides:  # (a pending one would be training text or a copy in validation)
                    return "decontaminate"
                if side == PENDING:
                    matches[k] = -1 if TRAIN in sides else min(similar)
            self.lsh.insert(len(self.side), m, check_duplication=False)
        if key is not None:
            self.seen.add(key)
            added.append(key)
        self.side.append(side)
        return None

    def _minhash(self, doc: str) -> Any:
        import xxhash
        from datasketch import MinHash

        m = MinHash(num_perm=self.options.num_perm, seed=SEED, permutations=self._base.permutations,
                    scheme=self._base.scheme, hashfunc=xxhash.xxh32_intdigest)
        m.update_batch(shingles(doc, self.options.shingle_words))
        return m

    def _cut(self, p: int, first_id: int, lengths: array, matches: dict[int, int]) -> None:
        """Settle the sides of a tail-split corpus's kept documents where `routed` (tinylm.data.pack) will cut them
        (the same formula), and which of its validation documents near-duplicate training ones."""
        cut = int(sum(lengths) * (1 - self.val_fraction))
        seen, straddle = 0, -1
        for k, n in enumerate(lengths):
            if seen < cut < seen + n:
                straddle = k  # its head is training text, its tail validation
            self.side[first_id + k] = VAL if seen >= cut else TRAIN
            seen += n
        self.left_out[p] = {k for k, match in matches.items()
                            if (k == straddle or self.side[first_id + k] == VAL)
                            and (match == -1 or self.side[match] == TRAIN)}

    def report(self, p: int) -> dict:
        """Corpus `p`'s report (both its splits); complete once its documents were all read."""
        return Report.merge([r for (split, q), r in self.reports.items() if q == p], self.options.rules)


class CleanCorpus(Corpus):
    """Corpus `index` of the cleaner's corpora, cleaned: its documents are the kept ones, its fingerprint that of
    the text with these options (and, as duplicates are found across them, of the other corpora of the run)."""

    def __init__(self, cleaner: Cleaner, index: int) -> None:
        self.cleaner, self.index = cleaner, index
        self.inner = cleaner.parts[index]
        self.spec = self.inner.spec
        self._reported: set[int] = set()

    @property
    def has_validation(self) -> bool:  # type: ignore[override]
        return self.inner.has_validation

    @property
    def size_bytes(self) -> int | None:  # type: ignore[override]
        return self.inner.size_bytes

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    def __getattr__(self, name: str) -> Any:
        if name in ("val_source", "val_documents"):  # a streamed corpus's (tinylm.data.hf_corpus.HFStream)
            return getattr(self.inner, name)
        raise AttributeError(name)

    def _docs(self, split: str) -> Iterator[str]:
        return self.cleaner.documents(split, self.index)

    def _fingerprint(self) -> str:
        c = self.cleaner
        key = ["tinylm.clean.v1", c.options.key(), [part.fingerprint for part in c.parts], self.index]
        # the sides of a tail-split corpus's documents depend on where it is cut (no side of one with its own split)
        if c.options.decontaminate and not all(part.has_validation for part in c.parts):
            key.append(c.val_fraction)
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()

    def keeps_in_val(self, k: int, text: str) -> bool:
        """Whether the k-th kept document's validation text `text` stays in validation (see `Cleaner._cut`);
        asked by `routed` (tinylm.data.pack), which cuts the split. Leaving one out is entered in the report."""
        out = k in self.cleaner.left_out.get(self.index, ())
        if out and k not in self._reported:
            self._reported.add(k)
            self.cleaner.reports[("train", self.index)].add("decontaminate", text, len(text.encode("utf-8")),
                                                             read=False)
        return not out

    def write_report(self, folder: Path) -> dict:
        """Save the report to folder/clean.json; return what meta.json names: the options and the counts."""
        report = self.cleaner.report(self.index)
        report = {"options": dataclasses.asdict(self.cleaner.options), **report}
        (folder / REPORT_FILE).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return {"options": self.cleaner.options.key(), "report": REPORT_FILE,
                "removed": {k: {"documents": v["documents"], "bytes": v["bytes"]}
                            for k, v in report["removed"].items()}, "kept": report["kept"]}


def clean_corpora(corpora: list[Corpus], options: CleanOptions, *, val_fraction: float) -> list[Corpus]:
    """The corpora as cleaned by `options` (as they are when it turns nothing on)."""
    if not options.active:
        return corpora
    cleaner = Cleaner(corpora, options, val_fraction)
    return [CleanCorpus(cleaner, i) for i in range(len(corpora))]
