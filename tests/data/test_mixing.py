"""Mixing corpora: `data.corpus` as a list with `data.weights`; windows drawn in proportion, resumable, per-corpus
val."""

import csv
import unicodedata

import numpy as np
import pytest

from tinylm.cli import main
from tinylm.data import TinyLMDataModule
from tinylm.data.loader import MixedTrainBatches


@pytest.fixture
def two_corpora(tmp_path):
    """Corpus A uses only the letters a-e, corpus B only v-z: every window shows where it came from."""
    rng = np.random.default_rng(0)
    paths = []
    for name, letters in (("a.txt", "abcde"), ("b.txt", "vwxyz")):
        path = tmp_path / name
        path.write_text("".join(rng.choice(list(letters), size=20_000)), encoding="utf-8")
        paths.append(str(path))
    return paths


def _dm(tmp_path, corpora, **kw):
    return TinyLMDataModule(corpus=corpora, block_size=16, batch_size=8, cache_dir=str(tmp_path / "cache"), **kw)


def _rows_from_a(dm, x) -> np.ndarray:
    a_ids = [dm.tokenizer.encode(c)[0] for c in "abcde"]
    from_a = np.isin(x.numpy(), a_ids)
    assert (from_a.all(axis=1) | ~from_a.any(axis=1)).all()  # no window mixes the two corpora
    return from_a.all(axis=1)


def test_windows_are_drawn_in_proportion_to_the_weights(two_corpora, tmp_path):
    """Catches weights that are ignored, inverted or applied per batch instead of per window: over 500 batches of
    8 windows, the share of windows from corpus A must be its weight 0.7 (3 standard deviations: 0.015)."""
    dm = _dm(tmp_path, two_corpora, weights=[7, 3])  # normalised: 0.7, 0.3
    dm.prepare_data()
    loader = dm.train_dataloader()
    assert isinstance(loader.dataset, MixedTrainBatches)
    share = np.mean([_rows_from_a(dm, loader.dataset[k][0]).mean() for k in range(500)])
    assert abs(share - 0.7) < 0.015
    equal = _dm(tmp_path, two_corpora).train_dataloader().dataset  # no weights: by train tokens, here 50/50
    assert abs(np.mean([(equal.sources(k) == 0).mean() for k in range(500)]) - 0.5) < 0.02


def test_mixed_batches_are_a_pure_function_of_seed_batch_and_rank(two_corpora, tmp_path):
    """Catches a mixture that breaks exact or elastic resume: batch k must not depend on what was drawn before,
    and 1 device with batch 2B must draw the windows of 2 devices with batch B."""
    dm = _dm(tmp_path, two_corpora, weights=[0.5, 0.5])
    dm.prepare_data()
    whole = dm.train_dataloader().dataset
    fresh = dm.train_dataloader().dataset
    assert all((whole[k][0] == fresh[k][0]).all() for k in (3, 0, 7))  # any order, same batches
    dm.batch_size = 4
    ranks = []
    for r in range(2):
        dm.trainer = type("T", (), {"global_rank": r, "world_size": 2})()  # what train_dataloader reads
        ranks.append(dm.train_dataloader().dataset)
    for k in range(5):
        x = np.concatenate([ranks[0][k][0].numpy(), ranks[1][k][0].numpy()])
        assert (x == whole[k][0].numpy()).all()
    assert len({tuple(whole.sources(k)) for k in range(5)}) > 1  # the sources really vary


def test_fit_on_a_mixture_logs_val_loss_per_corpus(run_config, two_corpora, tmp_path, capsys):
    """Catches a mixture whose validation reports only one corpus, or drops the overall val/loss, and `tinylm
    validate --data.corpus ONE` of its checkpoint refused for the run's two data.weights, which it never passed."""
    config = run_config(data={"corpus": two_corpora, "weights": [0.5, 0.5], "block_size": 16, "batch_size": 2,
                              "val_batches": 2, "cache_dir": str(tmp_path / "cache"), "tokenizer": "char"})
    main(["fit", "--config", str(config)])
    with open(tmp_path / "runs" / "tiny" / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/loss")]
    assert len(rows) == 1 and rows[0]["val/loss/a.txt"] and rows[0]["val/loss/b.txt"]
    per = [float(rows[0][f"val/loss/{n}"]) for n in ("a.txt", "b.txt")]
    assert min(per) <= float(rows[0]["val/loss"]) <= max(per)  # the overall loss lies between the two
    capsys.readouterr()
    main(["validate", "--ckpt_path", str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"),
          "--data.corpus", two_corpora[0]])
    out = capsys.readouterr().out
    assert "val/loss " in out and "val/loss/a.txt" not in out  # one corpus: no per-corpus losses


def test_resume_takes_the_same_shares_written_otherwise(run_config, two_corpora, tmp_path, capsys):
    """Catches a resume with data.weights [1, 1] refused as other data after a run with [0.5, 0.5] (the same
    shares), while [2, 1] is still refused."""
    config = run_config(data={"corpus": two_corpora, "weights": [0.5, 0.5], "block_size": 16, "batch_size": 2,
                              "cache_dir": str(tmp_path / "cache"), "tokenizer": "char"})
    main(["fit", "--config", str(config)])
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "3", "--data.weights",
          "[1, 1]"])
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "4", "--data.weights",
              "[2, 1]"])
    assert "data.weights=[2" in capsys.readouterr().err


