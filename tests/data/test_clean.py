"""`data.clean`: quality rules, exact and near-duplicate removal, decontamination, the report, and the dataset key."""

import json
import random

import numpy as np
import pytest

from tinylm.cli import main
from tinylm.data import TinyLMDataModule
from tinylm.data.clean import (
    RULES,
    CleanOptions,
    clean_corpora,
    duplicate_ngram_share,
    quality_rule,
)
from tinylm.data.corpus import open_corpus
from tinylm.tokenize.patterns import EOT

VOCAB = [f"w{i}" for i in range(3000)]


def _doc(rng: random.Random, n_words: int = 300) -> str:
    """A document of random words, cut into lines of 12 words ending in a full stop."""
    words = [rng.choice(VOCAB) for _ in range(n_words)]
    return "\n".join(" ".join(words[i : i + 12]) + "." for i in range(0, n_words, 12))


def _change(rng: random.Random, doc: str, n: int) -> str:
    """`doc` with n of its words (at distinct places) replaced by words outside VOCAB."""
    words = doc.split(" ")
    for i in rng.sample(range(len(words)), n):
        words[i] = f"x{rng.randrange(10**9)}"
    return " ".join(words)


def _corpus_file(path, docs):
    path.write_text(EOT.join(docs), encoding="utf-8")
    return str(path)


def _decisions(tmp_path, docs, options, val_fraction=0.1):
    """The rule (None: kept) of each document of a text corpus holding `docs`, as the cleaner decided it."""
    corpus = open_corpus(_corpus_file(tmp_path / "docs.txt", docs), cache_dir=tmp_path / "cache")
    cleaned = clean_corpora([corpus], options, val_fraction=val_fraction)[0]
    kept = list(cleaned.documents("train"))
    mask = cleaned.cleaner.masks[("train", 0)]
    assert len(mask) == len(docs) and len(kept) == sum(m == 0 for m in mask)
    return [None if m == 0 else RULES[m - 1] for m in mask], cleaned


def test_near_duplicates_are_found_with_known_recall_and_precision(tmp_path):
    """Catches a near-duplicate step that misses copies with a few words changed (recall) or drops distinct
    documents, or copies changed beyond the threshold (precision), measured against the injected truth."""
    rng = random.Random(0)
    originals = [_doc(rng) for _ in range(150)]
    docs, truth = list(originals), [False] * len(originals)
    for changed, copies in ((1, 40), (2, 40), (90, 30)):  # of 300 words: Jaccard ~0.97, ~0.94, ~0.07 (5-grams)
        for src in rng.sample(originals, copies):
            docs.append(_change(rng, src, changed))
            truth.append(changed <= 2)
    order = list(range(len(docs)))
    rng.shuffle(order[150:])  # the copies after every original: the later of two is the one dropped
    rules, _ = _decisions(tmp_path, [docs[i] for i in order], CleanOptions(near=True))
    caught = [rule == "near" for rule in rules]
    truth = [truth[i] for i in order]
    true_pos = sum(c and t for c, t in zip(caught, truth))
    recall, precision = true_pos / sum(truth), true_pos / max(1, sum(caught))
    assert sum(truth) == 80 and recall >= 0.95 and precision == 1.0, (recall, precision)


def test_documents_shorter_than_a_shingle_are_near_duplicates_only_of_their_own_words(tmp_path):
    """Catches a document of fewer words than `shingle_words` having no shingle at all: every such MinHash is the
    same (of nothing), so near-dedup dropped every short document after the first (headlines, one-line answers)."""
    rng = random.Random(2)
    docs = [_doc(rng, 60) for _ in range(5)] + ["Alpha beta gamma.", "Delta epsilon.", "Zeta eta theta iota.",
                                                 "Delta  epsilon."]
    rules, _ = _decisions(tmp_path, docs, CleanOptions(near=True), val_fraction=0.01)
    assert rules == [None] * 8 + ["near"], rules


