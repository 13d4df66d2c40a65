"""Documents -> token ids on disk, at the speed of the tokenizer: encoding runs in a background thread (the Rust
tokenizers release the GIL and use every core) while this thread reads and decodes the next batch, and a
progress bar reports MB/s and an ETA.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tinylm.paths import naming
from tinylm.progress import bar
from tinylm.tokenize import Tokenizer

PIECE_CHARS = 1 << 20  # documents longer than this are encoded in pieces (bounded memory, parallel batches)
BATCH_CHARS = 8 << 20  # text handed to one encode_batch call


def progress(total: int | None, desc: str, initial: int = 0, unit: str = "B") -> Any:
    """A tqdm bar on stderr, in bytes unless told (shows MB/s, and an ETA when the total is known); where stderr is
    no terminal, a line every so often instead (`tinylm.progress.bar`)."""
    return bar(total=total, desc=desc, unit=unit, unit_scale=True, unit_divisor=1000, smoothing=0.05, initial=initial)


def read_whole(bar: Any) -> None:
    """End a bar whose pass read its whole total at 100 %: it counts documents' bytes, and a files' size holds the
    `<|endoftext|>` separators (and the whitespace around them) between them too (it ended at 98 % on TinyStories)."""
    if bar.total:
        bar.update(max(0, bar.total - bar.n))


def rate(n_bytes: int, seconds: float) -> dict:
    """What a timed pass measured, as stored in meta.json and printed by `tinylm prepare`."""
    return {"bytes": n_bytes, "seconds": round(seconds, 3), "mb_per_s": round(n_bytes / 1e6 / max(seconds, 1e-9), 3)}


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


class SplitWriter:
    """Appends documents' tokens to a .bin file (after what it holds), EOS after each complete document, encoding
    in batches of BATCH_CHARS characters. At most one batch encodes in `pool` while the next is gathered, so memory
    stays at a few batches whatever the corpus size, and the file is written in document order."""

    def __init__(self, path: Path, tok: Tokenizer, dtype: np.dtype, piece_chars: int, pool: ThreadPoolExecutor,
                 bar: Any = None) -> None:
        self.path = path
        self.file = open(path, "ab")  # noqa: SIM115 (open across add() calls; close() closes it)
        # a tokenizer that marks the start of a text (SentencePiece's "▁" before the first word) would put a space at
        # every cut: documents are encoded whole for it
        self.tok, self.dtype, self.piece_chars = tok, dtype, piece_chars if cuts_exactly(tok) else sys.maxsize
        self.pool, self.bar = pool, bar
        self.eos = None if tok.eos_id is None else np.array([tok.eos_id], dtype=dtype)
        self.texts: list[str] = []
        self.ends: list[bool] = []
        self.pending = 0
        self._encoding: Future | None = None
        self.stats = {"tokens": 0, "documents": 0, "bytes": 0, "chars": 0, "eos": 0}  # eos: end-of-text ids written

    def add(self, text: str, *, ends_document: bool) -> None:
        """Add a document, or part of one (the two sides of the train/val cut)."""
        self.stats["documents"] += 1
        self.stats["chars"] += len(text)
        last = None
        for piece in pieces(text, self.piece_chars):  # one piece behind: only the last one may end the document
            if last is not None:
                self._add_piece(last, ends_document=False)
            last = piece
        self._add_piece(last or "", ends_document=ends_document)

    def _add_piece(self, piece: str, *, ends_document: bool) -> None:
        self.stats["eos"] += ends_document and self.eos is not None
        self.texts.append(piece)
        self.ends.append(ends_document)
        n_bytes = len(piece.encode("utf-8"))
        self.stats["bytes"] += n_bytes
        if self.bar is not None:
            self.bar.update(n_bytes)
        self.pending += len(piece)
        if self.pending >= BATCH_CHARS:  # inside a document too: a one-document corpus stays at a few batches
            self.flush()

    def _encode(self, texts: list[str], ends: list[bool]) -> np.ndarray:
        parts = []
        for ids, end in zip(self.tok.encode_arrays(texts), ends):
            parts.append(np.asarray(ids, dtype=self.dtype))
            if end and self.eos is not None:
                parts.append(self.eos)
        return np.concatenate(parts)

    def _write_encoded(self) -> None:
        if self._encoding is not None:
            tokens, self._encoding = self._encoding.result(), None
            with self._naming_the_file():
                self.file.write(tokens.tobytes())
            self.stats["tokens"] += len(tokens)

    def flush(self) -> None:
        """Start encoding the gathered texts; write the batch before it (which had this long to encode)."""
        if self.texts:
            started = self.pool.submit(self._encode, self.texts, self.ends)
            self.texts, self.ends, self.pending = [], [], 0
            self._write_encoded()
            self._encoding = started

    def close(self) -> dict:
        try:
            self.flush()
            self._write_encoded()
        finally:
            with self._naming_the_file():
                self.file.close()  # its buffered bytes are written here
        return self.stats

    @contextlib.contextmanager
    def _naming_the_file(self) -> Iterator[None]:
        """A failed write (a full disk) says which file: a file object's own write error names none."""
        try:
            yield
        except OSError as e:
            if (named := naming(e, self.path)) is not e:
                raise named from e
            raise


_PROBE = "Once upon a time there was a cat.\nIt sat on the mat, and it purred.\n\nThe end: naïve café, 42 days!"


def cuts_exactly(tok: Tokenizer) -> bool:
    """Whether text cut by `pieces` encodes to the ids of the whole text, as it does for tinylm's own kinds (they
    split text by the GPT-2, cl100k or o200k patterns, or by character). A tokenizer.json may not: SentencePiece-style
    ones (Metaspace, Llama's prepend scheme) start every text with "▁", so each piece would begin with a space."""
    if tok.kind != "hf":
        return True
    try:
        whole = tok.encode(_PROBE)
    except ValueError:  # characters its vocabulary lacks, with no unknown token: nothing known, so no cutting
        return False
    # piece sizes at which every piece of the probe has a place `pieces` may cut (a smaller one cuts a word)
    return all([i for piece in pieces(_PROBE, n) for i in tok.encode(piece)] == whole for n in (20, 40))


def pieces(text: str, max_chars: int) -> Iterator[str]:
    """Cut text longer than max_chars where no pre-token of the GPT-2, cl100k or o200k patterns can span the cut,
    so the pieces encode to exactly the ids of the whole text: after a lone newline between two non-space
    characters, the second not "/" (o200k reads ";\\n//" as one pre-token), else before a space that follows a
    non-space character ("ab\\n\\ncd ef" -> "ab\\n\\ncd", " ef"; a cut after the second newline would turn the
    whitespace run "\\n\\n" into one token). Text with neither (one giant word) is cut hard at max_chars."""
    start, n = 0, len(text)
    while n - start > max_chars:
        end = start + max_chars
        cut = end
        i = text.rfind("\n", start + 1, end - 1)
        while i > start and (text[i - 1].isspace() or text[i + 1].isspace() or text[i + 1] == "/"):
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
