"""A from-scratch byte-level BPE tokenizer that reproduces tiktoken's GPT-2 encoding exactly.

Read it top to bottom: the helpers first, then the `ByteLevelBPE` class.

Byte-level BPE in three steps:
1. Pre-tokenize: the GPT-2 regex splits text into pieces ("Hello world!" -> "Hello", " world", "!"); merges never
   cross a piece boundary, so " world" and "world" are different tokens.
2. Bytes: each piece is UTF-8 encoded; the 256 byte values are the base alphabet, so any text can be encoded.
3. Merge by rank: every token is a byte string with a rank (its id). Inside a piece, repeatedly merge the adjacent
   pair whose concatenation has the lowest rank (leftmost on ties) until no concatenation is in the vocabulary.
   This is tiktoken's algorithm; with GPT-2's ranks it returns exactly GPT-2's ids.

Training (`ByteLevelBPE.train`) learns the ranks: start from the 256 bytes and repeatedly add the most frequent
adjacent pair as a new token. Example on "aaabdaaabac" (one piece): "aa" occurs 4 times -> token 256 = "aa";
then "ab" and ("aa","a") tie at 2, the lexicographically smaller byte pair wins -> 257 = "ab"; then
("aa","ab") -> 258 = "aaab"; then the four pairs of count 1 tie and ("a","c") is the smallest -> 259 = "ac".

Known gap: the regex's letter/number classes come from the installed `regex` package's Unicode tables, tiktoken's
from its Rust regex; characters newer than tiktoken's tables (Unicode 17 additions for tiktoken 0.14) may split
differently. Everything assigned up to Unicode 16 encodes identically.
"""

from __future__ import annotations

import base64
import functools
import heapq
import json
import warnings
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import regex

from tinylm.tokenize.patterns import GPT2_PATTERN, TRAIN_PIECE_CHARS

FORMAT = "tinylm-bpe"
FORMAT_VERSION = 1
"""Version of `to_state()` / `save()` output; bump when the layout changes, readers refuse newer versions."""


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, used in vocab.json / merges.txt (b" " -> "Ġ", b"\\n" -> "Ċ").

    Printable Latin-1 bytes stand for themselves; the other 68 bytes map to chr(256), chr(257), ... in order.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in keep]
    table = {b: chr(b) for b in keep}
    table.update({b: chr(256 + i) for i, b in enumerate(moved)})
    return table


def _to_unicode(token: bytes) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


@functools.lru_cache(maxsize=1)
def _unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def _from_unicode(token: str) -> bytes:
    inverse = _unicode_to_bytes()
    try:
        return bytes(inverse[c] for c in token)
    except KeyError as e:
        raise ValueError(f"token {token!r} has character {e.args[0]!r} outside GPT-2's byte-to-unicode alphabet; "
                         "is this a byte-level BPE vocab (or a special token missing from special_tokens)?") from None


def _bpe(piece: bytes, ranks: Mapping[bytes, int], max_rank: int | None = None) -> list[bytes]:
    """Split `piece` into tokens by tiktoken's rule: merge the lowest-rank adjacent pair first (leftmost on ties).

    `max_rank` (exclusive) restricts the merges to older tokens; used to recover the merge that made a token.
    This scan is O(len^2); long pieces (text without spaces) go to `_bpe_heap`, which gives the same result.
    """
    if len(piece) > _LONG_PIECE and max_rank is None:
        return _bpe_heap(piece, ranks)
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best_rank, best_i = None, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best_i = rank, i
        if best_rank is None or (max_rank is not None and best_rank >= max_rank):
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


_LONG_PIECE = 256  # bytes; above this the heap wins over the plain scan


