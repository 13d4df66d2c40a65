"""Constrained decoding: every output matches its regex / JSON schema / grammar, with every strategy, for a char
vocabulary and a byte-level BPE; what the tokenizer cannot write is refused in one line."""

import json
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinylm.generate import generate
from tinylm.generate.constrained import grammar_text
from tinylm.model import GPT, GPTConfig
from tinylm.tokenize import build_tokenizer

pytest.importorskip("llguidance")

# [0-9], not \d: llguidance's \d is every script's decimal digit by a newer Unicode than Python's re knows (a BPE wrote
# 'no, \ua8d7\U00016d703!', a Saurashtra and a Kirat Rai digit, which Python 3.11's re does not take for one)
PATTERNS = [r"[A-Z][a-z]{1,6}( [a-z]{1,5}){1,3}\.", r"(yes|no|maybe), ([0-9]{1,3}|many)!", r"[ab]{3}c?[de]{2,4}"]
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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_beam_without_an_end_token_goes_on_to_where_the_pattern_stops(char_tok, seed):
    """Catches beams finished at the first point the text could end ([de]{2,4} cut at two letters): with no end
    token to choose (a char vocabulary), a beam ends only where the grammar takes no further token."""
    model = _model(char_tok.vocab_size, seed)
    (ids,) = generate(model, [char_tok.encode("ROMEO:")], strategy="beam", num_beams=3, max_new_tokens=40,
                      regex=r"[ab]{3}c?[de]{2,4}", tokenizer=char_tok, eos_id=char_tok.eos_id)
    assert char_tok.eos_id is None and re.fullmatch(r"[ab]{3}c?[de]{4}", char_tok.decode(ids)), char_tok.decode(ids)


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
    ({"json_schema": '[{"type": "string"}]'},
     r"json_schema must be a JSON object \(a JSON Schema\) or true / false, got the JSON list '\[\{\"type\": "),
    ({"grammar": "start: x\n"}, "the grammar does not compile"),
    ({"regex": "ü+"}, r"the regex 'ü\+' needs text this char tokenizer \(\d+ ids\) cannot write"),
    ({"regex": "a", "grammar": "start: \"a\""}, "regex and grammar both constrain the text"),
    ({"regex": "a", "prompt_lookup": 2}, "speculative decoding does not take a grammar"),
    # a char vocabulary has no EOS: a regex of only "" left no id to take (a NaN traceback from torch.multinomial)
    ({"regex": "a{0}"}, r"the regex 'a\{0\}' matches only the empty text: there is nothing to generate"),
    ({"regex": r"[^\x00-\x{10FFFF}]"}, r"the regex .* matches no text at all; use one that matches some text"),
    ({"grammar": 'start: ""'}, r"the grammar 'start: \"\"' matches only the empty text"),
])
def test_bad_grammars_are_one_line(char_tok, kwargs, message):
    """Catches an invalid regex/schema/grammar, or one the tokenizer cannot write (ü is not in the char vocabulary),
    failing deep inside the engine or decoding free text."""
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        generate(_model(char_tok.vocab_size), [char_tok.encode("a")], max_new_tokens=4, tokenizer=char_tok, **kwargs)


def test_a_tokenizer_spec_in_place_of_the_tokenizer_is_named(char_tok):
    """Catches generate(..., tokenizer="char", regex=...) (the spec TinyLMDataModule takes) failing in "'str' object
    has no attribute 'eos_id'"."""
    with pytest.raises(ValueError, match=re.escape("need tokenizer= the model's Tokenizer (load_model's, or "
                                                   "build_tokenizer(spec)'s), got 'char'")):
        generate(_model(char_tok.vocab_size), [char_tok.encode("a")], max_new_tokens=4, tokenizer="char", regex="a+")


@pytest.mark.parametrize("schema, grammar_of", [("true", "{}"), ("false", None)])
def test_a_boolean_json_schema_is_a_schema_not_a_file_name(schema, grammar_of):
    """Catches --json_schema true (a valid JSON Schema: any JSON value; false: none) read as a file name and refused
    as "json_schema file 'true' cannot be read"."""
    if grammar_of is not None:
        assert grammar_text(None, schema, None) == grammar_text(None, grammar_of, None)
    else:
        with pytest.raises(ValueError, match="the json_schema does not compile: Unsatisfiable schema: schema is false"):
            grammar_text(None, schema, None)


@pytest.fixture(scope="module")
def char_tok_with_eos(small_data):
    """A char vocabulary of two documents: it has an <|endoftext|> id, which llguidance leaves allowed in a state
    no other id continues."""
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")
    return build_tokenizer("char", documents=lambda: [text[:5000], text[5000:10000]])


