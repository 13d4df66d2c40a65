"""``model.init_from``: a run that starts from pretrained weights (a tinylm checkpoint, or a Hugging Face GPT-2 or
Llama folder such as `tinylm export` writes) takes its architecture and weights from them; the run's data and config
give the rest (tinylm.model.config's "data" and "run" fields)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tinylm.checkpoint import checkpoint_in_folder, is_checkpoint, is_sharded_checkpoint, load_model


def architecture_fields() -> tuple[str, ...]:
    """The GPTConfig fields ``model.init_from`` takes from the weights (their kinds "size" and "arch"); the others
    ("data", "run") come from the run's data and config."""
    from tinylm.model.config import config_fields

    return config_fields("size", "arch")


def load_pretrained(path: str | os.PathLike, *, vocab_size: int, block_size: int
                    ) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(architecture, GPT state_dict, tokenizer fingerprint or None) of pretrained weights for ``model.init_from``: a
    Hugging Face GPT-2 or Llama directory (e.g. from `tinylm export`) or a tinylm checkpoint.

    The architecture is `architecture_fields`. The weights must have `vocab_size` ids; with learned
    positions their table must cover `block_size` (a longer one is cropped, as nanoGPT's crop_block_size does).
    """
    from tinylm.tokenize.tokenizer import Tokenizer

    if not str(path).strip():
        raise ValueError("model.init_from is empty; pass a tinylm .ckpt or a Hugging Face GPT-2/Llama directory, or "
                         "leave it unset (null) to start from random weights")
    path = Path(path)
    if path.is_file() and (path.suffix in (".safetensors", ".bin") or path.name == "config.json"):
        raise ValueError(f"model.init_from {str(path)!r} is one file of a Hugging Face model; pass the folder that "
                         f"holds it: --model.init_from {path.parent}")
    if path.is_dir() and not (path / "config.json").exists() and (found := checkpoint_in_folder(path)):
        raise FileNotFoundError(f"model.init_from {str(path)!r} is a run's folder, not a Hugging Face model's: pass "
                                f"one of its checkpoints, --model.init_from {found}")
    if path.is_dir() and not is_sharded_checkpoint(path):
        from tinylm.hf import TINYLM_TOKENIZER_DIR, import_hf

        model = import_hf(path)
        tok_dir = path / TINYLM_TOKENIZER_DIR
        tokenizer = Tokenizer.load(tok_dir) if tok_dir.is_dir() else None
    elif is_checkpoint(path):  # a .ckpt file, or the folder of a sharded (FSDP2) one
        model, tokenizer, _ = load_model(path, option="--model.init_from")
    else:
        raise FileNotFoundError(f"model.init_from {str(path)!r} not found; pass a tinylm .ckpt or a Hugging Face "
                                "GPT-2/Llama directory (e.g. one written by `tinylm export`)")
    c = model.config
    if c.vocab_size != vocab_size:
        raise ValueError(f"model.init_from {str(path)!r} has {c.vocab_size} token ids but this run's tokenizer has "
                         f"{vocab_size}: fine-tune with the tokenizer the weights were trained with (data.tokenizer)")
    state = model.state_dict()
    if c.positions == "learned":
        if block_size > c.block_size:
            raise ValueError(f"data.block_size {block_size} is longer than the {c.block_size} positions "
                             f"model.init_from {str(path)!r} learned; use data.block_size <= {c.block_size}")
        state["transformer.wpe.weight"] = state["transformer.wpe.weight"][:block_size]
    architecture = {name: getattr(c, name) for name in architecture_fields()}
    return architecture, state, tokenizer.fingerprint if tokenizer is not None else None
