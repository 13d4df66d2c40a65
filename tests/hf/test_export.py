"""Export to / import from Hugging Face transformers GPT-2: same logits, same tokens, clear errors."""

import fnmatch
import itertools
import json
import os
import re
import shlex
import shutil
from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from tinylm.checkpoint import CheckpointError, load_model
from tinylm.cli.commands import run as run_command
from tinylm.generate import generate
from tinylm.hf import export_hf, import_hf
from tinylm.model import GPT
from tinylm.tokenize.hf import save_hf_tokenizer
from tinylm.tokenize.tokenizer import EOT, Tokenizer, build_tokenizer
from tinylm.train.module import TinyLM

transformers = pytest.importorskip("transformers")


def _texts(small_data: Path) -> list[str]:
    """Real text with newlines, punctuation, umlauts and runs of spaces."""
    shakespeare = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:3000]
    german = (small_data / "german.txt").read_text(encoding="utf-8")[:2000]
    return [shakespeare, german, "  two  spaces\n\n\tand a tab   ", "a"]


def _write_checkpoint(path: Path, tokenizer: Tokenizer, *, bias: bool, pad_vocab_multiple: int, **options) -> Path:
    """A real `trainer.save_checkpoint` file of a 2-layer model whose every weight (biases, LayerNorm gains and the
    padded embedding rows included) is random, so a mis-mapped or dropped tensor changes the logits."""
    torch.manual_seed(0)
    module = TinyLM(vocab_size=tokenizer.vocab_size, block_size=32, eos_id=tokenizer.eos_id, n_layer=2, n_head=2,
                    n_embd=32, bias=bias, pad_vocab_multiple=pad_vocab_multiple, warmup_steps=0, **options)
    module.tokenizer_state = tokenizer.state_dict()
    data = torch.randint(0, tokenizer.vocab_size, (4, 33))
    loader = DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, loader)
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def char_tokenizer() -> Tokenizer:
    docs = ["First Citizen:\nBefore we proceed any further, hear me speak.", "All: Speak, speak!  Äpfel? 3.5"]
    return build_tokenizer("char", documents=lambda: docs)  # 2 documents, so it has <|endoftext|>


@pytest.mark.parametrize("bias, pad, tie, mlp", [(True, 64, True, "gelu"), (False, 64, True, "gelu"),
                                                (True, 1, True, "gelu"), (False, 64, False, "gelu"),
                                                (True, 64, True, "gelu_tanh"), (True, 64, True, "relu2")],
                         ids=["bias-padded", "nobias-padded", "bias-unpadded", "untied", "gelu_tanh", "relu2"])
def test_transformers_logits_match_tinylm(tmp_path, char_tokenizer, bias, pad, tie, mlp):
    """Catches untransposed Conv1D weights, dropped biases, padded vocab rows leaking into the export, tanh GELU
    (gelu_new) instead of tinylm's exact GELU, or a wrong eps/position table: logits must agree to 1e-5. An untied
    LM head (refused: "transformers' GPT-2 needs tie_embeddings=True", which it does not) is its lm_head.weight;
    mlp gelu_tanh (OpenAI's GPT-2's) is transformers' gelu_new, and imports back as itself; relu2 is its "relu2" (it was
    refused, "transformers' GPT-2 needs mlp='gelu' or 'gelu_tanh'")."""
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=bias, pad_vocab_multiple=pad,
                             tie_embeddings=tie, mlp=mlp)
    model, tokenizer, _hparams = load_model(ckpt)
    V = tokenizer.vocab_size
    assert (model.config.padded_vocab_size != V) == (pad == 64)  # the padded case really pads
    out = export_hf(ckpt, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    config = json.loads((out / "config.json").read_text())
    assert (config["vocab_size"], config["n_positions"], config["activation_function"]) == \
        (V, 32, {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu2": "relu2"}[mlp])
    assert config["eos_token_id"] == config["bos_token_id"] == tokenizer.eos_id

    idx = torch.tensor([tokenizer.encode("First Citizen:\nBefore we proceed, hear me."[:32]),
                        tokenizer.encode("All: Speak, speak!  Äpfel? 3.5 First Citizen"[:32])])  # (2, 32)
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits  # (B, T, V) each
    assert theirs.shape == ours.shape == (2, 32, V)
    assert ours.std() > 0.1  # random weights give spread-out logits: the comparison is not of two near-zero tensors
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)

    back = import_hf(out)  # and back into tinylm, same architecture options
    assert (back.config.bias, back.config.pad_vocab_multiple, back.config.tie_embeddings, back.config.mlp) == \
        (bias, pad, tie, mlp)
    assert config["tie_word_embeddings"] is tie
    with torch.no_grad():
        torch.testing.assert_close(back(idx), ours, atol=1e-5, rtol=0)
    saved = Tokenizer.load(out / "tinylm_tokenizer")
    assert saved.fingerprint == tokenizer.fingerprint


def _tokenizers(small_data: Path) -> dict:
    docs = _texts(small_data)[:2]
    cl100k_like = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
                   r"""|\s*[\r\n]|\s+(?!\S)|\s+""")
    from tinylm.tokenize.backends import ScratchBackend
    from tinylm.tokenize.bpe import ByteLevelBPE

    return {
        "char": lambda: build_tokenizer("char", documents=lambda: docs + ["  \t\n"]),
        "bpe": lambda: build_tokenizer("bpe", vocab_size=400, documents=lambda: docs),
        "scratch-bpe": lambda: build_tokenizer("scratch-bpe", vocab_size=400, documents=lambda: docs),
        # another pre-tokenization regex (cl100k's shape), so the Split + ByteLevel path is exercised
        "scratch-bpe-cl100k-regex": lambda: Tokenizer(ScratchBackend(ByteLevelBPE.train(
            docs, vocab_size=400, special_tokens=[EOT], pattern=cl100k_like, progress=False)), "scratch-bpe"),
    }


@pytest.mark.parametrize("kind", ["char", "bpe", "scratch-bpe", "scratch-bpe-cl100k-regex"])
def test_exported_tokenizer_encodes_like_tinylm(tmp_path, small_data, kind):
    """Catches an exported tokenizer that splits text differently (pre-tokenizer regex, merge order, byte mapping,
    char splitting), shifts the special-token ids, or decodes with extra spaces."""
    tokenizer = _tokenizers(small_data)[kind]()
    files = save_hf_tokenizer(tokenizer, tmp_path, model_max_length=1 << 20)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(files)
    # GPT-2's vocab.json + merges.txt only where GPT2Tokenizer would split text the same way
    assert ("vocab.json" in files and "merges.txt" in files) == (kind in ("bpe", "scratch-bpe"))
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in _texts(small_data):
        ids = tokenizer.encode(text)
        assert hf.encode(text, add_special_tokens=False) == ids
        assert hf.decode(ids) == text
    if kind != "char":  # guard: merges really ran, so their order is what is being compared
        assert len(tokenizer.encode(_texts(small_data)[0])) < 0.9 * len(_texts(small_data)[0])
    for special, i in tokenizer.special_tokens.items():
        assert hf.convert_tokens_to_ids(special) == i
    if tokenizer.eos_id is not None:
        assert hf.eos_token_id == tokenizer.eos_id


def test_exported_tokenizer_adds_no_post_processor_tokens(tmp_path, small_data):
    """Catches a user's tokenizer.json with a post-processor (Llama's BOS before each text) exported as it is:
    transformers adds the BOS by default, tinylm never did, so the exported model saw other ids than it trained on."""
    from tokenizers import processors

    tokenizer = _tokenizers(small_data)["bpe"]()
    hf = tokenizer._b.tok
    bos = tokenizer.eos_id
    hf.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A",
                                                      special_tokens=[("<|endoftext|>", bos)])
    hf.save(str(tmp_path / "tokenizer.json"))
    mine = Tokenizer.load(tmp_path / "tokenizer.json")
    save_hf_tokenizer(mine, tmp_path / "hf", model_max_length=64)
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = _texts(small_data)[0][:200]
    assert exported(text)["input_ids"] == mine.encode(text) and mine.encode(text)[0] != bos


def test_exported_tokenizer_gives_the_model_no_token_type_ids(tmp_path, small_data):
    """Catches an exported tokenizer that hands the model token_type_ids: transformers 4.x (which tinylm supports)
    reads tokenizer_config.json's class, PreTrainedTokenizerFast, whose default inputs include them, and GPT-2 adds
    the embedding of id 0 at every position for them: `model(**tokenizer(text))` and `model.generate(**...)` of an
    export predicted other tokens than tinylm (logits 2.1 apart), and Llama's generate raised on the unused input.
    The config names the inputs, which every version reads."""
    save_hf_tokenizer(_tokenizers(small_data)["bpe"](), tmp_path, model_max_length=64)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["model_input_names"] == ["input_ids", "attention_mask"]
    assert set(transformers.AutoTokenizer.from_pretrained(tmp_path)("First Citizen")) == {"input_ids",
                                                                                         "attention_mask"}


