"""Streamed Hugging Face datasets (`data.streaming`) and builds that resume after an interruption."""

import json

import numpy as np
import pytest

from tinylm.data import TinyLMDataModule, pack
from tinylm.data.corpus import Corpus
from tinylm.data.prepare import dataset_dir_for, load_meta, prepare_dataset
from tinylm.tokenize.tokenizer import build_tokenizer


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def _ids(path, meta) -> list[int]:
    return np.fromfile(path, dtype=meta["dtype"]).tolist()


def _expected(tok, docs) -> list[int]:
    return [i for d in docs for i in tok.encode(d) + [tok.eos_id]]


def test_streamed_dataset_takes_a_prefix_and_holds_out_its_head(tmp_path):
    """Catches a streamed corpus that reads past data.max_documents, trains on its validation documents, or
    packs other text than the stream's rows in order."""
    docs = [f"story number {i}: " + "la " * (i % 7) for i in range(300)]
    path = _jsonl(tmp_path / "rows.jsonl", docs)
    dm = TinyLMDataModule(corpus=str(path), streaming=True, max_documents=100, val_fraction=0.1,
                          tokenizer="scratch-bpe", vocab_size=270, cache_dir=str(tmp_path / "cache"))
    meta, tok = dm.meta, dm.tokenizer
    assert meta["settings"]["val_source"] == "held-out head"
    assert _ids(dm.dataset_dir / "val.bin", meta) == _expected(tok, docs[:10])  # the first 10% of 100, held out
    assert _ids(dm.dataset_dir / "train.bin", meta) == _expected(tok, docs[10:110])
    assert meta["splits"]["train"]["documents"] == 100