def _bpe_heap(piece: bytes, ranks: Mapping[bytes, int]) -> list[bytes]:
    """`_bpe` in O(len log len): a heap of (rank, start) over a linked list of parts. Starts grow along the list,
    so the smallest (rank, start) is the lowest-rank pair, leftmost on ties, exactly as `_bpe` chooses. An entry
    is stale when the pair starting there has changed; since a merged token is longer than either half, a stale
    entry can never carry the rank of the pair now at its start, so checking the rank is enough."""
    n = len(piece)
    parts: list[bytes | None] = [piece[i : i + 1] for i in range(n)]
    nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))  # nxt[i] == n: i is the last part
    heap = [(r, i) for i in range(n - 1) if (r := ranks.get(piece[i : i + 2])) is not None]
    heapq.heapify(heap)
    while heap:
        rank, i = heapq.heappop(heap)
        j = nxt[i]
        if parts[i] is None or j >= n or ranks.get(parts[i] + parts[j]) != rank:
            continue  # stale
        parts[i], parts[j] = parts[i] + parts[j], None
        nxt[i] = nxt[j]
        if nxt[i] < n:
            prv[nxt[i]] = i
        for a in (prv[i], i):  # the two pairs that now include the merged part
            if a >= 0 and nxt[a] < n and (r := ranks.get(parts[a] + parts[nxt[a]])) is not None:
                heapq.heappush(heap, (r, a))
    return [p for p in parts if p is not None]


