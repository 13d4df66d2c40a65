"""Every numeric option is range-checked when it is built, and resuming refuses settings that change the run."""

import math
import re

import lightning as L
import pytest
import torch
from helpers import _one_line_error
from torch.utils.data import DataLoader, TensorDataset

from tinylm.cli import main
from tinylm.data.datamodule import TinyLMDataModule
from tinylm.model import GPTConfig
from tinylm.ranges import check_ranges
from tinylm.train.module import TinyLM

TINY = {"vocab_size": 50, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, "pad_vocab_multiple": 1}


def test_check_ranges_reads_interval_notation():
    """Catches an off-by-one bound (open vs closed), NaN or a bool slipping through, and options named wrongly."""
    ok = {"lo": 0, "hi": 1}
    for value, interval in [(0, "[0, 1)"), (0.5, "(0, 1)"), (1, "(0, 1]"), (2**64 - 1, "[0, 2**64)"), (5, "[0, inf)")]:
        check_ranges("x", {"v": value, **ok}, {"v": interval})
    for value, interval in [(1, "[0, 1)"), (0, "(0, 1)"), (-1, "[0, inf)"), (2**64, "[0, 2**64)"),
                            (float("nan"), "[0, 1]"), (float("inf"), "(0, inf)"), (True, "[0, 2]"), ("1", "[0, 2]")]:
        with pytest.raises(ValueError, match=rf"^x\.v must be in {re.escape(interval)}, got "):
            check_ranges("x", {"v": value}, {"v": interval})
    with pytest.raises(ValueError, match=r"^model\.min_lr must be in \[0, lr=0\.1\], got 0\.2$"):
        check_ranges("model", {"lr": 0.1, "min_lr": 0.2}, {"min_lr": "[0, lr]"})
    check_ranges("model", {"lr": None, "min_lr": 0.2}, {"min_lr": "[0, lr]"})  # a bound that is unset: skipped
    check_ranges("data", {"val_batches": None}, {"val_batches": "[1, inf)"})  # None = unset: the default


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"weight_decay": -1.0}, r"model\.weight_decay must be in \[0, inf\), got -1"),
        ({"decay_steps": -5}, r"model\.decay_steps must be a whole number in \[1, inf\), got -5"),
        ({"prefix_len": -5, "attn_mask": "prefix"},
         r"model\.prefix_len must be a whole number in \[0, block_size=16\), got -5"),
        ({"prefix_len": 16, "attn_mask": "prefix"},
         r"model\.prefix_len must be a whole number in \[0, block_size=16\), got 16"),
        ({"prefix_len": 4}, r"prefix_len=4 is used only with model\.attn_mask: prefix"),
        ({"dropout": 1.0}, r"model\.dropout must be in \[0, 1\)"),
        ({"dropout": -0.1}, r"model\.dropout must be in \[0, 1\)"),
        ({"beta1": 1.0}, r"model\.beta1 must be in \[0, 1\)"),
        ({"beta2": -0.5}, r"model\.beta2 must be in \[0, 1\)"),
        ({"decay_fraction": 1.5}, r"model\.decay_fraction must be in \[0, 1\]"),
        ({"lr": 0.0}, r"model\.lr must be in \(0, inf\)"),
        ({"lr": float("nan")}, r"model\.lr must be in \(0, inf\), got nan"),
        ({"min_lr": 1.0}, r"model\.min_lr must be in \[0, lr=0\.0006\]"),
        ({"warmup_steps": -1}, r"model\.warmup_steps must be a whole number in \[0, inf\)"),
        ({"n_layer": 0}, r"model\.n_layer must be in \[1, inf\)"),
        ({"eos_id": 50}, r"model\.eos_id must be in \[0, vocab_size=50\)"),
        ({"n_embd": 33}, r"n_embd \(33\) must be divisible by n_head \(2\)"),
        ({"logit_softcap": 1e300}, r"model\.logit_softcap must be in \[1, 10000\]"),  # inf in fp32: NaN logits
        ({"attn_mask": "document"}, r"needs eos_id.*use attn_mask causal"),  # eos_id cannot be passed by hand
        ({"init_from": ""}, r"model\.init_from is empty"),  # was "no config.json in '.'"
    ],
)
def test_bad_model_options_fail_at_construction(bad, message):
    """Catches an out-of-range model option (negative weight decay, a prefix as long as the window, beta2 = 1)
    training silently wrong, or failing much later with a message that does not name the option."""
    with pytest.raises(ValueError, match=message):
        TinyLM(**{**TINY, **bad})


def test_gpt_config_checks_the_same_ranges():
    """Catches the model used without Lightning (GPTConfig) accepting what TinyLM refuses."""
    with pytest.raises(ValueError, match=r"^dropout must be in \[0, 1\), got 1\.5$"):
        GPTConfig(vocab_size=50, block_size=16, dropout=1.5)


@pytest.mark.parametrize(
    "bad, message",
    [
        # (was an OverflowError inside numpy)
        ({"seed": -1}, r"data\.seed must be a whole number in \[0, 2\*\*64\), got -1"),
        ({"vocab_size": 0}, r"data\.vocab_size must be a whole number in \[1, 2\*\*21\]"),
        ({"batch_size": 0}, r"data\.batch_size must be a whole number in \[1, inf\)"),
        ({"block_size": -3}, r"data\.block_size must be a whole number in \[1, inf\)"),
        ({"val_fraction": 1.0}, r"data\.val_fraction must be in \(0, 1\)"),
        ({"val_batches": 0}, r"data\.val_batches must be a whole number in \[1, inf\)"),
        ({"num_workers": -1}, r"data\.num_workers must be a whole number in \[0, inf\)"),
    ],
)
def test_bad_data_options_fail_at_construction(bad, message):
    """Catches an out-of-range data option failing deep in numpy (data.seed -1: OverflowError) or not at all."""
    with pytest.raises(ValueError, match=message):
        TinyLMDataModule(**bad)


