"""Corpus -> train.bin / val.bin, built so that an interrupted build goes on where it stopped.

Documents are routed to train or val (`routed`) and encoded by `SplitWriter`s, which append to `train.bin` and
`val.bin` in `<dataset>.partial/`. Every `SHARD_CHARS` characters a shard is closed: the files are synced, then
`00003.json`, the shard's completion marker (written last, atomically), records its documents and tokens. A build
that is killed or fails keeps what its complete shards wrote; the next one cuts the files back to the end of the
last complete shard, skips the documents it holds and goes on from there. At the end the two files are linked
into the dataset's folder (no copy: the build needs the disk space of the dataset once), which `prepare._publish`
renames into place with meta.json: a `.partial` folder is never a dataset.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tinylm.data.corpus import Corpus
from tinylm.data.writer import SplitWriter, progress, read_whole
from tinylm.tokenize import Tokenizer
from tinylm.tokenize.backends import MissingCharacter

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
SHARD_CHARS = 1 << 28  # ~268 M characters per shard: the most an interrupted build has to redo


def routed(corpus: Corpus, val_fraction: float) -> Iterator[list[tuple[str, str, bool]]]:
    """For each document of the corpus, its parts as (split, text, ends_document): the corpus's own validation
    split when it has one, else the tail by characters, exactly like nanoGPT's data[:int(n * 0.9)], with the
    document that straddles the cut divided (its train part has no EOS)."""
    if corpus.has_validation:
        for split, name in (("train", "train"), ("validation", "val")):
            for doc in corpus.documents(split):
                yield [(name, doc, True)]
        return
    total = sum(len(doc) for doc in corpus.documents("train"))
    cut = int(total * (1 - val_fraction))
    seen = 0
    keeps_in_val = getattr(corpus, "keeps_in_val", None)  # tinylm.data.clean: a cleaned corpus's decontamination
    for k, doc in enumerate(corpus.documents("train")):
        if seen + len(doc) <= cut:
            yield [("train", doc, True)]
        elif seen >= cut:
            yield [("val", doc, True)] if keeps_in_val is None or keeps_in_val(k, doc) else []
        elif keeps_in_val is None or keeps_in_val(k, doc[cut - seen:]):
            yield [("train", doc[: cut - seen], False), ("val", doc[cut - seen:], True)]
        else:
            yield [("train", doc[: cut - seen], True)]
        seen += len(doc)


def write_splits(out: Path, partial: Path, corpus: Corpus, tok: Tokenizer, dtype: np.dtype, *, val_fraction: float,
                 piece_chars: int) -> tuple[dict, int]:
    """Write out/train.bin and out/val.bin through `partial` (going on after its complete shards); return each
    split's stats (tokens, documents, bytes, chars, eos: the end-of-text ids among the tokens), and the bytes of
    text an interrupted build had encoded (0 for a build from the start)."""
    partial.mkdir(parents=True, exist_ok=True)
    done = _complete_shards(partial, dtype.itemsize)
    skip = done[-1]["next_document"] if done else 0
    if done:
        log.info("resuming the build of %s: %d shard(s) of %d documents already done",
                 partial.name.removesuffix(".partial"), len(done), skip)
    bytes_done = sum(s["bytes"] for d in done for s in d["splits"].values())
    try:
        done = _write_shards(partial, corpus, tok, dtype, val_fraction, piece_chars, done, skip, bytes_done)
    except MissingCharacter as e:  # its own words speak of a prompt
        raise ValueError(f"corpus {corpus.name!r} holds the character {e.char!r}, which the char tokenizer ({e.size} "
                         "characters, those of the corpus it was built from) cannot encode; pass text of those "
                         "characters, or train with a byte-level tokenizer (--data.tokenizer bpe)") from None
    stats = {}
    for split in SPLITS:
        _link_or_move(partial / f"{split}.bin", out / f"{split}.bin")
        stats[split] = {key: sum(d["splits"][split].get(key, 0) for d in done)
                        for key in ("tokens", "documents", "bytes", "chars", "eos")}
    return stats, bytes_done


def _write_shards(partial: Path, corpus: Corpus, tok: Tokenizer, dtype: np.dtype, val_fraction: float,
                  piece_chars: int, done: list[dict], skip: int, bytes_done: int) -> list[dict]:
    """Encode the corpus's documents after the first ``skip`` into shards after ``done``; return every shard's
    record."""
    shard_chars = SHARD_CHARS  # read here, so a test can make shards small
    total = corpus.size_bytes
    with ThreadPoolExecutor(1, thread_name_prefix="tinylm-encode") as pool, \
            progress(total, f"tokenizing {corpus.name}", initial=bytes_done) as bar:
        writers: dict[str, SplitWriter] | None = None
        chars, index = 0, skip
        try:
            for parts in itertools.islice(routed(corpus, val_fraction), skip, None):
                if writers is None:
                    writers = {s: SplitWriter(partial / f"{s}.bin", tok, dtype, piece_chars, pool, bar)
                               for s in SPLITS}
                for split, text, ends in parts:
                    writers[split].add(text, ends_document=ends)
                    chars += len(text)
                index += 1
                if chars >= shard_chars:
                    done.append(_close_shard(partial, len(done), writers, index))
                    writers, chars = None, 0
            if writers is not None:
                done.append(_close_shard(partial, len(done), writers, index))
        finally:  # a build that failed (a full disk): its files closed now, not by a garbage collection, so that
            for writer in (writers or {}).values():  # removing them frees their space
                with contextlib.suppress(OSError):  # (what a full disk left buffered cannot be written)
                    writer.file.close()
        read_whole(bar)
    return done


def _link_or_move(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst`` without copying (the folders are siblings): a hard link, so that a build killed before
    the dataset is published still finds every shard in .partial/ (which is removed after publishing); a rename
    where the file system has no hard links."""
    try:
        os.link(src, dst)
    except OSError:
        os.replace(src, dst)