UNWRITABLE = [  # each needs "ü" (no char vocabulary here has it) somewhere every match must pass
    ("regex", "(x|y)ü", "after '[xy]' \\(it needs 'ü' there\\)"),
    ("regex", "ü+", "at the start \\(it needs 'ü' there\\)"),
    ("regex", "[a-c]{2}ü", "after '[a-c]{2}' \\(it needs 'ü' there\\)"),
    ("json_schema", json.dumps({"type": "object", "properties": {"ü": {"type": "integer"}}, "required": ["ü"],
                                "additionalProperties": False}, ensure_ascii=False),
     "at the start \\(it needs '\\{\"ü\":' there\\)"),  # llguidance forces the whole '{"ü":' at once
    ("grammar", 'start: ("to" | "be") "ü"', "after '[tb]' \\(it needs '[oe]ü' there\\)"),
]


@pytest.mark.parametrize("kind, value, where", UNWRITABLE, ids=[u[0] + " " + u[1][:10] for u in UNWRITABLE])
@pytest.mark.parametrize("vocab", ["char", "char+eos", "bpe"])
def test_a_grammar_the_tokenizer_cannot_write_is_refused_before_generating(char_tok, char_tok_with_eos, bpe_tok, kind,
                                                                            value, where, vocab):
    """Catches a grammar needing a character the vocabulary lacks being found only at the step that needs it (after
    the text before it had streamed out), or never: with an end-of-text id, llguidance's dead state still allows the
    EOS, and the row ended at once with empty text, no error. The refusal comes before the first token (no token
    reaches on_token) and names the constraint, the tokenizer and where it got stuck. A byte-level BPE writes every
    text, so the same grammar is written there, and matched."""
    tok = {"char": char_tok, "char+eos": char_tok_with_eos, "bpe": bpe_tok}[vocab]
    seen = []
    call = {"strategy": "sample", "max_new_tokens": 40, "tokenizer": tok, "eos_id": tok.eos_id, "seed": 0,
            "on_token": lambda row, t: seen.append(t), kind: value}
    if vocab == "bpe":
        out = generate(_model(tok.vocab_size), [tok.encode("A")] * 2, **call)
        assert all(tok.decode(ids).endswith(("ü", "}")) and "ü" in tok.decode(ids) for ids in out), out
        return
    want = rf"^the {kind} '.*' needs text this char tokenizer \({tok.vocab_size:,} ids\) cannot write: no id " \
           rf"continues it {where}; use characters"
    with pytest.raises(ValueError, match=want):
        generate(_model(tok.vocab_size), [tok.encode("A")] * 2, **call)
    assert seen == []  # nothing was generated


def test_the_text_a_refused_grammar_needs_is_cut_to_one_short_line(char_tok):
    """Catches the refusal quoting all the text the grammar forces where it got stuck: a regex of a long literal
    (here 301 characters; `a{300000}` forced 300,000) made a line of that length."""
    with pytest.raises(ValueError, match=r"at the start \(it needs 'ü(bc){28}\.\.\.' there\); use") as err:
        generate(_model(char_tok.vocab_size), [char_tok.encode("A")], max_new_tokens=4, regex="ü" + "bc" * 150,
                 tokenizer=char_tok)
    assert len(str(err.value)) < 400


@pytest.mark.parametrize("regex", ["a{300000}", "(bc){100000}"])
def test_a_regex_too_large_for_the_engine_is_named_so_not_blamed_on_the_tokenizer(char_tok, regex):
    """Catches llguidance giving up on a huge repeat (its lexer's size limit, its fuel) reported as "needs text
    this char tokenizer cannot write": the tokenizer has every character the regex names."""
    with pytest.raises(ValueError, match=r"is too large for the grammar engine \((lexer error|fuel exhausted)"):
        generate(_model(char_tok.vocab_size), [char_tok.encode("A")], max_new_tokens=4, regex=regex,
                 tokenizer=char_tok)


@pytest.mark.parametrize("vocab", ["char", "char+eos"])
def test_a_regex_that_loops_before_a_missing_character_is_refused_too(char_tok, char_tok_with_eos, vocab):
    """Catches `[a-z]+ü` (letters as long as you like, then a character the vocabulary lacks) passing the check:
    no step is ever stuck (a letter always fits), so the model wrote letters until max_new_tokens, an unfinished
    match, without a word. llguidance's regex engine intersects the regex with the tokenizer's characters."""
    tok = {"char": char_tok, "char+eos": char_tok_with_eos}[vocab]
    with pytest.raises(ValueError, match=r"^the regex '\[a-z\]\+ü' needs text this char tokenizer .* every match "
                                         r"holds a character none of its ids has"):
        generate(_model(tok.vocab_size), [tok.encode("A")], max_new_tokens=40, regex="[a-z]+ü", tokenizer=tok)
    out = generate(_model(tok.vocab_size), [tok.encode("A")], max_new_tokens=40, regex="[a-z]+é?!", tokenizer=tok,
                   eos_id=tok.eos_id, seed=0)  # guard: a loop the vocabulary can leave passes
    assert re.fullmatch("[a-z]+é?!", tok.decode(out[0]))


