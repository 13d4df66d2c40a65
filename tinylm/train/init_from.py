"""``model.init_from``: a run that starts from pretrained weights (a tinylm checkpoint, or a Hugging Face GPT-2 or
Llama folder such as `tinylm export` writes) takes its architecture and weights from them; the run's data and config
give the rest (tinylm.model.config's "data" and "run" fields)."""

from __future__ import annotations

import logging
import os
import re
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
    own = source / "tinylm_tokenizer"  # (an export's; any Hugging Face folder holds its tokenizer.json)
    if source.is_dir():
        return f"--data.tokenizer {own if own.is_dir() else source}"
    return (f"write it out with `tinylm export --ckpt_path {source} --out DIR` and pass --data.tokenizer "
            "DIR/tinylm_tokenizer")


# what a Hub model's folder needs here (import_hf's files): not the repository's other formats (GPT-2's holds TF,
# Flax, ONNX and Rust copies of its weights, ~3 GB)
HUB_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
             "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")
_FILE_SUFFIXES = {".ckpt", ".pt", ".pth", ".bin", ".safetensors", ".json", ".txt", ".yaml", ".yml", ".py"}
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def local_source(source: str | os.PathLike) -> str:
    """``model.init_from`` as a local path: a file or folder here as given; else a Hugging Face Hub model's name
    (``gpt2``, ``openai-community/gpt2``, ``org/name``) is its snapshot folder in the Hugging Face cache, downloaded
    there once (its config, safetensors weights and tokenizer files), as nanoGPT's ``init_from='gpt2'`` takes it
    through transformers' from_pretrained. HF_HUB_OFFLINE=1 and HF_HUB_CACHE / HF_HOME work as for transformers."""
    given = str(source)
    path = os.path.expanduser(given)
    if os.path.exists(path) or not _HUB_NAME.fullmatch(given) or Path(given).suffix in _FILE_SUFFIXES:
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    from tinylm.net import hub_offline, hub_offline_asked, hub_unreachable

    log.info("model.init_from %r is no file here: reading the Hugging Face Hub model of that name (its cached copy, "
             "or downloaded once into the Hugging Face cache)", given)
    unreachable = hub_unreachable()  # (asked in 3 s: huggingface_hub retries a dead network for longer)
    try:
        with hub_offline(hub_offline_asked() or unreachable is not None):
            return snapshot_download(given, allow_patterns=list(HUB_FILES))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        why = unreachable or (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise FileNotFoundError(
            f"model.init_from {given!r} is no file or folder here, and no Hugging Face Hub model of that name could be "
            f"read ({why}); pass a tinylm .ckpt, a Hugging Face GPT-2/Llama directory (e.g. one written by `tinylm "
            "export`), or a Hub model's name with the network up (or one in the Hugging Face cache)") from None


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
