"""Tokenizer facade: every backend round-trips, matches its reference, survives state_dict/save, fails clearly."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinylm.tokenize.tokenizer import EOT, GPT2_PATTERN, Tokenizer, build_tokenizer

SHARED_TEXTS = ("german.txt", "address.txt", "tinystories_sample.txt")
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"


def _no_network(monkeypatch):
    """Route every HTTP(S) request to a closed local port, so a download fails at once."""
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def shakespeare_100k(small_data):
    return (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def bpe(shakespeare_100k):
    return build_tokenizer("bpe", vocab_size=400, documents=lambda: [shakespeare_100k[:50_000],
                                                                       shakespeare_100k[50_000:]])


@pytest.fixture(scope="module")
def gpt2_path(shared_data):
    return f"tiktoken:{shared_data / 'gpt2.tiktoken'}"


@pytest.fixture(scope="module")
def gpt2(gpt2_path):
    return build_tokenizer(gpt2_path)


@pytest.fixture(scope="module")
def small_tiktoken(small_bpe):
    """The tiktoken:PATH backend on a 512-id .tiktoken file (conftest's small_bpe), for tests that need any one."""
    return build_tokenizer(f"tiktoken:{small_bpe.tiktoken}")


def _plain(obj) -> bool:
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in obj.items())
    if isinstance(obj, list):
        return all(_plain(v) for v in obj)
    return obj is None or isinstance(obj, (str, int, float, bool))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=40))
def test_bpe_round_trips_any_text(bpe, text):
    """Prevents a byte-level BPE that loses or alters characters it never saw in training (emoji, CJK, controls)."""
    assert bpe.decode(bpe.encode(text)) == text


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=40))
def test_tiktoken_path_round_trips_any_text(small_tiktoken, text):
    """Prevents a tiktoken backend whose decode is not the inverse of encode."""
    assert small_tiktoken.decode(small_tiktoken.encode(text)) == text


def test_a_lone_surrogate_reads_as_u_fffd_in_every_byte_level_backend(bpe, small_tiktoken):
    """Catches the bpe (Hugging Face) backend's TypeError "TextInputSequence must be str" for a str with a lone
    surrogate (Python's surrogateescape, a JSON "\\udc80"), where tiktoken and scratch-bpe read it as U+FFFD."""
    for tok in (bpe, small_tiktoken):
        assert tok.encode("a\udc80b") == tok.encode("a\ufffdb")
        assert tok.encode_batch(["x", "a\udc80b"]) == [tok.encode("x"), tok.encode("a\ufffdb")]


@pytest.mark.parametrize("spec", ["bpe", "scratch-bpe"])
def test_a_lone_surrogate_in_training_text_reads_as_u_fffd(spec):
    """Catches bpe training (Hugging Face's trainer) failing with UnicodeEncodeError on a document with a lone
    surrogate (a JSON "\\ud83d" read by json.loads, Python's surrogateescape), which its own encode and scratch-bpe's
    training read as U+FFFD: it learns what it would learn from U+FFFD."""
    def train(text):
        return build_tokenizer(spec, vocab_size=270, documents=lambda: [text * 20, "a few more words"])

    assert train("an \ud83d emoji cut in two ").fingerprint == train("an \ufffd emoji cut in two ").fingerprint


def test_a_char_tokenizer_trained_on_a_lone_surrogate_is_saved(tmp_path):
    """Catches a char tokenizer trained through the Python API on text with a lone surrogate (a JSON "\\ud83d" read
    by json.loads) that could not be saved (UnicodeEncodeError from the state file's UTF-8, and from its fingerprint,
    which `prepare` keys the dataset by): the surrogate reads as U+FFFD, as the byte-level kinds read it."""
    tok = build_tokenizer("char", documents=lambda: ["an \ud83d emoji cut in two", "and \ud83d\ude00 one whole"])
    assert tok.fingerprint == build_tokenizer("char", documents=lambda: ["an \ufffd emoji cut in two",
                                                                         "and \U0001f600 one whole"]).fingerprint
    loaded = Tokenizer.load(tok.save(tmp_path / "char"))
    assert loaded.fingerprint == tok.fingerprint
    assert loaded.encode("cut \udc80") == loaded.encode("cut \ufffd") == list(loaded.encode_arrays(["cut \udc80"])[0])
    with pytest.raises(ValueError, match="is not in the char tokenizer"):  # (one it lacks: still refused)
        loaded.encode_arrays(["cut \u00e9"])


def test_bpe_trained_shape(bpe):
    """Prevents a trained BPE without the 256-byte alphabet, without EOS, or over the requested size."""
    assert 257 <= bpe.vocab_size <= 400
    assert bpe.eos_id == bpe.special_tokens[EOT]
    assert len(bpe.encode("To be, or not to be")) < len("To be, or not to be")  # merges were learned


def test_special_token_text_is_plain_text(bpe, small_tiktoken):
    """Prevents user text containing '<|endoftext|>' from injecting the EOS id."""
    text = f"end{EOT}start"
    for tok in (bpe, small_tiktoken):
        ids = tok.encode(text)
        assert tok.eos_id not in ids
        assert tok.decode(ids) == text
    assert bpe.decode([bpe.eos_id]) == EOT  # appended by id it is the separator


def test_tiktoken_path_matches_tiktoken(shared_data, gpt2_path):
    """Prevents ids that differ from tiktoken's own GPT-2 encoding (wrong pattern, ranks or EOS id)."""
    import tiktoken
    import tiktoken.load

    ref = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN,
                            mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(shared_data / "gpt2.tiktoken")),
                            special_tokens={EOT: 50256})
    tok = build_tokenizer(gpt2_path)
    assert (tok.vocab_size, tok.eos_id) == (50257, 50256)
    texts = [(shared_data / n).read_text(encoding="utf-8") for n in SHARED_TEXTS]
    texts.append((shared_data / "corpus.en").read_text(encoding="utf-8")[:20_000])
    for text in texts:
        assert tok.encode(text) == ref.encode_ordinary(text)
    assert tok.encode_batch(texts) == [ref.encode_ordinary(t) for t in texts]
    assert tok.encode("Hello world") == [15496, 995]  # GPT-2's well-known ids


