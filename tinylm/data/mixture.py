"""Several corpora as one run's data: `data.corpus` as a list (`open_corpora`, which refuses the same text listed
twice) and `Mixture`, all of them read one after the other (what the tokenizer they share learns from)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

from tinylm.data.corpus import Corpus, TextFiles, open_corpus
from tinylm.data.hf_corpus import local_files


class Mixture(Corpus):
    """Several corpora read one after the other: what a tokenizer shared by a mixture of corpora learns from."""

    def __init__(self, parts: list[Corpus]) -> None:
        self.parts = parts
        self.spec = " + ".join(p.spec for p in parts)

    @property
    def name(self) -> str:  # type: ignore[override]
        return "+".join(p.name for p in self.parts)

    @property
    def size_bytes(self) -> int | None:  # type: ignore[override]
        sizes = [p.size_bytes for p in self.parts]
        return None if None in sizes else sum(sizes)  # type: ignore[arg-type]

    def _docs(self, split: str) -> Iterator[str]:
        for part in self.parts:
            yield from part.documents("train")

    def _fingerprint(self) -> str:
        return hashlib.sha256("\0".join(["tinylm.corpus.mixture.v1", *(p.fingerprint for p in self.parts)])
                              .encode()).hexdigest()


def open_corpora(specs: list[str], **options: Any) -> list[Corpus]:
    """`open_corpus` of each spec of a `--data.corpus` list (``options``: its other arguments), refusing two that
    read the same text: one file named twice (`a.txt` and `./a.txt`, a link and its target) or a folder and a file
    in it would count that text twice (in train and val, with twice its share of the windows), as the same
    hf:NAME twice, or a copy of a file, would. Within one spec, globs and folders read each file once already
    (`_unique_files`)."""
    corpora = [open_corpus(spec, **options) for spec in specs]
    owner: dict[Any, str] = {}
    for corpus in corpora:
        for source in _sources(corpus):
            if source in owner:
                what = f"the file {source}" if isinstance(source, str) else f"the dataset {source[1]}"
                both = f"{owner[source]!r} twice ({what})" if owner[source] == corpus.spec else \
                    f"{owner[source]!r} and {corpus.spec!r}, which both read {what}"  # (it read "'a' twice the file a")
                raise ValueError(f"data.corpus lists {both}: its text would count twice (in both splits, "
                                 "with twice its share of the training windows); list each file once (for more "
                                 "of one corpus, use data.weights)")
            owner[source] = corpus.spec
    first: dict[str, str] = {}  # by what they hold: a copy or a hard link of one file is another path to its text
    for corpus in corpora if len(corpora) > 1 else []:  # (hashed here once: the tokenizer's key needs it anyway)
        if (same := first.setdefault(corpus.fingerprint, corpus.spec)) != corpus.spec:
            raise ValueError(f"data.corpus lists {same!r} and {corpus.spec!r}, which hold the same text (a copy or a "
                             "hard link): it would count twice (in both splits, with twice its share of the training "
                             "windows); list it once (for more of one corpus, use data.weights)")
    return corpora


def _sources(corpus: Corpus) -> set[Any]:
    """What ``corpus`` reads, comparable across corpora: each local file by its real path, a hub dataset by its
    name, configuration, revision and split."""
    # (a dataset's: its data_files, or an hf:DIR folder's files: `hf:d` and `hf:./d`, or `hf:d` and `d/train.jsonl`)
    files = corpus.files if isinstance(corpus, TextFiles) else local_files(getattr(corpus, "sources", None))
    if files:
        return {os.path.realpath(f) for f in files}
    return {("hf", corpus.path, corpus.config, corpus.revision, corpus.split)} if hasattr(corpus, "path") else set()