def test_tiktoken_gpt2_export_is_gpt2s_tokenizer(tmp_path, shared_data, small_data):
    """Catches a tokenizer.json that encodes differently from tiktoken's GPT-2, or vocab.json / merges.txt that differ
    from OpenAI's GPT-2 files (byte-to-unicode spelling, merge order, ids), which GPT2Tokenizer reads."""
    tokenizer = build_tokenizer(f"tiktoken:{shared_data / 'gpt2.tiktoken'}")
    save_hf_tokenizer(tokenizer, tmp_path, model_max_length=1 << 20)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in _texts(small_data):
        assert hf.encode(text, add_special_tokens=False) == tokenizer.encode(text)
    assert hf.eos_token_id == tokenizer.eos_id == 50256
    vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    assert vocab == json.loads((shared_data / "gpt2_vocab.json").read_text(encoding="utf-8"))

    def merges(path: Path) -> list[str]:  # a "#version" header is optional; "# #" is a real merge (rank 1979)
        lines = path.read_text(encoding="utf-8").splitlines()
        return [m for m in lines[lines[0].startswith("#version"):] if m]

    assert len(merges(tmp_path / "merges.txt")) == 50000
    assert merges(tmp_path / "merges.txt") == merges(shared_data / "gpt2_merges.txt")


def test_export_command_bfloat16_and_summary(tmp_path, char_tokenizer, capsys):
    """Catches --dtype being ignored (weights saved in fp32) or the command writing nothing it reports."""
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=64)
    run_command("export", ["--ckpt_path", str(ckpt), "--out", str(tmp_path / "hf"), "--dtype", "bfloat16"])
    printed = capsys.readouterr().out
    assert "model.safetensors" in printed and "bfloat16" in printed and "tinylm_tokenizer/" in printed
    from safetensors import safe_open

    with safe_open(tmp_path / "hf" / "model.safetensors", framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118 (safe_open is not iterable)
    with pytest.raises(ValueError, match="int8"):
        export_hf(ckpt, tmp_path / "hf2", dtype="int8")


def test_export_refuses_a_dtype_its_weights_overflow(tmp_path, char_tokenizer):
    """Catches `tinylm export --dtype float16` of a model with a weight past float16's range (65,504) writing it as
    inf, exit 0: the export's users got NaN logits (transformers) or a refusal at load (tinylm), far from the cause.
    It is one line naming the dtype, the tensor and the fix, and no folder is left; bfloat16 holds the same weights."""
    ckpt = torch.load(_write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=64),
                      weights_only=True)
    ckpt["state_dict"]["model.transformer.h.1.mlp.c_fc.weight"][0, 0] = 1e6
    torch.save(ckpt, tmp_path / "big.ckpt")
    with pytest.raises(ValueError) as err:
        export_hf(tmp_path / "big.ckpt", tmp_path / "hf", dtype="float16")
    assert str(err.value) == (f"--dtype float16 cannot hold the weights of {str(tmp_path / 'big.ckpt')!r}: "
                              "'transformer.h.1.mlp.c_fc.weight' overflows it to inf; export with --dtype bfloat16 or "
                              "float32")
    assert not (tmp_path / "hf").exists()
    export_hf(tmp_path / "big.ckpt", tmp_path / "hf", dtype="bfloat16")  # guard: a wider range holds it
    assert import_hf(tmp_path / "hf").transformer.h[1].mlp.c_fc.weight[0, 0] == 999424  # (bfloat16 of 1e6)


def test_export_says_its_result_once_and_its_files_follow_the_umask(tmp_path, char_tokenizer, capsys):
    """Catches `tinylm export` saying its result twice ("wrote DIR: ..." and "exported CKPT to DIR") and writing
    model.safetensors 0600 (other users of a shared model folder could not read the weights beside a readable
    config.json), also when an earlier export is replaced; and transformers' "Writing model shards" progress bar
    (carriage-return frames of a one-file bar) in its output, a log or a pipe included."""
    import os
    import stat

    from tinylm.cli import main

    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=1)
    out = tmp_path / "hf"
    old = os.umask(0o027)
    try:
        for _ in range(2):  # a new folder, then the earlier export replaced
            capsys.readouterr()
            main(["export", "--ckpt_path", str(ckpt), "--out", str(out)])
            said = capsys.readouterr()
            lines = [line for line in (said.out + said.err).splitlines()
                     if str(out) in line and "load with" not in line]
            assert len(lines) == 1, said
            assert "\r" not in said.out + said.err and "shards" not in said.err, said
            modes = {p.relative_to(out).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*")}
            assert modes["model.safetensors"] == 0o640, modes
            assert {m for p, m in modes.items() if (out / p).is_file()} == {0o640}, modes
    finally:
        os.umask(old)


def test_bad_checkpoints_fail_clearly(tmp_path, char_tokenizer):
    """Catches a missing path, a non-checkpoint file or weights of another shape failing deep inside torch instead
    of with a message naming the file, the tensor and both shapes."""
    with pytest.raises(FileNotFoundError, match="nope.ckpt.*--ckpt_path"):
        export_hf(tmp_path / "nope.ckpt", tmp_path / "out")
    junk = tmp_path / "junk.ckpt"
    junk.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="junk.ckpt"):
        load_model(junk)
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=True, pad_vocab_multiple=1)
    state = torch.load(ckpt, weights_only=True)
    state["hyper_parameters"]["block_size"] = 64  # the stored position table has 32 rows
    torch.save(state, tmp_path / "edited.ckpt")
    with pytest.raises(CheckpointError, match=r"transformer\.wpe\.weight.*\(32, 32\).*\(64, 32\)"):
        load_model(tmp_path / "edited.ckpt")
    bpe = _write_checkpoint(tmp_path / "bpe.ckpt", build_tokenizer("bpe", vocab_size=300, documents=lambda: [
        "First Citizen:\nBefore we proceed any further, hear me speak."]), bias=True, pad_vocab_multiple=1)
    state = torch.load(bpe, weights_only=True)
    state["tinylm"]["tokenizer"]["state"]["json"] = state["tinylm"]["tokenizer"]["state"]["json"].replace(
        '"added_tokens"', '"added_tokens\x01"', 1)  # a damaged byte: tokenizers raises a bare Exception
    torch.save(state, tmp_path / "damaged.ckpt")
    with pytest.raises(CheckpointError, match=r"damaged\.ckpt.*holds a tokenizer this tinylm cannot rebuild"):
        load_model(tmp_path / "damaged.ckpt")
    assert not (tmp_path / "out").exists()


# ---- import of directories not written by tinylm --------------------------------------------------------------
def _transformers_dir(path: Path, **overrides) -> Path:
    """A real `GPT2LMHeadModel` directory (2 layers, 32 wide, vocab 48, exact GELU unless overridden) with random
    weights everywhere, biases included, and no `tinylm` entry in its config.json."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(**({"vocab_size": 48, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 2,
                                             "activation_function": "gelu"} | overrides))
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("field, value", [
    ("activation_function", "relu"),
    ("layer_norm_epsilon", 1e-6),
    ("n_inner", 64),
    ("scale_attn_weights", False),
    ("scale_attn_by_inverse_layer_idx", True),
    ("add_cross_attention", True),
])
def test_import_refuses_gpt2_variants_tinylm_does_not_compute(tmp_path, field, value):
    """Catches import_hf loading a GPT-2 whose config asks for a function tinylm's GPT does not compute (it used to
    warn about gelu_new and ignore eps, attention scaling and cross-attention, then predict differently): the error
    is one line naming the field, its value and what tinylm supports."""
    path = _transformers_dir(tmp_path / "hf", **{field: value})
    assert getattr(transformers.GPT2Config.from_pretrained(path), field) == value  # guard: the setting was saved
    with pytest.raises(ValueError) as error:
        import_hf(path)
    message = str(error.value)
    assert "\n" not in message and f"{field}={value!r} (tinylm supports " in message and str(path) in message


@pytest.mark.parametrize("overrides", [{}, {"reorder_and_upcast_attn": True, "n_inner": 128},
                                       {"activation_function": "gelu_new"},
                                       {"activation_function": "gelu_pytorch_tanh"}],
                         ids=["plain", "reorder_and_upcast_attn", "gelu_new", "gelu_pytorch_tanh"])
def test_import_of_a_transformers_gpt2_matches_its_logits(tmp_path, overrides):
    """Catches import_hf refusing a config tinylm does compute, or mis-mapping a model tinylm did not write (biases
    present, unpadded vocab, no `tinylm` entry): logits must agree with transformers' to 1e-5. Eager attention runs
    reorder_and_upcast_attn's own code path, which only reorders the same fp32 arithmetic. OpenAI's GPT-2's tanh GELU
    ("gelu_new") imports as mlp gelu_tanh (it was refused: `--model.init_from gpt2` could not start)."""
    path = _transformers_dir(tmp_path / "hf", **overrides)
    hf = transformers.GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager").eval()
    model = import_hf(path)
    assert model.config.mlp == ("gelu" if overrides.get("activation_function", "gelu") == "gelu" else "gelu_tanh")
    idx = torch.randint(0, 48, (2, 32), generator=torch.Generator().manual_seed(0))  # (B, T)
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits  # (B, T, V)
        for mlp in {"gelu", "gelu_tanh"} - {model.config.mlp}:  # the other GELU is seen at this tolerance
            other = GPT(replace(model.config, mlp=mlp))
            other.load_state_dict(model.state_dict())
            assert (other.eval()(idx) - theirs).abs().max() > 1e-4
    assert ours.std() > 0.1
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_import_keeps_biases_changed_in_transformers(tmp_path, char_tokenizer):
    """Catches import_hf trusting the export's `bias: false` and dropping biases that are no longer zero (e.g. after
    fine-tuning in transformers): a bias-free export whose biases were then changed must import with them, so its
    logits equal transformers' (1e-5)."""
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=64)
    hf = transformers.GPT2LMHeadModel.from_pretrained(export_hf(ckpt, tmp_path / "hf")).eval()
    idx = torch.tensor([char_tokenizer.encode("First Citizen:\nBefore we proceed")])  # (1, 31)
    with torch.no_grad():
        before = hf(idx).logits
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.2)
        theirs = hf(idx).logits  # (1, T, V)
    assert (theirs - before).abs().max() > 0.1  # guard: the new biases change the function
    hf.save_pretrained(tmp_path / "tuned")
    assert json.loads((tmp_path / "tuned" / "config.json").read_text())["tinylm"]["bias"] is False  # still says so
    model = import_hf(tmp_path / "tuned")
    with torch.no_grad():
        torch.testing.assert_close(model(idx), theirs, atol=1e-5, rtol=0)


