"""To and from Hugging Face transformers' GPT-2 format (and, through tinylm/hf_llama.py, Llama's).

`hf_family` picks the format from the architecture options: nanoGPT's (learned positions, LayerNorm, GELU, tied)
is GPT-2; rope + rmsnorm + swiglu is Llama; anything else is refused naming the option.

tinylm's GPT is GPT-2's architecture, so a checkpoint maps onto `GPT2LMHeadModel` weight for weight:
- tinylm's `nn.Linear` stores (out, in); GPT-2's `Conv1D` stores (in, out): the four projection matrices of every
  block are transposed.
- tinylm pads the embedding rows up to a multiple of `pad_vocab_multiple`; the export keeps the first vocab_size rows
  (the padded rows are never inputs nor targets).
- `bias=False` models get zero biases (GPT-2 always has them), which computes the same function.
- tinylm's `gelu` MLP is exact GELU, so the config says `activation_function="gelu"`; OpenAI's GPT-2 uses "gelu_new",
  the tanh approximation, which is tinylm's `mlp: gelu_tanh` (how `--model.init_from gpt2` imports it); `relu2` is
  transformers' "relu2", relu(x)².
The tokenizer is written as a Hugging Face fast tokenizer (tinylm.tokenize.hf), plus tinylm's own copy in
`tinylm_tokenizer/`.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import fnmatch
import json
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tinylm.checkpoint import load_model, non_finite
from tinylm.model import GPT, GPTConfig
from tinylm.paths import ASIDE, check_output_path, follow_umask, naming, not_utf8, swap_in_folder
from tinylm.tokenize.hf import save_hf_tokenizer
from tinylm.tokenize.tokenizer import STATE_FILE

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TINYLM_TOKENIZER_DIR = "tinylm_tokenizer"
# what an export folder holds: transformers' model files (sharded weights included) and tokenizer files, and
# tinylm's own tokenizer. A folder holding only these (with tinylm's config.json) is an earlier export, which
# export_hf replaces whole; any other name there is the user's and stops it.
EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                "model-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].safetensors", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                "chat_template.jinja", TINYLM_TOKENIZER_DIR)
PARTIAL = ".tinylm-export.partial"  # the export being written, beside --out (.NAME.tinylm-export.partial); left behind
# only by a killed export (inside --out by earlier versions, and where the folder holding --out is not writable)
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# GPTConfig fields that GPT-2's config cannot express; kept under "tinylm" in config.json for an exact import
_EXTRA_FIELDS = ("bias", "pad_vocab_multiple", "attn_mask", "eos_id")
# model.mlp -> GPT-2's activation_function: tinylm's "gelu" is exact erf GELU (transformers' "gelu"); OpenAI's GPT-2
# uses the tanh approximation ("gelu_new"; "gelu_pytorch_tanh" is the same function, torch's kernel), tinylm's gelu_tanh
ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu2": "relu2"}  # (relu2: relu(x)², 4·C wide in both)
_MLP_OF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu2": "relu2"}
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which tinylm uses


# ---------------------------------------------------------------------------------------------------- loading
@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' log lines and progress bars off for the block, as they were after it. Its tqdm bars
    ("Writing model shards", "Loading weights") wrote carriage-return frames of a one-file, 100% bar into
    `tinylm export`'s output, a log or a pipe included, and into a `fit --model.init_from` run's log; tinylm says
    the result itself."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
        return DTYPES[dtype]
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype}")
    return dtype


# ---------------------------------------------------------------------------------------------------- model
def hf_family(config: GPTConfig) -> str:
    """"gpt2" or "llama": the transformers architecture that computes this GPT; ValueError naming every option that
    neither can represent (one at a time took a retraining each to find the next)."""
    from tinylm.hf_llama import LLAMA_OPTIONS

    family, wanted = ("gpt2", {"norm": ("layernorm",), "mlp": tuple(ACTIVATIONS)}) if config.positions == "learned" \
        else ("llama", {k: (v,) for k, v in LLAMA_OPTIONS.items() if k != "positions"})
    blocks = (["model.qk_norm=true (neither GPT-2 nor Llama in transformers normalises queries and keys; train with "
               "qk_norm false)"] if config.qk_norm else [])
    if config.logit_softcap is not None:
        blocks.append(f"model.logit_softcap={config.logit_softcap} (GPT-2 and Llama in transformers do not soft-cap "
                      "logits; train with logit_softcap null)")
    blocks += [f"model.{name}={getattr(config, name)!r} with positions={config.positions!r} (transformers' "
               f"{'GPT-2' if family == 'gpt2' else 'Llama'} needs {name}={' or '.join(map(repr, values))})"
               for name, values in wanted.items() if getattr(config, name) not in values]
    if blocks:
        raise ValueError(f"this model cannot be exported: {'; '.join(blocks)}. GPT-2: learned + layernorm + gelu "
                         "(or gelu_tanh, relu2); Llama: rope + rmsnorm + swiglu, no qk_norm, no logit_softcap")
    return family


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """tinylm GPT weights renamed and shaped for `GPT2LMHeadModel` (the names already match; Conv1D is transposed;
    an untied LM head is its own lm_head.weight)."""
    c = model.config
    out = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(_CONV1D):
            tensor = tensor.t()  # Linear (out, in) -> Conv1D (in, out)
        elif name in ("transformer.wte.weight", "lm_head.weight"):
            tensor = tensor[: c.vocab_size]  # (Vp, C) -> (V, C): drop the padding rows
        out[name] = tensor.contiguous()
    if not c.bias:  # GPT-2 always has biases: zeros compute the same function
        C = c.n_embd
        sizes = {"ln_1": C, "ln_2": C, "attn.c_attn": 3 * C, "attn.c_proj": C, "mlp.c_fc": 4 * C, "mlp.c_proj": C}
        for i in range(c.n_layer):
            for module, size in sizes.items():
                out[f"transformer.h.{i}.{module}.bias"] = torch.zeros(size)
        out["transformer.ln_f.bias"] = torch.zeros(C)
    return out


def hf_config(config: GPTConfig, *, eos_id: int | None) -> Any:
    """A transformers `GPT2Config` with tinylm's shape, its GELU (exact, or the tanh approximation) and LayerNorm eps
    1e-5."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=config.vocab_size,  # the real vocabulary: padded rows are not exported
        n_positions=config.block_size,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_inner=4 * config.n_embd,
        activation_function=ACTIVATIONS[config.mlp],
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        layer_norm_epsilon=LAYER_NORM_EPS,
        bos_token_id=eos_id,  # GPT-2 convention: one <|endoftext|> both starts and ends documents
        eos_token_id=eos_id,
        tie_word_embeddings=config.tie_embeddings,  # (false: lm_head.weight of its own)
        tinylm={k: getattr(config, k) for k in _EXTRA_FIELDS},
    )