def test_exact_duplicates_ignore_case_and_whitespace_only(tmp_path):
    """Catches exact de-duplication that misses a copy re-cased or re-wrapped, or drops a copy with one word
    changed (a near duplicate, not an exact one), or drops the first copy instead of the later."""
    rng = random.Random(1)
    docs = [_doc(rng, 60) for _ in range(20)]
    copies = [docs[3].upper(), "  " + docs[5].replace("\n", "\n\n  "), _change(rng, docs[7], 1)]
    rules, _ = _decisions(tmp_path, docs + copies, CleanOptions(exact=True))
    assert rules == [None] * 20 + ["exact", "exact", None]


GOOD = "The cat sat on the mat.\nIt was a warm day, and the sun was out.\nThen the dog came home!"


@pytest.mark.parametrize("options, doc, rule", [
    ({"min_words": 5}, "Too short here.", "min_words"),
    ({"min_words": 3}, "Just enough here.", None),
    ({"max_words": 10}, GOOD, "max_words"),
    ({"max_words": 30}, GOOD, None),
    ({"min_mean_word_length": 3}, "a b c d e f g h i j.", "min_mean_word_length"),
    ({"max_mean_word_length": 10}, "Pneumonoultramicroscopicsilicovolcanoconiosis is long.", "max_mean_word_length"),
    ({"max_mean_word_length": 10}, GOOD, None),
    ({"max_symbol_ratio": 0.1}, "#tag #more and #even more words here...", "max_symbol_ratio"),
    ({"max_symbol_ratio": 0.1}, "one #tag among twenty words " + "word " * 15 + ".", None),
    ({"min_punctuated_lines": 0.5}, "menu\nhome\nabout us\ncontact.", "min_punctuated_lines"),
    ({"min_punctuated_lines": 0.5}, GOOD, None),
    ({"max_duplicate_lines": 0.3}, "buy now!\nbuy now!\nbuy now!\nreal text here.", "max_duplicate_lines"),
    ({"max_duplicate_lines": 0.3}, GOOD + "\nThe cat sat on the mat.", None),  # 1 of 4 lines repeats: 0.25
    ({"max_duplicate_lines": 0.25}, GOOD + "\nThe cat sat on the mat.", None),  # at the threshold: kept
    ({"max_symbol_ratio": 0.5}, "Wait\u2026 what\u2026 no\u2026 really\u2026 yes.", "max_symbol_ratio"),  # "…" too
    ({"max_duplicate_ngrams": 0.15}, "a b c d e " * 6 + "and then something else entirely.", "max_duplicate_ngrams"),
    ({"max_duplicate_ngrams": 0.15}, GOOD, None),
])
def test_each_quality_rule_keeps_and_drops_what_it_says(options, doc, rule):
    """Catches a rule compared the wrong way round, on the wrong quantity, or dropping a document that passes."""
    assert quality_rule(doc, CleanOptions(**options)) == rule


@pytest.mark.parametrize("rule", ["max_symbol_ratio", "max_duplicate_lines", "max_duplicate_ngrams",
                                  "min_punctuated_lines"])
def test_a_threshold_of_zero_is_a_rule_turned_on(rule):
    """Catches a threshold of 0, the strictest, turning its rule off (`0 in (None, False)` is true): `prepare
    --data.clean.max_duplicate_lines 0` kept every document, said nothing and reused the uncleaned dataset."""
    options = CleanOptions(**{rule: 0})
    assert options.active and options.rules == [rule] and options.key() == {rule: 0}


def test_duplicate_ngram_share_by_hand():
    """Catches a share counted over n-grams instead of characters, or counting a word twice."""
    share = lambda text: duplicate_ngram_share(text.split())
    assert share("a b c d e a b c d e") == 1.0
    assert share("a b c d e f") == 0.0
    assert share("aa b c d e aa b c d e zzzz") == pytest.approx(12 / 16)  # 6 + 6 of the 16 characters repeat