# ---- decoding: the same beams as transformers' generate -------------------------------------------------------
@pytest.mark.parametrize("repetition_penalty", [1.3, 0.8])
def test_beam_search_with_repetition_penalty_equals_transformers(tmp_path, char_tokenizer, repetition_penalty):
    """Catches beam search applying repetition_penalty to raw logits (or renormalising after it): transformers'
    beam search penalises the log-probabilities, and users comparing the two must get identical beams."""
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=True, pad_vocab_multiple=64)
    model, tokenizer, _ = load_model(ckpt)
    hf = transformers.GPT2LMHeadModel.from_pretrained(export_hf(ckpt, tmp_path / "hf")).eval()
    eos = tokenizer.eos_id
    differs = 0
    for text in ("First Citizen:", "All: Speak", "hear me"):
        prompt = torch.tensor([tokenizer.encode(text)])  # (1, L)
        new = 32 - prompt.size(1)  # transformers' GPT-2 cannot look past n_positions = 32
        for num_beams, length_penalty in ((3, 1.0), (4, 0.5)):
            kwargs = {"num_beams": num_beams, "max_new_tokens": new, "length_penalty": length_penalty}
            ours = generate(model, prompt, strategy="beam", repetition_penalty=repetition_penalty, eos_id=eos,
                            **kwargs)[0]
            theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos, repetition_penalty=repetition_penalty, **kwargs)[0]
            theirs = theirs[prompt.size(1):].tolist()
            while theirs and theirs[-1] == eos:  # tinylm returns no EOS and no padding
                theirs.pop()
            assert ours == theirs, (text, num_beams)
            plain = generate(model, prompt, strategy="beam", eos_id=eos, **kwargs)[0]
            differs += plain != ours
    assert differs  # guard: the penalty changed some beams, so it is what is being compared


def test_no_repeat_ngram_size_equals_transformers(tmp_path, char_tokenizer):
    """Catches tinylm's no_repeat_ngram_size banning other tokens than transformers' option of that name (which a
    user switching between the two expects to behave alike): greedy and beam search give the same tokens."""
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=True, pad_vocab_multiple=64)
    model, tokenizer, _ = load_model(ckpt)
    hf = transformers.GPT2LMHeadModel.from_pretrained(export_hf(ckpt, tmp_path / "hf")).eval()
    eos = tokenizer.eos_id
    differs = 0
    for text in ("First Citizen:", "hear me"):
        prompt = torch.tensor([tokenizer.encode(text)])  # (1, L)
        new = 32 - prompt.size(1)  # transformers' GPT-2 cannot look past n_positions = 32
        for n, beams in itertools.product((2, 3), (1, 3)):
            kwargs = {"max_new_tokens": new, "no_repeat_ngram_size": n}
            ours = generate(model, prompt, strategy="beam" if beams > 1 else "greedy", num_beams=beams, eos_id=eos,
                            **kwargs)[0]
            theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, num_beams=beams,
                                 eos_token_id=eos, pad_token_id=eos, **kwargs)[0][prompt.size(1):].tolist()
            while theirs and theirs[-1] == eos:  # tinylm returns no EOS and no padding
                theirs.pop()
            assert ours == theirs, (text, n, beams)
            free = generate(model, prompt, strategy="beam" if beams > 1 else "greedy", num_beams=beams, eos_id=eos,
                            max_new_tokens=new)[0]
            differs += free != ours
    assert differs  # guard: the bans changed some outputs, so they are what is being compared


def _eos_prone_pair() -> tuple:
    """A tinylm GPT (2 layers, 32 wide, vocab 48, EOS 0) with spread-out random weights and its EOS embedding (tied to
    the LM head) scaled up 3x, so EOS is often among the best candidates and hypotheses end at different lengths;
    and the same weights in transformers' GPT2LMHeadModel, mapped by tinylm's own export functions."""
    from tinylm.hf import hf_config, hf_state_dict
    from tinylm.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=48, block_size=32, n_layer=2, n_head=2, n_embd=32, eos_id=0,
                          pad_vocab_multiple=1)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        model.transformer.wte.weight[0] *= 3.0
    hf = transformers.GPT2LMHeadModel(hf_config(model.config, eos_id=0)).eval()
    hf.load_state_dict(hf_state_dict(model), strict=True)
    return model, hf


def test_beam_length_penalty_and_early_stopping_equal_transformers():
    """Catches beam search ranking finished hypotheses without length_penalty (raw sum of log-probs, or always
    / length), deciding a prompt is done with a bound that ignores length_penalty, or keeping an EOS ranked below the
    top num_beams candidates as a finished hypothesis: for length_penalty 0.5, 1, 2 and early_stopping True/False,
    tinylm's beams must be transformers' `generate(num_beams=3, do_sample=False)` on the same weights."""
    model, hf = _eos_prone_pair()
    prompts = torch.randint(1, 48, (4, 4), generator=torch.Generator().manual_seed(1)).tolist()  # no EOS inside
    penalties, new = (0.5, 1.0, 2.0), 12
    out = {}
    for length_penalty, early_stopping, prompt in itertools.product(penalties, (True, False), prompts):
        kwargs = {"num_beams": 3, "max_new_tokens": new, "length_penalty": length_penalty,
                  "early_stopping": early_stopping}
        ours = generate(model, [prompt], strategy="beam", eos_id=0, **kwargs)[0]
        ids = torch.tensor([prompt])  # (1, 4)
        theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, eos_token_id=0,
                             pad_token_id=0, **kwargs)[0, ids.size(1):].tolist()
        while theirs and theirs[-1] == 0:  # tinylm returns no EOS and no padding
            theirs.pop()
        assert ours == theirs, (length_penalty, early_stopping, prompt)
        out[length_penalty, early_stopping, tuple(prompt)] = ours
    # guards: finished hypotheses of different lengths won, and both options change some prompt's result
    assert len({len(o) for o in out.values() if len(o) < new}) >= 2
    assert any(len({tuple(out[lp, es, p]) for lp in penalties}) > 1 for _, es, p in out)
    assert any(out[lp, True, p] != out[lp, False, p] for lp, _, p in out)


# ---- the README's export instructions run as written ----------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def _readme_block(language: str, containing: str) -> str:
    """The one fenced code block of docs/export.md in `language` that contains `containing`."""
    blocks = re.findall(rf"^```{language}\n(.*?)^```", (ROOT / "docs" / "export.md").read_text(encoding="utf-8"),
                        re.DOTALL | re.MULTILINE)
    [block] = [b for b in blocks if containing in b]
    return block