def test_tiktoken_name_loads_from_cache_offline(shared_data, gpt2, monkeypatch, tmp_path):
    """Prevents tiktoken:NAME from ignoring a cached encoding (or disagreeing with the same ranks from a path)."""
    _no_network(monkeypatch)
    cache = tmp_path / "tiktoken_cache"  # conftest points TIKTOKEN_CACHE_DIR here
    cache.mkdir(exist_ok=True)
    shutil.copy(shared_data / "gpt2.tiktoken", cache / hashlib.sha1(R50K_URL.encode()).hexdigest())
    tok = build_tokenizer("tiktoken:r50k_base")
    text = (shared_data / "address.txt").read_text(encoding="utf-8")
    assert tok.encode(text) == gpt2.encode(text)
    assert tok.eos_id == 50256


def test_tiktoken_name_is_the_encoding_beside_a_file_of_that_name(shared_data, gpt2, monkeypatch, tmp_path):
    """Catches `tiktoken:r50k_base` (or `tiktoken:gpt2`) run beside a plain file of that name (notes, a download)
    reading the file as a rank file ("not a .tiktoken rank file ...") instead of the named encoding; the file is
    still `tiktoken:./r50k_base`."""
    _no_network(monkeypatch)
    cache = tmp_path / "tiktoken_cache"  # conftest points TIKTOKEN_CACHE_DIR here
    cache.mkdir(exist_ok=True)
    shutil.copy(shared_data / "gpt2.tiktoken", cache / hashlib.sha1(R50K_URL.encode()).hexdigest())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r50k_base").write_text("my notes on the r50k_base encoding\n")
    assert build_tokenizer("tiktoken:r50k_base").encode("Hello world") == gpt2.encode("Hello world")
    with pytest.raises(ValueError, match="r50k_base"):  # (the file, named as a path: read as one)
        build_tokenizer("tiktoken:./r50k_base")


def test_tiktoken_name_unreachable_says_use_path(monkeypatch):
    """Prevents an opaque network traceback when a tiktoken encoding cannot be downloaded."""
    _no_network(monkeypatch)
    with pytest.raises(RuntimeError, match=r"tiktoken:PATH"):
        build_tokenizer("tiktoken:gpt2")
    with pytest.raises(ValueError, match=r"unknown tiktoken encoding 'nope'.*cl100k_base"):
        build_tokenizer("tiktoken:nope")


def test_char_tokenizer(small_data):
    """Prevents a char vocabulary that differs from nanoGPT's (65 for tinyshakespeare) or hides unknown chars."""
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")
    tok = build_tokenizer("char", documents=lambda: [text])
    # nanoGPT's sorted(set(text)): 61 characters in these first 100,000 ('$', '3', 'X', 'Z' come later; 65 in all)
    assert (tok.vocab_size, tok.eos_id) == (61, None)
    assert tok.encode("\n !") == [0, 1, 2] and tok.decode(tok.encode(text[:500])) == text[:500]
    with pytest.raises(ValueError, match=r"'é' is not in the char tokenizer"):
        tok.encode("café")
    multi = build_tokenizer("char", documents=lambda: ["ab", "ba"])
    assert multi.special_tokens == {EOT: 2} and multi.vocab_size == 3


def test_a_combining_mark_the_char_vocabulary_lacks_is_named():
    """Catches a prompt typed in decomposed form (NFD: e + U+0301, as macOS file names and some PDFs hold é) refused
    as "character '́' is not in the char tokenizer's vocabulary": the mark alone, drawn on the quote, for a letter
    the vocabulary has; it is named by its code point, with the fix."""
    tok = build_tokenizer("char", documents=lambda: ["a café, then tea"])
    assert tok.decode(tok.encode("café")) == "café"
    with pytest.raises(ValueError, match=r"character '\u0301' \(U\+0301") as e:
        tok.encode(unicodedata.normalize("NFD", "café"))
    assert "(U+0301 COMBINING ACUTE ACCENT, which follows its letter in text in decomposed form, NFD)" in str(e.value)
    assert "compose the text (NFC: unicodedata.normalize('NFC', text))" in str(e.value)


def test_scratch_bpe_backend(shakespeare_100k):
    """Prevents the scratch-bpe spec from being miswired to tinylm.tokenize.bpe (round trip, EOS, state)."""
    pytest.importorskip("tinylm.tokenize.bpe")
    tok = build_tokenizer("scratch-bpe", vocab_size=300, documents=lambda: [shakespeare_100k[:20_000]])
    assert tok.vocab_size == 300 and tok.eos_id is not None
    text = f"To be{EOT} or not 😀"
    assert tok.decode(tok.encode(text)) == text and tok.eos_id not in tok.encode(text)
    again = Tokenizer.from_state_dict(tok.state_dict())
    assert again.fingerprint == tok.fingerprint and again.encode(text) == tok.encode(text)


def test_state_dict_is_plain_and_loads_weights_only(bpe, small_tiktoken, tmp_path):
    """Prevents a tokenizer state that breaks torch.load(weights_only=True) or does not rebuild the same one."""
    char = build_tokenizer("char", documents=lambda: ["hello ", "world"])
    text = "hello world"
    for tok in (bpe, small_tiktoken, char):
        state = tok.state_dict()
        assert _plain(state), tok.kind
        torch.save({"tokenizer": state}, tmp_path / "t.pt")
        back = Tokenizer.from_state_dict(torch.load(tmp_path / "t.pt", weights_only=True)["tokenizer"])
        assert back.fingerprint == tok.fingerprint and back.encode(text) == tok.encode(text)
        assert back.special_tokens == tok.special_tokens and back.vocab_size == tok.vocab_size


def test_save_load_and_tokenizer_json_path(bpe, tmp_path):
    """Prevents a saved tokenizer (or its HF tokenizer.json) that loads as a different tokenizer."""
    bpe.save(tmp_path / "tok")
    text = "Wherefore art thou?"
    for spec in (str(tmp_path / "tok"), str(tmp_path / "tok" / "tokenizer.json")):
        tok = build_tokenizer(spec)
        assert tok.encode(text) == bpe.encode(text) and tok.eos_id == bpe.eos_id
    assert Tokenizer.load(tmp_path / "tok").fingerprint == bpe.fingerprint