def export_hf(ckpt_path: str | Path, out_dir: str | Path, *, dtype: torch.dtype | str = torch.float32) -> Path:
    """Write a transformers `GPT2LMHeadModel` (nanoGPT architecture) or `LlamaForCausalLM` (rope + rmsnorm +
    swiglu) directory from a tinylm checkpoint; returns `out_dir`. Other architectures raise ValueError naming the
    option transformers cannot represent.

    Args:
        ckpt_path: a `.ckpt` written by `tinylm fit`.
        out_dir: directory to write: config.json, generation_config.json, model.safetensors, the Hugging Face
            tokenizer files and `tinylm_tokenizer/`. An earlier export there is replaced whole (no file of it
            left behind to mix with this one): the new one is written beside it and swapped in, so at every
            instant the folder holds one whole export. A folder holding anything else is refused.
        dtype: dtype of the saved weights: torch.float32 (exact), torch.bfloat16 or torch.float16 (or their names).
    """
    dtype = _dtype(dtype)
    out = Path(out_dir)
    if not str(out_dir).strip():  # Path("") is ".": the working folder, which the user did not name
        check_output_path(out_dir, folder=True)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {str(out)!r} is a file; pass a directory path (it is created if missing)")
    if out.is_symlink() and not out.exists():
        raise NotADirectoryError(f"--out {str(out)!r} is a link to nothing; pass a directory path")
    check_output_path(out, folder=True)  # a folder that cannot be made (under /proc, read-only): one line, now
    if why := not_utf8(str(out.absolute()), "rename it in UTF-8 (convmv -f latin1 -t utf8 --notest NAME, or mv), or "
                       "pass another --out"):  # (the tokenizer's writer takes UTF-8 paths alone: a traceback)
        raise ValueError(f"--out {str(out.absolute())!r} is no UTF-8 text: {why}")
    with _one_export_at_a_time(next((p for p in out.absolute().parents if p.is_dir()), out.absolute())):
        return _export_into(ckpt_path, out, dtype)


