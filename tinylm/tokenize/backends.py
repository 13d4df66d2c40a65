"""The four tokenizer backends behind `tinylm.tokenize.tokenizer.Tokenizer`: Hugging Face `tokenizers`, tiktoken,
characters, and tinylm's own byte-level BPE; each keeps a str/int-only state for checkpoints. Also the `.tiktoken`
rank-file format (`parse_ranks`, `ranks_to_text`)."""

from __future__ import annotations

import base64
import functools
import logging
import re
import unicodedata
from collections.abc import Callable
from typing import Any

from tinylm.machine import usable_cpus
from tinylm.tokenize.bpe import _valid_utf8

_SHOWN = ("max_length", "pad_token", "length")  # the settings of truncation / padding that a note names


class HFBackend:
    """A Hugging Face `tokenizers.Tokenizer` (trained here or loaded from tokenizer.json)."""

    kind = "hf"

    def __init__(self, tok: Any) -> None:
        tok.encode_special_tokens = True  # "<|endoftext|>" in user text stays text
        # a tokenizer.json saved with truncation or padding on (a BERT-like one, or one saved after a call with
        # truncation=True) cut every document to max_length and padded each batch to its longest: a corrupt dataset
        settings = {"truncation": tok.truncation, "padding": tok.padding}
        if on := {name: setting for name, setting in settings.items() if setting is not None}:
            said = [f"{name} ({', '.join(f'{k} {v}' for k, v in setting.items() if k in _SHOWN and v is not None)})"
                    for name, setting in on.items()]
            logging.getLogger("tinylm").info("the tokenizer file turns on %s: off here (tinylm encodes whole "
                                             "documents and packs them)", " and ".join(said).replace(" ()", ""))
            tok.no_truncation()
            tok.no_padding()
        self.tok = tok

    def encode(self, text: str) -> list[int]:
        try:
            return self.tok.encode(text, add_special_tokens=False).ids
        except TypeError:  # "TextInputSequence must be str": a lone surrogate (no UTF-8 has it), which tiktoken and
            if (fixed := _valid_utf8(text)) is text:  # scratch-bpe read as U+FFFD
                raise
            return self.encode(fixed)
        except Exception as e:
            if type(e) is not Exception:  # the tokenizers library raises a bare Exception for text it cannot encode
                raise
            raise _uncovered(e, [text], self._encodes) from None

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if (enc := self._as_tiktoken) is not None:  # the same ids for a fifth of the CPU (see tiktoken_twin)
            return encode_in_threads(enc, texts)
        # encode_batch runs on all cores (Rust threads); the _fast variant skips offsets we never use
        fn = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        try:
            return [e.ids for e in fn(texts, add_special_tokens=False)]
        except TypeError:  # a lone surrogate (see encode)
            if (fixed := [_valid_utf8(t) for t in texts]) == texts:
                raise
            return self.encode_batch(fixed)
        except Exception as e:
            if type(e) is not Exception:  # the tokenizers library raises a bare Exception for text it cannot encode
                raise
            raise _uncovered(e, texts, self._encodes) from None

    @functools.cached_property
    def _as_tiktoken(self) -> Any:
        return tiktoken_twin(self.tok)

    def _encodes(self, text: str) -> bool:
        try:
            self.tok.encode(text, add_special_tokens=False)
        except Exception:
            return False
        return True

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def token_bytes(self, i: int, *, first: bool = False) -> bytes:
        token = self.tok.id_to_token(i) or ""
        if self._byte_level:  # GPT-2's byte-to-unicode spelling
            from tinylm.tokenize.bpe import _from_unicode

            try:
                return _from_unicode(token)
            except ValueError:  # an added token kept as written (code models' runs of spaces): its decoder gives
                return token.encode("utf-8")  # its own UTF-8, as here
        if "ByteFallback" in repr(self.tok.decoder) and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):
            return bytes([int(token[3:5], 16)])  # Llama's byte fallback: one byte of a character not in the vocab
        # Other decoders spell a token by its place: SentencePiece's "▁the" is " the" after a word but "the" at the
        # start of a text, WordPiece's "##ing" joins the word before it while "the" gets a space. Decoded alone, a
        # token lost that space (or kept "##"): bits-per-byte came out 14-20 % off. What it adds after an ordinary
        # word is what it adds in running text. As a document's first token (``first``) it is spelled alone: there
        # the decoder strips the "▁" that the normalizer or pre-tokenizer prepended to the document, as in its text.
        if self._anchor is not None and not first:
            anchor, before = self._anchor
            both = self.tok.decode([anchor, i], skip_special_tokens=False).encode("utf-8")
            if both.startswith(before):
                return both[len(before):]
        return self.tok.decode([i], skip_special_tokens=False).encode("utf-8")

    @functools.cached_property
    def _byte_level(self) -> bool:
        """Whether tokens are spelled in GPT-2's byte-to-unicode alphabet: a ByteLevel decoder or pre-tokenizer,
        alone or inside a Sequence (a file may have the pre-tokenizer and no decoder, or a wrapped decoder)."""
        return "ByteLevel" in repr(self.tok.decoder) + repr(self.tok.pre_tokenizer)

    @functools.cached_property
    def _anchor(self) -> tuple[int, bytes] | None:
        """The first id that decodes to letters alone (a word or a piece of one), to decode tokens after, and its
        bytes; None if the vocabulary has none."""
        specials = set(self.special_tokens.values())
        for j in range(self.tok.get_vocab_size(with_added_tokens=True)):
            text = self.tok.decode([j], skip_special_tokens=False)
            if j not in specials and text.isalpha():
                return j, text.encode("utf-8")
        return None

    @property
    def vocab_size(self) -> int:
        # the largest id + 1: ids with a gap (a token removed, reserved ids left out) number fewer tokens than that
        return max(self.tok.get_vocab_size(with_added_tokens=True),
                   max(self.tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1)

    def normal_token(self, i: int) -> str | None:
        return self.tok.model.id_to_token(i)  # (the model's own vocabulary: added tokens are not in it)

    @property
    def special_tokens(self) -> dict[str, int]:
        return {t.content: i for i, t in sorted(self.tok.get_added_tokens_decoder().items()) if t.special}

    def state(self) -> dict:
        return {"json": self.tok.to_str()}

    @classmethod
    def from_state(cls, state: dict) -> HFBackend:
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_str(state["json"]))