def test_fingerprint_tracks_content(shakespeare_100k):
    """Prevents a fingerprint that changes between identical trainings or stays equal for different vocabs."""
    docs = lambda: [shakespeare_100k[:30_000]]
    a = build_tokenizer("bpe", vocab_size=300, documents=docs)
    b = build_tokenizer("bpe", vocab_size=300, documents=docs)
    c = build_tokenizer("bpe", vocab_size=320, documents=docs)
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert len(a.fingerprint) == 64


def test_encode_batch_equals_encode(bpe):
    """Prevents the parallel batch path from producing ids the single-text path would not."""
    texts = ["First Citizen:", "", "Before we proceed any further, hear me speak.", "ünïcödé 😀"]
    assert bpe.encode_batch(texts) == [bpe.encode(t) for t in texts]


def test_a_tiktoken_rank_file_is_read_by_its_path_alone(small_bpe, small_tiktoken):
    """Catches `--data.tokenizer gpt2.tiktoken` (without tiktoken:) refused as "not a tokenizer file": a path ending
    in .tiktoken is a rank file."""
    tok = build_tokenizer(str(small_bpe.tiktoken))
    assert tok.kind == "tiktoken" and tok.fingerprint == small_tiktoken.fingerprint


def test_bad_specs_are_clear(tmp_path):
    """Prevents unknown specs, missing paths, paths that are not files or a too-small BPE vocab from failing
    obscurely."""
    with pytest.raises(ValueError, match=r"unknown tokenizer 'wordpiece'.*bpe, scratch-bpe, char, tiktoken:NAME"):
        build_tokenizer("wordpiece")
    with pytest.raises(FileNotFoundError, match=r"missing/tokenizer.json"):
        build_tokenizer(str(tmp_path / "missing" / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"single distinct character \('a'\): a model of it has nothing to learn"):
        build_tokenizer("char", documents=lambda: ["aaaa"])
    with pytest.raises(ValueError, match=r"vocab_size=200 is too small.*257"):
        build_tokenizer("bpe", vocab_size=200, documents=lambda: ["abc"])
    with pytest.raises(FileNotFoundError, match=r"tiktoken:PATH"):
        build_tokenizer(f"tiktoken:{tmp_path / 'nope.tiktoken'}")
    # a device (or a FIFO) is there but is no file: named so, not "not found" nor "unknown tiktoken encoding"
    for spec in ("/dev/null", "tiktoken:/dev/null"):
        with pytest.raises(FileNotFoundError, match=r"'/dev/null' is not a regular file"):
            build_tokenizer(spec)


_TRAIN_ON_DNA = r"""
import random, sys
from tinylm.tokenize.patterns import TRAIN_PIECE_CHARS
from tinylm.tokenize.tokenizer import build_tokenizer
spec, n = sys.argv[1], int(sys.argv[2])
text = "".join(random.Random(0).choices("ACGT", k=n))
tok = build_tokenizer(spec, vocab_size=300, documents=lambda: [text])
ids = tok.encode(text[:60_000])  # scratch-bpe used to take minutes here: the whole text is one pre-token
assert tok.decode(ids) == text[:60_000] and len(ids) < 60_000 / 2  # merges were learned
assert tok.vocab_size == 300 and max(len(tok.decode([i])) for i in range(256, 299)) <= TRAIN_PIECE_CHARS
"""


@pytest.mark.parametrize("spec, chars", [("bpe", 2_000_000), ("scratch-bpe", 60_000)])
def test_training_on_text_without_spaces_stays_linear(spec, chars):
    """Prevents BPE training from going quadratic on text with no whitespace (DNA, base64, minified code), where
    the whole text is one pre-token: 2 MB hung `bpe` training, and 60 k characters took scratch-bpe minutes to
    encode. Runs in a subprocess so that a regression fails at the timeout instead of hanging the suite."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", _TRAIN_ON_DNA, spec, str(chars)], env=env, timeout=60,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_piece_cap_leaves_training_on_ordinary_text_unchanged(shakespeare_100k):
    """Prevents the training-time pre-token cap (TRAIN_PIECE_CHARS) from changing tokenizers trained on ordinary
    text: a changed fingerprint would rebuild every cached dataset for nothing."""
    from tinylm.tokenize.bpe import ByteLevelBPE
    from tinylm.tokenize.tokenizer import _train_bpe

    docs = [shakespeare_100k[:30_000], shakespeare_100k[30_000:40_000]]
    assert _train_bpe(docs, 400).fingerprint == _train_bpe(docs, 400, max_piece_chars=None).fingerprint
    capped = ByteLevelBPE.train(docs, vocab_size=300, progress=False)
    assert capped.ranks == ByteLevelBPE.train(docs, vocab_size=300, progress=False, max_piece_chars=None).ranks


def test_files_that_are_not_tokenizers_are_named(tmp_path):
    """Prevents `--data.tokenizer x.yaml` (or a binary file, another tool's JSON, a broken .tiktoken) from failing
    with a bare JSON/Unicode/KeyError that names neither the file nor what tinylm accepts."""
    (tmp_path / "x.yaml").write_text("data:\n  tokenizer: bpe\n")
    (tmp_path / "image.json").write_bytes(bytes(range(256)))
    (tmp_path / "config.json").write_text('{"n_layer": 2}')
    (tmp_path / "state.json").write_text('{"version": 1, "kind": "hf", "state": {}}')
    (tmp_path / "bad.tiktoken").write_text("not ranks\n")
    for name in ("x.yaml", "image.json", "config.json", "state.json"):
        with pytest.raises(ValueError, match=rf"{name} is not a tokenizer file .*--data\.tokenizer takes bpe, "
                                             r".*tiktoken:NAME"):
            build_tokenizer(str(tmp_path / name))
    (tmp_path / "vocab.json").write_text('{"hello": 0, "kind": 1, "state": 2, "version": 3, "model": 4}')  # as GPT-2's
    with pytest.raises(ValueError, match=r"vocab\.json is not a tokenizer file .*a vocabulary \(token -> id\) "
                                         r"without the rest.*save_pretrained\(DIR\)\) and pass that\)"):
        build_tokenizer(str(tmp_path / "vocab.json"))
    with pytest.raises(ValueError, match=r"bad\.tiktoken is not a \.tiktoken rank file .*tiktoken:NAME"):
        build_tokenizer(f"tiktoken:{tmp_path / 'bad.tiktoken'}")


def test_a_folder_of_vocab_and_merges_loads_with_its_ranks(small_bpe, tmp_path):
    """Catches a Hugging Face GPT-2 download (vocab.json + merges.txt) or ByteLevelBPE.save's folder refused with a
    hint that does not help ("pass bpe|char|tiktoken:NAME"), and GPT-2's vocab.json passed alone failing to parse
    (its words "model" and "state" made it look like a tokenizer.json)."""
    text = "First Citizen:\nBefore we proceed any further, hear me speak. <|endoftext|> naïve"
    expected = build_tokenizer(f"tiktoken:{small_bpe.tiktoken}")
    bare = tmp_path / "gpt2-like"
    bare.mkdir()
    for file in (small_bpe.vocab, small_bpe.merges):
        shutil.copy(file, bare / file.name)
    (bare / "config.json").write_text('{"n_layer": 2}')  # a model's config.json, as in a Hugging Face download
    for folder in (small_bpe.vocab.parent, bare):
        tok = build_tokenizer(str(folder))
        assert tok.encode(text) == expected.encode(text) and tok.decode(tok.encode(text)) == text
        assert tok.eos_id == expected.eos_id == 511
    # the same files in a folder or a rank file of another name are the same tokenizer (a renamed download resumes
    # its runs)
    assert build_tokenizer(str(small_bpe.vocab.parent)).fingerprint == build_tokenizer(str(bare)).fingerprint
    shutil.copy(small_bpe.tiktoken, tmp_path / "renamed.tiktoken")
    assert build_tokenizer(f"tiktoken:{tmp_path / 'renamed.tiktoken'}").fingerprint == expected.fingerprint
    with pytest.raises(ValueError, match=r"pass the folder that holds it and merges\.txt, --data\.tokenizer "
                                         + re.escape(str(bare))):
        build_tokenizer(str(bare / "vocab.json"))


def test_byte_lengths_of_a_tiktoken_encoding_with_unused_ids(small_bpe, tmp_path):
    """Catches cl100k_base/o200k_base (ids no token has, below n_vocab) crashing fit at its start with a KeyError
    from token_byte_lengths: an unused id stands for no text, 0 bytes."""
    lines = small_bpe.tiktoken.read_text(encoding="ascii").splitlines()
    gap = tmp_path / "gap.tiktoken"
    gap.write_text("\n".join(line for line in lines if not line.endswith(" 300")) + "\n", encoding="ascii")
    tok = build_tokenizer(f"tiktoken:{gap}")
    lengths = tok.token_byte_lengths()
    assert len(lengths) == tok.vocab_size and lengths[300] == 0
    text = "First Citizen:\nBefore we proceed any further, hear me speak."
    assert sum(lengths[i] for i in tok.encode(text)) == len(text.encode("utf-8"))
    # the end-of-text id follows the highest rank: the number of ranks (511) is a real token's id in a file with gaps
    highest = max(int(line.split()[1]) for line in lines)
    assert tok.eos_id == highest + 1 == tok.vocab_size - 1 and tok.decode([highest]) != "<|endoftext|>"
    # a sampler can pick an unused id (a model gives it a small probability): it decodes to nothing, not a KeyError
    assert tok.decode([*tok.encode("ab"), 300, *tok.encode("cd")]) == "abcd"


@pytest.mark.parametrize("kind", ["metaspace", "wordpiece", "bytelevel-no-decoder", "bytelevel-in-a-sequence"])
def test_byte_lengths_of_tokenizer_files_that_spell_tokens_by_their_place(shakespeare_100k, tmp_path, kind):
    """Catches bits-per-byte 14-20 % off for SentencePiece-style (Metaspace) and WordPiece tokenizer.json files:
    a token decoded alone loses the space its "▁" stands for, and keeps WordPiece's "##"; and for byte-level files
    whose ByteLevel is only in the pre-tokenizer or inside a decoder Sequence. The byte lengths of a text's tokens
    must add up to the text's bytes (WordPiece drops line breaks: within 3 %)."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    text = shakespeare_100k[:30_000]
    if kind == "metaspace":
        hf = HF(models.Unigram())
        hf.pre_tokenizer, hf.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=["<unk>"], unk_token="<unk>")
    elif kind.startswith("bytelevel"):  # GPT-2's byte alphabet, spelled out by the pre-tokenizer
        hf = HF(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.Sequence([decoders.ByteLevel()]) if kind.endswith("sequence") else None
        trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        hf = HF(models.WordPiece(unk_token="[UNK]"))
        hf.normalizer, hf.pre_tokenizer = normalizers.BertNormalizer(lowercase=False), pre_tokenizers.BertPreTokenizer()
        hf.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=["[UNK]"])
    hf.train_from_iterator([text], trainer)
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.load(tmp_path / "tokenizer.json")
    lengths = tok.token_byte_lengths()
    held_out = shakespeare_100k[50_000:60_000] + (" naïve café — 東京" if kind.startswith("bytelevel") else "")
    counted = sum(lengths[i] for i in tok.encode(held_out))
    if kind.startswith("bytelevel"):  # lossless bytes: exact, also for tokens that are parts of a character
        assert counted == len(held_out.encode())
    else:
        assert counted == pytest.approx(len(held_out.encode()), rel=0.03 if kind == "wordpiece" else 0.005)


def test_byte_lengths_of_byte_fallback_tokens(tmp_path):
    """Catches Llama-style byte-fallback tokens ("<0xC3>") counted as the 3-byte replacement character their lone
    decoding gives: each stands for one byte."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models

    vocab = {"<unk>": 0, "▁": 1, "a": 2, "<0xC3>": 3, "<0xA9>": 4}
    hf = HF(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.load(tmp_path / "tokenizer.json")
    ids = tok.encode("aé")
    assert tok.decode(ids) == "aé" and [hf.id_to_token(i) for i in ids] == ["a", "<0xC3>", "<0xA9>"]
    assert sum(tok.token_byte_lengths()[i] for i in ids) == len("aé".encode())


def test_byte_lengths_of_added_tokens_kept_as_written(bpe, tmp_path):
    """Catches a byte-level tokenizer.json with added (non-special) tokens kept as written, as code models' runs of
    spaces (CodeGen's, phi-2's "        "), failing fit's bits-per-byte setup: their " " is no letter of GPT-2's byte
    alphabet (ValueError). The decoder gives such a token's own UTF-8; the lengths must add up to the text's bytes."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HF

    hf = HF.from_str(bpe._b.tok.to_str())
    hf.add_tokens([AddedToken(" " * 8, normalized=False), AddedToken("→€", normalized=False)])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.load(tmp_path / "tokenizer.json")
    text = "def f():\n        return 1 →€"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and {hf.token_to_id(" " * 8), hf.token_to_id("→€")} <= set(ids)
    assert sum(tok.token_byte_lengths()[i] for i in ids) == len(text.encode())


@pytest.mark.parametrize("spec", ["bpe", "scratch-bpe"])
def test_a_corpus_too_small_for_the_vocabulary_is_named(spec):
    """Catches the Hugging Face trainer returning fewer ids than --data.vocab_size in silence (scratch-bpe said so):
    the model's vocabulary, and its size in the run name, are not what the user asked for."""
    with pytest.warns(UserWarning, match=r"ran out of pairs to merge after \d+ merges; "
                                         r"vocab_size is \d+ instead of 8192"):
        tok = build_tokenizer(spec, vocab_size=8192, documents=lambda: ["the cat sat on the mat, the cat sat"])
    assert tok.vocab_size < 300


def test_tokenizer_json_without_an_unknown_token_names_text_it_cannot_encode(tmp_path):
    """Catches a tokenizer.json whose vocabulary has no unknown token (a WordLevel over characters, as `tinylm export`
    writes for a char model) failing with the tokenizers library's bare "Exception: WordLevel error: Missing [UNK]
    token" and a traceback: at prepare's probe of how text may be cut, before any corpus text was read."""
    from tokenizers import Regex, models, pre_tokenizers
    from tokenizers import Tokenizer as HF

    from tinylm.data.writer import cuts_exactly

    hf = HF(models.WordLevel({"a": 0, "b": 1, " ": 2}))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = build_tokenizer(str(tmp_path / "tokenizer.json"))
    assert tok.encode("ab ba") == [0, 1, 2, 1, 0]  # text it covers encodes (not vacuous)
    assert cuts_exactly(tok) is False  # its probe holds other characters: documents are encoded whole
    for encode in (tok.encode, lambda text: tok.encode_batch([text])):
        with pytest.raises(ValueError, match=r"cannot encode 'c' \(character 2 of the text, in 'abc'\).*no unknown "
                                             r"token.*--data.tokenizer bpe"):
            encode("abc")
    # the character is named where it is, not the start of a long document (which named text it could encode)
    with pytest.raises(ValueError, match=r"cannot encode '€' \(character 400 of the text, in 'a{30}€ab'\)"):
        tok.encode_batch(["ab", "a" * 400 + "€ab"])


def test_a_cached_tokenizer_whose_eos_collides_is_refused(tmp_path):
    """Catches a cached char tokenizer whose <|endoftext|> id was edited onto a character's id: prepare reused it
    and every apostrophe became an end of document, silently. Refused in one line naming the folder and the fix."""
    from tinylm.data.corpus import TextFiles
    from tinylm.data.prepare import prepare_tokenizer

    (tmp_path / "a.txt").write_text("it's one<|endoftext|>and two", encoding="utf-8")
    corpus = TextFiles("a.txt", [tmp_path / "a.txt"])
    tok = prepare_tokenizer(corpus, "char", vocab_size=0, cache_dir=tmp_path / "cache")
    saved = next((tmp_path / "cache" / "tokenizers").glob("char-*/tinylm_tokenizer.json"))
    apostrophe = tok.encode("'")[0]
    saved.write_text(saved.read_text(encoding="utf-8").replace(f'"<|endoftext|>": {tok.eos_id}',
                                                              f'"<|endoftext|>": {apostrophe}'), encoding="utf-8")
    with pytest.raises(ValueError, match=r"cached tokenizer in .* is damaged .*'<\|endoftext\|>' has id \d+, which "
                                         r"the normal token \"'\" has too.*delete that folder"):
        prepare_tokenizer(corpus, "char", vocab_size=0, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="outside its vocabulary of 3 ids"):
        Tokenizer.from_state_dict({"version": 1, "kind": "char", "spec": "char",
                                   "state": {"chars": "ab", "special_tokens": {EOT: 7}}})


def test_a_truncated_or_edited_tiktoken_file_is_named(small_bpe, tmp_path):
    """Catches a .tiktoken file cut mid-line ("b3JpZXM= 174" of "... 1747") or with a line repeated: tiktoken's Rust
    core panicked (a PanicException traceback, "Encoder and decoder must be of equal length") instead of one line."""
    lines = small_bpe.tiktoken.read_text(encoding="ascii").splitlines()
    token, _ = lines[300].split()
    cases = {"cut": [*lines[:300], f"{token} 17"], "twice": [*lines, lines[5].split()[0] + " 999"],
             "negative": [*lines[:300], f"{token} -3"]}
    for name, body in cases.items():
        (tmp_path / f"{name}.tiktoken").write_text("\n".join(body) + "\n")
    with pytest.raises(ValueError, match=r"cut\.tiktoken is not a \.tiktoken rank file .*line 301 of the tiktoken "
                                         r"ranks repeats rank 17 of line 18 \(a truncated or edited file\?\)"):
        build_tokenizer(f"tiktoken:{tmp_path / 'cut.tiktoken'}")
    with pytest.raises(ValueError, match=rf"repeats token {re.escape(lines[5].split()[0])} of line 6"):
        build_tokenizer(f"tiktoken:{tmp_path / 'twice.tiktoken'}")
    with pytest.raises(ValueError, match=r"line 301 .* is not 'base64token rank'"):
        build_tokenizer(f"tiktoken:{tmp_path / 'negative.tiktoken'}")


def test_a_tiktoken_file_without_every_single_byte_is_named(small_bpe, tmp_path):
    """Catches a .tiktoken file of 256 or more ranks that lacks a single byte (here the NUL's line, of 512) loading
    without a word: then text holding that byte failed mid-encode with tiktoken's Rust panic ("no entry found for
    key", a PanicException no `except Exception` catches) instead of one line naming the file at load."""
    lines = small_bpe.tiktoken.read_text(encoding="ascii").splitlines()
    (tmp_path / "no-nul.tiktoken").write_text("\n".join(line for line in lines if line.split()[0] != "AA==") + "\n")
    with pytest.raises(ValueError, match=r"no-nul\.tiktoken is not a \.tiktoken rank file .*lacks 1 of the 256 single "
                                         r"bytes \(b'\\x00'\)"):
        build_tokenizer(f"tiktoken:{tmp_path / 'no-nul.tiktoken'}")


def test_bpe_training_writes_nothing_to_standard_output_but_a_terminal(capfd):
    """Catches the tokenizers library's progress bars writing blank lines into `tinylm prepare > out.txt` (its bars
    write to standard output, and only redraw on a terminal)."""
    build_tokenizer("bpe", vocab_size=270, documents=lambda: ["the cat sat on the mat, " * 40, "a dog ran " * 30])
    assert capfd.readouterr().out == ""


@pytest.mark.parametrize(("kind", "lossy"), [("bytelevel", False), ("metaspace", False),
                                              ("bytelevel-no-decoder", True), ("whitespace", True)])
def test_a_tokenizer_file_that_does_not_give_back_its_text_is_warned_of(shakespeare_100k, tmp_path, kind, lossy):
    """Catches a tokenizer.json whose ids decode to other text than they encoded (a Whitespace pre-tokenizer
    without a decoder: 'O n ce up on'; an unknown token) accepted without a word: the model trained on that text
    and generate wrote it."""
    import warnings

    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if kind == "metaspace":
        hf = HF(models.Unigram())
        hf.pre_tokenizer, hf.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=["<unk>"], unk_token="<unk>")
    elif kind.startswith("bytelevel"):
        hf = HF(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = None if kind.endswith("no-decoder") else decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        hf = HF(models.BPE(unk_token="[UNK]"))
        hf.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]"])
    hf.train_from_iterator([shakespeare_100k[:30_000]], trainer)
    hf.save(str(tmp_path / "tokenizer.json"))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        build_tokenizer(str(tmp_path / "tokenizer.json"))
    lines = [str(w.message) for w in said if "does not give back the text it encodes" in str(w.message)]
    assert len(lines) == lossy, lines
    if lossy:
        assert lines[0].startswith(f"tokenizer {tmp_path / 'tokenizer.json'} does not give back the text it encodes ")
        assert "use --data.tokenizer bpe, or a tokenizer.json that decodes its own ids to the text" in lines[0]