def test_prepare_reports_what_it_removed_and_keys_the_dataset_by_the_options(tmp_path, capsys):
    """Catches a report that is not written or not printed, options missing from meta.json, and another option
    reusing a dataset made with other options (or without cleaning)."""
    rng = random.Random(2)
    docs = [_doc(rng, 60) for _ in range(40)]
    corpus = _corpus_file(tmp_path / "c.txt", docs + docs[:10] + ["too short."] * 3)
    common = ["prepare", "--data.corpus", corpus, "--data.tokenizer", "char", "--data.block_size", "16",
              "--data.cache_dir", str(tmp_path / "cache")]
    main(common + ["--data.clean.exact", "true", "--data.clean.min_words", "5"])
    out = capsys.readouterr().out
    assert "removed by exact      10 documents" in out and "removed by min_words  3 documents" in out
    (folder,) = [p for p in (tmp_path / "cache" / "datasets").iterdir()]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["clean"]["options"] == {"exact": True, "min_words": 5}
    assert meta["clean"]["removed"]["exact"]["documents"] == 10
    report = json.loads((folder / "clean.json").read_text())
    assert report["removed"]["min_words"]["examples"] == ["too short."] * 3
    assert report["kept"]["documents"] == 40
    main(common + ["--data.clean.exact", "true"])
    main(common)
    assert len(list((tmp_path / "cache" / "datasets").iterdir())) == 3  # one dataset per setting


@pytest.mark.parametrize("flag, value, says", [
    ("near_threshold", "1.5", "data.clean.near_threshold must be in (0, 1], got 1.5"),
    ("shingle_words", "0", "data.clean.shingle_words must be a whole number in [1, 64], got 0"),
    ("min_punctuated_lines", "-0.1", "data.clean.min_punctuated_lines must be in [0, 1], got -0.1"),
])
def test_bad_thresholds_end_in_one_line(tmp_path, small_data, capsys, flag, value, says):
    """Catches an out-of-range threshold accepted (a filter that drops everything or nothing) or ending in a
    traceback."""
    with pytest.raises(SystemExit) as e:
        main(["prepare", "--data.corpus", str(small_data / "stories.txt"), "--data.cache_dir", str(tmp_path),
              f"--data.clean.{flag}", value])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


def test_a_corpus_cleaned_away_is_named_with_the_rules_that_did_it(tmp_path):
    """Catches cleaning that removes every document ending in "corpus is empty (no text in it)", which blames the
    corpus for what the rules did."""
    with pytest.raises(ValueError, match=r"data.clean removed every document of corpus .* \(min_words 3\)"):
        TinyLMDataModule(corpus=_corpus_file(tmp_path / "c.txt", ["a b", "c d", "e f"]), tokenizer="char",
                         cache_dir=str(tmp_path / "cache"), clean=CleanOptions(min_words=5)).prepare_data()


def test_min_words_above_max_words_is_refused():
    """Catches a minimum above its maximum (words, or mean word length) that no document can pass being found only
    after a whole cleaning pass, as "data.clean removed every document"."""
    with pytest.raises(ValueError, match="min_words 50 is above data.clean.max_words 10"):
        CleanOptions(min_words=50, max_words=10)
    with pytest.raises(ValueError, match="min_mean_word_length 5.0 is above data.clean.max_mean_word_length 3.0: no "
                                         "document could pass; lower min_mean_word_length"):
        CleanOptions(min_mean_word_length=5.0, max_mean_word_length=3.0)
    CleanOptions(min_mean_word_length=3.0, max_mean_word_length=3.0)  # equal: a word length of exactly 3 passes