class TiktokenBackend:
    """A tiktoken `Encoding`; its ranks are kept as `.tiktoken`-format text so the state is str-only."""

    kind = "tiktoken"

    def __init__(self, name: str, pattern: str, ranks_text: str, special_tokens: dict[str, int]) -> None:
        import tiktoken

        self.name, self.pattern, self.ranks_text, self.specials = name, pattern, ranks_text, dict(special_tokens)
        self.enc = tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=parse_ranks(ranks_text),
                                     special_tokens=self.specials)

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return encode_in_threads(self.enc, texts)

    def decode(self, ids: list[int]) -> str:
        if self._unused:  # tiktoken raises KeyError on them; a sampler can pick one (a model gives it a tiny p)
            ids = [i for i in ids if i not in self._unused]
        return self.enc.decode(ids)

    @functools.cached_property
    def _unused(self) -> frozenset[int]:
        """Ids below n_vocab that no token has (cl100k_base leaves 100256 and 100261-100275 unused): they decode to
        nothing."""
        used = set(self.enc._mergeable_ranks.values()) | set(self.specials.values())
        return frozenset(range(self.enc.n_vocab)) - used

    def token_bytes(self, i: int) -> bytes:
        try:
            return self.enc.decode_single_token_bytes(i)
        except KeyError:  # an id no token has: cl100k_base leaves 100256 and 100261-100275 unused
            return b""

    @property
    def vocab_size(self) -> int:
        return self.enc.n_vocab

    def normal_token(self, i: int) -> str | None:  # a rank's bytes come first, then a special's
        return self.token_bytes(i).decode("utf-8", "replace") or None

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self.specials)

    def state(self) -> dict:
        return {"name": self.name, "pattern": self.pattern, "ranks": self.ranks_text, "special_tokens": self.specials}

    @classmethod
    def from_state(cls, state: dict) -> TiktokenBackend:
        return cls(state["name"], state["pattern"], state["ranks"], state["special_tokens"])


class CharBackend:
    """Character-level: id = position of the character in the sorted set of the corpus's characters."""

    kind = "char"

    def __init__(self, chars: str, special_tokens: dict[str, int]) -> None:
        self.chars, self.specials = chars, dict(special_tokens)
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.itos = {**dict(enumerate(chars)), **{i: s for s, i in self.specials.items()}}
        self._table: Any = None  # encode_array's lookup table, made at its first call

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            if "\ud800" <= e.args[0] <= "\udfff" and (fixed := _valid_utf8(text)) is not text:  # a lone surrogate
                return self.encode(fixed)  # as U+FFFD, as the byte-level backends read it (and training, _train_char)
            raise MissingCharacter(e.args[0], len(self.chars)) from None

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_array(self, text: str) -> Any:
        """`encode` as an int32 numpy array, looked up in a table by code point: what a dataset build writes, at ~8x
        the speed of the list (which held the GIL a character at a time: 100 MB took 10 s of CPU, nanoGPT's pace)."""
        import numpy as np

        if self._table is None:  # id by code point; -1 for the characters it lacks, the last entry for all above
            self._table = np.full(max(map(ord, self.chars), default=0) + 2, -1, dtype=np.int32)
            self._table[[ord(c) for c in self.chars]] = np.arange(len(self.chars), dtype=np.int32)
        points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        ids = self._table[np.minimum(points, len(self._table) - 1)]
        if len(ids) and int(ids.min()) < 0:  # MissingCharacter, naming the first character the vocabulary lacks,
            return np.asarray(self.encode(text), dtype=np.int32)  # or a lone surrogate's U+FFFD (see encode)
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] for i in ids)

    def token_bytes(self, i: int) -> bytes:
        return self.itos[i].encode("utf-8")

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + len(self.specials)

    def normal_token(self, i: int) -> str | None:
        return self.chars[i] if 0 <= i < len(self.chars) else None

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self.specials)

    def state(self) -> dict:
        return {"chars": self.chars, "special_tokens": self.specials}

    @classmethod
    def from_state(cls, state: dict) -> CharBackend:
        return cls(state["chars"], state["special_tokens"])


