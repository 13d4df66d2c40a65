"""tinylm's tokenizers as Hugging Face ones: a `tokenizers.Tokenizer` for every backend (char, scratch BPE,
tiktoken, HF), and the files `transformers` reads (`tokenizer.json` + `tokenizer_config.json`, plus GPT-2's
`vocab.json`/`merges.txt` for byte-level BPEs with GPT-2's pre-tokenization). `tinylm export` writes them beside the
model (tinylm.hf)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tinylm.tokenize.backends import parse_ranks
from tinylm.tokenize.tokenizer import GPT2_PATTERN, Tokenizer


def hf_tokenizer(tokenizer: Tokenizer) -> Any:
    """The same tokenizer as a Hugging Face `tokenizers.Tokenizer` (one difference: HF tokenizers read special-token
    strings in the text as specials, tinylm reads them as plain text)."""
    from tokenizers import Tokenizer as HFTokenizer

    state = tokenizer.state_dict()["state"]
    if tokenizer.kind == "hf":
        tok = HFTokenizer.from_str(state["json"])  # a copy; tinylm's own sets encode_special_tokens on its object
        # tinylm encodes without the post-processor's additions (a BOS before each text, Llama style): the model
        # never saw them, so the export must not add them either
        tok.post_processor = None
    elif tokenizer.kind == "char":
        tok = _char_tokenizer(state["chars"], state["special_tokens"])
    elif tokenizer.kind == "scratch-bpe":
        from tinylm.tokenize.bpe import ByteLevelBPE

        tok = _byte_level_tokenizer(ByteLevelBPE.from_state(state))
    elif tokenizer.kind == "tiktoken":
        from tinylm.tokenize.bpe import ByteLevelBPE

        bpe = ByteLevelBPE(parse_ranks(state["ranks"]), special_tokens=state["special_tokens"],
                           pattern=state["pattern"])
        tok = _byte_level_tokenizer(bpe)
    else:
        raise ValueError(f"cannot convert a {tokenizer.kind!r} tokenizer to Hugging Face format")
    for s, i in tokenizer.special_tokens.items():
        if tok.token_to_id(s) != i:
            raise ValueError(f"special token {s!r} got id {tok.token_to_id(s)} in the Hugging Face tokenizer instead "
                             f"of {i}; it is spelled like an ordinary token")
    return tok


def _char_tokenizer(chars: str, specials: dict[str, int]) -> Any:
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {ch: i for i, ch in enumerate(chars)} | specials
    # WordLevel over single characters; an unknown character fails ("Missing [UNK]") as it does in tinylm
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per code point
    tok.decoder = decoders.Fuse()  # join pieces without the spaces a WordLevel decode puts between them
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def _byte_level_tokenizer(bpe: Any) -> Any:
    """A tinylm.tokenize.bpe.ByteLevelBPE as a HF BPE. Specials go into the BPE vocab so they keep their ids."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    from tinylm.tokenize.bpe import _to_unicode

    state = bpe.to_state()  # tokens in GPT-2's byte-to-unicode form, like vocab.json
    vocab = state["vocab"] | state["special_tokens"]
    if len(vocab) != len(state["vocab"]) + len(state["special_tokens"]):
        raise ValueError(f"special tokens {sorted(state['special_tokens'])} are spelled like ordinary tokens")
    merges = [(_to_unicode(a), _to_unicode(b)) for a, b in bpe.merges]  # in rank order = HF merge priority
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    if bpe.pattern == GPT2_PATTERN:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2's regex
    else:  # e.g. cl100k: split with the encoding's own regex, then only map bytes to unicode
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(bpe.pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in state["special_tokens"]])
    return tok


def save_hf_tokenizer(tokenizer: Tokenizer, out_dir: str | Path, *, model_max_length: int) -> list[str]:
    """Write `tokenizer.json` + `tokenizer_config.json` (a `PreTrainedTokenizerFast`), and GPT-2's `vocab.json` +
    `merges.txt` when the tokenizer is a byte-level BPE with GPT-2's pre-tokenization. Returns the file names."""
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    tok = hf_tokenizer(tokenizer)
    eos = next((s for s, i in tokenizer.special_tokens.items() if i == tokenizer.eos_id), None)
    kwargs = {"bos_token": eos, "eos_token": eos} if eos is not None else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length,
                                   clean_up_tokenization_spaces=False, **kwargs)
    written = [Path(p).name for p in fast.save_pretrained(out)]
    # transformers 5 names the class TokenizersBackend, which 4.x cannot load; both read PreTrainedTokenizerFast
    config_path = out / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text(encoding="utf-8"))
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    # 4.x's PreTrainedTokenizerFast also returns token_type_ids, which GPT-2 embeds (wte[0] added at every position)
    # and Llama's generate refuses: the model's inputs named, for every version
    tok_config["model_input_names"] = ["input_ids", "attention_mask"]
    config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    gpt2_like = isinstance(tok.model, models.BPE) and type(tok.pre_tokenizer) is pre_tokenizers.ByteLevel
    if gpt2_like:  # what GPT2Tokenizer (and tools that predate tokenizer.json) read
        written += [Path(p).name for p in tok.model.save(str(out))]
    return written