def test_readme_export_instructions_run_on_what_make_train_writes(tmp_path, small_data, monkeypatch, capsys):
    """Catches the README's export section rotting: its `tinylm export` commands must read the checkpoint that
    `make train` writes (runs/<run.name of the Makefile's CONFIG>/checkpoints/last.ckpt), and its transformers snippet
    must run as written on the directory they write (it used paths nothing created, and asked for more new tokens
    than n_positions, which crashes GPT-2)."""
    config = re.search(r"^CONFIG\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE).group(1)
    import yaml

    name = yaml.safe_load((ROOT / config).read_text(encoding="utf-8"))["run"]["name"]
    monkeypatch.chdir(tmp_path)  # the README's relative paths land in tmp_path
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")
    tokenizer = build_tokenizer("char", documents=lambda: [text])  # the recipe's kind: 61 of its 65 characters
    (tmp_path / "runs" / name / "checkpoints").mkdir(parents=True)
    _write_checkpoint(tmp_path / "runs" / name / "checkpoints" / "last.ckpt", tokenizer, bias=False,
                      pad_vocab_multiple=64)
    commands = [shlex.split(line, comments=True) for line in _readme_block("bash", "tinylm export").splitlines()]
    assert commands and all(c[:2] == ["tinylm", "export"] for c in commands)
    for command in commands:
        run_command("export", command[2:])  # what `tinylm export` runs
    capsys.readouterr()
    snippet = _readme_block("python", "AutoModelForCausalLM.from_pretrained")
    exec(compile(snippet, "docs/export.md", "exec"), {})  # noqa: S102 (the README's own snippet, run as a user would)
    printed = capsys.readouterr().out
    assert printed.startswith("ROMEO:") and len(printed.strip()) > len("ROMEO:") + 10


# ---- Llama: rope + rmsnorm + swiglu ---------------------------------------------------------------------------
LLAMA = {"positions": "rope", "norm": "rmsnorm", "mlp": "swiglu", "rope_theta": 500.0}


@pytest.mark.parametrize("bias, tie", [(False, False), (True, False), (False, True)],
                         ids=["untied", "bias-untied", "tied"])
def test_llama_export_logits_match_tinylm(tmp_path, char_tokenizer, bias, tie, capsys):
    """Catches a wrong q/k/v split, gate/up swapped, RoPE pairing or theta lost, RMSNorm eps or placement, padded
    vocab rows or an untied head mis-exported: LlamaForCausalLM's logits must equal tinylm's to 1e-4 (fp32), and
    importing the directory back gives the same model."""
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=bias, pad_vocab_multiple=64,
                             tie_embeddings=tie, **LLAMA)
    model, tokenizer, _ = load_model(ckpt)
    out = export_hf(ckpt, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] == tie
    hf = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    assert isinstance(hf, transformers.LlamaForCausalLM)
    idx = torch.tensor([tokenizer.encode("First Citizen:\nBefore we proceed, hear me."[:32])])  # (1, 32)
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits
    assert ours.std() > 0.1 and theirs.shape == ours.shape == (1, 32, tokenizer.vocab_size)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
    # transformers 4.x (supported) reads RoPE's base at the top level, 5 from rope_parameters: a 5.x export without
    # the first ran in 4.x with the default 10,000 (logits 0.94 apart)
    assert config["rope_theta"] == config.get("rope_parameters", config)["rope_theta"] == 500.0
    back = import_hf(out)
    assert (back.config.positions, back.config.mlp, back.config.rope_theta, back.config.tie_embeddings) == \
        ("rope", "swiglu", 500.0, tie)
    run_command("export", ["--ckpt_path", str(ckpt), "--out", str(tmp_path / "cli")])  # the command's summary too
    assert "LlamaForCausalLM 2 layers" in capsys.readouterr().out
    with torch.no_grad():
        torch.testing.assert_close(back(idx), ours, atol=1e-5, rtol=0)


@pytest.mark.parametrize("options, message", [
    (dict(LLAMA, qk_norm=True), "cannot be exported: model.qk_norm=true"),
    (dict(LLAMA, logit_softcap=15.0), "cannot be exported: model.logit_softcap=15.0"),
    (dict(LLAMA, mlp="relu2"), "cannot be exported: model.mlp='relu2' with positions='rope' .*mlp='swiglu'"),
    # every option in one line (one at a time took a retraining each): the modern recipes' three
    (dict(LLAMA, qk_norm=True, logit_softcap=15.0, mlp="relu2"), r"model.qk_norm=true .*; model.logit_softcap=15.0 "
                                                                  r".*; model.mlp='relu2'"),
    ({"positions": "rope"}, "model.norm='layernorm' with positions='rope'"),
    ({"norm": "rmsnorm"}, "model.norm='rmsnorm' with positions='learned'.*norm='layernorm'"),
])
def test_export_refuses_what_transformers_cannot_represent(tmp_path, char_tokenizer, options, message):
    """Catches an export that silently drops an option (a model that predicts differently in transformers): the
    refusal is one line naming the option, and nothing is written."""
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=64, **options)
    with pytest.raises(ValueError, match=message) as err:
        export_hf(ckpt, tmp_path / "hf")
    assert "\n" not in str(err.value) and not (tmp_path / "hf").exists()


def _llama_dir(path: Path, **changes) -> Path:
    """A transformers Llama config.json describing exactly what a 2-layer, 32-wide tinylm GPT computes (no bias),
    with ``changes`` written over its fields; no weights: a refusal must come before they are read."""
    from tinylm.hf_llama import llama_config
    from tinylm.model import GPTConfig

    config = GPTConfig(vocab_size=48, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=False, **LLAMA)
    llama_config(config, eos_id=None).save_pretrained(path)
    fields = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**fields, **changes}))
    return path


@pytest.mark.parametrize("changes, message", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu' (tinylm supports 'silu' (SwiGLU))"),
    ({"num_key_value_heads": 1}, "num_key_value_heads=1 (tinylm supports = num_attention_heads (no GQA))"),
    ({"intermediate_size": 128}, "intermediate_size=128 (tinylm supports 8/3·hidden_size rounded to 64)"),
    ({"rms_norm_eps": 1e-5}, "rms_norm_eps=1e-05 (tinylm supports 1e-06)"),
    ({"head_dim": 8}, "head_dim=8 (tinylm supports hidden_size / heads)"),
    ({"mlp_bias": True}, "mlp_bias=True (tinylm supports = attention_bias)"),
    ({"rope_parameters": None, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     "rope_type='linear' (tinylm supports 'default' (no RoPE scaling))"),
    ({"num_key_value_heads": 1, "rms_norm_eps": 1e-5},  # both named, in one line
     "num_key_value_heads=1 (tinylm supports = num_attention_heads (no GQA)); "
     "rms_norm_eps=1e-05 (tinylm supports 1e-06)"),
], ids=["act", "gqa", "ffn", "eps", "head_dim", "mlp_bias", "rope_scaling", "two"])
def test_import_refuses_llama_variants_tinylm_does_not_compute(tmp_path, changes, message):
    """Catches import_hf loading a Llama whose config asks for what tinylm's GPT does not compute (grouped-query
    attention, scaled RoPE, another head size, eps, FFN width, activation, an MLP bias without attention bias): it
    would build a model that predicts differently. Each refusal is one line naming the field, its value and what
    tinylm supports, before any weight is read (the folder has none); the unchanged config gets past the check."""
    with pytest.raises(OSError, match="model.safetensors"):  # guard: the config itself passes, the weights are next
        import_hf(_llama_dir(tmp_path / "plain"))
    path = _llama_dir(tmp_path / "hf", **changes)
    with pytest.raises(ValueError) as err:
        import_hf(path)
    assert f"cannot import {str(path)!r}: its config.json has {message}; tinylm's GPT would" in str(err.value)
    assert "\n" not in str(err.value)


def _edit_config(path: Path, **changes) -> Path:
    fields = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**fields, **changes}))
    return path


@pytest.mark.parametrize("family, changes, message", [
    ("gpt2", {"n_layer": 3}, r"config.json names .* 3 layers, and its weights hold .* 2 layers"),
    ("gpt2", {"n_layer": 1}, r"config.json names .* 1 layers, and its weights hold .* 2 layers"),
    ("gpt2", {"n_positions": 16}, r"config.json names n_positions 16 \(width 32\), .* position table of \(32, 32\)"),
    ("gpt2", {"n_positions": 10**12}, r"config.json names n_positions 1,000,000,000,000 .* table of \(32, 32\)"),
    ("gpt2", {"n_head": 3}, r"n_embd=32, which n_head=3 does not divide into heads"),
    ("gpt2", {"n_layer": "two"}, r"n_layer='two', not a whole number >= 1"),
    ("gpt2", {"tinylm": [1]}, r"tinylm=\[1\], not a mapping of tinylm's options"),
    ("llama", {"num_hidden_layers": 3}, r"config.json names .* 3 layers, and its weights hold .* 2 layers"),
    ("gpt2", {"vocab_size": 10**12}, r"config.json names vocab_size 1,000,000,000,000"),
    ("llama", {"num_attention_heads": 0}, r"num_attention_heads=0, not a whole number >= 1"),
    ("gpt2", {}, r"no weights in .*model.safetensors"),
], ids=["more-layers", "fewer-layers", "positions", "huge-positions", "heads", "not-a-number", "tinylm-entry",
        "llama-layers", "huge-vocab", "llama-heads", "no-weights"])
def test_import_refuses_weights_that_do_not_fit_the_config(tmp_path, family, changes, message):
    """Catches import_hf building what config.json says over weights of another shape: a config.json saying 3
    layers over a 2-layer model's weights imported a model whose third layer was random (transformers only logged
    a report), one saying 1 layer dropped the second, and another position count, a head count that does not divide
    the width, a size that is not a number or a folder without weights ended in a traceback from transformers (a
    RuntimeError, a ZeroDivisionError, its own validation error); n_positions 10**12 allocated its position table
    first. Each is one line naming the field or weight and the fix, a user's error for the CLI."""
    from tinylm.cli.errors import is_user_error

    path = _family_dir(tmp_path / "hf", family)
    if not changes:
        (path / "model.safetensors").unlink()
    with pytest.raises((ValueError, OSError), match=message) as err:
        import_hf(_edit_config(path, **changes))
    assert "\n" not in str(err.value) and is_user_error(err.value) and str(path) in str(err.value)