def _close_shard(partial: Path, k: int, writers: dict[str, SplitWriter], next_document: int) -> dict:
    """Finish shard k's tokens, then mark it complete (after this, a new build skips its documents)."""
    stats = {split: w.close() for split, w in writers.items()}
    for split in SPLITS:
        with open(partial / f"{split}.bin", "rb+") as f:
            os.fsync(f.fileno())  # the data is on disk before the marker that says so
    marker = {"shard": k, "next_document": next_document, "splits": stats}
    tmp = partial / f"{k:05d}.json.tmp"
    tmp.write_text(json.dumps(marker) + "\n", encoding="utf-8")
    os.replace(tmp, partial / f"{k:05d}.json")
    return marker


def _complete_shards(partial: Path, itemsize: int) -> list[dict]:
    """The markers of shards 0, 1, ... that are complete (their tokens all in the files); the files are cut back
    to the end of the last one, and later markers (and the per-shard .bin files of older builds) removed."""
    done: list[dict] = []
    ends = dict.fromkeys(SPLITS, 0)  # bytes of each file that complete shards wrote
    while (path := partial / f"{len(done):05d}.json").is_file():
        try:
            marker = json.loads(path.read_text(encoding="utf-8"))
            after = {s: ends[s] + marker["splits"][s]["tokens"] * itemsize for s in SPLITS}
            if any(not (partial / f"{s}.bin").is_file() or (partial / f"{s}.bin").stat().st_size < after[s]
                   for s in SPLITS):
                raise ValueError(f"shard {len(done)} is not whole")
        except (OSError, ValueError, KeyError, TypeError):
            break  # a damaged shard: it and everything after it are redone
        done.append(marker)
        ends = after
    for path in partial.iterdir():
        if path.name[:5].isdigit() and (path.suffix != ".json" or int(path.name[:5]) >= len(done)):
            if path.suffix == ".bin":
                log.info("removing %s: a shard of an earlier tinylm's build (encoded again)", path.name)
            path.unlink()
    for split in SPLITS:
        with open(partial / f"{split}.bin", "ab") as f:
            f.truncate(ends[split])  # what a killed build wrote after its last complete shard
    return done
