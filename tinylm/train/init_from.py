"""``model.init_from``: a run that starts from pretrained weights (a tinylm checkpoint, or a Hugging Face GPT-2 or
Llama folder such as `tinylm export` writes) takes its architecture and weights from them; the run's data and config
give the rest (tinylm.model.config's "data" and "run" fields)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from tinylm.checkpoint import (
    checkpoint_in_folder,
    gpt_from_checkpoint,
    is_checkpoint,
    is_sharded_checkpoint,
    load_checkpoint,
)
from tinylm.errors import named_option

log = logging.getLogger("tinylm")


def architecture_fields() -> tuple[str, ...]:
    """The GPTConfig fields ``model.init_from`` takes from the weights (their kinds "size" and "arch"); the others
    ("data", "run") come from the run's data and config."""
    from tinylm.model.config import config_fields

    return config_fields("size", "arch")


def own_tokenizer(source: str | os.PathLike) -> str:
    """How to pass the tokenizer pretrained weights ``source`` were trained with as --data.tokenizer: a Hugging Face
    folder holds it (tinylm's own in an export's tinylm_tokenizer/), a checkpoint's is written out by `tinylm export`
    (a checkpoint is no tokenizer file: it said "(data.tokenizer)", which a user could not follow)."""
    source = Path(source)
    own = source / "tinylm_tokenizer"  # (an export's; a Hugging Face folder its tokenizer.json, or vocab.json)
    if source.is_dir() and (own.is_dir() or (source / "tokenizer.json").is_file() or (source / "vocab.json").is_file()):
        return f"--data.tokenizer {own if own.is_dir() else source}"
    if source.is_dir():  # a model saved alone (save_pretrained of the model, not its tokenizer): that advice failed,
        # "no tokenizer in directory ..."
        return (f"{str(source)!r} holds none (no tokenizer.json, nor vocab.json + merges.txt): save it into that "
                f"folder (transformers' tokenizer.save_pretrained) and pass --data.tokenizer {source}, or pass its "
                "tokenizer.json as --data.tokenizer PATH")
    return (f"write it out with `tinylm export --ckpt_path {source} --out DIR` and pass --data.tokenizer "
            "DIR/tinylm_tokenizer")


def load_pretrained(path: str | os.PathLike, *, vocab_size: int, block_size: int
                    ) -> tuple[dict[str, Any], dict[str, Any], str | None, tuple[int | None, dict | None]]:
    """(architecture, GPT state_dict, tokenizer fingerprint or None, origin) of pretrained weights for
    ``model.init_from``: a Hugging Face GPT-2 or Llama directory (e.g. from `tinylm export`) or a tinylm checkpoint.
    ``origin``: a checkpoint's (step, data): its global_step, from the same reading of the file as the weights, and
    its data module's state (what its run trained on, for `warn_same_batches`); (None, None) of a folder.

    The architecture is `architecture_fields`. The weights must have `vocab_size` ids; with learned
    positions their table must cover `block_size` (a longer one is cropped, as nanoGPT's crop_block_size does).
    """
    from tinylm.tokenize.tokenizer import Tokenizer

    if not str(path).strip():
        raise ValueError("model.init_from is empty; pass a tinylm .ckpt or a Hugging Face GPT-2/Llama directory, or "
                         "leave it unset (null) to start from random weights")
    path, origin = Path(path), (None, None)
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
        with named_option("--model.init_from"):  # (one reading: the step of the weights taken, also of a live
            ckpt = load_checkpoint(path, map_location="cpu", mmap=True)  # run's last.ckpt replaced meanwhile)
            model, tokenizer, _ = gpt_from_checkpoint(ckpt, path)
        origin = (int(ckpt.get("global_step", 0)), ckpt.get("TinyLMDataModule"))
    else:
        raise FileNotFoundError(f"model.init_from {str(path)!r} not found; pass a tinylm .ckpt or a Hugging Face "
                                "GPT-2/Llama directory (e.g. one written by `tinylm export`)")
    c = model.config
    if c.vocab_size != vocab_size:
        raise ValueError(f"model.init_from {str(path)!r} has {c.vocab_size} token ids but this run's tokenizer has "
                         f"{vocab_size}: fine-tune with the weights' own tokenizer: {own_tokenizer(path)}")
    state = model.state_dict()
    if c.positions == "learned":
        if block_size > c.block_size:
            raise ValueError(f"data.block_size {block_size} is longer than the {c.block_size} positions "
                             f"model.init_from {str(path)!r} learned; use data.block_size <= {c.block_size}")
        state["transformer.wpe.weight"] = state["transformer.wpe.weight"][:block_size]
    architecture = {name: getattr(c, name) for name in architecture_fields()}
    return architecture, state, tokenizer.fingerprint if tokenizer is not None else None, origin


def warn_same_batches(source: str, data: dict | None, dm: Any) -> None:
    """Say when a run from ``source``'s weights draws the very batches they were trained on: batch k is a pure
    function of (data.seed, k) (tinylm.data.loader), so a new run on the corpus of the source's run with its
    data.seed reads the source's first batches again, from batch 0 (the guard's and the health monitor's advice, a
    new run from step-N.ckpt with a lower LR, went over the N steps of data the weights had seen, without a word).
    ``data``: the source checkpoint's data module state; ``dm``: this run's data module."""
    if not isinstance(data, dict) or not data.get("train_batches_yielded") or "corpus_fingerprints" not in data:
        return
    seed, metas = getattr(dm, "seed", None), getattr(dm, "metas", None)
    if seed != data.get("seed") or [m["corpus_fingerprint"] for m in metas or []] != data["corpus_fingerprints"]:
        return
    if any(data.get(k, getattr(dm, k, None)) != getattr(dm, k, None) for k in ("block_size", "val_fraction")):
        return  # other windows: an offset is drawn over the train split's tokens less a window
    log.warning("model.init_from %s was trained on this corpus with data.seed %s (%s batches): this run draws the "
                "same windows again from its first batch; pass another --data.seed for other windows", source, seed,
                f"{data['train_batches_yielded']:,}")