def _family_dir(path: Path, family: str) -> Path:
    """A tiny transformers model's folder of ``family`` (gpt2 or llama), checked to import as written."""
    from tinylm.hf_llama import llama_config
    from tinylm.model import GPTConfig

    if family == "gpt2":
        path = _transformers_dir(path)
    else:
        config = GPTConfig(vocab_size=48, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=False, **LLAMA)
        transformers.LlamaForCausalLM(llama_config(config, eos_id=None)).save_pretrained(path)
    import_hf(path)  # guard: the folder as written imports
    return path


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_import_refuses_non_finite_weights(tmp_path, family):
    """Catches import_hf loading a model folder whose weights hold NaN or inf (an export of a diverged model, an
    edited file): a .ckpt is refused at load, a folder was not, so `generate --ckpt_path FOLDER` printed garbage
    (greedy's argmax of NaN logits) and sample-report, eval and a fine-tune's samples ended in torch.multinomial's
    traceback. It is one line naming the folder and the tensor, a user's error for the CLI."""
    from safetensors.torch import load_file, save_file

    from tinylm.cli.errors import is_user_error

    path = _family_dir(tmp_path / "hf", family)
    weights = load_file(path / "model.safetensors")
    name = next(k for k in sorted(weights) if ".1." in k and weights[k].dim() == 2)  # a layer's matrix: not tied
    weights[name][0, 0] = float("nan")
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as err:
        import_hf(path)
    assert str(err.value).startswith(f"model folder {str(path)!r} holds non-finite weights (NaN or inf) in 1 tensors")
    assert f"e.g. {name!r}: export it again from a checkpoint whose weights are finite" in str(err.value)
    assert "\n" not in str(err.value) and is_user_error(err.value)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "missing.safetensors"])
def test_import_refuses_a_shard_index_naming_files_outside_the_folder(tmp_path, shard):
    """Catches a sharded model's index (a downloaded or Hub folder) naming a file outside its folder: transformers
    read ``../outside.safetensors`` as the model's weights, and ``../../dev/zero`` until memory ran out (a
    MemoryError traceback; not tried here). One line names the file."""
    from tinylm.cli.errors import is_user_error

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=48, n_positions=32, n_embd=32, n_layer=2,
                                                                 n_head=2, activation_function="gelu"))
    model.save_pretrained(path := tmp_path / "hf", max_shard_size="40KB")
    index = path / "model.safetensors.index.json"
    import_hf(path)  # guard: the folder as written imports, sharded
    fields = json.loads(index.read_text())
    first = next(iter(fields["weight_map"]))
    (tmp_path / "outside.safetensors").write_bytes((path / fields["weight_map"][first]).read_bytes())
    fields["weight_map"][first] = shard
    index.write_text(json.dumps(fields))
    with pytest.raises(ValueError, match="model.safetensors.index.json names the weights file") as err:
        import_hf(path)
    assert "\n" not in str(err.value) and is_user_error(err.value)


# ---- init_from: a new run from pretrained weights --------------------------------------------------------------
@pytest.mark.parametrize("source", ["checkpoint", "llama-dir", "gpt2-dir"])
def test_init_from_takes_weights_and_shape_from_the_source(tmp_path, char_tokenizer, source):
    """Catches init_from ignoring the weights (a random model), building the config's shape instead of the weights'
    (n_layer 4 asked, 2 stored), or hyperparameters that no longer describe the model (load_model would fail)."""
    options = {} if source == "gpt2-dir" else LLAMA
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=64, **options)
    path = ckpt if source == "checkpoint" else export_hf(ckpt, tmp_path / "hf")
    want, _, _ = load_model(ckpt)
    module = TinyLM(vocab_size=char_tokenizer.vocab_size, block_size=16, n_layer=4, n_head=4, n_embd=64,
                    init_from=str(path))
    assert (module.hparams.n_layer, module.hparams.n_embd, module.model.config.positions) == \
        (2, 32, options.get("positions", "learned"))
    idx = torch.tensor([char_tokenizer.encode("First Citizen:\nBefore")])  # (1, 21) > block_size 16: crop
    with torch.no_grad():
        torch.testing.assert_close(module.model.eval()(idx[:, :16]), want(idx[:, :16]), atol=1e-5, rtol=0)
    if source == "gpt2-dir":
        assert module.model.transformer.wpe.weight.shape == (16, 32)  # the learned table cropped to block_size


def test_init_from_refuses_another_tokenizer(run_config, tmp_path, capsys):
    """Catches fine-tuning with a different tokenizer of the same size (ids would mean other characters): the run
    stops before training in one line naming init_from; a different vocabulary size is refused at once."""
    from tinylm.cli import main

    main(["fit", "--config", str(run_config(run={"name": "source"}))])
    source = tmp_path / "runs" / "source" / "checkpoints" / "last.ckpt"
    text = (tmp_path / "shakespeare_small.txt").read_text()
    assert "#" not in text and "z" in text
    other = tmp_path / "other.txt"
    other.write_text(text.replace("z", "#"))  # same number of distinct characters, another alphabet
    config = run_config(run={"name": "finetune"}, model={"init_from": str(source)},
                        data={"corpus": str(other), "cache_dir": str(tmp_path / "cache2")})
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(config)])
    err = capsys.readouterr().err.strip().splitlines()  # the data preparation's log lines, then the error
    assert exit_.value.code == 1
    assert re.search(r"model.init_from .*last.ckpt' was trained with another tokenizer", err[-1])
    assert not (tmp_path / "runs" / "finetune").exists()  # refused before it wrote anything: no empty run left
    # the fix it names can be followed (it said "data.tokenizer", and a checkpoint is no tokenizer file)
    assert f"`tinylm export --ckpt_path {source} --out DIR` and pass --data.tokenizer DIR/tinylm_tokenizer" in err[-1]
    main(["export", "--ckpt_path", str(source), "--out", str(tmp_path / "exported")])
    main(["fit", "--config", str(config), "--data.tokenizer", str(tmp_path / "exported" / "tinylm_tokenizer"),
          "--data.corpus", str(tmp_path / "shakespeare_small.txt")])  # (other.txt has a character it lacks)
    assert (tmp_path / "runs" / "finetune" / "checkpoints" / "last.ckpt").is_file()
    with pytest.raises(ValueError, match="has 48 token ids but this run's tokenizer has 2"):
        TinyLM(vocab_size=2, block_size=16, init_from=str(_write_checkpoint(
            tmp_path / "m.ckpt",
            build_tokenizer("char", documents=lambda: ["abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU", "v"]),
            bias=False, pad_vocab_multiple=1)))


@pytest.mark.parametrize("source", ["checkpoint", "export", "model-alone"])
def test_init_from_of_another_vocabulary_size_names_the_weights_tokenizer(tmp_path, char_tokenizer, source):
    """Catches the refusal of a tokenizer of another size (a char tokenizer built from a new corpus, whose characters
    are nearly always others) saying "fine-tune with the tokenizer the weights were trained with (data.tokenizer)":
    a checkpoint is no tokenizer file (--data.tokenizer X.ckpt fails), so it named no fix a user could follow. It
    names the way out as the same-size refusal does: a checkpoint's tokenizer written out by export, an export's
    folder; and of a folder holding the model alone (transformers' model.save_pretrained, no tokenizer files), it
    says the folder holds none (it said "--data.tokenizer FOLDER", which failed: "no tokenizer in directory")."""
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=64)
    path = ckpt if source == "checkpoint" else export_hf(ckpt, tmp_path / "hf")
    if source == "model-alone":
        for name in os.listdir(path):
            if name not in ("config.json", "generation_config.json", "model.safetensors"):
                shutil.rmtree(path / name) if (path / name).is_dir() else os.remove(path / name)
        with pytest.raises(ValueError, match="token ids but this run's tokenizer has 2") as err:
            TinyLM(vocab_size=2, block_size=16, init_from=str(path))
        assert f"own tokenizer: {str(path)!r} holds none (no tokenizer.json, nor vocab.json + merges.txt): save it " \
               "into that folder" in str(err.value) and "\n" not in str(err.value)
        return
    with pytest.raises(ValueError, match="token ids but this run's tokenizer has 2") as err:
        TinyLM(vocab_size=2, block_size=16, init_from=str(path))
    want = (f"`tinylm export --ckpt_path {ckpt} --out DIR` and pass --data.tokenizer DIR/tinylm_tokenizer"
            if source == "checkpoint" else f"--data.tokenizer {path / 'tinylm_tokenizer'}")
    assert want in str(err.value) and "\n" not in str(err.value)
    assert Tokenizer.load(path / "tinylm_tokenizer" if source == "export" else
                          export_hf(ckpt, tmp_path / "out") / "tinylm_tokenizer").fingerprint == \
        char_tokenizer.fingerprint  # the fix named gives the weights' own tokenizer


