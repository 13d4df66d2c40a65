"""Constrained decoding: every output matches its regex / JSON schema / grammar, with every strategy, for a char
vocabulary and a byte-level BPE; what the tokenizer cannot write is refused in one line."""

import json
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinylm.generate import generate
from tinylm.model import GPT, GPTConfig
from tinylm.tokenize import build_tokenizer

pytest.importorskip("llguidance")

PATTERNS = [r"[A-Z][a-z]{1,6}( [a-z]{1,5}){1,3}\.", r"(yes|no|maybe), (\d{1,3}|many)!", r"[ab]{3}c?[de]{2,4}"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def char_tok(small_data):
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")
    return build_tokenizer("char", documents=lambda: [text + "0123456789{}\"é"])


@pytest.fixture(scope="module")
def bpe_tok(small_bpe):
    return build_tokenizer(f"tiktoken:{small_bpe.tiktoken}")


def _model(vocab: int, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=vocab, block_size=64, n_layer=2, n_head=2, n_embd=32, pad_vocab_multiple=1))
    with torch.no_grad():
        m.lm_head.weight.mul_(6.0)  # a peaked random model: its favourite tokens mostly break the pattern
    return m.eval()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=st.sampled_from(PATTERNS), strategy=st.sampled_from(["greedy", "sample", "beam", "contrastive"]),
       prompt=st.text(alphabet="abcdefgh ROMEO:", min_size=1, max_size=12), seed=st.integers(0, 1000),
       vocab=st.sampled_from(["char", "bpe"]))
def test_every_output_matches_the_regex(char_tok, bpe_tok, pattern, strategy, prompt, seed, vocab):
    """Catches text that leaves the pattern (a mask off by one id, a byte-level token that is half a character,
    beams reordered without their grammar states) and an EOS where the pattern is not finished."""
    tok = char_tok if vocab == "char" else bpe_tok
    model = _model(tok.vocab_size, seed % 3)
    beams = {"num_beams": 3} if strategy == "beam" else {}
    rows = 1 if strategy == "beam" else 3
    out = generate(model, [tok.encode(prompt)] * rows, strategy=strategy, max_new_tokens=40, regex=pattern,
                   tokenizer=tok, eos_id=tok.eos_id, seed=seed, top_k=5, **beams)
    for ids in out:
        assert re.fullmatch(pattern, tok.decode(ids)), (pattern, tok.decode(ids))


def test_free_text_does_not_match(char_tok):
    """Guard: the same model unconstrained does not write these patterns (so the tests above test the mask)."""
    model = _model(char_tok.vocab_size)
    out = generate(model, [char_tok.encode("ROMEO:")] * 4, max_new_tokens=20, seed=0)
    assert not any(re.fullmatch(p, char_tok.decode(ids)) for p in PATTERNS for ids in out)


@pytest.mark.parametrize("vocab", ["char", "bpe"])
def test_every_output_is_json_valid_under_the_schema(char_tok, bpe_tok, vocab, tmp_path):
    """Catches JSON that does not parse or breaks the schema; the schema is read from a file, as --json_schema
    FILE does."""
    tok = char_tok if vocab == "char" else bpe_tok
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    out = generate(_model(tok.vocab_size), [tok.encode("A")] * 8, strategy="sample", max_new_tokens=60,
                   json_schema=str(path), tokenizer=tok, eos_id=tok.eos_id, seed=1)
    for ids in out:
        obj = json.loads(tok.decode(ids))
        assert set(obj) == {"name", "n"} and 0 <= obj["n"] <= 99 and len(obj["name"]) <= 8


def test_a_lark_grammar(bpe_tok):
    """Catches --grammar: sums of small numbers, as a Lark grammar of two rules."""
    grammar = 'start: num (" + " num){1,3} " = ?"\nnum: /[1-9][0-9]?/'
    out = generate(_model(bpe_tok.vocab_size), [bpe_tok.encode("Q:")] * 4, strategy="sample", max_new_tokens=40,
                   grammar=grammar, tokenizer=bpe_tok, eos_id=bpe_tok.eos_id, seed=2)
    for ids in out:
        assert re.fullmatch(r"[1-9][0-9]?( \+ [1-9][0-9]?){1,3} = \?", bpe_tok.decode(ids)), bpe_tok.decode(ids)


def test_the_grammar_wins_over_a_ban_that_removes_every_allowed_token(char_tok):
    """Catches a NaN crash when no-repeat n-grams ban the only token the grammar allows ("a" after "aa" with
    no_repeat_ngram_size 2): the grammar's token is taken."""
    out = generate(_model(char_tok.vocab_size), [char_tok.encode("x")], strategy="sample", max_new_tokens=6,
                   regex="a{6}", no_repeat_ngram_size=2, tokenizer=char_tok, seed=0)
    assert char_tok.decode(out[0]) == "aaaaaa"


@pytest.mark.parametrize("kwargs, message", [
    ({"regex": "a("}, "the regex does not compile"),
    ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
    ({"json_schema": "missing.json"}, "json_schema file 'missing.json' cannot be read"),
    ({"grammar": "start: x\n"}, "the grammar does not compile"),
    ({"regex": "ü+"}, "the grammar needs text this tokenizer cannot write"),
    ({"regex": "a", "grammar": "start: \"a\""}, "regex and grammar both constrain the text"),
    ({"regex": "a", "prompt_lookup": 2}, "speculative decoding does not take a grammar"),
])
def test_bad_grammars_are_one_line(char_tok, kwargs, message):
    """Catches an invalid regex/schema/grammar, or one the tokenizer cannot write (ü is not in the char vocabulary),
    failing deep inside the engine or decoding free text."""
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        generate(_model(char_tok.vocab_size), [char_tok.encode("a")], max_new_tokens=4, tokenizer=char_tok, **kwargs)