def test_a_tokenizer_shorter_than_the_vocabulary_is_never_asked_for_ids_it_lacks():
    """Catches a model whose vocabulary has more ids than its tokenizer (an imported model's padded vocabulary, a
    checkpoint put together from two runs) generating an id the tokenizer has no text for: decoding it was a KeyError
    traceback. Every strategy (and a draft's proposals) stays inside the tokenizer; the model alone does not."""
    tok = build_tokenizer("char", documents=lambda: ["abcdefghij klmnop"])
    model = _model(58)
    free = generate(model, [[0]], max_new_tokens=200, strategy="sample", temperature=2.0, seed=0)[0]
    assert max(free) >= tok.vocab_size  # without the tokenizer it does sample them (the test can fail)
    for options in ({"strategy": "sample", "temperature": 2.0, "seed": 0}, {"strategy": "greedy"},
                    {"strategy": "beam", "num_beams": 3}, {"strategy": "contrastive", "top_k": 4, "penalty_alpha": 0.6},
                    {"strategy": "greedy", "prompt_lookup": 2}):
        out = generate(model, [[0, 1, 0, 1]], max_new_tokens=60, tokenizer=tok, **options)[0]
        assert out and max(out) < tok.vocab_size, options
        tok.decode(out)
    out = generate(model, [[0]], max_new_tokens=30, tokenizer=tok, draft=_model(58, seed=1), strategy="sample",
                   seed=0)[0]
    assert max(out) < tok.vocab_size and model.sample_vocab is None  # restored after the generation


@pytest.mark.parametrize("strategy", ["sample", "contrastive"])
def test_an_eos_id_other_than_the_tokenizers_is_refused_with_a_grammar(strategy):
    """Catches a constrained row running on unconstrained after the tokenizer's end-of-text token: under an eos_id of
    another id (a library caller's newline, to stop at a line's end) the grammar's EOS was not the row's end, so it
    was kept as text, the grammar let go of the row, and regex [ab]{1,5} gave 'ab<|endoftext|>dachabax'."""
    tok = build_tokenizer("char", documents=lambda: ["abcdefgh xyz\n", "zzz"])  # 2 documents: it has an EOS
    model = _model(tok.vocab_size)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_id] += 5 * model.transformer.ln_f.weight.sign()  # EOS wherever it is allowed
    kwargs = dict(strategy=strategy, regex="[ab]{1,5}", tokenizer=tok, max_new_tokens=12, seed=0)
    out = generate(model, [tok.encode("ab")], eos_id=tok.eos_id, **kwargs)[0]
    assert re.fullmatch("[ab]{1,5}", tok.decode(out)) and len(out) < 5  # guard: the model ends the match early
    with pytest.raises(ValueError, match=rf"eos_id {tok.encode(chr(10))[0]} with a regex.*end-of-text id "
                                         rf"{tok.eos_id}; leave eos_id unset"):
        generate(model, [tok.encode("ab")], eos_id=tok.encode("\n")[0], **kwargs)


def test_a_schema_file_starting_with_a_tilde_is_in_the_home_folder(char_tok, tmp_path, monkeypatch):
    """Catches `--json_schema=~/s.json` (no shell expands ~ after "=", in quotes or in a config) refused as "cannot be
    read", where every other path option reads ~ as the home folder."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "s.json").write_text('{"type": "string", "maxLength": 3}')
    out = generate(_model(char_tok.vocab_size), [char_tok.encode("a")], max_new_tokens=8, tokenizer=char_tok,
                   json_schema="~/s.json", seed=0)
    assert re.fullmatch(r'"[^"]{0,3}"', char_tok.decode(out[0])), char_tok.decode(out[0])


def test_a_constrained_sample_a_stop_string_ended_is_not_blamed_on_max_new_tokens(char_tok, caplog):
    """Catches `tinylm generate --regex abcdefgh --stop c` saying "the sample ended at --max_new_tokens 6 before its
    text matched ...; raise --max_new_tokens" of a sample its --stop string ended after 3 tokens: raising
    --max_new_tokens changes nothing there. A sample max_new_tokens did cut is still named."""
    from tinylm.cli.commands import _warn_cut_short
    from tinylm.generate import SamplingConfig

    model = _model(char_tok.vocab_size)
    for stop, max_new, cut_short in ((["c"], 6, False), (None, 3, True)):
        config = SamplingConfig(regex="abcdefgh", stop_strings=stop, max_new_tokens=max_new, strategy="greedy")
        out = generate(model, [char_tok.encode("A")], decode=char_tok.decode, tokenizer=char_tok, **vars(config))
        assert char_tok.decode(out[0]) == "abc"  # guard: the stop, or max_new_tokens, ended it unmatched
        caplog.clear()
        with caplog.at_level("WARNING", logger="tinylm"):
            _warn_cut_short(model, char_tok, config, out)
        assert ("ended at --max_new_tokens" in caplog.text) == cut_short, (stop, caplog.text)