def test_a_stream_shorter_than_max_documents_is_said(tmp_path, caplog):
    """Catches `--data.max_documents 50` on a 50-row file training on 45 (its first 5 held out for validation)
    without a word."""
    import logging

    path = _jsonl(tmp_path / "rows.jsonl", [f"story number {i}" for i in range(50)])
    for wanted, said in ((50, True), (40, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tinylm.data"):
            dm = TinyLMDataModule(corpus=str(path), streaming=True, max_documents=wanted, tokenizer="char",
                                  cache_dir=str(tmp_path / "cache"))
            dm.prepare_data()
        lines = [r.getMessage() for r in caplog.records if "ran out" in r.getMessage()]
        assert lines == ([f"streamed corpus {path} ran out after 45 training documents of the 50 of "
                          "--data.max_documents (validation held out its first 5)"] if said else []), lines


def test_streamed_dataset_uses_its_own_validation_split(tmp_path):
    """Catches a stream with a validation split still cutting validation out of its train split."""
    train = _jsonl(tmp_path / "train.jsonl", [f"train doc {i}" for i in range(50)])
    val = _jsonl(tmp_path / "val.jsonl", [f"dart cod {i}" for i in range(50)])
    dm = TinyLMDataModule(corpus="hf:json", data_files={"train": str(train), "validation": str(val)},
                          streaming=True, max_documents=40, tokenizer="char", cache_dir=str(tmp_path / "cache"))
    meta, tok = dm.meta, dm.tokenizer
    assert meta["settings"]["val_source"] == "validation split"
    assert _ids(dm.dataset_dir / "train.bin", meta) == _expected(tok, [f"train doc {i}" for i in range(40)])
    assert _ids(dm.dataset_dir / "val.bin", meta) == _expected(tok, [f"dart cod {i}" for i in range(4)])


def test_streaming_misuse_names_the_fix(tmp_path):
    """Catches a stream with no validation split reading forever (no size for its held-out head), and
    --data.streaming on a text file being silently ignored."""
    path = _jsonl(tmp_path / "rows.jsonl", ["a", "b"])
    with pytest.raises(ValueError, match=r"--data.max_documents"):
        _ = TinyLMDataModule(corpus=str(path), streaming=True, cache_dir=str(tmp_path / "c")).meta
    with pytest.raises(ValueError, match=r"validation holds out its first 100 .*lower --data.max_documents"):
        _ = TinyLMDataModule(corpus=str(path), streaming=True, max_documents=1000,
                             cache_dir=str(tmp_path / "c")).meta  # 2 rows: validation's head takes both
    (tmp_path / "t.txt").write_text("text")
    with pytest.raises(ValueError, match=r"drop --data.streaming"):
        _ = TinyLMDataModule(corpus=str(tmp_path / "t.txt"), streaming=True, cache_dir=str(tmp_path / "c")).meta


class _FlakyStream(Corpus):
    """A stream of documents whose connection drops after `fail_after` documents (once)."""

    has_validation = True

    def __init__(self, docs, fail_after):
        self.spec, self.docs, self.fail_after = "flaky", docs, fail_after

    def _docs(self, split):
        for i, doc in enumerate(self.docs if split == "train" else self.docs[:5]):
            if self.fail_after is not None and i == self.fail_after:
                self.fail_after = None
                raise ConnectionError("the stream dropped")
            yield doc

    def _fingerprint(self):
        return "flaky-v1"


def _build_cut_at_document_150(tmp_path, monkeypatch, shard_chars: int):
    """A build of 200 short documents (26-27 characters) in shards of ~``shard_chars`` characters whose stream fails
    at document 150: (documents, tokenizer, stream, the dataset's folder)."""
    monkeypatch.setattr(pack, "SHARD_CHARS", shard_chars)
    docs = [f"document {i:03d} " + "abc " * 3 for i in range(200)]
    tok = build_tokenizer("char", documents=lambda: docs + ["x<|"])
    flaky = _FlakyStream(docs, fail_after=150)
    with pytest.raises(ConnectionError):
        prepare_dataset(flaky, tok, val_fraction=0.1, cache_dir=tmp_path / "cache")
    return docs, tok, flaky, dataset_dir_for(flaky, tok, val_fraction=0.1, cache_dir=tmp_path / "cache")


def test_interrupted_build_resumes_from_its_complete_shards(tmp_path, monkeypatch, caplog):
    """Catches an interrupted prepare that starts over (re-encoding everything), leaves a folder a later run
    takes for a dataset, resumes into different ids than an uninterrupted build (keeping tokens a killed build wrote
    after its last complete shard), or copies the token files at the end (twice the dataset's size on disk)."""
    docs, tok, flaky, final = _build_cut_at_document_150(tmp_path, monkeypatch, 500)  # 20 documents a shard
    assert not final.exists()  # nothing that looks like a dataset
    partial = final.with_name(final.name + ".partial")
    assert len(list(partial.glob("*.json"))) == 7  # 7 complete shards of 20 documents; the 8th was cut off
    with open(partial / "train.bin", "ab") as f:
        f.write(b"\x07\x00" * 33)  # what a build killed mid-shard wrote after its last complete shard
    inode = (partial / "train.bin").stat().st_ino
    with caplog.at_level("INFO", logger="tinylm.data"):
        resumed = prepare_dataset(flaky, tok, val_fraction=0.1, cache_dir=tmp_path / "cache")
    assert "7 shard(s) of 140 documents already done" in caplog.text  # not encoded again
    meta = load_meta(resumed, tok)
    # the speed is of what this build encoded (it was the whole dataset's bytes over this build's time)
    build, total = meta["build"], sum(meta["splits"][s]["bytes"] for s in ("train", "val"))
    assert 0 < build["resumed_bytes"] < total and build["bytes"] + build["resumed_bytes"] == total
    assert f"tokenized {flaky.spec}: 0.0 MB in" in caplog.text and "going on after the 0.0 MB an interrupted " \
        "build had tokenized" in caplog.text
    assert not partial.exists() and (resumed / "train.bin").stat().st_ino == inode  # renamed into place, not copied
    clean = prepare_dataset(_FlakyStream(docs, None), tok, val_fraction=0.1, cache_dir=tmp_path / "clean")
    for split in ("train", "val"):
        assert (resumed / f"{split}.bin").read_bytes() == (clean / f"{split}.bin").read_bytes()
    assert _ids(resumed / "train.bin", meta) == _expected(tok, docs)
    assert meta["splits"]["train"]["documents"] == 200


def test_a_build_stopped_before_its_first_shard_leaves_no_partial_folder(tmp_path, monkeypatch):
    """Catches the tokens of a build stopped before any shard was complete (a full disk, a signal, a lost stream)
    left in .partial/: no build resumes from them, and on a full disk they kept it full."""
    _, _, _, final = _build_cut_at_document_150(tmp_path, monkeypatch, 1_000_000)  # no shard completes
    assert not final.with_name(final.name + ".partial").exists() and not final.exists()


def test_a_build_stopped_while_publishing_keeps_its_shards(tmp_path, monkeypatch, caplog):
    """Catches the finished token files moved out of .partial/ into the temporary dataset folder, which a failure
    before publishing (here: writing meta.json) removes: the next build encoded everything again."""
    from tinylm.data import prepare

    monkeypatch.setattr(pack, "SHARD_CHARS", 500)
    docs = [f"document {i:03d} " + "abc " * 3 for i in range(100)]
    tok = build_tokenizer("char", documents=lambda: docs + ["x<|"])

    def fail(*args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(prepare, "rate", fail)  # after the token files are placed, before meta.json
        with pytest.raises(OSError, match="disk full"):
            prepare_dataset(_FlakyStream(docs, None), tok, val_fraction=0.1, cache_dir=tmp_path / "cache")
    with caplog.at_level("INFO", logger="tinylm.data.pack"):
        built = prepare_dataset(_FlakyStream(docs, None), tok, val_fraction=0.1, cache_dir=tmp_path / "cache")
    assert f"{built.name}: 6 shard(s) of 105 documents already done" in caplog.text  # every shard kept
    assert _ids(built / "train.bin", load_meta(built, tok)) == _expected(tok, docs)


def test_a_resume_with_other_streaming_settings_names_them(tmp_path):
    """Catches a resume that changed how the stream is read blamed on something else: without streaming it said
    "data.val_fraction=0.1 but this run has data.val_fraction=0.1", with another max_documents that the files were
    edited. Each names the option that changed and its value to resume with."""
    from types import SimpleNamespace

    from lightning.pytorch.trainer.states import TrainerFn

    from tinylm.checkpoint import CheckpointError

    path = _jsonl(tmp_path / "rows.jsonl", [f"story number {i}: " + "la " * (i % 7) for i in range(60)])
    options = {"corpus": str(path), "tokenizer": "char", "block_size": 8, "cache_dir": str(tmp_path / "cache")}
    run = TinyLMDataModule(**options, streaming=True, max_documents=40)
    _ = run.metas  # prepared, as in a run: its state holds the split settings and the corpus fingerprints
    saved = run.state_dict()
    fitting = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING), world_size=1)
    cases = (({"streaming": False}, "data.streaming=True but this run has data.streaming=False, .*resume with "
                                    "--data.streaming true"),
             ({"streaming": True, "max_documents": 50}, "data.max_documents=40 but this run has data.max_documents=50, "
                                                        ".*--data.max_documents 40"))
    for changed, said in cases:
        dm = TinyLMDataModule(**options, **changed)
        dm.trainer = fitting
        with pytest.raises(CheckpointError, match=said):
            dm.load_state_dict(saved)
    dm = TinyLMDataModule(**options, streaming=True, max_documents=40)
    dm.trainer = fitting
    dm.load_state_dict(saved)  # the same settings resume (not vacuous)


def test_a_streamed_file_rewritten_while_it_is_packed_is_refused(tmp_path, monkeypatch):
    """Catches a streamed local .jsonl rewritten during `prepare` (the same rows in another order: same size, same
    characters) packed and published under the fingerprint of the text it held before, as files read whole are not."""
    from tinylm.data.corpus import CorpusChanged, open_corpus

    path = tmp_path / "rows.jsonl"
    rows = [json.dumps({"text": f"story number {i:02d} of the stream"}) for i in range(60)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    corpus = open_corpus(str(path), cache_dir=tmp_path, streaming=True, max_documents=50)
    tok = build_tokenizer("char", documents=lambda: [path.read_text(encoding="utf-8")])
    routed = pack.routed

    def rewritten_midway(corpus, val_fraction):
        parts = routed(corpus, val_fraction)
        yield next(parts)
        path.write_text("\n".join(reversed(rows)) + "\n", encoding="utf-8")
        yield from parts

    monkeypatch.setattr(pack, "routed", rewritten_midway)
    with pytest.raises(CorpusChanged, match=rf"^corpus file {path} changed while it was read"):
        prepare_dataset(corpus, tok, val_fraction=0.1, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("meta.json"))  # nothing published


def test_a_corpus_file_written_to_while_it_is_packed_is_refused(tmp_path, monkeypatch):
    """Catches a dataset stored under the key of text its file no longer holds: a log appended to while prepare
    packed it (here after the writing pass's first chunk: the change is real, only its timing is arranged) was
    published under the old content's fingerprint, and its shards were left for a resume to build on."""
    from tinylm.data import corpus as corpus_mod
    from tinylm.data.corpus import EOT, CorpusChanged, open_corpus

    monkeypatch.setattr(pack, "SHARD_CHARS", 100)  # a shard every ~5 documents
    monkeypatch.setattr(corpus_mod, "_READ_BYTES", 64)  # several reads of the file
    path = tmp_path / "log.txt"
    path.write_text(EOT.join(f"line {i:02d} of the log" for i in range(40)), encoding="utf-8")
    corpus, cache = open_corpus(str(path), cache_dir=tmp_path), tmp_path / "cache"
    tok = build_tokenizer("char", documents=lambda: [path.read_text(encoding="utf-8")])
    final = dataset_dir_for(corpus, tok, val_fraction=0.1, cache_dir=cache)
    routed, shards = pack.routed, []

    def appended_midway(corpus, val_fraction):
        parts = routed(corpus, val_fraction)
        yield next(parts)  # the writing pass has read its first chunk
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{EOT}line 40 of the log")
        try:
            yield from parts
        finally:
            shards.extend(final.with_name(final.name + ".partial").glob("*.json"))

    monkeypatch.setattr(pack, "routed", appended_midway)
    with pytest.raises(CorpusChanged, match=rf"^corpus file {path} changed while it was read .*; run again when it "
                                            "is no longer written to$"):
        prepare_dataset(corpus, tok, val_fraction=0.1, cache_dir=cache)
    assert len(shards) >= 5  # complete shards of the old text were there when it was refused ...
    assert list(final.parent.iterdir()) == []  # ... and are gone with the rest: no dataset, no .partial, no temp
    monkeypatch.setattr(pack, "routed", routed)
    unchanged = open_corpus(str(path), cache_dir=tmp_path)
    meta = load_meta(prepare_dataset(unchanged, tok, val_fraction=0.1, cache_dir=cache), tok)
    assert meta["corpus_fingerprint"] == unchanged.fingerprint != corpus.fingerprint
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 41 + 1  # the cut counts twice


def test_streamed_files_of_other_columns_are_one_line(tmp_path):
    """Catches streamed train and validation files whose columns differ (a validation row with one key more) ending
    in `datasets`' CastError traceback (the same files read whole: one line)."""
    from tinylm.data.corpus import open_corpus

    train = _jsonl(tmp_path / "t.jsonl", [f"train doc {i}" for i in range(20)])
    val = tmp_path / "v.jsonl"
    val.write_text("".join(json.dumps({"text": f"val doc {i}", "body": "x"}) + "\n" for i in range(5)))
    corpus = open_corpus("hf:json", cache_dir=tmp_path / "cache", streaming=True, max_documents=10,
                         data_files={"train": str(train), "validation": str(val)})
    with pytest.raises(ValueError, match=r"could not read the validation rows of .* as a json dataset \(CastError"):
        list(corpus.documents("validation"))


def test_a_tokenizer_sample_of_streamed_corpora_reads_each_of_them(tmp_path):
    """Catches the tokenizer of a mixture of streamed corpora (their size unknown) learning from the head of the
    mixture: tokenizer_train_chars of the first corpus only, none of the second corpus's text."""
    from tinylm.data.prepare import _sample

    first = _jsonl(tmp_path / "first.jsonl", ["aaaa " * 20] * 100)  # 10,000 characters, more than the sample
    second = _jsonl(tmp_path / "second.jsonl", ["zzzz " * 20] * 100)
    dm = TinyLMDataModule(corpus=[str(first), str(second)], streaming=True, max_documents=90, tokenizer="bpe",
                          vocab_size=263, tokenizer_train_chars=2000, cache_dir=str(tmp_path / "cache"))
    assert dm.corpus.size_bytes is None  # (a stream's size is not known before it is read)
    sample = "".join(_sample(dm.corpus, 2000))
    assert len(sample) == 2000 and sample.count("a") == sample.count("z") == 800  # half of it each
    assert "zz" in dm.tokenizer.decode(dm.tokenizer.encode("zzzz zzzz")) and \
        len(dm.tokenizer.encode(" zzzz")) == 1  # a piece of the second corpus was learnt


def test_a_resume_reading_the_stream_otherwise_is_refused_before_it_is_read_again(run_config, tmp_path, capsys):
    """Catches a resume of a streamed run with another --data.val_fraction (another held-out head), --data.max_documents
    or --data.streaming refused only after the whole stream was read and tokenized again into a second dataset (a hub
    dataset streamed again: hours for a large --data.max_documents), and the held-out head's change said to be "the
    files were edited or replaced". A val_fraction that holds out as many documents resumes (not vacuous)."""
    from helpers import _one_line_error

    from tinylm.cli import main

    path = _jsonl(tmp_path / "rows.jsonl", [f"story number {i}: " + "la " * (i % 7) for i in range(120)])
    config = run_config(data={"corpus": str(path), "streaming": True, "max_documents": 100})  # 10 held out
    main(["fit", "--config", str(config)])
    built = sorted((tmp_path / "cache" / "datasets").iterdir())
    resume = ["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "3"]
    for flags, said in ((["--data.val_fraction", "0.2"], "--data.val_fraction 0.1"),
                        (["--data.max_documents", "80"], "--data.max_documents 100"),
                        (["--data.streaming", "false"], "--data.streaming true")):
        _one_line_error(capsys, [*resume, *flags], f"so the resumed run would draw different data; resume with {said}")
        assert sorted((tmp_path / "cache" / "datasets").iterdir()) == built  # refused before the data was prepared
    main([*resume, "--data.val_fraction", "0.105"])  # int(0.105 x 100) = 10 documents held out, as the run's
    assert sorted((tmp_path / "cache" / "datasets").iterdir()) == built


def test_validating_a_stream_on_another_held_out_count_says_what_it_scores(tmp_path, caplog):
    """Catches `tinylm validate --data.val_fraction` (or `--data.max_documents`) on a streamed run's checkpoint said
    to be "the files were edited or replaced" (the held-out count is part of the stream's fingerprint): a larger
    held-out head scores documents the run trained on, which is what to say; the same count of documents, or the
    first documents of a dataset's own validation split, hold none of them (nothing to warn of)."""
    from types import SimpleNamespace

    from lightning.pytorch.trainer.states import TrainerFn

    rows = _jsonl(tmp_path / "rows.jsonl", [f"story number {i}: " + "la " * (i % 7) for i in range(100)])
    val = _jsonl(tmp_path / "val.jsonl", [f"dart cod {i}" for i in range(50)])
    validating = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.VALIDATING), world_size=1)
    own_split = {"corpus": "hf:json", "data_files": {"train": str(rows), "validation": str(val)}}
    for source, changed, said in (({"corpus": str(rows)}, {"val_fraction": 0.25},  # the first 10 documents
                                   "the checkpoint's run its first 4, and trained on those after them, so 6 of them "
                                   "are text the model trained on"),
                                  ({"corpus": str(rows)}, {"val_fraction": 0.05, "max_documents": 80}, None),  # 4
                                  (own_split, {"val_fraction": 0.25}, None)):
        options = {**source, "streaming": True, "tokenizer": "char", "block_size": 4, "cache_dir": str(tmp_path / "c")}
        run = TinyLMDataModule(**options, max_documents=40)  # validation: the first 4 documents
        _ = run.metas
        saved = run.state_dict()
        dm = TinyLMDataModule(**{"max_documents": 40, **options, **changed})
        dm.trainer = validating
        caplog.clear()
        dm.load_state_dict(saved)
        warned = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
        assert "edited" not in warned
        assert (said in warned) if said else not warned, warned
        assert dm.metas[0]["corpus_fingerprint"] != saved["corpus_fingerprints"][0]  # not vacuous: other documents


def test_a_dataset_that_save_to_disk_wrote_streams_as_it_reads_whole(tmp_path):
    """Catches `hf:DIR --data.streaming true` of one Dataset that `save_to_disk` wrote ending in `datasets`' "Please
    use `load_from_disk` instead", which no option reaches (read whole, tinylm loads it so): its rows stream, with a
    column of another name, validation its held-out head."""
    import datasets

    docs = [f"row {i}: " + "ab " * (i % 5) for i in range(30)]
    datasets.Dataset.from_dict({"content": docs}).save_to_disk(str(tmp_path / "saved"))
    dm = TinyLMDataModule(corpus=f"hf:{tmp_path / 'saved'}", text_column="content", streaming=True, max_documents=20,
                          tokenizer="char", cache_dir=str(tmp_path / "cache"))
    meta, tok = dm.meta, dm.tokenizer
    assert meta["settings"]["val_source"] == "held-out head"
    assert _ids(dm.dataset_dir / "val.bin", meta) == _expected(tok, docs[:2])  # 0.1 x 20 documents
    assert _ids(dm.dataset_dir / "train.bin", meta) == _expected(tok, docs[2:22])
