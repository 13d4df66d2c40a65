"""Constrained decoding: every row's text matches a regex, a JSON schema or a Lark grammar.

The engine is llguidance (`pip install 'tinylm[grammar]'`, imported only here): it compiles the grammar over bytes,
and at each step gives the bitmask of token ids whose bytes keep the text inside the grammar, for any vocabulary
(a char one, a byte-level BPE whose ids can be half a UTF-8 character, tiktoken's). Picked over xgrammar and
outlines-core by benchmarks/bench_grammar_engines.py (docs/benchmarks.md): millisecond compiles where they took
seconds on GPT-2's vocabulary, the fastest masks there, and Lark grammars (outlines-core has none).

The mask is applied to the model's logits before every other processor, so top-k / top-p choose among the tokens
the grammar allows. A no-repeat n-gram ban that would remove every allowed token lets go of that row at that step, as
of any row it would leave no token; should the other processors still remove them all, the grammar wins: that row
samples from the allowed tokens under the model's plain logits. EOS is allowed only where the
grammar may end; for a tokenizer without one (a char vocabulary), a row ends as soon as the grammar allows nothing
more. A row cut short by max_new_tokens is an unfinished match (a prefix of one).
"""

from __future__ import annotations

import json
import math
from collections import deque
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from tinylm.errors import UnavailableError

_TOKENIZERS: dict[tuple[str, int], object] = {}  # (tokenizer fingerprint, ids) -> llguidance.LLTokenizer
_EVERY_BYTE: dict[tuple[str, int], bool] = {}  # (tokenizer fingerprint, ids) -> whether each byte alone is an id
_BYTES: list = []  # the byte-level LLTokenizer (`_byte_lltokenizer`), made once
_WRITABLE: set[tuple[str, str, int]] = set()  # (grammar, tokenizer fingerprint, ids) found writable


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise UnavailableError("--regex, --json_schema and --grammar need llguidance: pip install 'tinylm[grammar]'") \
            from None
    return llguidance


def grammar_text(regex: str | None, json_schema: str | None, grammar: str | None) -> str | None:
    """The llguidance grammar of whichever constraint is set (None when none is): ``json_schema`` and ``grammar`` are
    the text itself or the path of a file holding it."""
    given = [(k, v) for k, v in (("regex", regex), ("json_schema", json_schema), ("grammar", grammar)) if v]
    if not given:
        return None
    kind, value = given[0]
    ll = _llguidance().LLMatcher
    if kind == "regex":
        built = ll.grammar_from_regex(value)
    elif kind == "grammar":
        built = ll.grammar_from_lark(_text_or_file(kind, value))
    else:
        built = _json_schema_grammar(_text_or_file(kind, value))
    _check(built, kind)
    _check_begins(built, constraint_name(kind, value))
    return built


def _json_schema_grammar(text: str) -> str:
    """The llguidance grammar of a JSON schema's text."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"json_schema is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); pass a JSON "
                         "Schema or the path of a .json file holding one") from None
    if not isinstance(schema, (dict, bool)):  # (llguidance: "Expecting object schema to apply options")
        raise ValueError(f"json_schema must be a JSON object (a JSON Schema) or true / false, got the JSON "
                         f"{type(schema).__name__} {text.strip()[:40]!r}; a list of schemas is {{\"anyOf\": [...]}}")
    if schema is False:  # a boolean schema that no value meets: refused by _check ("Unsatisfiable schema")
        return _llguidance().LLMatcher.grammar_from_json_schema(False)  # (llguidance's defaults take an object)
    # compact JSON (", " and ": " as separators, no free whitespace): a char vocabulary without "{" is refused at the
    # first step instead of writing whitespace forever, and a small model is not tempted into padding
    return _llguidance().LLMatcher.grammar_from_json_schema({} if schema is True else schema,  # true: any value
                                                            defaults={"whitespace_flexible": False})


def constraint_name(kind: str, value: str, spelled: str | None = None) -> str:
    """How messages name a constraint: ``regex '[a-z]+'`` (``spelled``: the option as the user wrote it,
    ``samples.regex``); a long value (a schema can be pages) is cut to 60 characters."""
    return f"{spelled or kind} {value if len(value) <= 60 else value[:57] + '...'!r}"


def _check(grammar: str, kind: str, lltok=None) -> None:
    """Refuse a grammar llguidance cannot compile, in one line."""
    error = _llguidance().LLMatcher.validate_grammar(grammar, lltok)
    if error and not error.startswith("WARNING"):
        raise ValueError(f"the {kind} does not compile: {' '.join(error.split())[:300]}")


def _check_begins(grammar: str, name: str) -> None:
    """Refuse a grammar whose text cannot begin, whatever the tokenizer: it matches no text at all, or only the
    empty text (nothing to generate; a row of a tokenizer without an EOS had no id to take: a NaN crash). Read by
    bytes, the grammar's own view."""
    m = _llguidance().LLMatcher(_byte_lltokenizer(), grammar, log_level=0)
    bits = _bits(m)
    if m.is_error() or not bits[:256].any():  # (llguidance's error here: no byte can begin its text)
        empty = m.is_accepting() and not m.is_error()
        what = "only the empty text: there is nothing to generate" if empty else "no text at all"
        raise ValueError(f"the {name} matches {what}; use one that matches some text")