def _export_into(ckpt_path: str | Path, out: Path, dtype: torch.dtype) -> Path:
    foreign = _not_an_export(out) if out.is_dir() else []
    if foreign:
        raise FileExistsError(f"--out {str(out)!r} holds files that are not a tinylm export ({', '.join(foreign[:3])}"
                              f"{', ...' if len(foreign) > 3 else ''}); pass a new or empty folder")
    made = [p for p in [*reversed(out.parents), out] if not p.exists()]  # the folders mkdir makes, outermost first
    out.parent.mkdir(parents=True, exist_ok=True)
    target = out.resolve()  # a link to a folder: the folder it names is replaced, the link kept
    # written whole beside --out first, then swapped in: at every instant --out holds one whole export (the
    # earlier one or this one), and a failed or killed export leaves the earlier one as it was
    tmp = target.parent / f".{target.name}{PARTIAL}"
    shutil.rmtree(tmp, ignore_errors=True)  # a killed export's: never mixed into this one
    shutil.rmtree(target.parent / f".{target.name}{ASIDE}", ignore_errors=True)
    try:
        tmp.mkdir()
    except PermissionError:  # --out's own folder is the user's to write, not the one that holds it
        tmp = None
    try:
        if tmp is None:
            out.mkdir(exist_ok=True)
            _write_in_place(ckpt_path, out, dtype)
        else:
            _write_export(ckpt_path, tmp, dtype)
    except BaseException as e:
        shutil.rmtree(made[0] if made else tmp or out / PARTIAL, ignore_errors=True)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, OSError) and "(os error 28)" in str(e):  # safetensors' Rust writer: not an OSError
            raise OSError(errno.ENOSPC, "No space left on device", str(out)) from None
        if (named := naming(e, out)) is not e:  # (transformers' config.json on a full disk: at close, unnamed)
            raise named from None
        raise
    if tmp is not None:
        follow_umask(tmp)
        swap_in_folder(tmp, target, event="tinylm.export.swap")
    return out


@contextlib.contextmanager
def _one_export_at_a_time(parent: Path) -> Iterator[None]:
    """Exports into one folder take turns (a lock on the nearest existing folder above --out, held until the export
    is in place; exports to two folders side by side wait for each other too, which costs seconds and leaves no
    lock file beside them): two at once shared the partial folder beside --out, each removing the other's, so one said
    "wrote" and published nothing, or --out got one model's config beside the other's weights."""
    import fcntl
    import logging
    import os

    try:
        fd = os.open(parent, os.O_RDONLY)
    except OSError:  # a folder that cannot be opened to lock: the export goes on as before (and says what fails)
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logging.getLogger("tinylm").info("waiting for another tinylm export in %s to finish (exports into one "
                                             "folder take turns)", parent)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks
            pass
        yield
    finally:
        os.close(fd)