def test_a_byte_level_tokenizer_file_without_every_byte_is_warned_of(shakespeare_100k, tmp_path):
    """Catches a byte-level tokenizer.json trained without the 256-byte alphabet (on English text: no byte above
    0x7F) accepted without a word, its round-trip probe being English too: the library drops every byte it has no
    token for, so "café" was packed as "caf" and a German corpus lost its umlauts, silently."""
    import warnings

    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HF(models.BPE())
    hf.pre_tokenizer, hf.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    hf.train_from_iterator([shakespeare_100k[:30_000]], trainers.BpeTrainer(vocab_size=400))
    hf.save(str(tmp_path / "tokenizer.json"))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        tok = build_tokenizer(str(tmp_path / "tokenizer.json"))
    assert tok.decode(tok.encode("café")) == "caf"
    lines = [str(w.message) for w in said if "of the 256 byte tokens" in str(w.message)]
    assert len(lines) == 1 and re.search(r"lacks 1\d\d of the 256 byte tokens \(e\.g\. b'\\x00", lines[0]), lines


def test_an_empty_tokenizer_spec_is_refused(tmp_path, monkeypatch):
    """Catches `--data.tokenizer ""` (an unset shell variable) read as the working folder: its tokenizer.json, if it
    held one, was taken without a word."""
    monkeypatch.chdir(tmp_path)
    for spec in ("", " "):
        with pytest.raises(ValueError, match=r"^--data.tokenizer is empty \(.*an unset shell variable\?\); pass one"):
            build_tokenizer(spec)