def test_the_start_line_counts_passes_over_each_weighted_corpus(run_config, two_corpora, tmp_path, caplog):
    """Catches a mixture whose data.weights favour a small corpus reported by its passes over all the text together
    (0.1 passes, while a step read the small one more than once over) and not warned about: weights [1, 9] over
    a.txt (18,000 train tokens) and a 2,000-character b.txt (1,800) with steps of 2,048 tokens read 0.9 x 2,048 =
    1,843 tokens of b.txt a step, 1.02 passes; a.txt 0.0114."""
    (tmp_path / "b.txt").write_text((tmp_path / "b.txt").read_text()[:2000])
    config = run_config(data={"corpus": two_corpora, "weights": [1, 9], "block_size": 16, "batch_size": 128,
                              "val_batches": 1, "cache_dir": str(tmp_path / "cache"), "tokenizer": "char"},
                        trainer={"max_steps": 1, "val_check_interval": 1})
    with pytest.warns(UserWarning, match=r"one optimizer step reads 1,843 tokens of b.txt \(its data.weights share "
                                         r"0.9\) but its training split holds 1,800: every step goes over it 1.02 "
                                         r"times; use a smaller weight for it"):
        main(["fit", "--config", str(config)])
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("global batch:"))
    assert "read 2,048 tokens: 0.103 passes over the training split (19,800 tokens)" in line, line
    assert line.endswith("(by data.weights: a.txt 0.0114 passes of 18,000, b.txt 1.02 passes of 1,800)"), line


def test_bad_weights_name_the_fix(two_corpora, tmp_path):
    """Catches weights that do not match the corpora being accepted (and silently mis-mixed)."""
    with pytest.raises(ValueError, match=r"data.weights has 3 entries but data.corpus names 2 corpora"):
        _dm(tmp_path, two_corpora, weights=[1, 1, 1])
    with pytest.raises(ValueError, match=r"positive finite"):
        _dm(tmp_path, two_corpora, weights=[1, 0])
    with pytest.raises(ValueError, match=r"data.weights sum to more than the largest float .*e.g. \[1, 3\]"):
        _dm(tmp_path, two_corpora, weights=[1e308, 1e308])  # each finite: the shares were NaN (mixture 0.000, 0.000)
    with pytest.raises(ValueError, match=r"empty list"):
        _dm(tmp_path, [])


def test_per_corpus_val_losses_are_each_corpus_own(tmp_path):
    """Catches val/loss/NAME reporting the overall loss (or another corpus's) instead of its own corpus's: the
    two per-corpus losses must differ, each must be the loss over that corpus's validation windows alone, and the
    overall val/loss their token-weighted mean (here 125 windows of A to 50 of B)."""
    import lightning as L
    import torch
    import torch.nn.functional as F

    from tinylm.train.module import TinyLM

    rng = np.random.default_rng(0)
    corpora = []
    for name, letters, size in (("a.txt", "abcde", 20_000), ("b.txt", "vwxyz", 8_000)):
        path = tmp_path / name
        path.write_text("".join(rng.choice(list(letters), size=size)), encoding="utf-8")
        corpora.append(str(path))
    dm = _dm(tmp_path, corpora)
    torch.manual_seed(0)
    module = TinyLM(vocab_size=dm.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=32, pad_vocab_multiple=1)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(module, datamodule=dm, verbose=False)
    got = {k: v.item() for k, v in trainer.callback_metrics.items()}
    by_hand, tokens = {}, {}
    module.eval()
    with torch.no_grad():
        for name, loader in zip(("a.txt", "b.txt"), dm.val_dataloader()):
            nats = [F.cross_entropy(module(x).flatten(0, 1), y.flatten(), reduction="sum").item() for x, y in loader]
            tokens[name] = sum(y.numel() for _, y in loader)
            by_hand[name] = sum(nats) / tokens[name]
    assert tokens == {"a.txt": 125 * 16, "b.txt": 50 * 16}  # 2,001 and 801 val tokens (EOS at the end)
    for name in ("a.txt", "b.txt"):
        assert got[f"val/loss/{name}"] == pytest.approx(by_hand[name], rel=1e-5), name
    assert abs(got["val/loss/a.txt"] - got["val/loss/b.txt"]) > 1e-3
    weighted = sum(by_hand[n] * tokens[n] for n in tokens) / sum(tokens.values())
    assert got["val/loss"] == pytest.approx(weighted, rel=1e-5)


