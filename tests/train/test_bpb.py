"""val/bpb: the nats of the tokens actually evaluated over the UTF-8 bytes those tokens stand for."""

import math
import string

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from tinylm.data import TinyLMDataModule
from tinylm.tokenize import EOT, build_tokenizer
from tinylm.train.module import TinyLM


def test_token_byte_lengths_are_utf8_bytes_and_zero_for_specials(small_data):
    """Catches a byte table that counts characters instead of bytes, or counts the EOS as text."""
    text = (small_data / "german.txt").read_text(encoding="utf-8")
    for spec in ("char", "bpe", "scratch-bpe"):
        tok = build_tokenizer(spec, vocab_size=300, documents=lambda: [text[:3000], text[3000:6000]])
        lengths = tok.token_byte_lengths()
        ids = tok.encode(text[:500])
        assert sum(lengths[i] for i in ids) == len(text[:500].encode("utf-8")), spec
        if tok.eos_id is not None:
            assert lengths[tok.eos_id] == 0
        assert max(lengths) > 1  # guard: multi-byte tokens exist (umlauts, merges)


def _validated(tmp_path, corpus, tokenizer: str, *, block_size: int, val_batches: int | None, n_layer: int):
    """(data module, model, val/bpb) of a fresh tiny model validated on ``corpus`` (30 % held out, batches of 4)."""
    dm = TinyLMDataModule(corpus=str(corpus), tokenizer=tokenizer, block_size=block_size, batch_size=4,
                          val_batches=val_batches, val_fraction=0.3, cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    dm.setup("validate")
    torch.manual_seed(0)
    module = TinyLM(vocab_size=dm.vocab_size, block_size=block_size, eos_id=dm.eos_id, n_layer=n_layer, n_head=2,
                    n_embd=32, decay_steps=10)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    return dm, module, trainer.validate(module, datamodule=dm, verbose=False)[0]["val/bpb"]


def test_val_bpb_divides_by_the_bytes_evaluated(tmp_path):
    """Catches val/bpb using the whole split's bytes per token when data.val_batches evaluates only part of it
    (+0.36 % on a BPE model; any tokenizer whose tokens vary in bytes shows it), and counting the EOS between
    documents as text."""
    corpus = tmp_path / "docs.txt"  # short documents with 1-, 2- and 3-byte characters
    docs = ["Grüße aus Köln, schön war's!", "Ein Bär aß zwölf Äpfel für 3 €.", "Plain ASCII text here."]
    corpus.write_text(EOT.join(docs[i % 3] * (1 + i % 2) for i in range(60)), encoding="utf-8")
    dm, module, bpb = _validated(tmp_path, corpus, "char", block_size=64, val_batches=1, n_layer=2)

    # by hand: the one evaluated batch, its targets' text (EOS excluded) and their nats
    x, y = next(iter(dm.val_dataloader()))
    tok = dm.tokenizer
    assert (y == tok.eos_id).any()  # guard: an EOS sits among the evaluated targets
    with torch.no_grad():
        logits = module(x)
        nats = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                               reduction="none")
    text = y.reshape(-1) != tok.eos_id
    nbytes = sum(len(tok.decode([i]).encode("utf-8")) for i in y.reshape(-1)[text].tolist() if EOT != tok.decode([i]))
    # (a char tokenizer, so decoding token by token is exact; its characters are 1-3 UTF-8 bytes each)
    expected = nats[text].sum().item() / math.log(2) / nbytes
    assert bpb == pytest.approx(expected, rel=1e-5)
    split_bytes_per_token = dm.meta["splits"]["val"]["bytes"] / dm.meta["splits"]["val"]["tokens"]
    old_formula = nats.mean().item() / math.log(2) / split_bytes_per_token
    assert abs(old_formula - expected) / expected > 1e-3  # guard: the two formulas differ on this data