def test_ctrl_c_during_bpe_training_is_not_held_until_it_ends():
    """Catches a Ctrl+C (or SIGTERM) during BPE training waiting for the training's end (10 s on 10 MB): Python runs
    a signal's handler in the main thread alone, which was inside the tokenizers library's Rust the whole time. The
    Ctrl+C comes 0.2 s after the last text is read, while the training (its merges) still goes on. (Sent as the last
    text was read, from the training's thread, it could reach the main thread before the thread marked its reading
    done, and the command rightly waited for the thread, here until the training ended: a flaky test on a loaded
    machine.)"""
    import random
    import signal
    import threading

    from tinylm.tokenize.tokenizer import _train_bpe

    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=3 + i % 12)) for i in range(50_000)]

    def docs():  # read in 0.1 s, merged in 1.7 s
        for _ in range(40):
            yield " ".join(rng.choices(words, k=5_000))
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl+C

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        _train_bpe(docs(), 3000)
    training = [t for t in threading.enumerate() if t.name == "tinylm-tokenizer-training"]
    assert [t.is_alive() for t in training] == [True]
    training[0].join()


def test_a_stop_while_bpe_training_reads_the_corpus_ends_with_its_status(tmp_path):
    """Catches `tinylm prepare` aborting on a SIGTERM (or Ctrl+C) that came while BPE training still read the
    corpus: the training's thread, left inside the tokenizers library, called back for the next text as the
    interpreter exited, and the process died with "FATAL: exception not rethrown" and exit 134 (SIGABRT) in place of
    the stop's 143 (1 SIGTERM in 10 to a 1 MB prepare). The library's reading now stops with the command."""
    script = """
import os, signal, sys, time
from tinylm.cli import signals
from tinylm.cli.errors import Terminated
from tinylm.tokenize.tokenizer import _train_bpe

def docs():  # a corpus read slowly (a large one, a slow disk): the library reads it as the command stops
    for i in range(100_000):
        if i == 50:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.001)
        yield f"text number {i} to train a tokenizer on "

try:
    with signals.terminate_cleanly("prepare", True):
        _train_bpe(docs(), 300)
except Terminated as e:
    sys.stderr.write(f"{e}\\n")
    sys.exit(143)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (143, "terminated by SIGTERM before it finished; run the same `tinylm "
                                                   "prepare` again\n"), done.stderr[-2000:]


def test_a_tokenizer_json_saved_with_truncation_or_padding_encodes_whole_texts(tmp_path, shakespeare_100k, caplog):
    """Catches a tokenizer.json saved with truncation or padding on (BERT-like ones; one saved after a call with
    truncation=True): every document was cut to max_length (61 % of a corpus lost) and each batch padded to its
    longest document with <pad> ids (18 % of the tokens), in silence."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HF(models.BPE())
    hf.pre_tokenizer, hf.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    hf.train_from_iterator([shakespeare_100k[:20000]], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[EOT, "<pad>"]))
    hf.enable_truncation(max_length=8)
    hf.enable_padding(pad_id=1, pad_token="<pad>")
    hf.save(str(tmp_path / "tokenizer.json"))
    with caplog.at_level("INFO", logger="tinylm"):
        tok = build_tokenizer(str(tmp_path / "tokenizer.json"))
    assert "turns on truncation (max_length 8) and padding (pad_token <pad>): off here" in caplog.text
    texts = [shakespeare_100k[:300], shakespeare_100k[300:330]]
    assert [tok.decode(ids) for ids in tok.encode_batch(texts)] == texts
    assert tok.decode(tok.encode(texts[0])) == texts[0]
    assert Tokenizer.from_state_dict(tok.state_dict()).encode(texts[0]) == tok.encode(texts[0])