def _merge_pair(word: list[int], a: int, b: int, new_id: int) -> list[int]:
    """Replace each non-overlapping (a, b) in `word`, left to right: [a, a, a] with (a, a) -> [new, a]."""
    out, i, n = [], 0, len(word)
    while i < n:
        if i < n - 1 and word[i] == a and word[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def _special_regex(specials: Iterable[str]) -> regex.Pattern | None:
    # longest first, so "<|a|>" wins over its prefix "<|a" when both are special
    alts = sorted(specials, key=len, reverse=True)
    return regex.compile("|".join(regex.escape(s) for s in alts)) if alts else None


def _valid_utf8(text: str) -> str:
    """Replace lone surrogates (not encodable as UTF-8) with U+FFFD, as tiktoken does."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _count_pieces(texts: str | Iterable[str], pattern: regex.Pattern, specials: Collection[str],
                  max_chars: int | None = None) -> Counter[str]:
    """Count pre-tokens over all documents; text is first split on special-token strings so no merge spans one.
    A pre-token longer than `max_chars` counts as its chunks of `max_chars` ("ACGTAC", 4 -> "ACGT", "AC")."""
    split = _special_regex(specials)
    counts: Counter[str] = Counter()
    for doc in [texts] if isinstance(texts, str) else texts:
        if not isinstance(doc, str):
            raise TypeError(f"train() needs str documents, got {type(doc).__name__}; decode bytes first")
        for chunk in split.split(doc) if split else [doc]:
            pieces = pattern.findall(_valid_utf8(chunk))
            if max_chars is not None and any(len(p) > max_chars for p in pieces):
                pieces = [p[i : i + max_chars] for p in pieces for i in range(0, len(p), max_chars)]
            counts.update(pieces)
    return counts


def _train_merges(
    piece_counts: Mapping[str, int], n_new: int, *, progress: bool
) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Learn up to `n_new` tokens beyond the 256 bytes; returns (token bytes by id, merges that made ids 256+).

    Each distinct pre-token is stored once with its count, and pair counts are updated only for the words that
    contain the merged pair (no full recount per merge). The best pair is the one with the highest count; ties go
    to the lexicographically smallest (left bytes, right bytes). A max-heap with lazy deletion finds it: stale
    entries (whose count changed since they were pushed) are skipped when popped.
    """
    from tinylm.progress import bar as progress_bar

    vocab = [bytes([b]) for b in range(256)]  # id -> bytes
    ids = {t: i for i, t in enumerate(vocab)}  # bytes -> id
    merges: list[tuple[int, int]] = []
    words = [list(p.encode("utf-8")) for p in piece_counts]
    freqs = list(piece_counts.values())
    pair_counts: Counter[tuple[int, int]] = Counter()
    where: dict[tuple[int, int], set[int]] = {}  # pair -> words that may contain it (may hold stale entries)
    for w, (word, f) in enumerate(zip(words, freqs)):
        for pair in pairwise(word):
            pair_counts[pair] += f
            where.setdefault(pair, set()).add(w)
    heap = [(-c, vocab[a], vocab[b], a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)

    bar = progress_bar(total=n_new, desc="bpe merges", unit="tok", enabled=progress)
    while len(vocab) - 256 < n_new and heap:
        neg, ba, bb, a, b = heapq.heappop(heap)
        if pair_counts.get((a, b), 0) != -neg:
            continue  # stale: the count changed after this entry was pushed
        merged = ba + bb
        new_id = ids.get(merged)
        if new_id is None:  # a second route to an existing token ("a"+"bc" after "ab"+"c") reuses its id
            new_id = len(vocab)
            ids[merged] = new_id
            vocab.append(merged)
            merges.append((a, b))
            bar.update(1)
        changed: set[tuple[int, int]] = set()
        for w in where.pop((a, b)):
            old = words[w]
            new = _merge_pair(old, a, b, new_id)
            if len(new) == len(old):
                continue
            f = freqs[w]
            for pair in pairwise(old):
                pair_counts[pair] -= f
                changed.add(pair)
            for pair in pairwise(new):
                pair_counts[pair] += f
                changed.add(pair)
                where.setdefault(pair, set()).add(w)
            words[w] = new
        for pair in changed:
            c = pair_counts[pair]
            if c > 0:
                heapq.heappush(heap, (-c, vocab[pair[0]], vocab[pair[1]], *pair))
            else:
                del pair_counts[pair]
    bar.close()
    return vocab, merges


class ByteLevelBPE:
    """Byte-level BPE: GPT-2 pre-tokenization, 256-byte base alphabet, tiktoken's merge-by-rank encoding.

    Args:
        ranks: token bytes -> id (its merge rank); must hold all 256 single bytes.
        special_tokens: special token string -> id; ids must not collide with `ranks`.
        pattern: pre-tokenization regex (`regex` package syntax); GPT-2's by default.
        merges: the (left, right) byte pairs that made each multi-byte token, in rank order; only used to write
            merges.txt, recovered from `ranks` when not given.
        cache_size: most pre-tokens whose encoding is cached (repetitive text encodes from the cache); the cache
            is emptied when full.
    """

    def __init__(
        self,
        ranks: Mapping[bytes, int],
        *,
        special_tokens: Mapping[str, int] | None = None,
        pattern: str = GPT2_PATTERN,
        merges: list[tuple[bytes, bytes]] | None = None,
        cache_size: int = 200_000,
    ) -> None:
        missing = [b for b in range(256) if bytes([b]) not in ranks]
        if missing:
            raise ValueError(f"ranks lack single bytes {missing[:8]} (of {len(missing)}); a byte-level BPE needs "
                             "all 256 so any text can be encoded")
        self._ranks = dict(ranks)
        self._decoder = {i: t for t, i in self._ranks.items()}
        if len(self._decoder) != len(self._ranks):
            raise ValueError("ranks give the same id to two tokens; each token needs its own id")
        specials = dict(special_tokens or {})
        for s, i in specials.items():
            if not isinstance(s, str) or not s:
                raise ValueError(f"special token {s!r} must be a non-empty str")
            if i in self._decoder:
                raise ValueError(f"special token {s!r} id {i} is already the id of token {self._decoder[i]!r}; "
                                 f"use an id >= {max(self._decoder) + 1}")
        if len(set(specials.values())) != len(specials):
            raise ValueError(f"special tokens share ids: {specials}; give each its own id")
        self._specials = specials
        self._special_decoder = {i: s.encode("utf-8") for s, i in specials.items()}
        self._special_re = _special_regex(specials)
        self._pattern = pattern
        self._pat = regex.compile(pattern)
        self._merges = merges
        self._cache: dict[str, list[int]] = {}
        self._cache_size = cache_size

    # ---------------------------------------------------------------- properties
    @property
    def vocab_size(self) -> int:
        """Size of an embedding table that covers every id, special tokens included (max id + 1)."""
        return max([*self._decoder, *self._special_decoder]) + 1

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special token string -> id (a copy)."""
        return dict(self._specials)

    @property
    def pattern(self) -> str:
        """The pre-tokenization regex."""
        return self._pattern

    @property
    def ranks(self) -> dict[bytes, int]:
        """Token bytes -> id for the ordinary (non-special) tokens (a copy)."""
        return dict(self._ranks)

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """(left, right) byte pairs that made each multi-byte token, in rank order (recovered if not known)."""
        if self._merges is None:
            self._merges = self._recover_merges()
        return list(self._merges)

    def _recover_merges(self) -> list[tuple[bytes, bytes]]:
        out = []
        for token, rank in sorted(self._ranks.items(), key=lambda kv: kv[1]):
            if len(token) == 1:
                continue
            parts = _bpe(token, self._ranks, max_rank=rank)
            if len(parts) != 2:  # merge order cannot reach it; any split into two older tokens records it
                splits = [[token[:i], token[i:]] for i in range(1, len(token))
                          if self._ranks.get(token[:i], rank) < rank and self._ranks.get(token[i:], rank) < rank]
                if not splits:
                    raise ValueError(f"token {token!r} (rank {rank}) is not two lower-rank tokens joined; these "
                                     "ranks are not a BPE merge table, so no merges.txt can describe them")
                parts = splits[0]
            out.append((parts[0], parts[1]))
        return out

    # ---------------------------------------------------------------- encode / decode
    def clear_cache(self) -> None:
        """Forget cached pre-token encodings (e.g. to time the merge loop itself)."""
        self._cache.clear()

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode `text` treating special-token strings as plain text."""
        out: list[int] = []
        cache = self._cache
        for piece in self._pat.findall(_valid_utf8(text)):
            ids = cache.get(piece)
            if ids is None:
                b = piece.encode("utf-8")
                rank = self._ranks.get(b)  # tiktoken's shortcut: a whole piece in the vocab is one token
                ids = [rank] if rank is not None else [self._ranks[p] for p in _bpe(b, self._ranks)]
                if len(cache) >= self._cache_size:
                    cache.clear()
                cache[piece] = ids
            out.extend(ids)
        return out

    def encode(
        self,
        text: str,
        *,
        allowed_special: Literal["all"] | Collection[str] = frozenset(),
        disallowed_special: Literal["all"] | Collection[str] = "all",
    ) -> list[int]:
        """Encode `text` to ids, like `tiktoken.Encoding.encode`.

        Args:
            allowed_special: special-token strings to encode as their special id ("all" for every one).
            disallowed_special: special-token strings whose presence raises ValueError ("all": every special not
                allowed). Specials that are neither allowed nor disallowed are encoded as plain text.

        Unlike tiktoken, naming a string in `allowed_special` that is not a special token raises ValueError.
        """
        allowed = set(self._specials) if allowed_special == "all" else set(allowed_special)
        unknown = allowed - set(self._specials)
        if unknown:
            raise ValueError(f"allowed_special has {sorted(unknown)}, which are not special tokens of this "
                             f"tokenizer ({sorted(self._specials)}); remove them or add them as special_tokens")
        disallowed = set(self._specials) - allowed if disallowed_special == "all" else set(disallowed_special)
        if disallowed:
            found = _special_regex(disallowed).search(text)
            if found:
                raise ValueError(
                    f"text contains special token {found.group()!r}; pass allowed_special={{{found.group()!r}}} "
                    f"to encode it as a special token, or disallowed_special=() to encode it as plain text")
        if not allowed:
            return self.encode_ordinary(text)
        out: list[int] = []
        start = find = 0
        while m := self._special_re.search(text, find):
            if m.group() not in allowed:  # as tiktoken: look again one character on, so with specials "ab" and
                find = m.start() + 1  # "bc" and only "bc" allowed, "abc" is "a" then "bc" (a skip past "ab" lost it)
                continue
            out += self.encode_ordinary(text[start : m.start()])
            out.append(self._specials[m.group()])
            start = find = m.end()
        out += self.encode_ordinary(text[start:])
        return out

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The raw bytes of `ids` (special tokens as their UTF-8 string)."""
        try:
            return b"".join(self._decoder[i] if i in self._decoder else self._special_decoder[i] for i in ids)
        except KeyError as e:
            raise ValueError(f"id {e.args[0]} is not in the vocabulary (ids are 0..{self.vocab_size - 1})") from None

    def decode(self, ids: Iterable[int]) -> str:
        """Decode ids to text; bytes that are not valid UTF-8 become U+FFFD, as tiktoken does."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # ---------------------------------------------------------------- training
    @classmethod
    def train(
        cls,
        text: str | Iterable[str],
        *,
        vocab_size: int,
        special_tokens: Collection[str] = (),
        pattern: str = GPT2_PATTERN,
        progress: bool = True,
        max_piece_chars: int | None = TRAIN_PIECE_CHARS,
    ) -> ByteLevelBPE:
        """Learn a byte-level BPE from `text` (one str or an iterable of documents).

        Args:
            text: training text; special-token strings in it split the text (no merge crosses them).
            vocab_size: total ids, the 256 bytes and the special tokens included; special tokens get the last ids.
            special_tokens: special-token strings, e.g. ["<|endoftext|>"].
            pattern: pre-tokenization regex; GPT-2's by default.
            progress: show the merges' progress (a bar on a terminal, lines in a log: tinylm.progress).
            max_piece_chars: pre-tokens longer than this many characters are learned from as chunks of it, which
                keeps training linear on text without spaces (None: no limit; quadratic there). Encoding never
                chunks, so no token is longer than this many characters but any text still encodes.
        """
        specials = list(dict.fromkeys(special_tokens))
        if vocab_size < 256 + len(specials):
            raise ValueError(f"vocab_size={vocab_size} is too small: a byte-level BPE needs 256 byte tokens plus "
                             f"{len(specials)} special tokens; use vocab_size >= {256 + len(specials)}")
        pat = regex.compile(pattern)
        counts = _count_pieces(text, pat, specials, max_piece_chars)
        n_new = vocab_size - 256 - len(specials)
        vocab, merges = _train_merges(counts, n_new, progress=progress)
        if len(vocab) - 256 < n_new:
            warnings.warn(f"training text ran out of pairs to merge after {len(vocab) - 256} merges; vocab_size "
                          f"is {len(vocab) + len(specials)} instead of {vocab_size} (give more text for a larger one)")
        return cls(
            {t: i for i, t in enumerate(vocab)},
            special_tokens={s: len(vocab) + k for k, s in enumerate(specials)},
            pattern=pattern,
            merges=[(vocab[a], vocab[b]) for a, b in merges],
        )

    # ---------------------------------------------------------------- loading GPT-2
    @classmethod
    def from_tiktoken_file(
        cls, path: str | Path, *, special_tokens: Mapping[str, int] | None = None, pattern: str = GPT2_PATTERN
    ) -> ByteLevelBPE:
        """Load ranks from a `.tiktoken` file (one "base64(token) rank" per line), e.g. GPT-2's gpt2.tiktoken."""
        ranks = {}
        for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    token, rank = line.split()
                    ranks[base64.b64decode(token, validate=True)] = int(rank)
                except ValueError:
                    raise ValueError(f"{path}:{n}: expected 'base64token rank', got {line[:60]!r}") from None
        return cls(ranks, special_tokens=special_tokens, pattern=pattern)

    @classmethod
    def from_vocab_merges(
        cls,
        vocab_path: str | Path,
        merges_path: str | Path,
        *,
        special_tokens: Mapping[str, int] | None = None,
        pattern: str = GPT2_PATTERN,
    ) -> ByteLevelBPE:
        """Load GPT-2-style `vocab.json` + `merges.txt` (tokens in byte-to-unicode form, "Ġ" for a space).

        As in tiktoken, the ranks are rebuilt from the merges (base bytes by their vocab.json id, then one rank per
        merge in file order) and checked against vocab.json. vocab.json entries no merge produces are special
        tokens: with `special_tokens=None` they are taken as such; otherwise they must be listed there.
        """
        vocab: dict[str, int] = json.loads(Path(vocab_path).read_text(encoding="utf-8"))
        lines = Path(merges_path).read_text(encoding="utf-8").splitlines()
        if lines and lines[0].startswith("#version"):
            lines = lines[1:]
        table = bytes_to_unicode()
        ranks = {}
        for b in range(256):
            if table[b] not in vocab:
                raise ValueError(f"{vocab_path} lacks the byte token {table[b]!r}; not a byte-level BPE vocab")
            ranks[bytes([b])] = vocab[table[b]]
        merges = []
        next_rank = max(ranks.values()) + 1
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ValueError(f"{merges_path}:{n}: expected 'left right', got {line!r}")
            left, right = _from_unicode(parts[0]), _from_unicode(parts[1])
            if left not in ranks or right not in ranks:
                raise ValueError(f"{merges_path}:{n}: merge {line!r} uses a token no earlier merge made")
            merged = left + right
            if merged not in ranks:
                ranks[merged] = next_rank
                next_rank += 1
                merges.append((left, right))
        inverse, listed = _unicode_to_bytes(), set(special_tokens or ())
        by_file, extra = {}, {}  # ordinary tokens by bytes; the rest (special tokens) by string
        for token, i in vocab.items():
            spelled = token not in listed and all(c in inverse for c in token)
            b = bytes(inverse[c] for c in token) if spelled else None
            if b in ranks:
                by_file[b] = i
            else:
                extra[token] = i
        wrong = [(_to_unicode(t), r, by_file.get(t)) for t, r in ranks.items() if by_file.get(t) != r]
        if wrong:
            raise ValueError(f"{vocab_path} disagrees with the ranks from {merges_path} for {len(wrong)} tokens, "
                             f"e.g. (token, merge rank, vocab id) {wrong[:3]}; are the two files from one tokenizer?")
        if special_tokens is not None:
            unlisted = set(extra) - set(special_tokens)
            if unlisted:
                raise ValueError(f"{vocab_path} has tokens {sorted(unlisted)[:5]} that no merge produces; list them "
                                 "in special_tokens (or pass special_tokens=None to take them all as specials)")
            clash = {s: (i, extra[s]) for s, i in special_tokens.items() if s in extra and extra[s] != i}
            if clash:
                raise ValueError(f"special_tokens ids differ from {vocab_path}: {clash} (given, file)")
            extra = dict(special_tokens)
        return cls(ranks, special_tokens=extra, pattern=pattern, merges=merges)

    # ---------------------------------------------------------------- state and files
    def to_state(self) -> dict[str, Any]:
        """Everything needed to rebuild this tokenizer, as str/int/dict values only (safe for weights_only=True).

        Tokens are in GPT-2's byte-to-unicode form, like vocab.json.
        """
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "pattern": self._pattern,
            "vocab": {_to_unicode(t): i for t, i in self._ranks.items()},
            "special_tokens": dict(self._specials),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ByteLevelBPE:
        """Rebuild a tokenizer from `to_state()` output."""
        _check_header(state, "state")
        ranks = {_from_unicode(t): i for t, i in state["vocab"].items()}
        return cls(ranks, special_tokens=state["special_tokens"], pattern=state["pattern"])

    def save(self, path: str | Path) -> Path:
        """Write the tokenizer into directory `path`: readable `vocab.json` + `merges.txt` (GPT-2's format, also
        readable by Hugging Face tokenizers) and `config.json` (format version, pattern, special tokens)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        vocab = {_to_unicode(t): i for t, i in sorted(self._ranks.items(), key=lambda kv: kv[1])}
        clash = set(vocab) & set(self._specials)
        if clash:
            raise ValueError(f"special tokens {sorted(clash)} are spelled like ordinary tokens in vocab.json; "
                             "rename them")
        vocab.update(self._specials)
        merges = "".join(f"{_to_unicode(a)} {_to_unicode(b)}\n" for a, b in self.merges)
        config = {"format": FORMAT, "version": FORMAT_VERSION, "pattern": self._pattern,
                  "special_tokens": self._specials}
        (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        (path / "merges.txt").write_text("#version: 0.2\n" + merges, encoding="utf-8")
        (path / "config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> ByteLevelBPE:
        """Load a tokenizer written by `save(path)`."""
        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no tokenizer at {path} (config.json missing); write one with bpe.save({path!r})")
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        _check_header(config, str(path / "config.json"))
        return cls.from_vocab_merges(path / "vocab.json", path / "merges.txt",
                                     special_tokens=config["special_tokens"], pattern=config["pattern"])

    def __repr__(self) -> str:
        return f"ByteLevelBPE(vocab_size={self.vocab_size}, special_tokens={self._specials})"


def _check_header(header: Mapping[str, Any], where: str) -> None:
    if header.get("format") != FORMAT:
        raise ValueError(f"{where} is not a {FORMAT} tokenizer (format={header.get('format')!r})")
    if header.get("version", 0) > FORMAT_VERSION:
        raise ValueError(f"{where} has {FORMAT} version {header.get('version')}, newer than this tinylm reads "
                         f"({FORMAT_VERSION}); upgrade tinylm")