def _write_in_place(ckpt_path: str | Path, out: Path, dtype: torch.dtype) -> None:
    """The export written into ``out/PARTIAL``, then moved into ``out`` file by file: only where the folder that
    holds --out cannot be written to (so no new folder can go beside it)."""
    tmp = out / PARTIAL
    shutil.rmtree(tmp, ignore_errors=True)
    _write_export(ckpt_path, tmp, dtype)
    follow_umask(tmp)
    # config.json goes last and comes last, so a kill in between leaves a folder this function still recognises
    # only the names an export writes: a file that appeared meanwhile is the user's
    olds = [p for p in out.iterdir() if p != tmp and _export_name(p.name)]
    for old in sorted(olds, key=lambda p: p.name == "config.json"):
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    for new in sorted(tmp.iterdir(), key=lambda p: p.name == "config.json"):
        new.rename(out / new.name)
    tmp.rmdir()


@contextlib.contextmanager
def _weights_readable(path: Path) -> Iterator[None]:
    """A weights file that is cut or damaged (safetensors' "incomplete metadata, file not fully covered") is named,
    with the fix, in one line."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as e:
        raise ValueError(f"the weights in {str(path)!r} cannot be read ({str(e).splitlines()[0]}): the file is cut "
                         "or damaged; export the model again with `tinylm export`") from None


def _export_name(name: str) -> bool:
    """Whether an export writes a file or folder of this name (EXPORT_FILES)."""
    return any(fnmatch.fnmatch(name, pattern) for pattern in EXPORT_FILES)


def _not_an_export(folder: Path) -> list[str]:
    """What in `folder` an earlier `export_hf` did not write: names outside EXPORT_FILES, and a config.json without
    tinylm's own section (GPT-2 and Llama exports both have one). Empty for an empty folder, an earlier export, or
    what a killed export left (its PARTIAL folder, beside some of the files it was moving in)."""
    names = sorted(p.name for p in folder.iterdir() if p.name != PARTIAL)
    foreign = [n for n in names if not _export_name(n)]
    own = folder / TINYLM_TOKENIZER_DIR  # what Tokenizer.save writes there
    if own.is_dir():
        foreign += [f"{TINYLM_TOKENIZER_DIR}/{p.name}" for p in sorted(own.iterdir())
                    if p.name not in (STATE_FILE, "tokenizer.json")]
    if foreign or not names or (folder / PARTIAL).is_dir():
        return foreign
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ["no tinylm config.json"]
    return [] if isinstance(config, dict) and "tinylm" in config else ["config.json (not a tinylm export's)"]


def _write_export(ckpt_path: str | Path, out: Path, dtype: torch.dtype) -> None:
    model, tokenizer, _ = load_model(ckpt_path)
    c = model.config
    family = hf_family(c)
    if c.attn_mask != "causal":
        warnings.warn(f"this model was trained with attn_mask={c.attn_mask!r}; transformers' {family} only does "
                      "causal attention, so its outputs match tinylm's only on single documents without a prefix")
    eos_id = tokenizer.eos_id if tokenizer is not None else c.eos_id
    if family == "gpt2":
        from transformers import GPT2LMHeadModel

        hf = GPT2LMHeadModel(hf_config(c, eos_id=eos_id)).eval()
        state = hf_state_dict(model)
    else:
        from transformers import LlamaForCausalLM

        from tinylm.hf_llama import llama_config, llama_state_dict

        hf = LlamaForCausalLM(llama_config(c, eos_id=eos_id)).eval()
        state = llama_state_dict(model)
    hf.load_state_dict(state, strict=True)  # strict: every transformers weight comes from the checkpoint
    if broken := non_finite(hf.to(dtype).state_dict()):  # float16 ends at 65,504: a larger weight was written as inf
        raise ValueError(f"--dtype {str(dtype).removeprefix('torch.')} cannot hold the weights of {str(ckpt_path)!r}: "
                         f"{broken[0]!r} overflows it to inf; export with --dtype bfloat16 or float32")
    with quiet_transformers():
        hf.save_pretrained(out)
    if tokenizer is None:
        warnings.warn(f"checkpoint {str(ckpt_path)!r} holds no tokenizer; exported the model only")
    else:
        save_hf_tokenizer(tokenizer, out, model_max_length=c.block_size)
        shared = copy.copy(tokenizer)  # the checkpoint's own keeps its spec: a resume compares it
        shared.spec = published_spec(tokenizer.spec)
        shared.save(out / TINYLM_TOKENIZER_DIR)


def published_spec(spec: str) -> str:
    """A tokenizer spec as an export publishes it: a file or folder the run named by its path
    (`--data.tokenizer /home/me/tok.json`, `tiktoken:/home/me/x.tiktoken`) by its name alone, so a folder pushed to
    the hub does not carry the user's directories; `bpe`, `char`, `tiktoken:gpt2` as they are. Nothing reads the
    spec of an export back but messages (`--data.tokenizer DIR/tinylm_tokenizer` names the folder itself)."""
    prefix = "tiktoken:" if spec.startswith("tiktoken:") else ""
    path = spec.removeprefix(prefix)
    return prefix + re.split(r"[\\/]", path.rstrip("/\\"))[-1] if re.search(r"[\\/]", path) else spec


# ---------------------------------------------------------------------------------------------------- import
# GPT2Config fields that change the function GPT2LMHeadModel computes, with the one setting tinylm's GPT computes:
# (field, accepts(value, config), what tinylm supports). Dropout does not matter at inference;
# reorder_and_upcast_attn only reorders the same fp32 arithmetic (and sdpa attention ignores it), so it imports.
_IMPORTABLE = (
    ("activation_function", lambda v, hc: v in _MLP_OF,
     f"{', '.join(map(repr, _MLP_OF))}: exact erf GELU, the tanh approximation of OpenAI's GPT-2, relu(x)²"),
    ("layer_norm_epsilon", lambda v, hc: v == LAYER_NORM_EPS, f"{LAYER_NORM_EPS}, nn.LayerNorm's default"),
    ("n_inner", lambda v, hc: v in (None, 4 * hc.n_embd), "null or 4 * n_embd"),
    ("scale_attn_weights", lambda v, hc: v is True, "true: attention scores divided by sqrt(head size)"),
    ("scale_attn_by_inverse_layer_idx", lambda v, hc: not v, "false"),
    ("add_cross_attention", lambda v, hc: not v, "false: a decoder-only GPT has no cross-attention"),
)


# config.json's fields that give the weights' shapes: model_type -> (the sizes, the width, the heads it splits into)
_SHAPE_FIELDS = {
    "gpt2": (("vocab_size", "n_positions", "n_layer", "n_head", "n_embd"), "n_embd", "n_head"),
    "llama": (("vocab_size", "max_position_embeddings", "num_hidden_layers", "num_attention_heads", "hidden_size"),
              "hidden_size", "num_attention_heads"),
}
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
_AGAIN = "the file was edited or belongs to another model: export the model again with `tinylm export`"


def _check_shape(path: Path, config: dict, sizes: tuple[str, ...], width: str, heads: str) -> None:
    """The sizes in config.json are whole numbers >= 1 and the width splits into the heads, before transformers
    reads them (it raised a ZeroDivisionError or its own validation error, with a traceback)."""
    for field in sizes:
        value = config.get(field, 1)  # (a missing size takes transformers' default; the weights then decide)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"cannot import {str(path)!r}: its config.json has {field}={value!r}, not a whole "
                             f"number >= 1; {_AGAIN}")
    if not isinstance(config.get("tinylm", {}), dict):  # (tinylm's own section, which `tinylm export` writes)
        raise ValueError(f"cannot import {str(path)!r}: its config.json has tinylm={config['tinylm']!r}, not a "
                         f"mapping of tinylm's options; {_AGAIN}")
    if width in config and heads in config and config[width] % config[heads]:
        raise ValueError(f"cannot import {str(path)!r}: its config.json has {width}={config[width]}, which "
                         f"{heads}={config[heads]} does not divide into heads; {_AGAIN}")


def hf_weights(model_class: Any, path: Path) -> dict[str, torch.Tensor]:
    """The fp32 state_dict of ``model_class.from_pretrained(path)``, refusing weights that do not fit config.json:
    transformers fills a weight the file lacks with random numbers and drops one it does not expect, with only a
    logged report (a config.json saying n_layer 3 over a 2-layer model's weights imported a random third layer),
    and raised a RuntimeError with a traceback for a weight of another shape."""
    if not any((path / name).is_file() for name in _WEIGHT_FILES):
        raise FileNotFoundError(f"no weights in {str(path)!r} (none of {', '.join(_WEIGHT_FILES)}); pass a "
                                "directory written by `tinylm export`")
    import pickle

    from tinylm.checkpoint import check_finite, code_refused

    _check_shards(path)
    _check_size(path, model_class.config_class.from_pretrained(path))
    with quiet_transformers(), _weights_readable(path):  # its load report: the error below says what matters
        try:
            model, info = model_class.from_pretrained(path, output_loading_info=True, ignore_mismatched_sizes=True)
        except (pickle.UnpicklingError, OSError) as e:  # a pytorch_model.bin pickling code: transformers'
            # weights-only load refused it, in a traceback that advised weights_only=False (4.x: an OSError raised
            # over it, "Unable to load weights ... set from_tf=True")
            refused = e
            while refused is not None and not isinstance(refused, pickle.UnpicklingError):
                refused = refused.__cause__ or refused.__context__
            if refused is None:
                raise
            raise code_refused(path, refused, "its weights file", ": pass a directory with model.safetensors (e.g. "
                               "written by `tinylm export`)") from None
    wrong = [f"{name} is {tuple(theirs)} in the weights but {tuple(ours)} by config.json"
             for name, theirs, ours in sorted(info.get("mismatched_keys") or [])]
    wrong += [f"{name} is missing from the weights" for name in sorted(info.get("missing_keys") or [])]
    wrong += [f"{name} is in the weights but not in the model config.json describes"
              for name in sorted(info.get("unexpected_keys") or [])]
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise ValueError(f"cannot import {str(path)!r}: its weights do not fit its config.json: {wrong[0]}{more}; "
                         f"{_AGAIN}")
    state = {k: v.float() for k, v in model.state_dict().items()}
    # NaN or inf weights (an export of a diverged model, an edited file): generate printed garbage, sample-report
    # and the samples of a fine-tune from them ended in torch.multinomial's traceback
    check_finite(state, path, "model folder", "export it again from a checkpoint whose weights are finite "
                 "(tinylm export --ckpt_path CKPT --out DIR), or use another model")
    return state


def _check_shards(path: Path) -> None:
    """The files a sharded model's index names are files of its folder: transformers reads each name as a path from
    the folder, so an index naming ``../../../dev/zero`` read that device until memory ran out (a MemoryError
    traceback), and ``/dev/stdin`` waited on the terminal."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        try:
            names = (json.loads((path / index).read_text(encoding="utf-8")).get("weight_map") or {}).values()
        except (OSError, ValueError, AttributeError):  # (none, or damaged: transformers says so in its own words)
            continue
        bad = next((n for n in map(str, names) if Path(n).name != n or not (path / n).is_file()), None)
        if bad is not None:
            raise ValueError(f"cannot import {str(path)!r}: its {index} names the weights file {bad!r}, which is no "
                             f"file of the folder; {_AGAIN}")


def _weight_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of the weights files in ``path``, read from their headers (safetensors) or mapped
    (a weights-only torch file): nothing is allocated."""
    import pickle

    from safetensors import SafetensorError, safe_open

    files = [n for n in ("model.safetensors", "pytorch_model.bin") if (path / n).is_file()]
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if not files and (path / index).is_file():
            files = sorted(set((json.loads((path / index).read_text(encoding="utf-8")).get("weight_map") or {})
                               .values()))
    shapes = {}
    for name in files:
        try:
            if name.endswith(".safetensors"):
                with safe_open(path / name, "pt") as f:
                    shapes.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
            else:
                state = torch.load(path / name, map_location="cpu", weights_only=True, mmap=True)
                shapes.update({k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)})
        except (OSError, ValueError, RuntimeError, pickle.UnpicklingError, AttributeError, SafetensorError):
            return {}  # (a damaged or unsafe file: from_pretrained's load says so in its own words)
    return shapes


def _check_size(path: Path, hc: Any) -> None:
    """config.json's vocabulary, width and layers against the weights' own shapes, before transformers builds the
    model config.json names: vocab_size 10**12 ended in an allocation traceback, n_layer 10**6 ran for minutes
    taking the machine's memory."""
    shapes = _weight_shapes(path)
    embedding = next((v for k, v in shapes.items() if k.endswith(("wte.weight", "embed_tokens.weight"))), None)
    layers = {m[1] for k in shapes if (m := re.search(r"(?:^|\.)(?:h|layers)\.(\d+)\.", k))}
    n_layer, width = hc.num_hidden_layers, hc.hidden_size
    if embedding is None:
        return
    if embedding != (hc.vocab_size, width) or len(layers) != n_layer:
        raise ValueError(f"cannot import {str(path)!r}: its config.json names vocab_size {hc.vocab_size:,}, width "
                         f"{width:,} and {n_layer:,} layers, and its weights hold an embedding of {embedding} and "
                         f"{len(layers)} layers; {_AGAIN}")
    table = next((v for k, v in shapes.items() if k.endswith("wpe.weight")), None)  # GPT-2's learned positions
    if table is not None and table != (hc.max_position_embeddings, width):  # (n_positions 10**9: 128 GB allocated)
        raise ValueError(f"cannot import {str(path)!r}: its config.json names n_positions "
                         f"{hc.max_position_embeddings:,} (width {width:,}), and its weights hold a position table of "
                         f"{table}; {_AGAIN}")


def import_hf(path: str | Path) -> GPT:
    """A tinylm GPT (eval mode, fp32) from a transformers GPT-2 or Llama directory, e.g. one written by `export_hf`.

    Directories from elsewhere load too when their config describes the function tinylm's GPT computes (exact GELU,
    LayerNorm eps 1e-5, ...; see `_IMPORTABLE`); any other config raises ValueError naming the field. OpenAI's
    GPT-2 itself ("gelu_new", the tanh approximation) imports as ``mlp: gelu_tanh``.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {str(path)!r}; pass a directory written by `tinylm export`")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{str(path / 'config.json')!r} is not valid JSON ({e}); export the model again with "
                         "`tinylm export` (or fix the file)") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type is None:
        raise ValueError(f"{str(path / 'config.json')!r} names no model_type; only GPT-2 and Llama (model_type "
                         "'gpt2', 'llama') import")
    if model_type not in _SHAPE_FIELDS:
        raise ValueError(f"{str(path)!r} holds a {model_type!r} model; only GPT-2 and Llama (model_type 'gpt2', "
                         "'llama') import")
    _check_shape(path, config, *_SHAPE_FIELDS[model_type])
    if model_type == "llama":
        from tinylm.hf_llama import import_llama

        return import_llama(path, hf_weights)
    hc = GPT2Config.from_pretrained(path)
    unsupported = [f"{field}={getattr(hc, field, None)!r} (tinylm supports {what})"
                   for field, ok, what in _IMPORTABLE if not ok(getattr(hc, field, None), hc)]
    if unsupported:
        raise ValueError(f"cannot import {str(path)!r}: its config.json has {'; '.join(unsupported)}; tinylm's GPT "
                         "would predict differently from this model, so use it with transformers instead")
    state = hf_weights(GPT2LMHeadModel, path)
    extra = dict(getattr(hc, "tinylm", None) or {})
    biases = [v for k, v in state.items() if k.endswith(".bias") and k.startswith("transformer.")]
    # a bias-free export carries zero biases; keep them if something (e.g. fine-tuning in transformers) changed them
    bias = bool(extra.get("bias", True)) or any(bool(b.any()) for b in biases)
    # a folder from elsewhere carries none: GPTConfig's defaults
    carried = {k: extra[k] for k in _EXTRA_FIELDS if k in extra} | {"bias": bias}
    tied = bool(getattr(hc, "tie_word_embeddings", True))
    config = GPTConfig(vocab_size=hc.vocab_size, block_size=hc.n_positions, n_layer=hc.n_layer, n_head=hc.n_head,
                       n_embd=hc.n_embd, dropout=0.0, tie_embeddings=tied, mlp=_MLP_OF[hc.activation_function],
                       **carried)
    model = GPT(config)
    target = model.state_dict()
    for name in target:
        if name == "lm_head.weight" and tied:
            continue  # tied to wte
        tensor = state[name].t() if name.endswith(_CONV1D) else state[name]
        with torch.no_grad():
            target[name][: tensor.size(0)].copy_(tensor)  # wte, lm_head: the real rows; the padded ones are zeroed
            if name in ("transformer.wte.weight", "lm_head.weight"):
                target[name][tensor.size(0):].zero_()
    return model.eval()


def hf_folder(ckpt_path: str | Path, option: str = "--ckpt_path") -> Path | None:
    """The Hugging Face model folder ``ckpt_path`` names (a folder with a config.json, or a Hub name's folder in the
    Hugging Face cache), else None: a tinylm checkpoint."""
    from tinylm.net import model_source

    folder = Path(model_source(ckpt_path, option))
    return folder if folder.is_dir() and (folder / "config.json").is_file() else None


def load_any(ckpt_path: str | Path, map_location: Any = "cpu", *, option: str = "--ckpt_path") -> tuple[GPT, Any]:
    """(GPT in eval mode on ``map_location``, its Tokenizer) of ``ckpt_path``: a tinylm checkpoint (`load_model`), or a
    Hugging Face GPT-2/Llama folder (an export, or transformers' save_pretrained) or a Hub model's name (its folder in
    the Hugging Face cache, downloaded there once), read with the folder's own tokenizer: tinylm's copy in an export,
    else its tokenizer.json (or vocab.json + merges.txt). One without a tokenizer is refused (generate and
    sample-report need it). `tinylm generate --ckpt_path gpt2`."""
    from tinylm.device import resolve_device
    from tinylm.tokenize.tokenizer import Tokenizer

    folder = hf_folder(ckpt_path, option)
    if folder is None:
        model, tokenizer, _ = load_model(ckpt_path, map_location=map_location, option=option)
        if tokenizer is None:  # (sample-report's prompts ended in an AttributeError traceback)
            raise ValueError(f"checkpoint {str(ckpt_path)!r} carries no tokenizer; use a checkpoint written by "
                             "`tinylm fit`")
        return model, tokenizer
    model = import_hf(folder).to(resolve_device(str(map_location or "cpu")))
    own = folder / TINYLM_TOKENIZER_DIR
    if not (own.is_dir() or (folder / "tokenizer.json").is_file() or (folder / "vocab.json").is_file()):
        raise FileNotFoundError(f"{option} {str(ckpt_path)!r}: the Hugging Face model's folder {str(folder)!r} holds "
                                "no tokenizer (tokenizer.json, vocab.json + merges.txt, or tinylm_tokenizer/); save "
                                "its tokenizer there (transformers' tokenizer.save_pretrained(folder))")
    return model, Tokenizer.load(own if own.is_dir() else folder)