def test_a_run_from_init_from_resumes_and_validates_without_its_source(run_config, tmp_path, caplog):
    """Catches a resume (or `tinylm validate`) of a fine-tuning run reading model.init_from again: with the source
    moved it failed ('not found'); with another model written there it silently trained a different architecture
    (rope_theta) on the checkpoint's weights. The checkpoint alone must do."""
    import shutil

    from tinylm.checkpoint import load_checkpoint
    from tinylm.cli import main

    rope = {"positions": "rope", "rope_theta": 10000.0}
    main(["fit", "--config", str(run_config(run={"name": "source"}, model=rope))])
    source = tmp_path / "source.ckpt"
    shutil.copy(tmp_path / "runs" / "source" / "checkpoints" / "last.ckpt", source)
    config = run_config(run={"name": "finetune"}, model={"init_from": str(source)})
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["fit", "--config", str(config), "--model.n_layer", "3", "--model.positions", "learned"])
    last = tmp_path / "runs" / "finetune" / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["hyper_parameters"]["rope_theta"] == 10000.0
    # the architecture comes from the weights: an option set otherwise is named, and config.yaml records the model
    # built (it said n_layer 3 and positions learned, which a rerun of that file would have built)
    assert "the architecture comes from the weights; ignoring model.n_layer=3 (weights: 2)" in caplog.text
    assert "model.positions='learned' (weights: 'rope')" in caplog.text  # typed at its default: the user's too
    recorded = yaml.safe_load((tmp_path / "runs" / "finetune" / "config.yaml").read_text())["model"]
    assert (recorded["n_layer"], recorded["positions"], recorded["rope_theta"]) == (2, "rope", 10000.0)
    source.unlink()
    plain = run_config(run={"name": "finetune"}, name="plain.yaml")  # the same run, init_from not passed again
    caplog.clear()
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--config", str(plain), "--trainer.max_steps", "4", "--ckpt_path", "last"])
    messages = [r.getMessage() for r in caplog.records]
    assert any("its weights came from model.init_from" in m for m in messages)  # said where they came from
    assert not any("ignoring" in m for m in messages)  # init_from not passed, the architecture from the weights
    # a second resume (init_from passed again, as the run's own config has it): the checkpoints the first one wrote
    # still say where the weights came from (they had lost it, and the architecture the weights gave, and init_from
    # itself, were then taken for config values being ignored)
    caplog.clear()
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--config", str(config), "--trainer.max_steps", "6", "--ckpt_path", "last"])
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"its weights came from model.init_from {source}" in m for m in messages), messages
    assert not any("ignoring" in m for m in messages), messages
    assert load_checkpoint(last)["tinylm"]["init_from"] == str(source)
    main(["validate", "--config", str(config), "--ckpt_path", str(last)])
    hp = load_checkpoint(last)["hyper_parameters"]
    assert (hp["positions"], hp["rope_theta"]) == ("rope", 10000.0) and load_checkpoint(last)["global_step"] == 6


def test_a_run_from_init_from_records_which_weights_it_started_from(run_config, tmp_path, caplog):
    """Catches a fine-tuning run's record naming its source only as typed: config.yaml and every checkpoint said
    `init_from: runs/source/checkpoints/last.ckpt`, relative to a folder nobody recorded and with no step, and once
    the source run went on (it saves over its last.ckpt) the record named other weights: nobody could tell later
    where the run came from. The record names the absolute path and the step, as they were then."""
    from tinylm.checkpoint import load_checkpoint
    from tinylm.cli import main

    main(["fit", "--config", str(source := run_config(run={"name": "source"}))])
    config = run_config(run={"name": "finetune"}, model={"init_from": "runs/source/checkpoints/last.ckpt"},
                        name="finetune.yaml")
    main(["fit", "--config", str(config)])
    main(["fit", "--config", str(source), "--trainer.max_steps", "4", "--ckpt_path", "last"])  # the source goes on
    where = str(tmp_path / "runs" / "source" / "checkpoints" / "last.ckpt")
    record = (tmp_path / "runs" / "finetune" / "config.yaml").read_text()
    assert f"# first weights (model.init_from): {where} at step 2, as they were then\n" in record
    assert yaml.safe_load(record)["model"]["init_from"] == "runs/source/checkpoints/last.ckpt"  # the setting kept
    last = tmp_path / "runs" / "finetune" / "checkpoints" / "last.ckpt"
    meta = load_checkpoint(last)["tinylm"]
    assert (meta["init_from"], meta["init_from_step"]) == (where, 2)
    with caplog.at_level("INFO", logger="tinylm"):  # a resume names them too, and keeps them in its checkpoints
        main(["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", "last"])
    assert f"its weights came from model.init_from {where} at step 2;" in caplog.text
    assert load_checkpoint(last)["tinylm"]["init_from_step"] == 2 and load_checkpoint(last)["global_step"] == 4
    main(["fit", "--config", str(tmp_path / "runs" / "finetune" / "config.yaml"), "--run.name", "again"])
    assert "at step 4, as they were then" in (tmp_path / "runs" / "again" / "config.yaml").read_text()


def test_a_later_resume_with_the_runs_own_init_from_ignores_nothing(run_config, tmp_path, caplog):
    """Catches a fine-tuning run resumed with its own config (model.init_from: runs/source/checkpoints/last.ckpt)
    from a checkpoint that a resume wrote warning "ignoring model.init_from='runs/source/checkpoints/last.ckpt'
    (checkpoint: '/abs/runs/source/checkpoints/last.ckpt') (to change them, start a new run)": the checkpoints
    record the source's absolute path, and the config's relative one, the same file, was taken for another."""
    from tinylm.cli import main

    main(["fit", "--config", str(run_config(run={"name": "source"}))])
    config = run_config(run={"name": "finetune"}, model={"init_from": "runs/source/checkpoints/last.ckpt"},
                        name="finetune.yaml")
    main(["fit", "--config", str(config)])
    with caplog.at_level("WARNING", logger="tinylm"):
        for steps in ("4", "6"):  # (the second from the checkpoint the first resume wrote)
            main(["fit", "--config", str(config), "--trainer.max_steps", steps, "--ckpt_path", "last"])
    assert "ignoring model.init_from" not in caplog.text


def test_a_run_from_init_from_on_the_same_data_says_it_draws_the_same_batches(run_config, tmp_path, caplog):
    """Catches a new run from a checkpoint's weights on that run's own corpus (the guard's and the health monitor's
    advice: --model.init_from step-N.ckpt --model.lr ... --run.name NEW) reading the very batches the weights were
    trained on again from batch 0 (batch k is a pure function of data.seed and k), without a word. Another data.seed,
    another corpus or a resume of the new run is not told, nor another block_size or val_fraction (their windows are
    others: an offset is drawn over the train split's tokens less a window; these were told they were the same)."""
    from tinylm.cli import main
    from tinylm.data import TinyLMDataModule

    main(["fit", "--config", str(run_config(run={"name": "source"}))])
    source = str(tmp_path / "runs" / "source" / "checkpoints" / "last.ckpt")
    config = run_config(run={"name": "again"}, model={"init_from": source}, name="again.yaml")
    said = "was trained on this corpus with data.seed 1337 (2 batches): this run draws the same windows again"
    for argv, told in ((["--data.seed", "8", "--run.name", "other"], False),
                       (["--data.block_size", "8", "--run.name", "shorter"], False),  # (offsets over n - T tokens)
                       (["--data.val_fraction", "0.2", "--run.name", "split"], False),  # (a shorter train split)
                       ([], True), (["--trainer.max_steps", "4", "--ckpt_path", "last"], False)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="tinylm"):
            main(["fit", "--config", str(config), *argv])
        assert (said in caplog.text) is told, (argv, caplog.text)
    dms = [TinyLMDataModule(corpus=str(tmp_path / "shakespeare_small.txt"), tokenizer="char", block_size=16,
                            batch_size=2, cache_dir=str(tmp_path / "cache")) for _ in range(2)]
    for dm in dms:
        dm.setup("fit")
    first = [next(iter(dm.train_dataloader()))[0] for dm in dms]  # what the warning says: the same windows
    assert torch.equal(*first)