class ScratchBackend:
    """tinylm's own byte-level BPE (`tinylm.tokenize.bpe.ByteLevelBPE`)."""

    kind = "scratch-bpe"

    def __init__(self, bpe: Any) -> None:
        self.bpe = bpe

    def encode(self, text: str) -> list[int]:
        return self.bpe.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: list[int]) -> str:
        return self.bpe.decode(ids)

    def token_bytes(self, i: int) -> bytes:
        return self.bpe.decode_bytes([i])

    @property
    def vocab_size(self) -> int:
        return self.bpe.vocab_size

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self.bpe.special_tokens)

    def state(self) -> dict:
        return self.bpe.to_state()

    @classmethod
    def from_state(cls, state: dict) -> ScratchBackend:
        from tinylm.tokenize.bpe import ByteLevelBPE

        return cls(ByteLevelBPE.from_state(state))


BACKENDS = {b.kind: b for b in (HFBackend, TiktokenBackend, CharBackend, ScratchBackend)}


def _uncovered(e: Exception, texts: list[str], encodes: Callable[[str], bool]) -> ValueError:
    """The tokenizers library's error for text its vocabulary cannot encode (a WordLevel with no unknown token:
    "WordLevel error: Missing [UNK] token from the vocabulary") as a ValueError naming the text and the fix: the
    first character that cannot be encoded alone, with the text around it (the start of a long document named
    nothing the user could find), else the start of the text."""
    text = next((t for t in texts if not encodes(t)), texts[0] if texts else "")
    bad = next((c for c in dict.fromkeys(text) if not encodes(c)), None)
    if bad is None:
        what = repr(text[:60])
    else:
        at = text.index(bad)
        what = f"{bad!r} (character {at:,} of the text, in {text[max(0, at - 30):at + 30]!r})"
    return ValueError(f"the tokenizer cannot encode {what} ({e}): its vocabulary has no token for some of the "
                      "text and no unknown token to stand for it; use a tokenizer that covers the text "
                      "(--data.tokenizer bpe reads any text), or remove that text")


def tiktoken_twin(tok: Any) -> Any:
    """A tiktoken `Encoding` that gives the ids of the `tokenizers.Tokenizer` `tok`, or None where it may not. Both
    split by GPT-2's pattern (the same pieces for every code point) and merge inside a piece: tokenizers the pair
    of lowest place in the merges, tiktoken the pair whose joined bytes have the lowest rank (id). They agree where
    the merges make new tokens in increasing ids and each token's own bytes merge into it (both checked): then
    tiktoken never joins a pair that is not a merge ("a" + "bc" into "abc" where the merge is "ab" + "c", which the
    library leaves apart). A trained BPE has both, as `bpe` makes them; a merge list edited by hand may not. Taken
    only for a plain byte-level BPE: no normalizer, ByteLevel pre-tokenizer with GPT-2's regex and no prefix
    space, all 256 bytes, no dropout, affixes or byte fallback, only special added tokens (which tinylm reads as
    text). tiktoken encodes at ~5x less CPU: no offsets, no per-word objects."""
    import json

    from tinylm.tokenize.bpe import _from_unicode, bytes_to_unicode
    from tinylm.tokenize.patterns import GPT2_PATTERN

    spec = json.loads(tok.to_str())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    plain = (spec.get("normalizer") is None and model.get("type") == "BPE" and not model.get("dropout")
             and not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix")
             and not model.get("byte_fallback") and not model.get("ignore_merges")
             and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")
             and all(t.get("special") for t in spec.get("added_tokens") or []))
    vocab = model.get("vocab") or {}
    if not plain or not all(c in vocab for c in bytes_to_unicode().values()):
        return None
    ranks = {bytes([b]): vocab[c] for b, c in bytes_to_unicode().items()}
    made, tokens = [], []
    for merge in model.get("merges") or []:
        a, b = merge if isinstance(merge, list) else merge.split(" ")
        if a + b not in vocab or (made and vocab[a + b] <= made[-1]):  # a second route to a token, or out of order
            return None
        made.append(vocab[a + b])
        tokens.append(a + b)
        try:
            ranks[_from_unicode(a) + _from_unicode(b)] = vocab[a + b]
        except ValueError:  # a character outside GPT-2's byte alphabet: not a byte-level vocabulary
            return None
    if len(set(ranks.values())) != len(ranks):
        return None
    if unmerged_token(tokens, made, tok.model) is not None:
        return None
    import tiktoken

    return tiktoken.Encoding("tokenizer.json", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})