def test_decontamination_of_a_tail_split_leaves_copies_out_of_validation(tmp_path):
    """Catches decontamination that lets a validation document near-duplicate a training one, moves the cut, or
    removes anything when near-duplicate removal is off (train keeps its own near-duplicates)."""
    rng = random.Random(3)
    docs = [_doc(rng, 120) for _ in range(30)]
    docs += [_change(rng, docs[0], 1), _change(rng, docs[1], 1)]  # near copies inside train
    docs += [_doc(rng, 120) for _ in range(2)] + [_change(rng, docs[2], 1)]  # tail: 2 new, 1 copy of a train doc
    dm = TinyLMDataModule(corpus=_corpus_file(tmp_path / "c.txt", docs), tokenizer="char", block_size=16,
                          val_fraction=0.08, cache_dir=str(tmp_path / "cache"), clean=CleanOptions(decontaminate=True))
    meta, tok = dm.meta, dm.tokenizer
    val = np.fromfile(dm.dataset_dir / "val.bin", dtype=meta["dtype"]).tolist()
    text = tok.decode([i for i in val if i != tok.eos_id])
    assert docs[-2] in text and docs[-3][-300:] in text and docs[-1] not in text  # docs[-3]: cut by the split
    assert meta["clean"]["removed"]["decontaminate"]["documents"] == 1
    assert meta["splits"]["train"]["documents"] == 32 + 1  # every train document, and the straddler's head
    plain = TinyLMDataModule(corpus=str(tmp_path / "c.txt"), tokenizer="char", block_size=16, val_fraction=0.08,
                             cache_dir=str(tmp_path / "cache"))
    assert plain.meta["splits"]["train"] == meta["splits"]["train"]  # the cut did not move


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return str(path)


def test_streamed_corpus_is_cleaned_against_its_validation_split(tmp_path):
    """Catches cleaning that breaks `data.streaming`, keeps a training row near-duplicating a validation row, or
    keeps an exact duplicate row of the stream."""
    rng = random.Random(4)
    val = [_doc(rng, 80) for _ in range(5)]
    train = [_doc(rng, 80) for _ in range(20)]
    rows = train[:10] + [_change(rng, val[0], 1), train[3].upper()] + train[10:]
    dm = TinyLMDataModule(corpus="hf:json", streaming=True, tokenizer="char", block_size=16,
                          data_files={"train": _jsonl(tmp_path / "t.jsonl", rows),
                                      "validation": _jsonl(tmp_path / "v.jsonl", val)},
                          cache_dir=str(tmp_path / "cache"), clean=CleanOptions(exact=True, decontaminate=True))
    meta, tok = dm.meta, dm.tokenizer
    ids = np.fromfile(dm.dataset_dir / "train.bin", dtype=meta["dtype"]).tolist()
    assert ids == [i for d in train for i in tok.encode(d) + [tok.eos_id]]
    assert {k: v["documents"] for k, v in meta["clean"]["removed"].items()} == {"exact": 1, "decontaminate": 1}



def test_decontaminating_a_corpus_with_its_own_validation_split_does_not_key_it_by_val_fraction(tmp_path):
    """Catches `data.val_fraction`, which does nothing for a dataset with its own validation split (tinylm says so),
    still keying its cleaned text under `decontaminate`: another val_fraction trained another tokenizer, packed
    another dataset of the same tokens, and a resume with it was refused as text "edited or replaced"."""
    rng = random.Random(6)
    val = [_doc(rng, 120) for _ in range(5)]
    train = [_doc(rng, 120) for _ in range(20)] + [_change(rng, val[0], 1)]
    files = {"train": _jsonl(tmp_path / "t.jsonl", train), "validation": _jsonl(tmp_path / "v.jsonl", val)}
    dms = [TinyLMDataModule(corpus="hf:json", data_files=files, val_fraction=fraction, tokenizer="char",
                            block_size=16, cache_dir=str(tmp_path / "cache"), clean=CleanOptions(decontaminate=True))
           for fraction in (0.1, 0.3)]
    dms[0].prepare_data()
    assert dms[0].meta["clean"]["removed"]["decontaminate"]["documents"] == 1  # (not vacuous: it cleaned)
    assert dms[1].corpora[0].fingerprint == dms[0].corpora[0].fingerprint
    assert dms[1].dataset_dir == dms[0].dataset_dir  # the dataset made already, not another
    tail = [TinyLMDataModule(corpus=_corpus_file(tmp_path / "c.txt", train), val_fraction=fraction, tokenizer="char",
                             block_size=16, cache_dir=str(tmp_path / "cache"), clean=CleanOptions(decontaminate=True))
            for fraction in (0.1, 0.3)]
    assert tail[0].corpora[0].fingerprint != tail[1].corpora[0].fingerprint  # a tail's cut decides what is kept