def test_export_replaces_an_earlier_export_whole_and_refuses_other_folders(tmp_path, small_data, char_tokenizer):
    """Catches a re-export leaving the earlier export's files behind (a BPE export's vocab.json and merges.txt beside
    a char model's tokenizer: two tokenizers in one folder), and an export writing into a folder of the user's
    (a downloaded model, notes), which would mix or overwrite their files."""
    first = _write_checkpoint(tmp_path / "a.ckpt", _tokenizers(small_data)["bpe"](), bias=False,
                              pad_vocab_multiple=1)
    out = export_hf(first, tmp_path / "hf")
    assert (out / "merges.txt").is_file()
    second = _write_checkpoint(tmp_path / "b.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=1)
    export_hf(second, out)
    assert not (out / "merges.txt").exists() and not (out / "vocab.json").exists()
    assert Tokenizer.load(out / "tinylm_tokenizer").fingerprint == char_tokenizer.fingerprint
    assert not (out / ".tinylm-export.partial").exists()  # no temporary folder left
    refused = _write_checkpoint(tmp_path / "c.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=1, qk_norm=True)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with pytest.raises(ValueError, match="qk_norm"):
        export_hf(refused, out)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before  # a failed export keeps the earlier one
    (out / "notes.md").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds files that are not a tinylm export \(notes.md\); pass a new"):
        export_hf(second, out)
    assert (out / "notes.md").read_text() == "mine" and (out / "config.json").is_file()
    (out / "notes.md").unlink()
    (out / "tokenizer_notes.json").write_text("mine")  # named like an export's file, but not one
    with pytest.raises(FileExistsError, match=r"\(tokenizer_notes.json\)"):
        export_hf(second, out)
    (out / "tokenizer_notes.json").unlink()
    partial = out / ".tinylm-export.partial"  # what a killed export leaves: recognised, and never mixed in
    partial.mkdir()
    (partial / "merges.txt").write_text("stale")
    (out / "config.json").unlink()  # killed while moving the new files in: config.json comes last
    export_hf(second, out)
    assert not partial.exists() and not (out / "merges.txt").exists() and (out / "config.json").is_file()
    with pytest.raises(ValueError, match="qk_norm"):
        export_hf(refused, tmp_path / "new" / "deeper" / "hf")
    assert not (tmp_path / "new").exists()  # a failed export leaves no folders it made
    (out / "tinylm_tokenizer" / "notes.md").write_text("mine")  # the user's file inside the export's folder
    with pytest.raises(FileExistsError, match=r"\(tinylm_tokenizer/notes.md\)"):
        export_hf(second, out)
    assert (out / "tinylm_tokenizer" / "notes.md").read_text() == "mine"
    (out / "tinylm_tokenizer" / "notes.md").unlink()
    (out / "config.json").write_text('{"model_type": "gpt2"}')  # a downloaded model, not tinylm's
    with pytest.raises(FileExistsError, match=r"config.json \(not a tinylm export's\)"):
        export_hf(second, out)
    with pytest.raises(ValueError, match="--out is empty; pass a folder path"):  # was read as "." (the cwd)
        export_hf(second, "")


def test_init_from_one_file_of_an_export_names_its_folder(tmp_path, char_tokenizer):
    """Catches --model.init_from DIR/model.safetensors failing as "not a readable checkpoint" instead of naming
    the folder to pass."""
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=64)
    folder = export_hf(ckpt, tmp_path / "hf")
    with pytest.raises(ValueError, match=f"pass the folder that holds it: --model.init_from {folder}"):
        TinyLM(vocab_size=char_tokenizer.vocab_size, block_size=16, init_from=str(folder / "model.safetensors"))


@pytest.mark.parametrize("command", ["validate", "fit"])
def test_an_export_folder_as_ckpt_path_says_how_to_use_it(run_config, tmp_path, char_tokenizer, command, capsys):
    """Catches `--ckpt_path EXPORT_DIR` answered "is a folder; pass --ckpt_path PATH to a .ckpt written by `tinylm
    fit`", which the user of an export may not have: the line says it is a Hugging Face model's folder and names
    transformers and --model.init_from DIR."""
    from tinylm.cli import main

    folder = export_hf(_write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=64),
                       tmp_path / "hf")
    args = {"fit": ["--config", str(run_config())]}
    with pytest.raises(SystemExit):
        main([command, "--ckpt_path", str(folder), *args.get(command, [])])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is a Hugging Face model's folder" in line and f"--model.init_from {folder}" in line, line


@pytest.mark.parametrize("command", ["generate", "validate"])
def test_a_model_folder_without_its_config_json_says_so(tmp_path, char_tokenizer, command, capsys):
    """Catches `--ckpt_path DIR` of a Hugging Face model's folder that lost its config.json (weights copied alone)
    answered "is a folder; pass --ckpt_path PATH to a .ckpt", silent on what the folder lacked."""
    from tinylm.cli import main

    folder = export_hf(_write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=64),
                       tmp_path / "hf")
    (folder / "config.json").unlink()
    with pytest.raises(SystemExit):
        main([command, "--ckpt_path", str(folder)])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "holds a model's weights (model.safetensors) but no config.json" in line, line


@pytest.mark.parametrize("command", ["validate", "fit"])
def test_a_hub_name_as_ckpt_path_says_how_to_use_it(run_config, tmp_path, command, capsys, monkeypatch):
    """Catches `fit --ckpt_path gpt2` (as `generate --ckpt_path gpt2` reads it) answered only "checkpoint 'gpt2'
    not found; pass --ckpt_path PATH to a .ckpt": the line names --model.init_from NAME, which starts a run from a
    Hub model. A missing local path (runs/x, a.ckpt) is not called a Hub name."""
    from tinylm.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (nothing asked of the Hub either way)
    config = run_config()  # (and the working folder: tmp_path, where runs/ is a folder)
    args = ["--config", str(config)] if command == "fit" else []
    (tmp_path / "runs").mkdir()
    for given, hub in (("org/tiny", True), ("gpt2", True), ("runs/x", False), ("a.ckpt", False)):
        with pytest.raises(SystemExit):
            main([command, "--ckpt_path", given, *args])
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"checkpoint {given!r} not found" in line and (f"--model.init_from {given} " in line) == hub, line