def _text_or_file(kind: str, value: str) -> str:
    """A grammar or schema given as text, or the text of the file it names."""
    looks_like_text = "\n" in value or value.lstrip().startswith("{") or ":" in value or (
        kind == "json_schema" and value.strip() in ("true", "false"))  # a boolean JSON Schema
    path = Path(value) if looks_like_text else Path(value).expanduser()  # (`--json_schema=~/s.json`: no shell's ~)
    if not looks_like_text or path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except OSError as e:
            raise FileNotFoundError(f"{kind} file {value!r} cannot be read ({e.strerror}); pass the path of a file, "
                                    f"or the {kind} itself") from None
    return value


PREFLIGHT_STATES = 300  # most grammar states the check before generation visits (~0.1 s on a char vocabulary)


class Grammar:
    """One matcher per row over ``tokens`` (the bytes of every id); `allowed()` is the (B, V) mask of the next ids,
    `consume` advances a row, `reorder` follows beams. ``name`` says which constraint it is in messages ("regex
    'abc'"). A grammar the tokenizer cannot write is refused on creation, before any token is generated
    (`check_writable`), and at the first step where a row has no token to take, naming where."""

    def __init__(self, grammar: str, tokenizer, vocab_size: int, rows: int, name: str = "grammar") -> None:
        ll = _llguidance()
        self.V, self.eos, self.name, self.grammar = vocab_size, tokenizer.eos_id, name, grammar
        self.tokenizer = tokenizer
        self.lltok = _lltokenizer(tokenizer, vocab_size)
        _check(grammar, "grammar", self.lltok)
        self.matchers = [ll.LLMatcher(self.lltok, grammar, log_level=0) for _ in range(rows)]
        self.live = [True] * rows
        self.tokens: list[list[int]] = [[] for _ in range(rows)]  # each row's ids so far, for messages
        self.stuck: dict[int, str] = {}  # beams: row -> why the first beam of it that no id continued ended there
        check_writable(grammar, tokenizer, vocab_size, name)

    def _mask(self, m) -> np.ndarray:
        return _bits(m)[: self.V].astype(bool)

    def allowed(self, beams: bool = False) -> Tensor:
        """(B, V) bool: the ids each row may take next (all, for a row that ended). A row no id continues is refused;
        with ``beams`` it ends there instead (no id: its beam is dead, others may go on), the reason kept in
        ``stuck`` for a prompt whose every beam dies so."""
        masks = np.ones((len(self.matchers), self.V), dtype=bool)
        for row, m in enumerate(self.matchers):
            if self.live[row]:
                masks[row] = self._mask(m)
                if _dead(m, masks[row], self.eos):
                    why = _unwritable(self.name, self.tokenizer, self.tokens[row], self.grammar)
                    if not beams:
                        raise ValueError(why)
                    self.live[row], masks[row] = False, False
                    self.stuck.setdefault(row, why)
        return torch.from_numpy(masks)

    def consume(self, row: int, token: int) -> None:
        """Advance a row by ``token``; a row that ends (EOS, or a token its grammar refuses: a dead beam) stops."""
        if self.live[row] and (token == self.eos or not self.matchers[row].consume_token(token)):
            self.live[row] = False
        elif self.live[row]:
            self.tokens[row].append(token)

    def stopped(self, row: int) -> bool:
        """The grammar allows nothing more in this row (only an EOS)."""
        return self.matchers[row].is_stopped()

    def reorder(self, index: list[int]) -> None:
        self.matchers = [self.matchers[i].deep_copy() for i in index]
        self.live = [self.live[i] for i in index]
        self.tokens = [list(self.tokens[i]) for i in index]

    def ends_after(self, row: int, token: int) -> bool:
        """Whether ``token`` would end the row's grammar (a beam that finishes there)."""
        m = self.matchers[row].deep_copy()
        return m.consume_token(token) and m.is_stopped()