def test_a_vocabulary_file_alone_names_the_folder_form(tmp_path):
    """Catches `--data.tokenizer gpt2_vocab.json` (GPT-2's vocabulary, its merges file beside it under another name)
    told only to save a tokenizer.json: the folder of vocab.json + merges.txt, which tinylm reads, went unnamed."""
    (tmp_path / "gpt2_vocab.json").write_text('{"a": 0, "b": 1, "ab": 2}')
    with pytest.raises(ValueError, match=r"put the two in a folder as vocab\.json and merges\.txt and pass the "
                                          r"folder"):
        build_tokenizer(str(tmp_path / "gpt2_vocab.json"))


def test_every_backend_refuses_ids_outside_its_vocabulary_and_text_where_ids_go(bpe, small_tiktoken, shakespeare_100k):
    """Catches decode of an id past the vocabulary differing per backend (HF BPE gave '', char and tiktoken a bare
    KeyError) and encode_batch("ab") encoding a str as the two texts "a" and "b"."""
    text = shakespeare_100k[:20_000]
    toks = [bpe, small_tiktoken, build_tokenizer("char", documents=lambda: [text]),
            build_tokenizer("scratch-bpe", vocab_size=300, documents=lambda: [text])]
    for tok in toks:
        ids = tok.encode("To be")
        assert tok.decode(torch.tensor(ids)) == tok.decode(np.array(ids)) == "To be", tok.kind
        for bad in (tok.vocab_size, -1):
            with pytest.raises(ValueError, match=rf"id {bad} is outside the tokenizer's vocabulary "
                                                 rf"\(ids are 0\.\.{tok.vocab_size - 1}\)"):
                tok.decode([*ids, bad])
        for bad, named in (([1.5], "float 1.5"), ("To", "str 'To'"), ([True], "bool True")):
            with pytest.raises(TypeError, match=named):
                tok.decode(bad)
        with pytest.raises(TypeError, match=r"got one str 'ab': use encode\(text\) or encode_batch\(\[text\]\)"):
            tok.encode_batch("ab")
        with pytest.raises(TypeError, match=r"one is int 0"):
            tok.encode_batch(["a", 0])
        with pytest.raises(TypeError, match=r"encode takes one str; got list"):
            tok.encode(["a"])