def test_export_on_a_full_disk_is_one_line(tmp_path, char_tokenizer, monkeypatch, capsys):
    """Catches safetensors' disk-full error (a SafetensorError, not an OSError) printed as a 23-line traceback: it is
    reported as the disk-full line, and the earlier export stays whole."""
    from safetensors import SafetensorError

    from tinylm import hf
    from tinylm.cli import main

    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=1)
    out = export_hf(ckpt, tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def disk_full(*args, **kwargs):  # what safetensors raises when the disk fills mid-write
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(hf, "_write_export", disk_full)
    with pytest.raises(SystemExit):
        main(["export", "--ckpt_path", str(ckpt), "--out", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "no space left on the disk" in err and str(out) in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("damage, message", [
    (lambda out: (out / "config.json").write_text('{"broken'), r"config.json' is not valid JSON .*export the model"),
    (lambda out: os.truncate(out / "model.safetensors", 5000), r"cannot be read .*: the file is cut or damaged"),
], ids=["broken-config-json", "cut-safetensors"])
def test_init_from_a_damaged_export_names_the_file_and_the_fix(tmp_path, char_tokenizer, damage, message):
    """Catches --model.init_from a Hugging Face folder with a broken config.json or a cut model.safetensors ending
    in json's or safetensors' traceback (a ValueError naming the file is what the CLI says in one line)."""
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=1)
    out = export_hf(ckpt, tmp_path / "hf")
    damage(out)
    with pytest.raises(ValueError, match=message):
        import_hf(out)


def test_two_exports_into_one_folder_take_turns(tmp_path, char_tokenizer):
    """Catches two `tinylm export` into one --out at once sharing the partial folder beside it: the second removed
    the first's as it was being swapped in (the first ended in a FileNotFoundError traceback, or said "wrote" with
    nothing there), or --out got one model's config.json beside the other's weights. The second export starts
    while the first is swapping in its folder; it waits its turn, and --out is then its export, whole."""
    import sys
    import threading

    import safetensors.torch

    narrow = _write_checkpoint(tmp_path / "a.ckpt", char_tokenizer, bias=False, pad_vocab_multiple=1)
    wide = _write_checkpoint(tmp_path / "b.ckpt", char_tokenizer, bias=True, pad_vocab_multiple=1)
    want = export_hf(wide, tmp_path / "ref")
    out, second, errors = tmp_path / "hf", [], []

    def export_wide() -> None:
        try:
            export_hf(wide, out)
        except BaseException as e:  # noqa: BLE001 (raised again below, in the test's thread)
            errors.append(e)

    def hook(event, args):  # (an audit hook stays for the process: inert once the test has its second export)
        if event == "tinylm.export.swap" and not second and str(args[1]) == str(out.resolve()):
            second.append(threading.Thread(target=export_wide))
            second[0].start()
            second[0].join(timeout=1.0)  # (it runs to its end here when nothing makes it wait)

    sys.addaudithook(hook)
    export_hf(narrow, out)
    second[0].join()
    assert not errors, errors
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in want.iterdir())
    assert json.loads((out / "config.json").read_text()) == json.loads((want / "config.json").read_text())
    weights, wanted = (safetensors.torch.load_file(d / "model.safetensors") for d in (out, want))
    assert weights.keys() == wanted.keys() and all(torch.equal(weights[k], wanted[k]) for k in wanted)


class _Payload:
    def __reduce__(self):
        return (os.system, ("true",))


def test_import_refuses_a_pickled_weights_file_in_one_line(tmp_path):
    """Catches a downloaded GPT-2 folder whose pytorch_model.bin pickles code: transformers' weights-only load
    refused it (nothing ran) but in an UnpicklingError traceback advising weights_only=False."""
    from safetensors.torch import load_file

    folder = _transformers_dir(tmp_path / "gpt2")
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save({**state, "payload": _Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"refusing to load .*never executes code"):
        import_hf(folder)


def test_a_gpt2_folder_with_the_bare_models_weight_names_imports(tmp_path):
    """Catches the size check counting layers only under a prefix ("transformer.h.0."): a folder whose weights carry
    the bare GPT2Model's names ("h.0.attn...", "wte.weight": OpenAI's gpt2 files have this layout), which
    from_pretrained loads, was refused as holding 0 layers."""
    from safetensors.torch import load_file, save_file

    cfg = transformers.GPT2Config(vocab_size=58, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                  activation_function="gelu")
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    save_file({k.removeprefix("transformer."): v.contiguous() for k, v in state.items() if k != "lm_head.weight"},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert len(import_hf(tmp_path).transformer.h) == 2


@pytest.mark.parametrize("kind", ["json", "tiktoken"])
def test_export_does_not_publish_the_tokenizer_files_path(tmp_path, char_tokenizer, small_bpe, kind):
    """A run whose --data.tokenizer named a file by its path (/home/alice/tok.json): the checkpoint keeps the path (a
    resume compares it), but the export, made to be pushed to the hub, carried it in tinylm_tokenizer.json's spec."""
    home = tmp_path / "home" / "alice-SECRET"
    home.mkdir(parents=True)
    if kind == "json":
        char_tokenizer.save(home / "mytok")
        spec = str(home / "mytok" / "tinylm_tokenizer.json")
    else:
        spec = "tiktoken:" + str(Path(shutil.copy(small_bpe.tiktoken, home / "small.tiktoken")))
    tok = build_tokenizer(spec)
    assert tok.spec == spec
    ckpt = _write_checkpoint(tmp_path / "m.ckpt", tok, bias=True, pad_vocab_multiple=64)
    out = export_hf(ckpt, tmp_path / "hf")
    leaked = [p.relative_to(out) for p in out.rglob("*") if p.is_file() and b"alice-SECRET" in p.read_bytes()]
    assert leaked == []
    again = Tokenizer.load(out / "tinylm_tokenizer")
    named = "tiktoken:small.tiktoken" if kind == "tiktoken" else "tinylm_tokenizer.json"  # the file's name alone
    assert again.fingerprint == tok.fingerprint and again.spec == named
    assert load_model(ckpt)[1].spec == spec  # the checkpoint's own record is left as it was


def test_init_from_a_hub_models_name_reads_it_from_the_hugging_face_cache(run_config, tmp_path, monkeypatch, capsys):
    """Catches `--model.init_from gpt2` (nanoGPT's init_from='gpt2', which docs/export.md compares it to) refused as
    "'gpt2' not found" though transformers had the model in its cache: a Hub model's name is read from the Hugging
    Face cache (here laid out as huggingface_hub writes it, offline), recorded by the folder it was read from; a name
    in no cache, offline, is one line that says why."""
    import huggingface_hub.constants

    from tinylm.cli import main

    main(["fit", "--config", str(run_config(run={"name": "source"}))])
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--tinylm-test--tiny"
    export_hf(tmp_path / "runs" / "source" / "checkpoints" / "last.ckpt", repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # (HF_HUB_CACHE=...)
    snapshot = repo / "snapshots" / commit
    main(["fit", "--config", str(run_config(run={"name": "tuned"}, model={"init_from": "tinylm-test/tiny"})),
          "--data.tokenizer", str(snapshot / "tinylm_tokenizer")])
    assert (tmp_path / "runs" / "tuned" / "checkpoints" / "last.ckpt").is_file()
    record = (tmp_path / "runs" / "tuned" / "config.yaml").read_text()
    assert f"# first weights (model.init_from): {snapshot}, as they were then\n" in record
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(run_config(run={"name": "none"}, model={"init_from": "tinylm-test/absent"}))])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "model.init_from 'tinylm-test/absent' is no file or folder here, and no Hugging Face Hub model" in err
    assert not (tmp_path / "runs" / "none").exists()


def test_generate_and_sample_report_read_an_export_folder_and_a_hub_models_name(run_config, tmp_path, monkeypatch,
                                                                                 capsys):
    """Catches `tinylm generate --ckpt_path EXPORT_DIR` (or a Hub model's name: `--ckpt_path gpt2`) refused as "a
    Hugging Face model's folder, not a tinylm checkpoint": generate and sample-report read the folder with its own
    tokenizer (tinylm's copy, else its tokenizer.json), and write what the checkpoint it came from writes."""
    import huggingface_hub.constants

    from tinylm.cli import main

    main(["fit", "--config", str(run_config(run={"name": "src"}))])
    ckpt = tmp_path / "runs" / "src" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    greedy = ["--prompt", "Fir", "--strategy", "greedy", "--max_new_tokens", "12"]
    want = run_command("generate", ["--ckpt_path", str(ckpt), *greedy])
    export = run_command("export", ["--ckpt_path", str(ckpt), "--out", str(tmp_path / "hf")])
    assert run_command("generate", ["--ckpt_path", str(export), *greedy]) == want
    shutil.rmtree(export / "tinylm_tokenizer")  # a folder from transformers: its tokenizer.json
    assert run_command("generate", ["--ckpt_path", str(export), *greedy]) == want
    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(export, repo / "snapshots" / ("1" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("1" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert run_command("generate", ["--ckpt_path", "org/tiny", *greedy]) == want
    run_command("sample-report", ["--ckpt_path", "org/tiny", "--out", str(tmp_path / "report"), "--num_samples", "2",
                                  "--max_new_tokens", "4"])
    assert (tmp_path / "report").is_dir()


def test_a_hub_model_without_safetensors_is_read_with_its_pytorch_weights(tmp_path, monkeypatch):
    """Catches a Hub model published before safetensors (pytorch_model.bin alone, as many GPT-2 fine-tunes) read
    without its weights, which were left out of the download: `--model.init_from org/old` said "no weights in
    <the Hugging Face cache's folder>; pass a directory written by `tinylm export`"."""
    import huggingface_hub

    from tinylm.net import model_source

    published = {"config.json": "{}", "vocab.json": "{}", "pytorch_model.bin": "weights"}
    snapshot = tmp_path / "snapshot"

    def download(repo_id, allow_patterns):  # (huggingface_hub's: the repository's files that match, into the cache)
        snapshot.mkdir(exist_ok=True)
        for name, text in published.items():
            if any(fnmatch.fnmatch(name, p) for p in allow_patterns):
                (snapshot / name).write_text(text)
        return str(snapshot)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    monkeypatch.chdir(tmp_path)
    assert (Path(model_source("org/old", "model.init_from")) / "pytorch_model.bin").is_file()


def test_a_hub_models_name_at_a_revision_reads_that_revision(tmp_path, monkeypatch):
    """Catches `--ckpt_path gpt2@main` or `--model.init_from org/name@v1.0` (a Hub model pinned to a branch, tag or
    commit) refused as "checkpoint 'gpt2@main' not found": the whole text was taken for a path. NAME@REVISION is that
    revision's folder in the Hugging Face cache (here laid out as huggingface_hub writes it, offline); a revision in
    no cache is one line naming what was given."""
    import huggingface_hub.constants

    from tinylm.net import hub_name, model_source

    assert hub_name("org/tiny@refs/pr/1") and not hub_name("run@2.ckpt")  # (a missing file: "not found", no Hub)
    repo = tmp_path / "hub" / "models--org--tiny"
    for commit, ref in (("1" * 40, "main"), ("2" * 40, "v1.0")):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text("{}")
        (repo / "snapshots" / commit / "model.safetensors").write_text("")
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    for given, commit in (("org/tiny", "1"), ("org/tiny@main", "1"), ("org/tiny@v1.0", "2"),
                          ("org/tiny@" + "2" * 40, "2")):
        assert Path(model_source(given, "--ckpt_path")) == repo / "snapshots" / (commit * 40), given
    with pytest.raises(FileNotFoundError, match=r"--ckpt_path 'org/tiny@v2' is no file or folder here, and no "
                                                r"Hugging Face Hub model of that name could be read"):
        model_source("org/tiny@v2", "--ckpt_path")


def test_a_hugging_face_folder_without_a_tokenizer_is_refused_in_one_line(run_config, tmp_path, capsys):
    """Catches `tinylm sample-report --ckpt_path DIR` of a Hugging Face model's folder without tokenizer files ending
    in an AttributeError traceback ('NoneType' object has no attribute 'eos_id'), and `tinylm generate` telling the
    user of such a folder to "use a checkpoint written by `tinylm fit`": both name the folder and the files missing."""
    from helpers import _one_line_error

    from tinylm.cli import main

    main(["fit", "--config", str(run_config(run={"name": "src"}))])
    out = tmp_path / "hf"
    main(["export", "--ckpt_path", str(tmp_path / "runs" / "src" / "checkpoints" / "last.ckpt"), "--out", str(out)])
    shutil.rmtree(out / "tinylm_tokenizer")
    (out / "tokenizer.json").unlink()
    capsys.readouterr()
    said = "holds no tokenizer (tokenizer.json, vocab.json + merges.txt, or tinylm_tokenizer/)"
    _one_line_error(capsys, ["generate", "--ckpt_path", str(out), "--prompt", "a"], said)
    _one_line_error(capsys, ["sample-report", "--ckpt_path", str(out), "--out", str(tmp_path / "report")], said)