def test_an_empty_corpus_of_a_mixture_is_refused_before_the_tokenizer_trains(two_corpora, tmp_path):
    """Catches an empty file in a mixture being found only when its dataset is packed, after the tokenizer shared by
    the mixture had learnt from the other corpora (minutes at scale, for a run that cannot start)."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    dm = _dm(tmp_path, [two_corpora[0], str(empty), two_corpora[1]], tokenizer="scratch-bpe", vocab_size=300)
    with pytest.raises(ValueError, match=r"corpus '.*empty\.txt' is empty \(no text in it\)"):
        _ = dm.tokenizer
    assert not (tmp_path / "cache" / "tokenizers").exists()  # nothing was trained


def test_val_names_are_unique_when_a_numbered_name_is_another_corpus_name(tmp_path):
    """Catches a/x.txt, b/x.txt and a file x.txt_1 logged under two names: b/x.txt, numbered x.txt_1, shared its
    val/loss/NAME with the file x.txt_1, and the run logged the mean of their two losses (one corpus's loss lost)."""
    paths = []
    for rel in ("a/x.txt", "b/x.txt", "x.txt_1"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(f"text of {rel} " * 50, encoding="utf-8")
        paths.append(str(tmp_path / rel))
    names = _dm(tmp_path, paths).val_names
    assert len(set(names)) == 3, names
    assert names[2] == "x.txt_1" and names[0] == "x.txt_0"  # a name that is not repeated keeps its own


def test_corpora_named_in_other_scripts_keep_their_names(tmp_path):
    """Catches théâtre.txt, 日本語.txt and 中文.txt logged as val/loss/th_tre.txt, val/loss/.txt_1 and val/loss/.txt_2
    (every letter outside ASCII dropped: two corpora told apart only by their place in the list), and a name saved
    decomposed (NFD, as macOS writes é) logged as another name than the same name composed."""
    names = ["théâtre.txt", "日本語.txt", "中文.txt", unicodedata.normalize("NFD", "café.txt")]
    for name in names:
        (tmp_path / name).write_text(f"text of {name} " * 50, encoding="utf-8")
    dm = _dm(tmp_path, [str(tmp_path / name) for name in names])
    assert dm.val_names == ["théâtre.txt", "日本語.txt", "中文.txt", "café.txt"]


def test_corpora_named_in_scripts_with_vowel_signs_keep_their_names(tmp_path):
    """Catches हिन्दी.txt, தமிழ்.txt and น้ำ.txt logged as val/loss/ह_न_द_.txt, val/loss/தம_ழ_.txt and val/loss/น_ำ.txt:
    their vowel signs and tone marks (Unicode marks, not letters to `\\w`) became `_`, though the docs say letters of
    any script are kept."""
    names = ["हिन्दी.txt", "தமிழ்.txt", "น้ำ.txt", "a__b.txt"]
    for name in names:
        (tmp_path / name).write_text(f"text of {name} " * 50, encoding="utf-8")
    assert _dm(tmp_path, [str(tmp_path / name) for name in names]).val_names == names


def test_a_glob_of_a_mixture_is_named_by_its_folder(tmp_path):
    """Catches `[en/*.txt, de/*.txt]` logged as val/loss/.txt_0 and val/loss/.txt_1 (a glob's name is its pattern,
    whose `*` the metric name drops): each is named by its folder, as a folder corpus is."""
    for lang in ("en", "de"):
        (tmp_path / lang / "deep").mkdir(parents=True)
        (tmp_path / lang / "deep" / "p.txt").write_text(f"{lang} text " * 50, encoding="utf-8")
    dm = _dm(tmp_path, [str(tmp_path / "en" / "*" / "*.txt"), str(tmp_path / "de" / "deep" / "*.txt")])
    assert dm.val_names == ["en", "deep"]
    (tmp_path / "notes[1].txt").write_text("a file, not a pattern " * 20, encoding="utf-8")
    assert _dm(tmp_path, [str(tmp_path / "notes[1].txt"), str(tmp_path / "en")]).val_names == ["notes_1_.txt", "en"]