def test_validation_sums_keep_their_precision_under_bf16_true(tmp_path, small_data):
    """Catches --trainer.precision bf16-true converting the validation sums to bf16 with the model: past ~256x its
    increment a bf16 sum stops growing, so val/loss, val/ppl and val/bpb came out quantised and biased (5.59 for
    3.99 on 400 batches). bf16 weights change the logits a little; the sums must not add more than that."""
    corpus = tmp_path / "text.txt"
    corpus.write_text((small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8"))
    dm = TinyLMDataModule(corpus=str(corpus), tokenizer="char", block_size=32, batch_size=8, val_batches=60,
                          cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    torch.manual_seed(0)
    module = TinyLM(vocab_size=dm.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=32, decay_steps=10)
    results = {}
    for precision in ("32-true", "bf16-true"):
        trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                            precision=precision)
        results[precision] = trainer.validate(module, datamodule=dm, verbose=False)[0]
        module.float()  # back to fp32 weights, as Lightning leaves them converted
    for key in ("val/loss", "val/bpb"):
        assert results["bf16-true"][key] == pytest.approx(results["32-true"][key], rel=5e-3), key


def test_a_validation_batch_of_nan_makes_the_validation_nan(tmp_path, small_data):
    """Catches a validation with a NaN batch logged as a good one: torchmetrics' aggregators drop NaN values by
    default (with a warning), so val/loss was the mean of the finite batches and val/bpb 0.0 (a perfect score)
    beside a NaN."""
    corpus = tmp_path / "text.txt"
    corpus.write_text((small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:20000])
    dm = TinyLMDataModule(corpus=str(corpus), tokenizer="char", block_size=32, batch_size=4, val_batches=3,
                          cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    module = TinyLM(vocab_size=dm.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=32, decay_steps=10)

    class NaNOnce(L.Callback):  # the second validation batch's weights hold a NaN
        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            pl_module.model.lm_head.weight.data[0, 0] = float("nan") if batch_idx == 1 else 0.0

    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        callbacks=[NaNOnce()])
    result = trainer.validate(module, datamodule=dm, verbose=False)[0]
    assert all(math.isnan(result[key]) for key in ("val/loss", "val/ppl", "val/bpb")), result


def test_val_bpb_counts_no_byte_for_the_space_a_sentencepiece_tokenizer_prepends(tmp_path):
    """Catches val/bpb dividing by one byte per document more than the text holds with a SentencePiece-style
    tokenizer.json (Metaspace, prepend_scheme "first": Llama, T5, ...): a document's first word "▁Once" was counted
    as " Once" (5 bytes) where the text has "Once" (4), as it is after another word."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    docs = [f"Once upon a time {w} lived in a house." for w in ("Mia", "Tom", "Sue", "Pip", "Olive")] * 12
    hf = HFTokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    hf.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    alphabet = list(string.ascii_letters + string.digits + string.punctuation + "\n")  # (no <unk>: it round-trips)
    hf.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "</s>"],
                                                     initial_alphabet=alphabet))
    hf.save(str(tmp_path / "tokenizer.json"))
    corpus = tmp_path / "docs.txt"
    corpus.write_text(EOT.join(docs), encoding="utf-8")
    dm, module, _ = _validated(tmp_path, corpus, str(tmp_path / "tokenizer.json"), block_size=32, val_batches=None,
                               n_layer=1)

    val = dm.meta["splits"]["val"]
    assert val["documents"] > 5  # guard: many documents start after an EOS inside the split
    first = int(next(iter(dm.val_dataloader()))[0][0, 0])  # the split's first token
    # every target of the split is scored once: its text is the split's, less the first token's (never a target)
    assert module.val_bytes == val["bytes"] - len(dm.tokenizer.decode([first]).encode("utf-8"))


def test_val_bpb_counts_no_nats_for_a_documents_lone_leading_space_token(tmp_path):
    """Catches val/bpb counting the nats of a document's first token that stands for no text: a SentencePiece-style
    tokenizer (Metaspace, prepend_scheme "first": Llama's) starts a document whose first word it has no "▁word"
    token for (a number: Llama splits digits) with "▁" alone, which is 0 bytes there (the space it prepended), as
    an EOS is; its bytes were not counted, but its nats were, as if it were text."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    from tinylm.data.loader import IGNORE

    # "▁" and the characters alone: every document begins with the lone "▁", 1 byte elsewhere, 0 at a start
    chars = sorted(set(string.ascii_letters + string.digits + " .,\n"))  # (all of the round-trip probe's)
    vocab = {"<unk>": 0, "</s>": 1, "▁": 2} | {c: 3 + i for i, c in enumerate(c for c in chars if c != " ")}
    hf = HFTokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    hf.add_special_tokens(["<unk>", "</s>"])
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    hf.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    hf.save(str(tmp_path / "tokenizer.json"))
    corpus = tmp_path / "docs.txt"
    corpus.write_text(EOT.join(f"{i} cats sat on mat {i % 7}." for i in range(80)), encoding="utf-8")
    dm, module, bpb = _validated(tmp_path, corpus, str(tmp_path / "tokenizer.json"), block_size=32, val_batches=None,
                                 n_layer=1)

    tok, lone = dm.tokenizer, hf.token_to_id("▁")
    nats_sum = nbytes_sum = 0.0
    starts = 0
    for x, y in dm.val_dataloader():  # by hand: a target's bytes are its text's (0 for EOS and a start's "▁")
        with torch.no_grad():
            nats = F.cross_entropy(module(x).reshape(-1, dm.vocab_size), y.reshape(-1), ignore_index=IGNORE,
                                   reduction="none")
        for n, prev, target in zip(nats.tolist(), x.reshape(-1).tolist(), y.reshape(-1).tolist()):
            at_start = prev == tok.eos_id
            starts += at_start and target == lone
            n_bytes = 0 if target in (IGNORE, tok.eos_id) or (at_start and target == lone) else \
                len(hf.id_to_token(target).replace("▁", " ").encode("utf-8"))
            nats_sum, nbytes_sum = nats_sum + (n if n_bytes else 0.0), nbytes_sum + n_bytes
    assert starts > 5  # guard: many documents in the split start with the lone "▁"
    assert module.val_bytes == nbytes_sum
    assert bpb == pytest.approx(nats_sum / math.log(2) / nbytes_sum, rel=1e-6)