def _bits(m) -> np.ndarray:
    """A matcher's next-token bitmask as one 0/1 per id (llguidance packs 32 ids to a word, lowest bit first)."""
    return np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")


def _dead(m, mask: np.ndarray, eos: int | None) -> bool:
    """A matcher that can neither end nor go on: in error, or allowing no id but the EOS while it is not at an end
    (llguidance leaves the EOS bit set in a state no token continues)."""
    if m.is_error():
        return True
    writable = mask.any() if eos is None or eos >= mask.size else mask[:eos].any() or mask[eos + 1:].any()
    return not writable and not m.is_accepting()


def check_writable(grammar: str, tokenizer, vocab_size: int, name: str = "grammar") -> None:
    """Refuse, before generating, a grammar this tokenizer cannot write: one where every way the tokenizer's ids can
    go reaches a state no id continues (a character a char vocabulary lacks, where the grammar needs it).

    By kind of tokenizer: one with an id for every byte (byte-level BPE, tiktoken) writes any text, so every grammar
    passes. For the others, a breadth-first search over the grammar's states, id by id, ends at the first complete
    match (writable) or when every path has died (refused, naming where). After PREFLIGHT_STATES states a regex is
    intersected with "any text of the tokenizer's characters" by llguidance's regex engine, which answers exactly
    (`[a-z]+ü`: its letters loop past any search); a Lark grammar or JSON schema is left to the steps of generation
    (one that loops through writable text before it needs a missing character writes an unfinished match until
    max_new_tokens)."""
    lltok = _lltokenizer(tokenizer, vocab_size)
    key = (grammar, tokenizer.fingerprint, vocab_size)
    if key in _WRITABLE or _writes_every_byte(tokenizer, vocab_size):
        return
    _check_writable(grammar, tokenizer, vocab_size, name, lltok)
    if len(_WRITABLE) > 64:  # (a long session of many grammars)
        _WRITABLE.clear()
    _WRITABLE.add(key)  # each sample step of a run asks again


def _check_writable(grammar: str, tokenizer, vocab_size: int, name: str, lltok) -> None:
    """check_writable's search (and regex intersection), for a tokenizer without every byte."""
    ll = _llguidance()
    eos = tokenizer.eos_id
    root = ll.LLMatcher(lltok, grammar, log_level=0)
    if root.is_accepting():
        return
    queue, states, first_dead = deque([(root, [])]), 0, None
    while queue and states < PREFLIGHT_STATES:
        m, path = queue.popleft()
        mask = _bits(m)[:vocab_size].astype(bool)
        if _dead(m, mask, eos):
            first_dead = path if first_dead is None else first_dead
            continue
        for t in np.flatnonzero(mask).tolist():
            child = m.deep_copy()
            if t == eos:
                continue
            if not child.consume_token(t):  # an id its own mask allowed: the engine gave up, not the tokenizer
                _check_engine(child, name)
                continue
            if child.is_accepting():
                return
            queue.append((child, path + [t]))
            states += 1
    if not queue:  # every path died
        raise ValueError(_unwritable(name, tokenizer, first_dead or [], grammar))
    # the budget ran out: a regex has an exact answer still, other grammars are left to the steps of generation
    if _regex_needs_a_missing_character(grammar, tokenizer, vocab_size, name):
        raise ValueError(f"the {name} needs text this {tokenizer.kind} tokenizer ({tokenizer.vocab_size:,} ids) "
                         "cannot write: every match holds a character none of its ids has; use characters the "
                         "tokenizer has (a char tokenizer knows only its corpus's characters) or a tokenizer that "
                         "has them")


def _check_engine(m, name: str) -> None:
    """Refuse a grammar llguidance gives up on while matching, in one line: its lexer's or parser's size limit
    (`a{300000}`) or its fuel (`(ab){100000}`) is the grammar's size, not a character the tokenizer lacks (a text
    the grammar refuses is neither: it stops with another reason)."""
    error = m.get_error().split("\n", 1)[0] if m.is_error() else ""
    if m.stop_reason() in ("LexerTooComplex", "ParserTooComplex") or error.startswith(("lexer error: too many",
                                                                                      "fuel exhausted")):
        raise ValueError(f"the {name} is too large for the grammar engine ({error}); use a smaller one (e.g. a "
                         "repeat like a{300000} as a+ with --max_new_tokens to bound its length)")