def test_documents_must_be_a_function_returning_them():
    """Catches build_tokenizer("char", documents=[...]) failing with "'list' object is not callable"."""
    with pytest.raises(TypeError, match=r"documents= is a function returning the documents, got a list: pass "
                                        r"documents=lambda: texts"):
        build_tokenizer("char", documents=["ab"])


def _library_ids(tok, texts):
    """What the `tokenizers` library itself gives (lone surrogates read as U+FFFD first, as tinylm does)."""
    from tinylm.tokenize.bpe import _valid_utf8

    return [e.ids for e in tok.encode_batch([_valid_utf8(t) for t in texts], add_special_tokens=False)]


def test_a_trained_bpe_packs_through_tiktoken_with_the_library_ids(bpe, shared_data, shakespeare_100k):
    """Catches a trained `bpe` encoding datasets through `tokenizers`' encode_batch (5x tiktoken's CPU for the same
    ids: 0.5-0.7 MB/s in `tinylm prepare` on 2 cores), and a tiktoken twin whose ids differ from the library's:
    unicode, every code point in several contexts, text without spaces, special-token text, lone surrogates."""
    texts = [(shared_data / n).read_text(encoding="utf-8") for n in (*SHARED_TEXTS, "corpus.en")]
    # the scripts below U+3400 whole, then every 97th code point (every code point agrees too, in 2 minutes)
    points = [chr(c) for c in [*range(0x3400), *range(0x3400, 0x110000, 97)] if not 0xD800 <= c <= 0xDFFF]
    texts += ["".join(ctx.format(c) for c in points[i:i + 4096]) for ctx in ("{}", " {}", "a{}1", "{}\n\n ")
              for i in range(0, len(points), 4096)]
    texts += [shakespeare_100k, "a" * 5000, "ACGT" * 3000, f"end{EOT}start", "a\udc80b", "", "  \n\t x"]
    assert bpe._b._as_tiktoken is not None
    assert bpe.encode_batch(texts) == _library_ids(bpe._b.tok, texts)


@pytest.mark.filterwarnings("ignore:training text ran out of pairs")
def test_tiktoken_twins_agree_with_the_library_on_every_short_string():
    """Catches a twin that merges by rank where the library would not (a pair that joins into a token but is not
    its merge): BPEs trained on random words over "abc", every string of up to 6 of those letters."""
    import itertools
    import random

    from tinylm.tokenize.backends import encode_in_threads, tiktoken_twin

    words = ["".join(p) for n in range(1, 7) for p in itertools.product("abc", repeat=n)]
    rng = random.Random(0)
    for _ in range(12):
        vocab = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 9))) for _ in range(rng.randint(3, 30))]
        docs = [" ".join(w for w in vocab for _ in range(rng.randint(1, 4)))]
        tok = build_tokenizer("bpe", vocab_size=257 + rng.randint(3, 25), documents=lambda d=docs: d)._b.tok
        assert encode_in_threads(tiktoken_twin(tok), words) == _library_ids(tok, words)