def unmerged_token(tokens: list[str], ids: list[int], model: Any) -> str | None:
    """The first of `tokens` (in GPT-2's byte-to-unicode spelling, with their `ids`) whose own bytes the BPE `model`
    (a `tokenizers` BPE, which merges the pair listed first, as GPT-2's encoder does) does not merge into it, or
    None. tiktoken, which joins any pair whose bytes have a rank, gives such a token where the merges never do
    ("abc" from merges "b c", "a b", "ab c": they leave "a" + "bc"). A trained BPE has none. 0.3 s for GPT-2's."""
    return next((t for t, i in zip(tokens, ids, strict=True) if [x.id for x in model.tokenize(t)] != [i]), None)


def encode_in_threads(enc: Any, texts: list[str]) -> list[list[int]]:
    """`enc.encode_ordinary` of each text, in a run of texts per core but one (left to the thread that reads the
    next batch: on 2 cores two runs cost 20 % more CPU for no less time). tiktoken's own encode_ordinary_batch
    hands each text to its pool, which for documents of a few hundred bytes doubled the CPU of a plain loop. The
    cores are those the process may run on (a job given 2 of a node's 64 started 63 threads on its 2)."""
    threads = min(usable_cpus() - 1, len(texts))
    if threads <= 1:
        return [enc.encode_ordinary(t) for t in texts]
    from concurrent.futures import ThreadPoolExecutor

    step = -(-len(texts) // threads)
    with ThreadPoolExecutor(threads) as pool:  # (tiktoken encodes without the GIL)
        runs = pool.map(lambda run: [enc.encode_ordinary(t) for t in run],
                        [texts[i:i + step] for i in range(0, len(texts), step)])
        return [ids for run in runs for ids in run]


# ---------------------------------------------------------------------------------------------------- .tiktoken
def ranks_to_text(ranks: dict[bytes, int]) -> str:
    return "\n".join(f"{base64.b64encode(t).decode('ascii')} {r}" for t, r in sorted(ranks.items(), key=lambda x: x[1]))


class MissingCharacter(ValueError):
    """Text holding a character that a char tokenizer's vocabulary lacks (``char``; ``size`` characters known)."""

    def __init__(self, char: str, size: int) -> None:
        self.char, self.size = char, size
        what, fix = repr(char), "remove it from the text (a prompt)"
        if unicodedata.category(char).startswith("M"):  # drawn on the quote before it: an é typed decomposed (NFD,
            # as macOS file names and some PDFs hold it) was "character '́' is not in ...", though é was known
            what += f" (U+{ord(char):04X} {unicodedata.name(char, 'a combining mark')}, which follows its letter " \
                "in text in decomposed form, NFD)"
            fix = "compose the text (NFC: unicodedata.normalize('NFC', text))"
        super().__init__(f"character {what} is not in the char tokenizer's vocabulary of {size} characters (built "
                         f"from the training corpus); {fix}, or train on a corpus that contains it or with a "
                         "byte-level tokenizer (--data.tokenizer bpe)")


class FormatError(ValueError):
    """A file's content is not of the format it is read as, in tinylm's own words (kept whole where the error is
    reported, unlike a library's parse error)."""


def parse_ranks(text: str) -> dict[bytes, int]:
    """A `.tiktoken` rank file's `base64token rank` lines as {token bytes: rank}. Refused: a line of another form,
    a rank given twice or a token given twice (a truncated or edited file: tiktoken panics on the first and silently
    keeps one of the second)."""
    ranks: dict[bytes, int] = {}
    line_of: dict[int, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank_text = line.split()
            piece, rank = base64.b64decode(token, validate=True), int(rank_text)
            if rank < 0:
                raise ValueError(rank)
        except ValueError as e:
            raise FormatError(f"line {n} of the tiktoken ranks is not 'base64token rank': {line[:80]!r}") from e
        if rank in line_of or piece in ranks:
            first = line_of[rank] if rank in line_of else line_of[ranks[piece]]
            what = f"rank {rank}" if rank in line_of else f"token {token}"
            raise FormatError(f"line {n} of the tiktoken ranks repeats {what} of line {first} (a truncated or "
                              "edited file?); each token and each rank comes once: use the whole original file")
        ranks[piece], line_of[rank] = rank, n
    return ranks
