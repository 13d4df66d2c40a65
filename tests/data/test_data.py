"""Packing, the on-disk dataset, seekable batches, exact resume, and the DataModule's contract with Lightning."""

import contextlib
import json
import logging
import os
import shutil
import sys

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tinylm.data import TinyLMDataModule
from tinylm.data.corpus import EOT, open_corpus
from tinylm.data.loader import ResumableLoader, TrainBatches
from tinylm.data.prepare import load_meta, prepare_dataset
from tinylm.data.writer import SplitWriter, pieces
from tinylm.tokenize.tokenizer import Tokenizer, build_tokenizer


@pytest.fixture
def shakespeare(small_data, tmp_path):
    """The first 100 KB of tinyshakespeare as a file of its own."""
    path = tmp_path / "shakespeare.txt"
    path.write_text((small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8"), encoding="utf-8")
    return path


def _dm(tmp_path, corpus, **kw) -> TinyLMDataModule:
    kw = {"block_size": 16, "batch_size": 4, "cache_dir": str(tmp_path / "cache"), **kw}
    return TinyLMDataModule(corpus=str(corpus), **kw)


def _tokens(dm: TinyLMDataModule, split: str) -> np.ndarray:
    return np.fromfile(dm.dataset_dir / f"{split}.bin", dtype=dm.meta["dtype"])


def test_char_packing_matches_nanogpt_split(shakespeare, tmp_path):
    """Prevents a train/val cut other than nanoGPT's data[:int(n*0.9)], stray EOS, or wrong byte counts."""
    text = shakespeare.read_text(encoding="utf-8")
    dm = _dm(tmp_path, shakespeare)
    assert dm.eos_id is None  # single document, char tokenizer: nothing to separate
    cut = int(len(text) * 0.9)
    tok = dm.tokenizer
    assert _tokens(dm, "train").tolist() == tok.encode(text[:cut])
    assert _tokens(dm, "val").tolist() == tok.encode(text[cut:])
    meta = dm.meta
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == tok.vocab_size
    assert meta["splits"]["val"]["bytes"] == len(text[cut:].encode("utf-8"))
    assert meta["splits"]["train"]["tokens"] == cut and meta["settings"]["val_source"] == "tail"


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab \n\t.", min_size=1, max_size=120), max_chars=st.integers(4, 30))
def test_pieces_encode_like_the_whole_text_around_whitespace_runs(text, max_chars):
    """Catches a cut inside a run of whitespace (after the first of three newlines, of a newline and spaces):
    GPT-2's pattern reads the run as other pre-tokens, and the pieces then encode to other ids than the whole
    text (a document over the piece size: tinyshakespeare is one), with a BPE that merged whitespace runs."""
    tok = _whitespace_bpe()
    cut = list(pieces(text, max_chars))
    assert "".join(cut) == text
    assume(all(len(piece) < max_chars for piece in cut[:-1]))  # a piece of max_chars: no safe cut, cut hard
    assert [i for piece in cut for i in tok.encode(piece)] == tok.encode(text), cut


O200K_PATTERN = "|".join([  # tiktoken_ext.openai_public.o200k_base's pat_str (its ranks are downloaded; not here)
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""])


def test_pieces_encode_like_the_whole_text_under_o200ks_pattern(tmp_path):
    """Catches a long document of code cut after the newline of ";\n// ...": o200k_base's pattern (tiktoken:o200k_base)
    reads punctuation, newlines and slashes as one pre-token (";\n//"), so the pieces ";\n" and "// ..." encoded to
    other ids than the whole text. A tokenizer with o200k's pattern and a "\n//" merge, as o200k's ranks have."""
    from tinylm.tokenize.backends import ranks_to_text

    ranks = {bytes([b]): b for b in range(256)} | {b"\n/": 256, b"\n//": 257}
    tok = Tokenizer.from_state_dict({"version": 1, "kind": "tiktoken", "spec": "tiktoken:o200k_base", "state": {
        "name": "o200k_base", "pattern": O200K_PATTERN, "ranks": ranks_to_text(ranks), "special_tokens": {EOT: 258}}})
    text = "".join(f"// step {i} of the loop;\n" for i in range(40))  # each newline: between ";" and "/"
    (tmp_path / "code.c").write_text(text, encoding="utf-8")
    out = prepare_dataset(open_corpus(str(tmp_path / "code.c"), cache_dir=tmp_path), tok, val_fraction=0.1,
                          cache_dir=tmp_path / "cache", piece_chars=100)
    train = np.fromfile(out / "train.bin", dtype=load_meta(out, tok)["dtype"]).tolist()
    whole = tok.encode(text[: int(len(text) * 0.9)])
    assert 257 in whole  # (not vacuous: the whole text has "\n//" tokens for a cut to break)
    assert train == whole

def test_documents_packed_with_eos_and_pieces_encode_like_whole(small_data, small_bpe, tmp_path):
    """Prevents missing EOS between documents, a wrong val cut, or piecewise encoding changing the ids."""
    corpus = open_corpus(str(small_data / "stories.txt"), cache_dir=tmp_path)
    docs = list(corpus)
    tok = build_tokenizer(f"tiktoken:{small_bpe.tiktoken}")
    cut = int(sum(map(len, docs)) * 0.9)  # the val split is the last 10% of the characters
    train, val, seen = [], [], 0
    for d in docs:  # e.g. docs "aaaa","bbbb" with cut 6: train "aaaa<eos>bb", val "bb<eos>"
        k = min(max(cut - seen, 0), len(d))
        if k:
            train += tok.encode(d[:k]) + ([tok.eos_id] if k == len(d) else [])
        if k < len(d):
            val += tok.encode(d[k:]) + [tok.eos_id]
        seen += len(d)
    for piece_chars in (10**9, 50):  # 50 chars forces many cuts inside each document
        out = prepare_dataset(corpus, tok, val_fraction=0.1, cache_dir=tmp_path / f"c{piece_chars}",
                              piece_chars=piece_chars)
        meta = load_meta(out, tok)
        assert np.fromfile(out / "train.bin", dtype=meta["dtype"]).tolist() == train
        assert np.fromfile(out / "val.bin", dtype=meta["dtype"]).tolist() == val
        total_bytes = sum(meta["splits"][s]["bytes"] for s in ("train", "val"))
        assert total_bytes == sum(len(d.encode("utf-8")) for d in docs)
    assert len(list(pieces(docs[0], 50))) > 5


def test_a_tokenizer_that_marks_a_texts_start_encodes_long_documents_whole(small_data, tmp_path):
    """Catches documents longer than the piece size encoded in pieces by a SentencePiece-style tokenizer.json
    (Metaspace, prepend scheme "first" as in Llama): each piece began with its own "▁", a space at every cut."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:20_000]
    hf = HF(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    hf.decoder = decoders.Metaspace(prepend_scheme="first")
    hf.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"]))
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.load(tmp_path / "tokenizer.json")
    (tmp_path / "one.txt").write_text(text, encoding="utf-8")
    out = prepare_dataset(open_corpus(str(tmp_path / "one.txt"), cache_dir=tmp_path), tok, val_fraction=0.1,
                          cache_dir=tmp_path / "cache", piece_chars=500)
    train = np.fromfile(out / "train.bin", dtype=load_meta(out, tok)["dtype"]).tolist()
    assert train == tok.encode(text[:int(len(text) * 0.9)])
    assert tok.decode(train) == text[:int(len(text) * 0.9)]


@pytest.mark.parametrize("specials", [["<|begin_of_text|>", "<|end_of_text|>"], ["<|begin_of_text|>"]])
def test_a_tokenizer_without_an_end_of_text_token_is_named(small_data, tmp_path, caplog, specials):
    """Catches documents packed back to back in silence by a tokenizer.json whose end of text has another name
    than <|endoftext|> (Llama 3's <|end_of_text|>, now read as one) or that has none (now a warning)."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HF(models.BPE())
    hf.pre_tokenizer, hf.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    hf.train_from_iterator([(small_data / "stories.txt").read_text(encoding="utf-8")],
                           trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf.save(str(tmp_path / "tokenizer.json"))
    dm = _dm(tmp_path, small_data / "stories.txt", tokenizer=str(tmp_path / "tokenizer.json"))
    with caplog.at_level(logging.WARNING, logger="tinylm.data"):
        dm.prepare_data()
    eos = hf.token_to_id("<|end_of_text|>")
    assert dm.eos_id == eos and (dm.meta["splits"]["train"]["eos"] >= 4) == (eos is not None)  # 6 stories
    assert ("has no end-of-text token" in caplog.text) == (eos is None)
    if eos is not None:  # a dataset the older tinylm packed without it: its fingerprints match, its ids do not
        meta = json.loads((dm.dataset_dir / "meta.json").read_text())
        (dm.dataset_dir / "meta.json").write_text(json.dumps({**meta, "eos_id": None}))
        with pytest.raises(ValueError, match=r"packed with end-of-text id None, but its tokenizer's is \d+ .*delete"):
            load_meta(dm.dataset_dir, dm.tokenizer)


@pytest.mark.parametrize(("kind", "cuts"), [("trained-bpe", True), ("bytelevel-nfc-lowercase", True),
                                           ("wordpiece", True), ("metaspace-always", False),
                                           ("bytelevel-prefix-space", False)])
def test_only_tokenizers_whose_pieces_encode_like_the_whole_are_cut(small_data, tmp_path, kind, cuts):
    """Catches the piece probe failing for every tokenizer.json (a trained bpe too): a 31 MB one-document corpus was
    then encoded whole, 2.5x the time and 3.4x the memory; and passing for those that mark a text's start."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    from tinylm.data.writer import cuts_exactly

    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:20_000]
    if kind == "trained-bpe":
        tok = build_tokenizer("bpe", vocab_size=400, documents=lambda: [text])
    else:
        if kind == "wordpiece":
            hf = HF(models.WordPiece(unk_token="[UNK]"))
            hf.pre_tokenizer, hf.decoder = pre_tokenizers.BertPreTokenizer(), decoders.WordPiece()
            trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=["[UNK]"])
        elif kind == "metaspace-always":
            hf = HF(models.BPE(unk_token="<unk>"))
            hf.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
            hf.decoder = decoders.Metaspace(prepend_scheme="always")
            trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"])
        else:
            hf = HF(models.BPE())
            hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=kind.endswith("prefix-space"))
            hf.decoder = decoders.ByteLevel()
            if kind.endswith("lowercase"):
                hf.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
            trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        hf.train_from_iterator([text], trainer)
        hf.save(str(tmp_path / "tokenizer.json"))
        tok = Tokenizer.load(tmp_path / "tokenizer.json")
    assert cuts_exactly(tok) is cuts
    if cuts:  # and cut pieces of real text do encode like the whole
        assert [i for p in pieces(text, 300) for i in tok.encode(p)] == tok.encode(text)


def test_one_long_document_is_encoded_in_bounded_batches(small_data, tmp_path, monkeypatch):
    """Catches a one-document corpus being gathered whole before it is encoded (memory in proportion to the
    corpus: 4.7 GB for a 67 MB file, and a progress bar frozen until the end)."""
    from concurrent.futures import ThreadPoolExecutor

    from tinylm.data import writer

    monkeypatch.setattr(writer, "BATCH_CHARS", 4000)
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:40_000]
    tok = build_tokenizer("char", documents=lambda: iter([text]))
    batches = []

    class Recording(Tokenizer):  # the real tokenizer, with each batch's size written down
        def encode_arrays(self, texts):
            batches.append(sum(map(len, texts)))
            return super().encode_arrays(texts)

    spy = Recording(tok._b, tok.spec)
    with ThreadPoolExecutor(1) as pool:
        w = SplitWriter(tmp_path / "t.bin", spy, np.dtype("uint16"), 1000, pool)
        w.add(text, ends_document=True)
        stats = w.close()
    assert max(batches) <= 4000 + 1000 and len(batches) >= 8  # a batch is cut as soon as it passes BATCH_CHARS
    assert np.fromfile(tmp_path / "t.bin", dtype="uint16").tolist() == tok.encode(text)
    assert stats["tokens"] == len(text) and stats["documents"] == 1


def test_char_dataset_build_encodes_by_table_lookup(tmp_path, monkeypatch):
    """Catches a char dataset build encoding its text in Python a character at a time (`[stoi[c] for c in text]`,
    holding the GIL: 100 MB took ~10 s of CPU, 8x a table lookup), and the lookup giving other ids than `encode` or
    passing a character the vocabulary lacks (below or above its highest code point) without naming it."""
    from concurrent.futures import ThreadPoolExecutor

    from tinylm.tokenize.backends import CharBackend, MissingCharacter

    text = "naïve café, 42 days!\n\tÀ 𝔘 🙂 end" * 30
    tok = build_tokenizer("char", documents=lambda: iter([text]))
    expected = tok.encode(text)

    def per_character(self, text):
        raise AssertionError("a dataset build encoded a character at a time")

    monkeypatch.setattr(CharBackend, "encode", per_character)
    with ThreadPoolExecutor(1) as pool:
        w = SplitWriter(tmp_path / "t.bin", tok, np.dtype("uint16"), 100, pool)
        w.add(text, ends_document=True)
        w.close()
    assert np.fromfile(tmp_path / "t.bin", dtype="uint16").tolist() == expected
    monkeypatch.undo()
    for lacking in ("z", "\U0001F600", "\x00"):  # inside the table's range, above its highest point, the first
        with pytest.raises(MissingCharacter) as e:
            tok.encode_arrays([text, "na" + lacking])
        assert e.value.char == lacking


def test_second_run_reuses_and_changes_rebuild(shakespeare, tmp_path):
    """Prevents retraining/repacking on every run, and reusing a dataset after corpus/tokenizer/split changed."""
    dm = _dm(tmp_path, shakespeare, tokenizer="bpe", vocab_size=300)
    dm.prepare_data()
    first = dm.dataset_dir
    stamp = (first / "train.bin").stat().st_mtime_ns
    again = _dm(tmp_path, shakespeare, tokenizer="bpe", vocab_size=300)
    assert again.dataset_dir == first and again.tokenizer.fingerprint == dm.tokenizer.fingerprint
    again.prepare_data()
    assert (first / "train.bin").stat().st_mtime_ns == stamp
    assert len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 1  # trained once
    assert _dm(tmp_path, shakespeare, tokenizer="bpe", vocab_size=300, val_fraction=0.2).dataset_dir != first
    assert _dm(tmp_path, shakespeare, tokenizer="bpe", vocab_size=320).dataset_dir != first
    shakespeare.write_text(shakespeare.read_text() + "\nEPILOGUE.\n")
    assert _dm(tmp_path, shakespeare, tokenizer="bpe", vocab_size=300).dataset_dir != first


def test_folder_without_meta_is_rebuilt(shakespeare, tmp_path):
    """Prevents a crashed prepare (bins but no meta.json) from being used as a dataset."""
    dm = _dm(tmp_path, shakespeare)
    dm.prepare_data()
    folder, good = dm.dataset_dir, _tokens(dm, "train")
    (folder / "meta.json").unlink()
    (folder / "train.bin").write_bytes(b"\x00\x01")
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        load_meta(folder)
    fresh = _dm(tmp_path, shakespeare)
    fresh.prepare_data()
    assert fresh.dataset_dir == folder and np.array_equal(_tokens(fresh, "train"), good)
    assert not [p for p in folder.parent.iterdir() if ".tmp-" in p.name]


def test_uint32_when_vocab_needs_it(small_data, small_bpe, tmp_path):
    """Prevents ids above 65,535 from wrapping around in a uint16 file."""
    state = build_tokenizer(f"tiktoken:{small_bpe.tiktoken}").state_dict()
    state["state"]["special_tokens"]["<|big|>"] = 70_000  # beside <|endoftext|> = 511
    tok = Tokenizer.from_state_dict(state)
    assert tok.vocab_size == 70_001
    corpus = open_corpus(str(small_data / "german.txt"), cache_dir=tmp_path)
    out = prepare_dataset(corpus, tok, val_fraction=0.5, cache_dir=tmp_path)
    meta = load_meta(out, tok)
    assert meta["dtype"] == "uint32"
    ids = np.fromfile(out / "train.bin", dtype="<u4")
    assert ids.dtype.itemsize == 4 and ids[0] == tok.encode(next(iter(corpus)))[0]


def test_refuses_wrong_tokenizer_and_uint16_overflow(shakespeare, tmp_path):
    """Prevents training on ids from another tokenizer, or on a uint16 file for a vocab that needs uint32."""
    dm = _dm(tmp_path, shakespeare)
    dm.prepare_data()
    other = build_tokenizer("char", documents=lambda: ["abc"])
    with pytest.raises(ValueError, match=r"built with tokenizer .*copied from another dataset; delete the folder"):
        load_meta(dm.dataset_dir, other)
    meta_path = dm.dataset_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["vocab_size"] = 100_277
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"uint16 ids but the vocabulary has 100277 ids"):
        load_meta(dm.dataset_dir)


def test_split_shorter_than_block_is_clear(shakespeare, tmp_path):
    """Prevents an index error deep in the loader when a split cannot hold one window."""
    dm = _dm(tmp_path, shakespeare, block_size=20_000)  # val has 10,000 chars
    with pytest.raises(ValueError, match=r"the val split has 10000 tokens.*20001.*smaller --data\.block_size"):
        dm.setup("fit")


def test_empty_corpus_is_clear(tmp_path):
    """Prevents an empty corpus from producing an empty vocabulary or zero-length memmaps."""
    (tmp_path / "empty.txt").write_text("")
    for spec in ("char", "bpe"):
        with pytest.raises(ValueError, match=r"is empty.*--data\.corpus PATH"):
            _ = _dm(tmp_path, tmp_path / "empty.txt", tokenizer=spec, vocab_size=300).vocab_size


def test_own_validation_split_is_used(tmp_path):
    """Prevents a dataset's validation split being ignored in favour of a tail cut of train."""
    rows = lambda texts: "".join(json.dumps({"text": t}) + "\n" for t in texts)
    (tmp_path / "train.jsonl").write_text(rows(["the cat sat on the mat. " * 20] * 3))
    (tmp_path / "val.jsonl").write_text(rows(["a dog ran. " * 10]))
    files = {"train": str(tmp_path / "train.jsonl"), "validation": str(tmp_path / "val.jsonl")}
    dm = _dm(tmp_path, "hf:json", data_files=files, tokenizer="bpe", vocab_size=300)
    with pytest.warns(UserWarning, match="ran out of pairs to merge"):  # a few repeated sentences: said, not hidden
        val_ids = _tokens(dm, "val").tolist()
    assert dm.tokenizer.decode(val_ids) == "a dog ran. " * 10 + EOT
    assert dm.meta["settings"] == {"val_source": "validation split", "val_fraction": None}
    assert dm.meta["splits"]["train"]["documents"] == 3


def test_char_vocabulary_covers_the_datasets_own_validation_split(tmp_path):
    """Catches `char` on a dataset with its own validation split failing on a character only validation has
    ("character 'v' is not in the char tokenizer's vocabulary"), as TinyStories would."""
    rows = lambda texts: "".join(json.dumps({"text": t}) + "\n" for t in texts)
    (tmp_path / "train.jsonl").write_text(rows(["the cat sat on the mat. " * 20] * 3))
    (tmp_path / "val.jsonl").write_text(rows(["a dog ran very far. " * 10]))
    files = {"train": str(tmp_path / "train.jsonl"), "validation": str(tmp_path / "val.jsonl")}
    dm = _dm(tmp_path, "hf:json", data_files=files, tokenizer="char")
    assert dm.tokenizer.decode(_tokens(dm, "val").tolist()) == "a dog ran very far. " * 10 + EOT


def test_train_batches_are_shifted_windows(shakespeare, tmp_path):
    """Prevents x/y misalignment, wrong dtype/shape, or windows that are not real slices of the data."""
    dm = _dm(tmp_path, shakespeare, block_size=8, batch_size=5)
    dm.setup("fit")
    data = _tokens(dm, "train")
    ds = dm.train_dataloader().dataset
    x, y = ds[3]
    assert x.shape == y.shape == (5, 8) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row, off in zip(x, ds.offsets(3)):
        assert row.tolist() == data[off:off + 8].tolist()
    assert torch.equal(ds[3][0], x) and not torch.equal(ds[4][0], x)  # pure function of k, and k matters


def test_sampler_seed_rank_and_split_invariance(shakespeare, tmp_path):
    """Prevents ranks reading the same windows, and the data depending on how the global batch is split."""
    dm = _dm(tmp_path, shakespeare)
    dm.setup("fit")
    kw = {"path": dm.dataset_dir / "train.bin", "dtype": "uint16", "n_tokens": dm.meta["splits"]["train"]["tokens"],
          "block_size": 16}
    one = TrainBatches(**kw, batch_size=8, seed=1)
    r0 = TrainBatches(**kw, batch_size=4, seed=1, rank=0, world_size=2)
    r1 = TrainBatches(**kw, batch_size=4, seed=1, rank=1, world_size=2)
    for k in range(3):
        assert np.array_equal(one.offsets(k), np.concatenate([r0.offsets(k), r1.offsets(k)]))
        assert not np.array_equal(r0.offsets(k), r1.offsets(k))
    assert not np.array_equal(TrainBatches(**kw, batch_size=8, seed=2).offsets(0), one.offsets(0))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_resumes_at_the_next_batch(shakespeare, tmp_path, num_workers):
    """Prevents a resumed run from replaying or skipping batches (also across a notional epoch and in workers)."""
    dm = _dm(tmp_path, shakespeare, num_workers=num_workers)
    dm.setup("fit")
    ds = dm.train_dataloader().dataset
    straight = ResumableLoader(ds, epoch_length=3, num_workers=num_workers)
    seen = [x for _ in range(3) for x, _ in straight][:7]  # 3 epochs of 3 batches, keep 7
    part = ResumableLoader(ds, epoch_length=3, num_workers=num_workers)
    got = [x for x, _ in part]
    it = iter(part)
    got.append(next(it)[0])  # 4 batches: into the second epoch
    state = part.state_dict()
    assert state == {"batches_yielded": 4}
    fresh = ResumableLoader(ds, epoch_length=3, num_workers=num_workers)
    fresh.load_state_dict(state)
    got += [x for x, _ in fresh]  # finishes epoch 2 (batches 4, 5)
    got += [next(iter(fresh))[0]]  # batch 6 starts epoch 3
    assert len(got) == 7 and all(torch.equal(a, b) for a, b in zip(seen, got))
    # the DataModule carries the same counter (Lightning restores it before train_dataloader())
    dm2 = _dm(tmp_path, shakespeare, num_workers=num_workers)
    dm2.load_state_dict({"train_batches_yielded": 4})
    assert torch.equal(next(iter(dm2.train_dataloader()))[0], ds[4][0])
    assert dm2.state_dict()["train_batches_yielded"] == 5


def test_a_train_loader_made_again_goes_on_from_the_last_ones_position(shakespeare, tmp_path):
    """Catches --trainer.reload_dataloaders_every_n_epochs N (Lightning calls train_dataloader() again) restarting the
    stream of windows at the run's first: every reloaded epoch trained on the first epoch's windows again."""
    dm = _dm(tmp_path, shakespeare)
    dm.setup("fit")
    first = dm.train_dataloader()
    ds = first.dataset
    drawn = [batch for _, batch in zip(range(2), first)]  # 2 batches (zip asks range first: no third)
    assert drawn[1][0].equal(ds[1][0])
    again = dm.train_dataloader()
    assert next(iter(again))[0].equal(ds[2][0]) and not ds[2][0].equal(ds[0][0])
    assert dm.state_dict()["train_batches_yielded"] == 3


def test_a_resume_may_split_the_global_batch_another_way_and_counts_its_position_again(shakespeare, tmp_path):
    """Catches 2 devices x batch 4 resumed as 1 device x batch 4 x accumulation 2 (the same 8 windows a step) refused,
    or resumed at micro-batch 3 of the new size (the windows of steps 1.5 to 3 once more): the data module's position,
    the loader's count and Lightning's batch counters double, `completed` keeping its distance; a position that is
    no whole number of new micro-batches, and a global batch that changed, are refused naming what keeps the run's."""
    from types import SimpleNamespace

    from lightning.pytorch.trainer.states import TrainerFn

    from tinylm.checkpoint import CheckpointError

    dm = _dm(tmp_path, shakespeare, batch_size=4)
    dm.setup("fit")
    dm.trainer = SimpleNamespace(world_size=2, accumulate_grad_batches=1, state=SimpleNamespace(fn=TrainerFn.FITTING))
    saved = dm.state_dict() | {"train_batches_yielded": 3}
    counts = lambda n: {"ready": n, "started": n, "processed": n, "completed": n - 1}  # saved at a batch's end
    progress = {"total": counts(3), "current": counts(3), "is_last_batch": False}
    loader = {"batches_yielded": 3}
    ckpt = {"TinyLMDataModule": saved, "loops": {"fit_loop": {"state_dict": {"combined_loader": [loader]},
                                                              "epoch_loop.batch_progress": progress}}}
    dm.trainer.world_size, dm.trainer.accumulate_grad_batches = 1, 2
    with pytest.raises(CheckpointError, match="call resume_split"):  # by a module that does not count it again
        dm.load_state_dict(dict(saved))
    dm.resume_split(ckpt)
    dm.load_state_dict(saved)
    assert dm._resume_batches == loader["batches_yielded"] == 6
    assert progress["total"] == progress["current"] == counts(6)
    dm.trainer.world_size, dm.trainer.accumulate_grad_batches = 1, 1  # 8 windows a step, then 4: refused
    dm._resplit = None
    with pytest.raises(CheckpointError, match=r"global batch of 8 windows a step \(data.batch_size=4 x 2 device\(s\) "
                                              r"x accumulation 1\) but this run has 4 \(4 x 1 x 1\).*resume with "
                                              r"--data.batch_size 8 or --trainer.accumulate_grad_batches 2, or start"):
        dm.load_state_dict(dict(saved, train_batches_yielded=3))
    odd = {"TinyLMDataModule": dict(saved, world_size=1, accumulate_grad_batches=2, train_batches_yielded=3)}
    dm.trainer.world_size = 2  # 4 windows x accumulation 2 resumed as 8 windows x 1, at micro-batch 3: mid-step
    with pytest.raises(CheckpointError, match="position, 3, is not a whole number of this run's micro-batches"):
        dm.resume_split(odd)
    old = {k: v for k, v in saved.items() if k != "accumulate_grad_batches"}  # from before it was saved
    dm.trainer.world_size, dm.trainer.accumulate_grad_batches = 1, 2
    with pytest.raises(CheckpointError, match="from before tinylm saved the run's accumulation"):
        dm.load_state_dict(dict(old))


def test_a_resume_from_a_save_before_a_batch_trained_trains_that_batch(shakespeare, tmp_path):
    """Catches a resume from Lightning's OnExceptionCheckpoint of a failure in on_train_batch_start or training_step
    (its batch drawn, not trained) skipping that batch's windows and validating one batch early from there on: the
    loader's position and Lightning's ready/started counts go back to the batches that trained."""
    from types import SimpleNamespace

    from lightning.pytorch.trainer.states import TrainerFn

    dm = _dm(tmp_path, shakespeare)
    dm.setup("fit")
    dm.trainer = SimpleNamespace(world_size=1, accumulate_grad_batches=1, state=SimpleNamespace(fn=TrainerFn.FITTING))
    saved = dm.state_dict() | {"train_batches_yielded": 8}
    failed = {"ready": 8, "started": 7, "processed": 7, "completed": 7}  # as OnExceptionCheckpoint saves it
    progress = {"total": dict(failed), "current": dict(failed), "is_last_batch": True}
    loader = {"batches_yielded": 8}
    ckpt = {"TinyLMDataModule": saved, "loops": {"fit_loop": {"state_dict": {"combined_loader": [loader]},
                                                              "epoch_loop.batch_progress": progress}}}
    dm.resume_split(ckpt)
    dm.load_state_dict(saved)
    assert dm._resume_batches == loader["batches_yielded"] == 7
    assert progress["total"] == progress["current"] == dict.fromkeys(failed, 7)
    assert progress["is_last_batch"] is False
    at_end = {"ready": 5, "started": 5, "processed": 5, "completed": 4}  # a batch's end (ModelCheckpoint): as it is
    progress = {"total": dict(at_end), "current": dict(at_end), "is_last_batch": False}
    saved = dm.state_dict() | {"train_batches_yielded": 5}
    dm.resume_split({"TinyLMDataModule": saved, "loops": {"fit_loop": {"epoch_loop.batch_progress": progress}}})
    assert saved["train_batches_yielded"] == 5 and progress["total"] == progress["current"] == at_end


def test_val_batches_tile_the_split(shakespeare, tmp_path):
    """Prevents validation windows that overlap, skip data, vary between calls, or ignore val_batches."""
    dm = _dm(tmp_path, shakespeare, block_size=16, batch_size=64)
    dm.setup("fit")
    data = _tokens(dm, "val")
    batches = [x for x, _ in dm.val_dataloader()]
    rows = torch.cat(batches)
    whole = (len(data) - 1) // 16
    assert rows.shape == (whole + ((len(data) - 1) % 16 > 0), 16)  # and one window for the last targets
    assert rows[:whole].flatten().tolist() == data[: whole * 16].tolist()
    assert rows[-1].tolist() == data[-17:-1].tolist()
    assert all(torch.equal(a, b) for a, b in zip(batches, (x for x, _ in dm.val_dataloader())))
    assert len(_dm(tmp_path, shakespeare, block_size=16, batch_size=64, val_batches=2).val_dataloader()) == 2


def test_vocab_size_before_prepare_and_summary(shakespeare, tmp_path):
    """Prevents LightningCLI's early read of vocab_size failing, and `tinylm prepare` lacking its numbers."""
    dm = _dm(tmp_path, shakespeare, tokenizer="bpe", vocab_size=300)
    assert dm.vocab_size == dm.tokenizer.vocab_size <= 300 and dm.eos_id is not None
    s = dm.summary()
    assert s["train_tokens"] + s["val_tokens"] == len(_tokens(dm, "train")) + len(_tokens(dm, "val"))
    assert s["dtype"] == "uint16" and 1.1 < s["bytes_per_token"] < 4
    assert Tokenizer.load(dm.dataset_dir / "tokenizer").fingerprint == dm.tokenizer.fingerprint


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`")  # on purpose
def test_lightning_resume_sees_the_same_batches(shakespeare, tmp_path):
    """Prevents Lightning from restarting the data on resume (the loader/datamodule state must be saved)."""
    import lightning as L

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen = []

        def training_step(self, batch, batch_idx):
            self.seen.append(batch[0][:, 0].tolist())
            return (self.w * batch[0].float().mean()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    def fit(max_steps, ckpt_path=None):
        dm = _dm(tmp_path, shakespeare, block_size=512, batch_size=32)  # 90,000 tokens: epochs of 5 batches
        model = Recorder()
        trainer = L.Trainer(max_steps=max_steps, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, limit_val_batches=0, use_distributed_sampler=False,
                            enable_checkpointing=False,
                            default_root_dir=tmp_path / "run", accelerator="cpu")
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        trainer.save_checkpoint(tmp_path / f"step{max_steps}.ckpt")
        return model.seen

    straight = fit(8)
    first = fit(3)
    rest = fit(8, ckpt_path=tmp_path / "step3.ckpt")  # crosses the epoch boundary after batch 5
    assert first + rest == straight and len(straight) == 8


def test_foreign_dtype_and_damaged_meta_are_refused_by_name(shakespeare, tmp_path):
    """Prevents a meta.json naming a dtype tinylm never writes (int16 has uint16's size, so the size check passed
    and training read garbage) and an unparsable meta.json from failing without the file's name."""
    dm = _dm(tmp_path, shakespeare)
    dm.prepare_data()
    meta_path = dm.dataset_dir / "meta.json"
    good = meta_path.read_text()
    meta_path.write_text(good.replace('"uint16"', '"int16"'))
    with pytest.raises(ValueError, match=r"meta\.json is damaged.*dtype 'int16'.*uint16, uint32.*tinylm prepare"):
        load_meta(dm.dataset_dir)
    meta_path.write_text(good[:40])  # cut short
    with pytest.raises(ValueError, match=r"meta\.json is damaged.*JSONDecodeError.*tinylm prepare"):
        load_meta(dm.dataset_dir)
    meta_path.write_text(good)
    assert load_meta(dm.dataset_dir)["dtype"] == "uint16"  # guard: the untouched file loads


def test_hand_edited_meta_is_refused_by_field(shakespeare, tmp_path):
    """Prevents a meta.json edited by hand (a split removed, a count made a string, a bool or another vocab size)
    from failing later with an AttributeError or a KeyError traceback, or being used with a vocab_size that is not
    its tokenizer's (`tinylm prepare` printed `vocab_size True`, and `vocab_size 10` for a 58-id tokenizer)."""
    dm = _dm(tmp_path, shakespeare)
    dm.prepare_data()
    meta_path = dm.dataset_dir / "meta.json"
    good = meta_path.read_text()
    load_meta(dm.dataset_dir, dm.tokenizer)  # guard: the untouched file loads
    edits = [(lambda m: m.update(splits=[1]), r"splits is \[1\], not dict"),
             (lambda m: m["splits"].pop("val"), r"splits must be train and val \(got \['train'\]\)"),
             (lambda m: m.pop("settings"), r"KeyError: 'settings'"),
             (lambda m: m["splits"].update(train=5), r"splits\.train must hold the counts"),
             (lambda m: m["splits"]["val"].update(bytes="x"), r"splits\.val must hold the counts.*'bytes': 'x'"),
             (lambda m: m.update(vocab_size=True), r"vocab_size is True, not int"),
             (lambda m: m.update(vocab_size=10), r"says vocab_size 10, but the tokenizer that made the dataset has "
                                                 rf"{dm.tokenizer.vocab_size} ids")]
    for edit, named in edits:
        meta = json.loads(good)
        edit(meta)
        meta_path.write_text(json.dumps(meta))
        with pytest.raises(ValueError, match=named + r".*tinylm prepare` again"):
            load_meta(dm.dataset_dir, dm.tokenizer)


def test_ids_outside_the_vocabulary_are_refused_when_opened(shakespeare, tmp_path, monkeypatch):
    """Prevents a .bin with ids >= vocab_size from failing only when a batch draws one (an index error inside the
    embedding, a device-side assert on GPU), maybe hours in. The scan reads bounded chunks; the bad id is in a
    later one."""
    import tinylm.data.prepare as prepare_mod

    monkeypatch.setattr(prepare_mod, "SCAN_TOKENS", 1000)
    dm = _dm(tmp_path, shakespeare)
    dm.prepare_data()
    load_meta(dm.dataset_dir, dm.tokenizer)  # guard: clean before the damage
    ids = np.memmap(dm.dataset_dir / "train.bin", dtype="<u2", mode="r+")
    ids[5_432] = dm.tokenizer.vocab_size
    ids.flush()
    del ids
    with pytest.raises(ValueError, match=rf"train\.bin holds token id {dm.tokenizer.vocab_size} at position 5432, "
                                         r"outside the vocabulary.*tinylm prepare"):
        load_meta(dm.dataset_dir, dm.tokenizer)


def test_an_unchanged_dataset_has_its_ids_checked_once(shakespeare, tmp_path, monkeypatch):
    """Prevents every command (and every rank) from reading the whole dataset again to check its ids (~20 s for 10
    billion tokens from the page cache, minutes from a network disk): a file checked and unchanged since (by its
    stamp, recorded beside meta.json) is not read again; a file changed since is, and its bad id is refused; a record
    that cannot be written leaves the check on every open."""
    import tinylm.data.prepare as prepare_mod
    import tinylm.data.source as source_mod

    checked = []
    real = prepare_mod._check_ids
    monkeypatch.setattr(prepare_mod, "_check_ids", lambda path, *a: (checked.append(path.name), real(path, *a)))
    monkeypatch.setattr(source_mod, "RACY_NS", 10**18)  # "just written" however slowly this machine got here
    dm = _dm(tmp_path, shakespeare)
    dm.prepare_data()
    checked.clear()
    load_meta(dm.dataset_dir, dm.tokenizer)
    assert sorted(checked) == ["train.bin", "val.bin"]  # just written: its stamp is not trusted yet
    monkeypatch.setattr(source_mod, "RACY_NS", 0)
    load_meta(dm.dataset_dir, dm.tokenizer)
    load_meta(dm.dataset_dir, dm.tokenizer)
    assert len(checked) == 4  # checked once more, then remembered
    train = dm.dataset_dir / "train.bin"
    clean = train.read_bytes()
    ids = np.memmap(train, dtype="<u2", mode="r+")
    ids[7] = dm.tokenizer.vocab_size
    ids.flush()
    del ids
    with pytest.raises(ValueError, match=r"train\.bin holds token id .* at position 7, outside the vocabulary"):
        load_meta(dm.dataset_dir, dm.tokenizer)
    train.write_bytes(clean)
    record = dm.dataset_dir / prepare_mod.IDS_CHECKED
    record.unlink()
    record.mkdir()  # a record that cannot be read or written: checked on every open
    checked.clear()
    load_meta(dm.dataset_dir, dm.tokenizer)
    load_meta(dm.dataset_dir, dm.tokenizer)
    assert sorted(checked) == ["train.bin", "train.bin", "val.bin", "val.bin"]


@pytest.mark.skipif(sys.platform != "linux", reason="the open-for-writing check is Linux's read lease")
def test_a_bin_held_open_by_a_writable_memmap_is_not_recorded_as_checked(shakespeare, tmp_path, monkeypatch):
    """Catches a bad id written through a writable memory map kept open (a notebook's np.memmap(mode="r+")) passing
    every later open: the kernel sets a file's times only at a page's first write after it was saved, so the
    second write kept the stamp that the record of checked ids named, and its id was never read again."""
    import tinylm.data.source as source_mod

    dm = _dm(tmp_path, shakespeare)
    dm.prepare_data()
    monkeypatch.setattr(source_mod, "RACY_NS", 0)
    ids = np.memmap(dm.dataset_dir / "train.bin", dtype="<u2", mode="r+")
    ids[5] = ids[5]  # a first write, which sets the times
    load_meta(dm.dataset_dir, dm.tokenizer)  # checked: fine so far
    ids[7] = dm.tokenizer.vocab_size  # through the same mapping: no new times
    with pytest.raises(ValueError, match=r"train\.bin holds token id .* at position 7, outside the vocabulary"):
        load_meta(dm.dataset_dir, dm.tokenizer)
    del ids


def test_a_dtype_edited_in_meta_json_has_the_ids_checked_again(shakespeare, tmp_path, monkeypatch):
    """Catches a record of checked ids outliving an edit of meta.json's dtype: the same bytes read as uint32 (half
    the tokens, so the sizes agree) are ids in the millions, refused at the start before the record, let through
    to the model after it (whose CPU guard is all that stopped them; on a GPU, a device-side assert)."""
    import tinylm.data.source as source_mod

    dm = _dm(tmp_path, shakespeare)
    dm.prepare_data()
    monkeypatch.setattr(source_mod, "RACY_NS", 0)
    load_meta(dm.dataset_dir, dm.tokenizer)  # checked and recorded
    path = dm.dataset_dir / "meta.json"
    meta = json.loads(path.read_text(encoding="utf-8"))
    meta["dtype"] = "uint32"
    for split in meta["splits"].values():
        split["tokens"] //= 2
    path.write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.bin holds token id \d+ at position 0, outside the vocabulary"):
        load_meta(dm.dataset_dir, dm.tokenizer)


def test_a_dataset_on_a_read_only_mount_opens_without_a_record(shakespeare, tmp_path, monkeypatch):
    """Catches every command refusing a dataset on a read-only mount (docker -v ...:ro, a read-only NFS export) with
    "OSError: read-only file system: .../ids_checked.json.tmp-PID": the record's temp file could not be written,
    and removing it then failed with EROFS too (not FileNotFoundError), out of `remember`."""
    import errno
    import pathlib

    import tinylm.data.source as source_mod

    dm = _dm(tmp_path, shakespeare)
    dm.prepare_data()
    monkeypatch.setattr(source_mod, "RACY_NS", 0)

    def read_only(path, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(pathlib.Path, "write_text", read_only)
    monkeypatch.setattr(pathlib.Path, "unlink", read_only)
    assert load_meta(dm.dataset_dir, dm.tokenizer)["vocab_size"] == dm.tokenizer.vocab_size
    monkeypatch.undo()
    assert not (dm.dataset_dir / "ids_checked.json").exists()


def test_temp_folders_of_killed_builds_are_removed(shakespeare, tmp_path):
    """Prevents every killed `prepare` from leaving its <dataset>.tmp-<pid> folder (the size of a dataset) forever,
    without touching those of builds still running or of other hosts sharing the cache; a build killed and not yet
    reaped by its parent (a zombie, which a signal still reaches) is not running."""
    import os
    import socket
    import subprocess
    import sys
    import time

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # a process that has exited
    datasets = tmp_path / "cache" / "datasets"
    host = socket.gethostname()
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc to tell a zombie")
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits, and stays unreaped until .wait()
    while not os.path.exists(f"/proc/{zombie.pid}") or \
            open(f"/proc/{zombie.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.05)
    names = {"stale": f"a.tmp-{host}-{dead}", "stale_old_style": f"b.tmp-{dead}",
             "running": f"c.tmp-{host}-{os.getpid()}", "other_host": f"d.tmp-elsewhere-{dead}",
             "zombie": f"e.tmp-{host}-{zombie.pid}"}
    for name in names.values():
        (datasets / name).mkdir(parents=True)
        (datasets / name / "train.bin").write_bytes(bytes(1000))
    _dm(tmp_path, shakespeare).prepare_data()
    zombie.wait()
    left = {p.name for p in datasets.iterdir() if ".tmp-" in p.name}
    assert left == {names["running"], names["other_host"]}


def test_a_temp_folder_whose_build_holds_its_lock_is_kept(shakespeare, tmp_path):
    """Catches a build in another container with the host's name (`docker run --network host`, a cache volume
    shared) losing its temp folder mid-build to a `prepare` here: its pid is none of this pid namespace's, so it
    looked dead. The build's lock (a file lock, seen across pid namespaces) says it runs."""
    import socket
    import subprocess
    import sys

    pytest.importorskip("fcntl")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    cache = tmp_path / "cache"
    building, killed = (cache / "datasets" / f"{n}.tmp-{socket.gethostname()}-{dead}" for n in ("x", "y"))
    for folder in (building, killed):
        folder.mkdir(parents=True)
    (cache / ".locks").mkdir()
    for name in ("x", "y"):
        (cache / ".locks" / f"datasets-{name}.lock").touch()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1]); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
                               str(cache / ".locks" / "datasets-x.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        _dm(tmp_path, shakespeare).prepare_data()
    finally:
        holder.communicate("")
    assert building.is_dir() and not killed.exists()


def test_bytes_per_token_counts_text_tokens_only(tmp_path):
    """Catches `tinylm prepare`'s bytes/token dividing by the end-of-text ids too: a char tokenizer on ASCII
    documents is exactly 1 byte per token however many documents there are (it said 0.98 for short ones)."""
    path = tmp_path / "docs.txt"
    path.write_text("".join(f"story {i}: a cat sat.\n{EOT}\n" for i in range(300)), encoding="utf-8")
    dm = _dm(tmp_path, path)
    dm.prepare_data()
    assert dm.summary()["bytes_per_token"] == pytest.approx(1.0)
    assert sum(dm.meta["splits"][s]["eos"] for s in ("train", "val")) == 300  # one per document, not per part


def test_prepare_says_the_val_bytes_per_token_that_bits_per_byte_divides_by(shakespeare, tmp_path):
    """Catches docs/data.md quoting "the val bytes per token that `prepare` prints" where prepare printed one figure
    over both splits (3.515 for a BPE on tinyshakespeare, whose val figure is 3.386)."""
    dm = _dm(tmp_path, shakespeare, tokenizer="bpe", vocab_size=400)
    dm.prepare_data()
    val = dm.meta["splits"]["val"]
    s = dm.summary()
    assert s["val_bytes_per_token"] == pytest.approx(val["bytes"] / (val["tokens"] - val["eos"]))
    assert s["val_bytes_per_token"] != pytest.approx(s["bytes_per_token"], abs=1e-3)


def test_val_fraction_with_a_dataset_of_its_own_validation_split_is_warned_of(tmp_path, caplog):
    """Catches `--data.val_fraction 0.3` doing nothing, silently, for a dataset with its own validation split."""
    for name, n in (("train", 40), ("validation", 8)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": f"{name} story {i}. " * 3}) + "\n"
                                                        for i in range(n)))
    files = {"train": str(tmp_path / "train.jsonl"), "validation": str(tmp_path / "validation.jsonl")}
    for fraction, warns in ((0.3, True), (0.1, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tinylm.data"):
            _dm(tmp_path, "hf:json", data_files=files, val_fraction=fraction, block_size=8).prepare_data()
        said = [r.getMessage() for r in caplog.records if "val_fraction" in r.getMessage()]
        assert len(said) == warns, said
    assert said[0] if warns else True
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tinylm.data"):
        _dm(tmp_path, "hf:json", data_files=files, val_fraction=0.3, block_size=8).prepare_data()
    assert ("data.val_fraction=0.3 does nothing here: hf:json has its own validation split ('validation'), read "
            "whole; drop it, or pass --data.val_split train to cut validation from the tail of the train split "
            "instead") in caplog.text
    dm = _dm(tmp_path, "hf:json", data_files=files, val_fraction=0.3, block_size=8, val_split="train")
    dm.prepare_data()  # the way out it names: the tail of train, cut by the fraction
    assert dm.meta["settings"]["val_source"] == "tail" and dm.meta["settings"]["val_fraction"] == 0.3


def test_tokenizer_trains_on_a_sample_spread_over_the_corpus(tmp_path):
    """Prevents `data.tokenizer_train_chars` from training on the head of a sorted corpus only (or on all of it),
    and from changing the cache key of corpora smaller than the sample (which would retrain them for nothing)."""
    from tinylm.data.prepare import _sample, tokenizer_dir_for

    path = tmp_path / "docs.txt"  # 40 documents "doc00 xxx...", 100 characters each
    path.write_text("".join(f"doc{i:02d} " + "x" * 94 + f"\n{EOT}\n" for i in range(40)), encoding="utf-8")
    corpus = open_corpus(str(path), cache_dir=tmp_path)
    sample = list(_sample(corpus, 1000))  # 1000 of the file's 4,600 bytes: a share of 0.217 of the documents
    assert len(sample) == 9 and sum(map(len, sample)) == 900  # 0.217 x 4,000 characters of text, whole documents
    assert sample[0].startswith("doc00") and int(sample[-1][3:5]) >= 35  # spread to the end, not the head
    assert [s[:5] for s in _sample(corpus, None)] == [f"doc{i:02d}" for i in range(40)]
    where = lambda n: tokenizer_dir_for(corpus, "bpe", vocab_size=300, train_chars=n, cache_dir=tmp_path)
    assert where(10**9) == where(None) != where(1000)
    dm = _dm(tmp_path, path, tokenizer="bpe", vocab_size=300, tokenizer_train_chars=1000)
    with pytest.warns(UserWarning, match="ran out of pairs to merge"):  # 900 characters of "x": said, not hidden
        summary = dm.summary()
    assert dm.tokenizer.vocab_size <= 300 and "tokenizer trained on 0.0 MB" in summary["measured"]
    assert "MB/s" in summary["measured"].split("tokenized")[1]


def test_tokenizer_sample_counts_characters_of_a_multibyte_corpus(tmp_path):
    """Prevents a corpus of 2-byte characters (Cyrillic) from giving the tokenizer half the sample it asked for:
    the share of documents kept is max_chars over the corpus's size in bytes, so it must be applied to bytes read."""
    from tinylm.data.prepare import _sample

    path = tmp_path / "ru.txt"  # 40 documents of 100 Cyrillic characters (200 bytes) each
    path.write_text("".join(f"д{i:02d} " + "ж" * 96 + f"\n{EOT}\n" for i in range(40)), encoding="utf-8")
    corpus = open_corpus(str(path), cache_dir=tmp_path)
    kept = sum(map(len, _sample(corpus, 1000)))
    assert 800 <= kept <= 1000  # about 1000 characters (whole documents; separators are in the size, not the text)


def test_tokenizer_sample_of_a_dataset_with_other_wide_columns_is_the_size_asked(tmp_path):
    """Prevents a dataset whose rows hold more than their text (an `html` or `metadata` column beside `text`) from
    giving the tokenizer a fraction of the sample it asked for: the share of documents kept was max_chars over the
    bytes of whole rows (6,840 characters of 30,000 asked, beside a column of 300 bytes a row)."""
    from tinylm.data.prepare import _sample

    path = tmp_path / "rows.jsonl"  # 1000 rows of 90 characters of text, and 300 of markup
    path.write_text("".join(json.dumps({"text": f"row {i:04d} " + "y" * 81, "html": "<p>" * 100}) + "\n"
                            for i in range(1000)), encoding="utf-8")
    corpus = open_corpus(str(path), cache_dir=tmp_path / "cache")
    kept = list(_sample(corpus, 30_000))
    assert 27_000 <= sum(map(len, kept)) <= 30_000  # about 30,000 characters (whole documents)
    assert kept[-1].startswith("row 09")  # spread to the end (not vacuous: a sample, not the whole corpus)


def test_concurrent_ranks_train_the_tokenizer_once(shakespeare, tmp_path, caplog):
    """Prevents every DDP rank training its own tokenizer (torchrun and SLURM start all ranks at once, and
    LightningCLI reads the vocab size at instantiation): the first takes the lock and trains, the others wait
    for it and load the published copy."""
    import logging
    import threading

    from tinylm.data.prepare import prepare_tokenizer

    small = tmp_path / "small.txt"
    small.write_text(shakespeare.read_text(encoding="utf-8")[:5000], encoding="utf-8")
    corpus = open_corpus(str(small), cache_dir=tmp_path)
    start, got = threading.Barrier(3), []

    def rank():
        start.wait()
        got.append(prepare_tokenizer(corpus, "scratch-bpe", vocab_size=270, cache_dir=tmp_path / "cache"))

    with caplog.at_level(logging.INFO, logger="tinylm.data.prepare"):
        threads = [threading.Thread(target=rank) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    trained = [r for r in caplog.records if r.getMessage().startswith("training a scratch-bpe")]
    assert len(trained) == 1 and len(got) == 3 and len({t.fingerprint for t in got}) == 1
    # (how many logged "waiting" depends on scheduling: a thread that starts late finds the folder complete)


def test_tokenizer_training_gets_long_documents_in_pieces(shakespeare, tmp_path, monkeypatch):
    """Catches a BPE tokenizer being trained on each document whole: `tokenizers` held ~95 bytes a character of the
    longest one (a 50 MB file of one line peaked at 4.9 GB, 0.7 GB as documents). Pieces cut where no pre-token
    spans them train the same tokenizer."""
    from tinylm.data import prepare

    text = shakespeare.read_text(encoding="utf-8")[:20_000].replace("\n", " ")  # one long line
    one_line = tmp_path / "one_line.txt"
    one_line.write_text(text, encoding="utf-8")
    given, real = [], prepare.build_tokenizer

    def recording(spec, *, vocab_size, documents):
        return real(spec, vocab_size=vocab_size, documents=lambda: (given.append(len(d)) or d for d in documents()))

    monkeypatch.setattr(prepare, "PIECE_CHARS", 1000)
    monkeypatch.setattr(prepare, "build_tokenizer", recording)
    tok = prepare.prepare_tokenizer(open_corpus(str(one_line), cache_dir=tmp_path), "bpe", vocab_size=300,
                                    cache_dir=tmp_path / "cache")
    assert max(given) <= 1000 and sum(given) == len(text)
    assert tok.fingerprint == real("bpe", vocab_size=300, documents=lambda: [text]).fingerprint


def test_a_char_tokenizer_of_one_long_document_has_no_end_of_text_id(shakespeare, tmp_path, monkeypatch):
    """Catches the char tokenizer of a one-document corpus longer than the pieces the BPE trainer gets (tinyshakespeare,
    `make train`'s, is 1.1 M characters) being given those pieces: it counted them as documents and gained an
    end-of-text id (66 ids, not nanoGPT's 65), another val.bin and another val/loss for the laptop recipe."""
    from tinylm.data import prepare

    text = shakespeare.read_text(encoding="utf-8")[:20_000]
    one = tmp_path / "one.txt"
    one.write_text(text, encoding="utf-8")
    monkeypatch.setattr(prepare, "PIECE_CHARS", 1000)
    tok = prepare.prepare_tokenizer(open_corpus(str(one), cache_dir=tmp_path), "char", vocab_size=0,
                                    cache_dir=tmp_path / "cache")
    assert tok.eos_id is None and tok.vocab_size == len(set(text))


def test_cut_on_a_document_boundary_leaves_whole_documents_on_both_sides(tmp_path):
    """Catches a document that ends exactly at the train/val cut being treated as straddling it: its train part
    lost its EOS and val began with an empty document (a stray EOS), counted as one more document. Four documents
    of 50 characters with val_fraction 0.25 put the cut (int(200 x 0.75) = 150) on the end of the third."""
    path = tmp_path / "docs.txt"
    docs = [letter * 50 for letter in "abcd"]
    path.write_text(f"\n{EOT}\n".join(docs), encoding="utf-8")
    dm = _dm(tmp_path, path, tokenizer="char", val_fraction=0.25)
    tok, eos = dm.tokenizer, dm.eos_id
    assert eos is not None
    assert _tokens(dm, "train").tolist() == [t for d in docs[:3] for t in tok.encode(d) + [eos]]
    assert _tokens(dm, "val").tolist() == tok.encode(docs[3]) + [eos]
    splits = dm.meta["splits"]
    assert splits["train"]["documents"] == 3 and splits["val"]["documents"] == 1
    assert splits["train"]["chars"] == 150 and splits["val"]["chars"] == 50


def test_train_windows_reach_the_last_valid_offset(tmp_path):
    """Catches an off-by-one in the training offsets' bound that never draws the last window of the split: with
    n = T + 2 tokens the valid offsets are 0 and 1 (a window needs T + 1 tokens), and both must come up."""
    T, n = 4, 6
    path = tmp_path / "train.bin"
    np.arange(n, dtype="<u2").tofile(path)
    ds = TrainBatches(path, dtype="uint16", n_tokens=n, block_size=T, batch_size=8, seed=0)
    offsets = np.concatenate([ds.offsets(k) for k in range(50)])
    assert set(offsets.tolist()) == {0, 1}
    _, y = ds.windows(np.array([1]))
    assert y[0].tolist() == [2, 3, 4, 5]  # offset 1's target ends at the split's last token


def test_val_windows_cover_the_split_to_its_last_token(tmp_path):
    """Catches validation dropping its last window when n - 1 is a multiple of T (exactly k windows fit: their
    targets end at the final token): with T = 4 and n = 13 tokens, 3 windows whose last target is token 12."""
    from tinylm.data.loader import ValBatches

    T, n = 4, 13
    path = tmp_path / "val.bin"
    np.arange(n, dtype="<u2").tofile(path)
    val = ValBatches(path, dtype="uint16", n_tokens=n, block_size=T, batch_size=2)
    batches = [val[j] for j in range(len(val))]
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert len(val) == 2 and x.shape == (3, T)
    assert x.flatten().tolist() == list(range(12)) and y[-1].tolist() == [9, 10, 11, 12]


@pytest.mark.parametrize("n", [15, 16, 13, 5, 4])
def test_val_windows_score_every_target_once(tmp_path, n):
    """Catches validation dropping the split's last targets when n - 1 is not a multiple of T (up to T - 1 of
    them were never scored): a last window ends at the split's end, its targets scored already ignored. With
    T = 4 every target 1 .. n - 1 is counted exactly once; a split shorter than one window gives none."""
    from tinylm.data.loader import IGNORE, ValBatches

    T = 4
    path = tmp_path / "val.bin"
    np.arange(n, dtype="<u2").tofile(path)
    val = ValBatches(path, dtype="uint16", n_tokens=n, block_size=T, batch_size=1 if n == 15 else 2)
    ys = torch.cat([val[j][1] for j in range(len(val))]) if len(val) else torch.empty(0, T, dtype=torch.long)
    counted = sorted(ys[ys != IGNORE].tolist())
    assert counted == (list(range(1, n)) if n - 1 >= T else [])
    for j in range(len(val)):  # the tokens are 0 .. n - 1: each target is the token after its input
        x, y = val[j]
        assert ((y == x + 1) | (y == IGNORE)).all() and (x[:, 1:] == x[:, :-1] + 1).all()


@pytest.mark.parametrize("batches, world", [(3, 2), (5, 4), (4, 2), (1, 2)])
def test_every_rank_runs_as_many_val_batches_and_the_targets_count_once(tmp_path, batches, world):
    """Catches ranks given unequal shares of validation (3 batches on 2 ranks: 2 and 1): under FSDP each forward
    gathers the weights from every rank, and the rank with a batch fewer left the others waiting forever. Each rank
    runs as many; a padding batch counts no target, and over the ranks every target counts once, also with fewer
    batches than ranks (1 on 2: each rank scored it, and `tinylm validate` said it scored twice the bytes)."""
    from tinylm.data.loader import IGNORE, ValBatches

    T, B = 4, 2
    n = batches * B * T + 1
    path = tmp_path / "val.bin"
    np.arange(n, dtype="<u2").tofile(path)
    ranks = [ValBatches(path, dtype="uint16", n_tokens=n, block_size=T, batch_size=B, rank=r, world_size=world)
             for r in range(world)]
    assert len({len(v) for v in ranks}) == 1
    counted = sorted(t for v in ranks for j in range(len(v)) for t in v[j][1][v[j][1] != IGNORE].tolist())
    assert counted == list(range(1, n))
    for v in ranks:
        for j in range(len(v)):
            x, y = v[j]
            assert x.shape == y.shape == (B, T) and ((y == x + 1) | (y == IGNORE)).all()


@pytest.mark.parametrize("top_id, dtype", [(65_535, "uint16"), (65_536, "uint32")])
def test_uint16_holds_exactly_65536_ids(small_data, small_bpe, tmp_path, top_id, dtype):
    """Catches an off-by-one in the dtype choice: a vocabulary of 65,536 ids (0..65,535) fits uint16, one of
    65,537 needs uint32. The top id is a special token, and a uint16 dataset must hold it (the scan accepts it)."""
    state = build_tokenizer(f"tiktoken:{small_bpe.tiktoken}").state_dict()
    state["state"]["special_tokens"]["<|top|>"] = top_id  # beside <|endoftext|> = 511
    tok = Tokenizer.from_state_dict(state)
    assert tok.vocab_size == top_id + 1
    corpus = open_corpus(str(small_data / "german.txt"), cache_dir=tmp_path)
    out = prepare_dataset(corpus, tok, val_fraction=0.5, cache_dir=tmp_path)
    assert load_meta(out, tok)["dtype"] == dtype
    if dtype == "uint16":
        ids = np.memmap(out / "train.bin", dtype="<u2", mode="r+")
        ids[0] = top_id
        ids.flush()
        del ids
        load_meta(out, tok)  # the top id is inside the vocabulary and survives the round trip
        assert int(np.fromfile(out / "train.bin", dtype="<u2")[0]) == 65_535


@pytest.mark.parametrize("vocab_size, refused", [(65_536, False), (65_537, True)])
def test_uint16_dataset_is_refused_exactly_when_the_vocab_overflows_it(shakespeare, tmp_path, vocab_size, refused):
    """Catches the overflow check on load being off by one: a meta.json that says uint16 for 65,537 ids must be
    refused (id 65,536 cannot be stored), and 65,536 ids in uint16 accepted."""
    dm = _dm(tmp_path, shakespeare)
    dm.prepare_data()
    meta_path = dm.dataset_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    assert meta["dtype"] == "uint16"
    meta["vocab_size"] = vocab_size
    meta_path.write_text(json.dumps(meta))
    if refused:
        with pytest.raises(ValueError, match=r"uint16 ids but the vocabulary has 65537 ids"):
            load_meta(dm.dataset_dir)
    else:
        assert load_meta(dm.dataset_dir)["vocab_size"] == 65_536


@pytest.mark.parametrize("signals", [("SIGTERM",), ("SIGINT", "SIGINT")])
def test_validation_workers_outlive_a_sigterm_or_ctrl_c_to_the_whole_job(shakespeare, tmp_path, signals):
    """Catches the validation loader's workers dying of a SIGTERM sent to every process of the job (SLURM's time
    limit): a validation due before the stop then failed with "DataLoader worker ... is killed by signal" and the
    run ended unsaved. Likewise a Ctrl+C, which the terminal sends to every process of the foreground group: a
    worker raised KeyboardInterrupt and ended, and the run failed with "DataLoader worker ... exited unexpectedly"
    instead of stopping at the step (the first) or where it was (the second). (The training loader's workers are
    covered by tests/test_signals.py.)"""
    import os
    import signal

    dm = _dm(tmp_path, shakespeare, num_workers=2, val_batches=6)
    dm.setup("fit")
    batches = iter(dm.val_dataloader())
    first, second = next(batches), next(batches)  # one from each worker: both have installed their handler
    for name in signals:
        for worker in batches._workers:  # torch's multiprocessing iterator: its worker processes
            os.kill(worker.pid, getattr(signal, name))
    assert len([first, second, *batches]) == 6


def test_a_workers_grace_ends_it_whatever_sigalrm_handler_the_main_process_had():
    """Catches a worker stuck past its SIGTERM grace living on when the main process had a SIGALRM handler of its
    own (a script's time limit, pytest-timeout's): forked, the worker ran that handler at the grace's end."""
    import os
    import signal

    import forked

    from tinylm.data.loader import worker_signals

    child = os.fork()
    if child == 0:  # pragma: no cover (a child: ends by SIGALRM, or leaves at once)
        try:
            signal.signal(signal.SIGALRM, lambda *_: os._exit(5))  # the main process's handler, inherited
            worker_signals(0)
            os.kill(os.getpid(), signal.SIGALRM)  # the grace's alarm
        finally:
            os._exit(0)
    status = forked.reap(child, 60)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM, status


def test_a_sigterm_as_a_worker_reads_the_loaders_stop_event_does_not_hang_it():
    """Catches a worker's SIGTERM handler hanging for good (and with it every worker and the loader: CI's 10-minute
    timeout) when the SIGTERM came as the worker's loop read the loader's stop event (multiprocessing's Event, which
    the loader's workers share: Event.is_set holds its condition's lock, and the handler's own is_set waited for
    it). The signal comes with that lock held; the worker goes on."""
    import multiprocessing
    import os
    import signal

    import forked

    from tinylm.data.loader import worker_signals

    child = os.fork()
    if child == 0:  # pragma: no cover (a child: leaves at once, or hangs until reap kills it)
        code = 1
        try:
            done_event = multiprocessing.get_context("fork").Event()  # (read by worker_signals from this frame)
            worker_signals(0)
            with done_event._cond:  # as the worker's loop holds it in done_event.is_set()
                os.kill(os.getpid(), signal.SIGTERM)
                code = 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(forked.reap(child, 30)) == 0


OPEN_LOADER = (
    "import numpy as np\n"
    "from tinylm.data.loader import ResumableLoader, TrainBatches\n"
    "np.arange(10000, dtype=np.uint16).tofile('ids.bin')\n"
    "ds = TrainBatches('ids.bin', dtype='uint16', n_tokens=10000, block_size=16, batch_size=4, seed=0)\n"
    "batches = iter(ResumableLoader(ds, epoch_length=100, num_workers=2))\n"
    "next(batches)\n")


@pytest.mark.parametrize("ending", ["", (
    "import gc, multiprocessing, time\n"
    "cycle = [batches]\n"
    "cycle.append(cycle)\n"
    "del batches, cycle\n"
    "gc.collect()\n"
    # (a loaded machine: the workers need a moment to end; before, they lived 60 s)
    "deadline = time.monotonic() + 10\n"
    "while multiprocessing.active_children() and time.monotonic() < deadline:\n"
    "    time.sleep(0.1)\n"
    "print('workers left:', len(multiprocessing.active_children()))\n")], ids=["open", "freed-in-a-cycle"])
def test_a_process_that_exits_with_a_loader_open_ends_its_workers_at_once(tmp_path, ending):
    """Catches a script (or a test) that ends with a loader's iterator open waiting WORKER_GRACE_S (60 s) at exit,
    then printing "DataLoader worker ... is killed by signal: Alarm clock": the workers outlive a SIGTERM, and
    multiprocessing ends them with one. Likewise for an iterator the garbage collector frees in a reference cycle:
    its queues are finalized first, so the loader's stop message never reaches the workers, and they outlived the
    SIGTERM the loader sends them 5 s later."""
    import subprocess
    import sys
    import time

    script = tmp_path / "open_loader.py"
    script.write_text(OPEN_LOADER + ending + "import time\nprint('ending at', time.time(), flush=True)\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          check=False)
    ended = time.time()
    assert done.returncode == 0 and "killed by signal" not in done.stderr, done.stderr[-2000:]
    assert ("workers left: 0" in done.stdout) == bool(ending), done.stdout
    # the exit itself, timed from the script's last line (starting Python and torch can take long on a loaded machine)
    assert ended - float(done.stdout.split("ending at ")[1]) < 30, "the exit waited for the workers' grace (60 s)"


def test_building_a_data_module_or_model_frees_the_callers_locals_at_once(tmp_path, shakespeare):
    """Catches Lightning's save_hyperparameters keeping the caller's frame in a reference cycle: a function that built
    a TinyLMDataModule or a TinyLM kept every local alive after it returned (its loaders' worker processes too)
    until a garbage collection, which then freed the loaders' queues before the loaders."""
    import gc
    import weakref

    from tinylm.train.module import TinyLM

    class Local:
        pass

    def build(make):
        here = Local()
        make()
        return weakref.ref(here)

    gc.collect()
    gc.disable()
    try:
        for make in (lambda: _dm(tmp_path, shakespeare), lambda: TinyLM(vocab_size=65, n_layer=1, n_head=1, n_embd=8,
                                                                         block_size=8)):
            assert build(make)() is None
        cycle = []
        cycle.append(cycle)
        kept = build(lambda: cycle.append(__import__("inspect").currentframe()))
        assert kept() is not None  # not vacuous: a cycle through the caller's frame holds its locals
    finally:
        gc.enable()


def test_a_global_batch_no_batch_size_restores_names_the_device_count_that_does(shakespeare, tmp_path):
    """Catches the refusal of a resume onto 2 devices of a run whose global batch was 3 windows suggesting
    --data.batch_size 1 (a global batch of 2, refused again): 3 windows split over 2 devices by no batch size."""
    import types

    from tinylm.checkpoint import CheckpointError

    dm = _dm(tmp_path, shakespeare, batch_size=1)
    dm.setup("fit")
    dm.trainer = types.SimpleNamespace(world_size=2)
    with pytest.raises(CheckpointError, match=r"--data\.batch_size 3 on 1 device\(s\)"):
        dm._check_same_data({"batch_size": 3, "world_size": 1})
    with pytest.raises(CheckpointError, match=r"resume with --data\.batch_size 2\b"):
        dm._check_same_data({"batch_size": 4, "world_size": 1})  # 4 windows: 2 per device


def test_a_named_corpus_and_its_file_make_one_dataset(shared_data, tmp_path, monkeypatch):
    """Catches the file of a named corpus, placed where its error message says (CACHE/corpora/tinyshakespeare.txt)
    and passed as a path, building a second tokenizer and dataset of the same text under another name (and the
    name after the path doing it again): the folder's name is for reading, its key says what was made."""
    import urllib.request

    def offline(*args, **kwargs):
        raise OSError("no network in this test")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    placed = tmp_path / "cache" / "corpora" / "tinyshakespeare.txt"
    placed.parent.mkdir(parents=True)
    shutil.copy(shared_data / "tinyshakespeare.txt", placed)
    made = []
    for corpus in (str(placed), "tinyshakespeare", str(placed)):
        data = _dm(tmp_path, corpus, tokenizer="char")
        data.prepare_data()
        made.append(data.dataset_dir)
    assert made[0] == made[1] == made[2] and (made[0] / "meta.json").is_file()
    assert [p.name for p in (tmp_path / "cache" / "datasets").iterdir()] == [made[0].name]
    assert len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 1


def test_a_named_corpus_placed_where_its_error_says_is_the_downloaded_one(small_data, tmp_path, monkeypatch):
    """Catches a named corpus's file placed by hand (offline, where the error message says) making another dataset
    than the download would (another key, a second copy), and a placed copy of other text (CRLF line endings) being
    blamed as missing ("no verified copy is at ..."), which sent the user to place it again."""
    import contextlib
    import hashlib
    import io
    import urllib.request

    from tinylm.data import corpus as corpora
    from tinylm.errors import UnavailableError

    text = (small_data / "tinyshakespeare_100k.txt").read_bytes()[:5_000]
    monkeypatch.setitem(corpora.NAMED, "tiny", {"url": "https://example.invalid/tiny.txt", "file": "tiny.txt",
                                                "sha256": hashlib.sha256(text).hexdigest()})
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: contextlib.closing(io.BytesIO(text)))
    online = _dm(tmp_path / "online", "tiny", tokenizer="char")
    online.prepare_data()

    def offline(*args, **kwargs):
        raise OSError("no network in this test")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    placed = tmp_path / "cache" / "corpora" / "tiny.txt"
    placed.parent.mkdir(parents=True)
    placed.write_bytes(text.replace(b"\n", b"\r\n"))
    with pytest.raises(UnavailableError, match=rf"the copy at {placed} is not the expected text \(sha256"):
        _dm(tmp_path, "tiny", tokenizer="char").prepare_data()
    placed.write_bytes(text)
    data = _dm(tmp_path, "tiny", tokenizer="char")
    data.prepare_data()
    assert data.dataset_dir.name == online.dataset_dir.name and (data.dataset_dir / "meta.json").is_file()
    assert len(list((tmp_path / "cache" / "datasets").iterdir())) == 1


def test_a_corpus_with_a_character_the_char_tokenizer_lacks_is_named(tmp_path):
    """Catches validating (or training) a char tokenizer's model on other text failing with the prompt's words
    ("remove it from the text (a prompt)") and without naming the corpus that holds the character."""
    (tmp_path / "seen.txt").write_text("the cat sat on the mat.\n" * 40)
    (tmp_path / "other.txt").write_text("the cat sat on the mat.\n" * 40 + "Zebra\n")
    saved = _dm(tmp_path, tmp_path / "seen.txt", tokenizer="char").tokenizer.save(tmp_path / "tok")
    with pytest.raises(ValueError, match=r"corpus 'other.txt' holds the character 'Z', which the char tokenizer "
                                         r"\(\d+ characters, .*--data.tokenizer bpe"):
        _dm(tmp_path, tmp_path / "other.txt", tokenizer=str(saved)).prepare_data()


def test_a_full_disk_while_packing_names_the_file(tmp_path):
    """Catches a dataset build that fails part-way on a full disk (here a file size limit: the same OSError from the
    same write) saying only "no space left on the disk", without the file, so the user could not tell that it was
    the dataset cache (--data.cache_dir) that filled the disk."""
    import errno
    import resource
    import signal

    (tmp_path / "big.txt").write_text("the cat sat on the mat.\n" * 20_000)  # 480 KB: the limit falls in train.bin
    dm = _dm(tmp_path, tmp_path / "big.txt")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    ignored = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))
    try:
        with pytest.raises(OSError) as e:
            dm.prepare_data()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, ignored)
    assert e.value.errno == errno.EFBIG and e.value.filename.startswith(str(tmp_path / "cache"))
    assert e.value.filename.endswith("train.bin")



@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads the process's open files in /proc (Linux)")
def test_a_build_that_fails_part_way_leaves_none_of_its_files_open(tmp_path):
    """Catches a dataset build that failed part-way (a full disk; here a file size limit) keeping its train.bin and
    val.bin open until a garbage collection: the build removes their .partial folder so that a full disk is freed,
    but files held open keep their space taken, for good in a notebook (its last traceback holds them)."""
    import errno
    import resource
    import signal

    (tmp_path / "big.txt").write_text("the cat sat on the mat.\n" * 20_000)
    dm = _dm(tmp_path, tmp_path / "big.txt")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    ignored = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))
    try:
        with pytest.raises(OSError) as e:  # (`e` keeps the traceback, as a notebook does)
            dm.prepare_data()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, ignored)
    assert e.value.errno == errno.EFBIG and not any((tmp_path / "cache" / "datasets").glob("*.partial"))
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (the listing's own fd, closed by now)
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
    assert not [path for path in held if path.startswith(str(tmp_path / "cache"))], held

def test_a_fit_starts_at_the_first_batch_whatever_the_data_module_read_before(shakespeare, tmp_path):
    """Catches a notebook's `next(iter(dm.train_dataloader()))` (a peek at a batch), or an earlier fit of the same
    data module, moving where the next fit starts: it trained on batch 2 onwards (the peek's count kept), or went on
    from the earlier fit's last batch. A new fit without ckpt_path reads the fresh run's batches from the first."""
    import lightning as L

    from tinylm.train.module import TinyLM

    def first_batches(dm) -> list[list[int]]:
        seen = []

        class Record(L.Callback):
            def on_train_batch_start(self, trainer, module, batch, batch_idx):
                seen.append(batch[0][0, :4].tolist())

        L.seed_everything(0)
        module = TinyLM(vocab_size=dm.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16)
        L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, limit_val_batches=0, callbacks=[Record()]).fit(module, datamodule=dm)
        return seen

    dm = _dm(tmp_path, shakespeare)
    dm.prepare_data()
    fresh = first_batches(dm)
    assert first_batches(dm) == fresh  # a second fit of the same data module
    peeked = _dm(tmp_path, shakespeare)
    peeked.prepare_data()
    next(iter(peeked.train_dataloader()))
    assert first_batches(peeked) == fresh


def test_the_python_api_takes_a_path_object_and_refuses_fractional_counts(tmp_path):
    """Catches TinyLMDataModule(corpus=Path(...)) failing late in setup ("'PosixPath' object is not iterable"), a
    Path kept in the hyperparameters (a checkpoint torch.load(weights_only=True) refuses), and batch_size=8.5
    accepted."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("To be, or not to be, that is the question. " * 40, encoding="utf-8")
    dm = TinyLMDataModule(corpus=corpus, tokenizer="char", block_size=8, batch_size=2, cache_dir=str(tmp_path / "c"))
    assert dm.hparams["corpus"] == str(corpus) and type(dm.hparams["corpus"]) is str
    dm.prepare_data()
    dm.setup("fit")
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (2, 8)
    assert TinyLMDataModule(corpus=[corpus, "tinyshakespeare"]).corpus_specs == [str(corpus), "tinyshakespeare"]
    with pytest.raises(TypeError, match=r"data.corpus takes a path, a dataset name or a list of them; got int 3"):
        TinyLMDataModule(corpus=3)
    for name, value in (("batch_size", 8.5), ("block_size", 64.0), ("val_batches", 2.0)):
        with pytest.raises(ValueError, match=rf"data.{name} must be a whole number in \[1, inf\), got {value}"):
            TinyLMDataModule(corpus=str(corpus), **{name: value})


_BPE: dict = {}


def _whitespace_bpe():
    """A byte-level BPE (GPT-2's pre-tokenization) trained on runs of spaces, tabs and newlines between short
    words, so that it merged "\n\n", built once for the property test's examples."""
    if "tok" not in _BPE:
        import random

        from tinylm.tokenize.bpe import ByteLevelBPE

        rng = random.Random(0)
        text = "".join(rng.choice(["a", "b", "ab", "."]) + rng.choice([" ", "\n", "\n\n", "\n\n\n", "  ", "\n ", "\t"])
                       for _ in range(5000))
        _BPE["tok"] = ByteLevelBPE.train([text], vocab_size=262, progress=False)  # (all the pairs it holds)
        assert len(_BPE["tok"].encode("\n\n")) == 1
    return _BPE["tok"]


def test_other_text_under_the_same_name_says_where_the_run_read_it(tmp_path):
    """Catches "other text than data.corpus 'corpus.txt' holds now (the run read 'corpus.txt')": a relative
    corpus of another folder (a run folder moved, a resume from elsewhere) names where the run read it."""
    from tinylm.data.datamodule import _other_text

    saved = {"corpus_fingerprints": ["a"], "corpus_specs": ["corpus.txt"], "corpus_paths": ["/old/place/corpus.txt"]}
    said = str(_other_text(saved, ["b"], ["corpus.txt"]))
    assert "(the run read 'corpus.txt' at /old/place/corpus.txt)" in said, said


def test_a_mixture_listed_in_another_order_is_named_as_such():
    """Catches a resume whose data.corpus lists the run's corpora in another order being told "other text than
    data.corpus 'b.txt' holds now (the run read 'a.txt')" and to resume "with the text it was trained on": every
    file holds the run's text; their order (which picks each window's corpus) is what changed."""
    from tinylm.data.datamodule import _other_text

    saved = {"corpus_fingerprints": ["fa", "fb"], "corpus_specs": ["a.txt", "b.txt"], "corpus_paths": ["/a", "/b"]}
    said = str(_other_text(saved, ["fb", "fa"], ["b.txt", "a.txt"]))
    assert "listed its corpora in another order (a.txt, b.txt; this run b.txt, a.txt)" in said, said
    assert "resume with --data.corpus [a.txt,b.txt] and its data.weights in that order" in said, said
    assert "\n" not in said


def test_the_bars_of_a_whole_pass_over_a_corpus_end_at_100_percent(tmp_path, monkeypatch, capsys):
    """Catches "training bpe on c.txt: 98% 3.72k/3.79k" ("cleaning", "tokenizing" too) left as the bars' last word
    after a complete pass: their total is the files' size, but they counted the documents' bytes, without the
    `<|endoftext|>` separators (and the whitespace around them) that the pass read too."""
    import re

    from tinylm.cli import main

    monkeypatch.setattr("tinylm.progress.LINE_INTERVAL", 0.0)  # a line at every update, and the last one at close
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n<|endoftext|>\n".join(f"story {i}: " + "the cat sat on a mat. " * 20 for i in range(8)))
    main(["prepare", "--data.corpus", str(corpus), "--data.tokenizer", "bpe", "--data.vocab_size", "270",
          "--data.block_size", "8", "--data.clean.exact", "true", "--data.cache_dir", str(tmp_path / "cache")])
    last = {}
    for line in capsys.readouterr().err.splitlines():
        if m := re.match(r"(cleaning c\.txt|training bpe on c\.txt|tokenizing c\.txt): +(\d+)%", line):
            last[m[1]] = int(m[2])
    assert last == {"cleaning c.txt": 100, "training bpe on c.txt": 100, "tokenizing c.txt": 100}


def test_batches_are_pinned_only_for_a_run_on_the_gpu(tmp_path, shakespeare, monkeypatch):
    """Catches a run on the CPU of a GPU machine (--trainer.accelerator cpu) pinning every batch: page-locked host
    memory and a CUDA context for batches that never go to the GPU (the loaders asked torch.cuda.is_available())."""
    import lightning as L

    dm = _dm(tmp_path, shakespeare, tokenizer="char")
    dm.prepare_data()
    dm.setup("fit")
    dm.trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the machine has a GPU; the run is on the CPU
    assert not dm.train_dataloader().pin_memory and not dm.val_dataloader().pin_memory
    dm.trainer = None  # (a loader made outside a run: pinned where a GPU is)
    assert dm.train_dataloader().pin_memory


def test_a_datasets_file_is_closed_with_it(tmp_path, shakespeare):
    """Catches the .bin file a dataset holds open for its life left to the collector unclosed (a ResourceWarning
    for every fit in a notebook, a test run, `python -X dev`)."""
    import gc
    import warnings

    dm = _dm(tmp_path, shakespeare, tokenizer="char")
    dm.prepare_data()
    dm.setup("fit")
    path = str(dm.dataset_dir / "train.bin")
    batches = TrainBatches(path, dtype=dm.meta["dtype"], n_tokens=len(_tokens(dm, "train")), block_size=16,
                           batch_size=2, seed=0)
    assert batches[0][0].shape == (2, 16)
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del batches
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning) and path in str(w.message)]