def _regex_needs_a_missing_character(grammar: str, tokenizer, vocab_size: int, name: str) -> bool:
    """For a regex (as `grammar_text` compiles one): whether the regex and "any text of the characters the
    tokenizer's ids hold" have no match in common, read by llguidance's own regex engine (an exact answer, loops
    included: `[a-z]+ü` needs a ü however long its letters run). Other grammars: False (the search decides)."""
    try:
        spec = json.loads(grammar)["grammars"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return False
    if spec.get("name") != "regex" or not str(spec.get("lark_grammar", "")).startswith("start: /"):
        return False
    chars = {c for i in range(min(vocab_size, tokenizer.vocab_size))
             for c in tokenizer.token_bytes(i).decode("utf-8", "ignore")}
    alphabet = "".join(f"\\x{{{ord(c):X}}}" for c in sorted(chars))  # \x{41}: any character, escaped alike
    lark = spec["lark_grammar"].replace("start: ", "start: WRITABLE\nWRITABLE: ", 1) + f" & /[{alphabet}]*/"
    ll = _llguidance()
    if ll.LLMatcher.validate_grammar(lark, None):  # (no answer from a grammar that does not compile)
        return False
    m = ll.LLMatcher(_byte_lltokenizer(), lark, log_level=0)
    bits = _bits(m)
    _check_engine(m, name)
    return m.is_error() or not bits[:256].any() and not m.is_accepting()  # (llguidance: an error when no byte fits)


def _writes_every_byte(tokenizer, vocab_size: int) -> bool:
    """Whether some id of the tokenizer is each of the 256 bytes alone (then any text has a spelling in its ids)."""
    key = (tokenizer.fingerprint, vocab_size)
    if key not in _EVERY_BYTE:
        singles = {b for i in range(min(vocab_size, tokenizer.vocab_size)) if len(b := tokenizer.token_bytes(i)) == 1}
        _EVERY_BYTE[key] = len(singles) == 256
    return _EVERY_BYTE[key]


def _unwritable(name: str, tokenizer, ids: list[int], grammar: str) -> str:
    """The one line refusing a grammar the tokenizer cannot write: which constraint, which tokenizer, where it
    got stuck and (when the grammar forces it) the text it needed there."""
    written = b"".join(tokenizer.token_bytes(i) for i in ids)
    where = f"after {written.decode('utf-8', 'replace')!r}" if ids else "at the start"
    needs = _forced_text(grammar, written)
    needs = needs if len(needs) <= 60 else needs[:57] + "..."  # (`a{300000}` forced 300,000 a's into one line)
    return (f"the {name} needs text this {tokenizer.kind} tokenizer ({tokenizer.vocab_size:,} ids) cannot write: "
            f"no id continues it {where}{f' (it needs {needs!r} there)' if needs else ''}; use characters the "
            "tokenizer has (a char tokenizer knows only its corpus's characters) or a tokenizer that has them")


def _forced_text(grammar: str, written: bytes) -> str:
    """The text ``grammar`` forces after ``written``, read by a byte-level matcher (every byte an id); "" when it
    forces none."""
    m = _llguidance().LLMatcher(_byte_lltokenizer(), grammar, log_level=0)
    if not m.consume_tokens(list(written)):
        return ""
    return m.compute_ff_bytes().decode("utf-8", "replace")


def _byte_lltokenizer():
    """An llguidance tokenizer whose ids 0-255 are the bytes (256: an EOS): the grammar's own view of text."""
    if not _BYTES:
        ll = _llguidance()

        class Bytes:
            eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
            tokens = [bytes([b]) for b in range(256)] + [b"<|tinylm-end|>"]

            def __call__(self, text: bytes | str) -> list[int]:
                return list(text.encode("utf-8") if isinstance(text, str) else text)

        _BYTES.append(ll.LLTokenizer(ll.TokenizerWrapper(Bytes())))
    return _BYTES[0]


def full_matches(grammar: str, tokenizer, vocab_size: int, outputs: list[list[int]]) -> list[bool]:
    """Whether each output (ids, no EOS) writes a whole match of ``grammar``, as llguidance reads it (the regex
    dialect generation used)."""
    ll = _llguidance()
    lltok = _lltokenizer(tokenizer, vocab_size)
    found = []
    for ids in outputs:
        m = ll.LLMatcher(lltok, grammar, log_level=0)
        found.append(m.consume_tokens(list(ids)) and m.is_accepting())
    return found


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