def test_duplicates_are_found_across_the_corpora_of_a_mixture(tmp_path):
    """Catches a mixture whose corpora are de-duplicated each on its own (the same document trained on twice),
    and a corpus's dataset reused when another corpus of the mixture changed what it removes."""
    rng = random.Random(5)
    a = [_doc(rng, 60) for _ in range(20)]
    b = [_doc(rng, 60) for _ in range(20)] + a[:4]
    files = [_corpus_file(tmp_path / "a.txt", a), _corpus_file(tmp_path / "b.txt", b)]
    dm = TinyLMDataModule(corpus=files, tokenizer="char", block_size=16, cache_dir=str(tmp_path / "cache"),
                          clean=CleanOptions(exact=True))
    assert [m["clean"]["removed"]["exact"]["documents"] for m in dm.metas] == [0, 4]
    _corpus_file(tmp_path / "a.txt", a[:2])  # b's copies of a[2:4] are no longer duplicates
    dm = TinyLMDataModule(corpus=files, tokenizer="char", block_size=16, cache_dir=str(tmp_path / "cache"),
                          clean=CleanOptions(exact=True))
    assert [m["clean"]["removed"]["exact"]["documents"] for m in dm.metas] == [0, 2]


def test_a_pass_stopped_early_is_undone(tmp_path):
    """Catches a reader that stops early (a tokenizer's sample, an emptiness check) leaving its documents in the
    index, so that the next pass drops every one of them as a duplicate of itself."""
    rng = random.Random(6)
    docs = [_doc(rng, 60) for _ in range(10)]
    corpus = open_corpus(_corpus_file(tmp_path / "c.txt", docs + docs[:2]), cache_dir=tmp_path)
    cleaned = clean_corpora([corpus], CleanOptions(exact=True, near=True), val_fraction=0.1)[0]
    stream = cleaned.documents("train")
    assert [next(stream) for _ in range(5)] == docs[:5]
    del stream
    assert list(cleaned.documents("train")) == docs
    assert list(cleaned.documents("train")) == docs  # replayed


def test_resume_refuses_another_clean_option_and_validate_follows_the_run(run_config, tmp_path, capsys):
    """Catches a resumed run that silently trains on data cleaned otherwise than its checkpoint's, and `validate`
    evaluating on other data than the run's cleaned split, or overriding a `--data.clean.*` it was given."""
    config = str(run_config())
    main(["fit", "--config", config, "--data.clean.exact", "true"])
    datasets = tmp_path / "cache" / "datasets"
    assert len(list(datasets.iterdir())) == 1
    main(["validate", "--config", config, "--ckpt_path", "last"])  # the run's options, from the checkpoint
    assert len(list(datasets.iterdir())) == 1
    main(["validate", "--config", config, "--ckpt_path", "last", "--data.clean.exact", "false"])  # the raw text
    assert len(list(datasets.iterdir())) == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", config, "--ckpt_path", "last", "--trainer.max_steps", "4",
              "--data.clean.exact", "true", "--data.clean.min_words", "3"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "data.clean.min_words off but this run has data.clean.min_words=3" in err and "Traceback" not in err, err


@pytest.mark.parametrize("command", ["prepare", "fit"])
def test_the_options_are_in_help(command, capsys):
    """Catches the data.clean section missing from --help (a nested dataclass turned Optional shows only
    `--data.clean CLEAN`, its options hidden behind another flag)."""
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for option in ("exact", "near", "near_threshold", "shingle_words", "decontaminate", "max_duplicate_ngrams"):
        assert f"--data.clean.{option} " in out
    assert "Gopher: 0.15" in out