def test_negative_gradient_clip_val_is_refused():
    """Catches gradient_clip_val=-1 flipping every gradient (clip_grad_norm_ scales by max_norm / norm): gradient
    ascent, the loss rising, and exit 0."""
    torch.manual_seed(0)
    data = torch.randint(0, 50, (4, 17))
    loader = DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, gradient_clip_val=-1.0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ValueError, match=r"^trainer\.gradient_clip_val must be in \[0, inf\), got -1\.0$"):
        trainer.fit(TinyLM(**TINY, warmup_steps=0), loader)
    assert math.isfinite(trainer.gradient_clip_val)  # guard: the bad value did reach the hook


def test_gradient_clip_algorithm_value_is_refused():
    """Catches gradient_clip_algorithm="value" (Lightning's clamp of each gradient element) being silently run as
    tinylm's norm clipping: a run asked for one kind of clipping got another. The first step refuses it, naming
    the value as typed (it said <GradClipAlgorithmType.VALUE: 'value'>) and the fix, before any weight moves;
    "norm" (what tinylm does) trains."""
    data = torch.randint(0, 50, (4, 17), generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=4)
    for algorithm in ("norm", "value"):
        torch.manual_seed(0)
        module = TinyLM(**TINY, warmup_steps=0)
        before = module.model.transformer.wte.weight.detach().clone()
        trainer = L.Trainer(accelerator="cpu", max_steps=1, gradient_clip_val=0.5, gradient_clip_algorithm=algorithm,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        if algorithm == "norm":
            trainer.fit(module, loader)
            assert trainer.global_step == 1 and not torch.equal(module.model.transformer.wte.weight, before)
            continue
        with pytest.raises(ValueError, match=r"^tinylm clips by norm only; "
                                             r"got trainer\.gradient_clip_algorithm='value': "
                                             r"leave it unset \(or pass 'norm'\)$"):
            trainer.fit(module, loader)
        assert torch.equal(module.model.transformer.wte.weight, before)  # refused before the optimizer stepped


@pytest.mark.parametrize(
    "override, needles",
    [
        (["--model.weight_decay", "-1"], ["model.weight_decay", "[0, inf)", "-1"]),
        (["--model.attn_mask", "prefix", "--model.prefix_len", "16"], ["model.prefix_len", "block_size=16"]),
        (["--data.seed", "-1"], ["data.seed", "[0, 2**64)"]),
    ],
)
def test_bad_options_are_one_line_through_the_cli(run_config, capsys, override, needles):
    """Catches a range error escaping the CLI as a traceback (an OverflowError from numpy for data.seed -1)."""
    _one_line_error(capsys, ["fit", "--config", str(run_config()), *override], *needles)


@pytest.fixture
def trained(run_config, tmp_path):
    """A 2-step run with last.ckpt; returns (config, checkpoint bytes)."""
    config = run_config()
    main(["fit", "--config", str(config)])
    return config, (tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt").read_bytes()


@pytest.mark.parametrize(
    "override, needles",
    [
        (["--data.batch_size", "3"], ["global batch of 2", "data.batch_size=2", "--data.batch_size 2"]),
        (["--data.seed", "5"], ["data.seed=1337", "--data.seed 1337"]),
        (["--data.val_fraction", "0.2"], ["data.val_fraction=0.1", "--data.val_fraction 0.1"]),
    ],
)
def test_resume_with_other_data_settings_is_refused(trained, tmp_path, capsys, override, needles):
    """Catches a resume with another data.batch_size, data.seed or val_fraction silently drawing other data
    (losses then differed by 0.16-0.21 from the uninterrupted run), and another val_fraction building a whole new
    dataset before it was refused."""
    config, before = trained
    datasets = sorted((tmp_path / "cache" / "datasets").iterdir())
    argv = ["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", "last", *override]
    _one_line_error(capsys, argv, *needles)
    assert (tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt").read_bytes() == before  # nothing damaged
    assert sorted((tmp_path / "cache" / "datasets").iterdir()) == datasets


def test_resume_with_another_tokenizer_of_the_same_size_is_refused(run_config, tmp_path, capsys):
    """Catches a resume under another tokenizer of the same vocabulary size being accepted: the checkpoint keeps
    the old tokenizer, so generate/export would decode the new run's ids with the wrong one. (Here a BPE of the same
    size trained on another sample of the same text; another corpus is refused before that, as other text.)"""
    config = run_config(data={"tokenizer": "bpe", "vocab_size": 300})
    main(["fit", "--config", str(config)])
    last = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    argv = ["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", "last",
            "--data.tokenizer_train_chars", "4000"]
    _one_line_error(capsys, argv, "tokenizer", "fingerprint", "data.tokenizer_train_chars")
    assert last.read_bytes() == before


def test_a_model_too_large_for_memory_is_one_line(monkeypatch):
    """Catches a model too large to allocate (--model.n_embd 1048576) ending in torch's allocator traceback. The
    allocator's failure is raised directly: really allocating terabytes would depend on the machine's overcommit."""
    from tinylm.train import module

    def fail(config):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 TiB")

    monkeypatch.setattr(module, "GPT", fail)
    with pytest.raises(ValueError, match="does not fit in this machine's memory .*tinylm plan"):
        TinyLM(**TINY)
    monkeypatch.setattr(module, "GPT", lambda config: (_ for _ in ()).throw(RuntimeError("a bug, not memory")))
    with pytest.raises(RuntimeError, match="a bug"):  # other errors stay what they are
        TinyLM(**TINY)
