"""Constrained decoding: every row's text matches a regex, a JSON schema or a Lark grammar.

The engine is llguidance (`pip install 'tinylm[grammar]'`, imported only here): it compiles the grammar over bytes,
and at each step gives the bitmask of token ids whose bytes keep the text inside the grammar, for any vocabulary
(a char one, a byte-level BPE whose ids can be half a UTF-8 character, tiktoken's). Picked over xgrammar and
outlines-core by benchmarks/bench_grammar_engines.py (docs/benchmarks.md): millisecond compiles where they took
seconds on GPT-2's vocabulary, the fastest masks there, and Lark grammars (outlines-core has none).

The mask is applied to the model's logits before every other processor, so top-k / top-p choose among the tokens
the grammar allows. If the other processors then remove every allowed token (a no-repeat n-gram ban, say), the
grammar wins: that row samples from the allowed tokens under the model's plain logits. EOS is allowed only where the
grammar may end; for a tokenizer without one (a char vocabulary), a row ends as soon as the grammar allows nothing
more. A row cut short by max_new_tokens is an unfinished match (a prefix of one).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

_TOKENIZERS: dict[tuple[str, int], object] = {}  # (tokenizer fingerprint, ids) -> llguidance.LLTokenizer


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise ImportError("--regex, --json_schema and --grammar need llguidance; pip install 'tinylm[grammar]'") \
            from None
    return llguidance


def grammar_text(regex: str | None, json_schema: str | None, grammar: str | None) -> str | None:
    """The llguidance grammar of whichever constraint is set (None when none is): ``json_schema`` and ``grammar`` are
    the text itself or the path of a file holding it."""
    given = [(k, v) for k, v in (("regex", regex), ("json_schema", json_schema), ("grammar", grammar)) if v]
    if not given:
        return None
    ll = _llguidance().LLMatcher
    kind, value = given[0]
    if kind != "json_schema":
        built = ll.grammar_from_regex(value) if kind == "regex" else ll.grammar_from_lark(_text_or_file(kind, value))
        _check(built, kind)
        return built
    text = _text_or_file(kind, value)
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"json_schema is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); pass a JSON "
                         "Schema or the path of a .json file holding one") from None
    # compact JSON (", " and ": " as separators, no free whitespace): a char vocabulary without "{" is refused at the
    # first step instead of writing whitespace forever, and a small model is not tempted into padding
    built = ll.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
    _check(built, kind)
    return built


def _check(grammar: str, kind: str, lltok=None) -> None:
    """Refuse a grammar llguidance cannot compile, in one line."""
    error = _llguidance().LLMatcher.validate_grammar(grammar, lltok)
    if error and not error.startswith("WARNING"):
        raise ValueError(f"the {kind} does not compile: {' '.join(error.split())[:300]}")


def _text_or_file(kind: str, value: str) -> str:
    """A grammar or schema given as text, or the text of the file it names."""
    looks_like_text = "\n" in value or value.lstrip().startswith("{") or ":" in value
    path = Path(value)
    if not looks_like_text or path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except OSError as e:
            raise FileNotFoundError(f"{kind} file {value!r} cannot be read ({e.strerror}); pass the path of a file, "
                                    f"or the {kind} itself") from None
    return value


class Grammar:
    """One matcher per row over ``tokens`` (the bytes of every id); `allowed()` is the (B, V) mask of the next ids,
    `consume` advances a row, `reorder` follows beams."""

    def __init__(self, grammar: str, tokenizer, vocab_size: int, rows: int) -> None:
        ll = _llguidance()
        self.V, self.eos = vocab_size, tokenizer.eos_id
        self.lltok = _lltokenizer(tokenizer, vocab_size)
        _check(grammar, "grammar", self.lltok)
        self.matchers = [ll.LLMatcher(self.lltok, grammar, log_level=0) for _ in range(rows)]
        self.live = [True] * rows

    def allowed(self) -> Tensor:
        """(B, V) bool: the ids each row may take next (all, for a row that ended)."""
        masks = np.ones((len(self.matchers), self.V), dtype=bool)
        for row, m in enumerate(self.matchers):
            if self.live[row]:
                bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
                masks[row] = bits[: self.V].astype(bool)
                if m.is_error() or not masks[row].any() and not m.is_stopped():
                    raise ValueError("the grammar needs text this tokenizer cannot write (no token id continues "
                                     "it); use characters the tokenizer has (a char tokenizer knows only its "
                                     "corpus's characters)")
        return torch.from_numpy(masks)

    def consume(self, row: int, token: int) -> None:
        """Advance a row by ``token``; a row that ends (EOS, or a token its grammar refuses: a dead beam) stops."""
        if self.live[row] and (token == self.eos or not self.matchers[row].consume_token(token)):
            self.live[row] = False

    def stopped(self, row: int) -> bool:
        """The grammar allows nothing more in this row (only an EOS)."""
        return self.matchers[row].is_stopped()

    def reorder(self, index: list[int]) -> None:
        self.matchers = [self.matchers[i].deep_copy() for i in index]
        self.live = [self.live[i] for i in index]

    def ends_after(self, row: int, token: int) -> bool:
        """Whether ``token`` would end the row's grammar (a beam that finishes there)."""
        m = self.matchers[row].deep_copy()
        return m.consume_token(token) and m.is_stopped()


def _lltokenizer(tokenizer, vocab_size: int):
    """llguidance's view of a tinylm tokenizer (cached: ~0.5 s for GPT-2's 50k ids): the bytes of every id, its
    special ids, and an EOS (a spare id past the vocabulary when the tokenizer has none)."""
    key = (tokenizer.fingerprint, vocab_size)
    if key in _TOKENIZERS:
        return _TOKENIZERS[key]
    ll = _llguidance()
    tokens = [tokenizer.token_bytes(i) if i < tokenizer.vocab_size else b"" for i in range(vocab_size)]
    specials = sorted(set(tokenizer.special_tokens.values()))
    eos = tokenizer.eos_id
    if eos is None:  # llguidance needs one: an id no model produces
        tokens, eos = tokens + [b"<|tinylm-end|>"], vocab_size
        specials.append(eos)

    class Vocabulary:  # what llguidance.TokenizerWrapper reads
        eos_token_id, bos_token_id, special_token_ids = eos, None, specials

        def __init__(self) -> None:
            self.tokens = tokens

        def __call__(self, text: bytes | str) -> list[int]:  # tokenizes text the grammar forces
            if isinstance(text, bytes):
                text = text.decode("utf-8", errors="replace")
            try:
                return tokenizer.encode(text)
            except ValueError:  # a character a char vocabulary lacks: no id writes it
                return []

    lltok = ll.LLTokenizer(ll.TokenizerWrapper(Vocabulary()))
    _TOKENIZERS.clear()  # one at a time: an LLTokenizer of a big vocabulary holds tens of MB
    _TOKENIZERS[key] = lltok
    return lltok


def restrict(logits: Tensor, allowed: Tensor | None) -> Tensor:
    """``logits`` (B, V) with the ids the grammar forbids at -inf."""
    return logits if allowed is None else logits.masked_fill(~allowed.to(logits.device), -math.inf)


def rescue(processed: Tensor, restricted: Tensor, allowed: Tensor | None) -> Tensor:
    """Rows whose every id the other processors removed fall back to the grammar's ids (``restricted``). Without a
    grammar (``allowed`` None) nothing is restricted and the processors leave a row free themselves: no work per
    token."""
    if allowed is None:
        return processed
    empty = torch.isneginf(processed).all(dim=-1, keepdim=True)
    return torch.where(empty, restricted, processed)