def test_gpt2s_tokenizer_json_gets_a_twin_and_other_kinds_none(shared_data, bpe):
    """Catches the tiktoken twin taken for a tokenizer.json it does not copy (a normalizer, a prefix space, merges
    out of order), and GPT-2's own vocab.json + merges.txt (the library's form of tiktoken's gpt2) left without one."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, normalizers, pre_tokenizers

    from tinylm.tokenize.backends import tiktoken_twin

    gpt2 = HFTokenizer(models.BPE.from_file(str(shared_data / "gpt2_vocab.json"),
                                            str(shared_data / "gpt2_merges.txt")))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    texts = [(shared_data / n).read_text(encoding="utf-8") for n in (*SHARED_TEXTS, "corpus.en")]
    assert [tiktoken_twin(gpt2).encode_ordinary(t) for t in texts] == _library_ids(gpt2, texts)
    for change in ("normalizer", "prefix", "order"):
        tok = HFTokenizer.from_str(bpe._b.tok.to_str())
        if change == "normalizer":
            tok.normalizer = normalizers.Lowercase()
        elif change == "prefix":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        else:
            spec = json.loads(tok.to_str())
            spec["model"]["merges"][:2] = spec["model"]["merges"][1::-1]
            tok = HFTokenizer.from_str(json.dumps(spec))
        assert tiktoken_twin(tok) is None, change


def test_a_token_its_own_bytes_do_not_merge_into_gets_no_tiktoken_twin():
    """Catches a tokenizer.json whose merges are in id order but where tiktoken joins a pair that is not a merge:
    merges "b c", "a b", "ab c" leave "abc" as a + bc in the library, while tiktoken joined a + bc into "abc" by its
    rank (prepare wrote a token the library never gives, ~1 in 6 of the ids of such a corpus)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    from tinylm.tokenize.backends import HFBackend, tiktoken_twin
    from tinylm.tokenize.bpe import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())} | {"bc": 256, "ab": 257, "abc": 258}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[("b", "c"), ("a", "b"), ("ab", "c")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    texts = ["abc", "x abc abcabc"]
    assert tiktoken_twin(tok) is None
    a, space, x, bc = 64, 220, 87, 256
    expected = [[a, bc], [x, space, a, bc, space, a, bc, a, bc]]  # the library's: "abc" is never one token
    assert HFBackend(tok).encode_batch(texts) == _library_ids(tok, texts) == expected


def test_gpt2_files_whose_token_its_own_bytes_do_not_merge_into_are_refused(tmp_path):
    """Catches a folder of vocab.json + merges.txt encoded by tiktoken's ranks where GPT-2's BPE (the pair listed
    first) gives other ids: merges "b c", "a b", "ab c" leave "abc" as a + bc, tiktoken made it one token."""
    from tinylm.tokenize.bpe import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())} | {"bc": 256, "ab": 257, "abc": 258}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\nb c\na b\nab c\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"its merges make 'abc', but in their order 'abc' itself is encoded as "
                                         r"other tokens.*save the files as one tokenizer.json"):
        build_tokenizer(str(tmp_path))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\nb c\nab c\n", encoding="utf-8")  # as training makes
    vocab |= {"ab": 256, "bc": 257}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    assert build_tokenizer(str(tmp_path)).encode("abc bc") == [258, 220, 257]


def test_tiktoken_batches_start_no_threads_beyond_the_cores_the_process_may_use(monkeypatch):
    """Catches `encode_in_threads` counting the machine's cores, not the process's (os.cpu_count: a SLURM job or
    `taskset` given 2 of a node's 64 cores encoded in 63 threads on those 2); with one core allowed, a plain loop."""
    import concurrent.futures

    import tiktoken

    from tinylm.tokenize.backends import encode_in_threads

    def no_pool(*args, **kwargs):
        raise AssertionError("threads started on a process allowed one core")

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", no_pool)
    enc = tiktoken.Encoding("t", pat_str=r"\S+|\s+", mergeable_ranks={bytes([b]): b for b in range(256)},
                            special_tokens={})
    assert encode_in_threads(enc, ["ab", "c", "de f"]) == [[97, 98], [99], [100, 101, 32, 102]]


def test_a_tokenizer_json_whose_ids_have_a_gap_covers_its_largest_id(tmp_path):
    """Catches a tokenizer.json whose ids skip one (a token removed by hand, ids reserved and left out) read as
    having as many ids as tokens: the vocabulary (and the model's embedding) ended short of the largest id, so its
    end-of-text id was refused as "outside its vocabulary" (the file called damaged), and without the check a
    dataset held ids that no embedding row looks up. A byte-level BPE laid out as GPT-2's file: the 256 bytes,
    "Ġt" 256, (257 unused), "he" 258, <|endoftext|> 259 in the vocabulary and added as special: 259 tokens, 260 ids."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers

    from tinylm.tokenize.bpe import bytes_to_unicode

    vocab = {c: b for b, c in bytes_to_unicode().items()} | {"Ġt": 256, "he": 258, EOT: 259}
    hf = HF(models.BPE(vocab=vocab, merges=[("Ġ", "t"), ("h", "e")]))
    hf.pre_tokenizer, hf.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    spec = json.loads(hf.to_str())
    spec["added_tokens"] = [{"id": 259, "content": EOT, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True}]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    hf = HF.from_file(str(tmp_path / "tokenizer.json"))
    assert hf.token_to_id(EOT) == 259 and hf.get_vocab_size(with_added_tokens=True) == 259  # (the gap is real)
    tok = Tokenizer.load(tmp_path / "tokenizer.json")
    assert tok.vocab_size == 260 and tok.eos_id == 259
    ids = tok.encode("the theme")
    assert 258 in ids and max(ids) < tok.vocab_size and tok.decode(ids) == "the theme"
    lengths = tok.token_byte_lengths()
    assert len(lengths) == 260 and lengths[257] == 0 and lengths[259] == 0  # (no token, and the EOS: no text)
    assert sum(lengths[i] for i in ids) == len("the theme")
