"""GPTConfig: the shape and architecture options of a GPT, validated on creation. Each option is declared once,
here: `TinyLM`'s signature (what `tinylm fit --help` lists under ``--model.*``), the checkpoint, init_from, export
and scaling code read the fields and their kinds from this class."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from tinylm.model.attention import ATTN_MASKS
from tinylm.ranges import check_ranges

POSITIONS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "gelu_tanh", "swiglu", "relu2")
CONFIG_RANGES = {
    "vocab_size": "[1, inf)", "block_size": "[1, inf)", "n_layer": "[1, inf)", "n_head": "[1, inf)",
    "n_embd": "[1, inf)", "pad_vocab_multiple": "[1, inf)", "dropout": "[0, 1)", "eos_id": "[0, vocab_size)",
    "rope_theta": "(1, inf)", "logit_softcap": "[1, 10000]",
}
"""Valid values of GPTConfig's numeric fields (interval notation, see tinylm.ranges)."""
_FLOATS = ("dropout", "rope_theta", "logit_softcap")
KINDS = {
    "data": "set by the data: the tokenizer and data.block_size decide it (`tinylm fit` links it; never by hand)",
    "size": "the model's size: what a scaling ladder varies from rung to rung",
    "arch": "the rest of the architecture: pretrained weights (model.init_from) bring their own",
    "run": "how this run uses the model: its own choice, also when starting from pretrained weights",
}
"""What each field's ``kind`` means. The architecture of a set of weights is its "size" and "arch" fields."""


def option(kind: str, default: Any) -> Any:
    """A GPTConfig field of ``kind`` (one of KINDS) with ``default`` (every field has one: it is TinyLM's too)."""
    assert kind in KINDS, kind  # a typo in the fields below
    return field(default=default, metadata={"kind": kind})


@dataclass
class GPTConfig:
    """Shape and options of a GPT; validated on creation. The fields come in TinyLM's (and `--help`'s) order."""

    vocab_size: int = option("data", 0)  # 0: not linked yet (TinyLM says how; GPTConfig refuses it)
    """Number of token ids. Linked from the data module's tokenizer; do not set it by hand."""
    block_size: int = option("data", 256)
    """Context length in tokens. Linked from ``data.block_size``."""
    eos_id: int | None = option("data", None)
    """End-of-document token id (for ``attn_mask: document``). Linked from the data module."""
    n_layer: int = option("size", 6)
    """Number of transformer blocks."""
    n_head: int = option("size", 6)  # must divide n_embd
    """Attention heads per block."""
    n_embd: int = option("size", 384)
    """Width of the residual stream."""
    dropout: float = option("run", 0.0)
    """Dropout probability on embeddings, attention weights and residual branches (0 for pretraining)."""
    bias: bool = option("arch", True)
    """Use biases in Linear layers and LayerNorms (GPT-2 style); False is a bit faster and as good."""
    attn_mask: str = option("run", "causal")  # "document" needs eos_id; with "prefix" GPT.forward takes prefix_len
    """``causal`` (default), ``document`` (causal, never across the EOS between packed documents) or
    ``prefix`` (bidirectional over a prefix)."""
    pad_vocab_multiple: int = option("arch", 64)
    """Pad the embedding table up to a multiple of this (64 is faster on GPUs); 1 disables."""
    positions: str = option("arch", "learned")
    """``learned`` (nanoGPT's table of block_size position vectors) or ``rope`` (rotary embeddings of
    q and k: relative positions, no table)."""
    rope_theta: float = option("arch", 10000.0)  # 10,000 as in RoFormer and Llama
    """RoPE base: channel pair i turns by rope_theta^(-2i/head_size) radians per position."""
    norm: str = option("arch", "layernorm")
    """``layernorm`` (nanoGPT) or ``rmsnorm`` (no mean subtraction, no bias, a learned gain: Llama's; the
    speedruns' RMSNorm has no gain, docs/modern.md "What differs from the speedruns")."""
    qk_norm: bool = option("arch", False)  # RMS without a gain: no parameters
    """RMS-normalise each head's queries and keys before attention (bounded attention logits)."""
    mlp: str = option("arch", "gelu")
    """``gelu`` (nanoGPT, 4·n_embd wide), ``gelu_tanh`` (the same with GELU's tanh approximation: OpenAI's GPT-2,
    transformers' ``gelu_new``), ``swiglu`` (Llama; ~8/3·n_embd wide, a multiple of 64, so about the
    same parameters from n_embd ~128 up; the rounding swings small widths either way) or ``relu2`` (relu(x)²,
    4·n_embd wide; modded-nanogpt)."""
    tie_embeddings: bool = option("arch", True)
    """The LM head shares the token embedding matrix (nanoGPT); false gives it its own."""
    logit_softcap: float | None = option("arch", None)  # Gemma 2's too
    """Squash logits into (-cap, cap) with cap·tanh(logits/cap), cap >= 1 (modded-nanogpt: 15-30);
    null: off."""
    zero_init_proj: bool = option("arch", False)
    """Start every residual branch's output projection at zero, so each block begins as the
    identity (modded-nanogpt, nanochat); false: GPT-2's N(0, 0.02/sqrt(2·n_layer))."""

    def __post_init__(self) -> None:
        values = vars(self)
        for name in [n for n in CONFIG_RANGES if n not in _FLOATS]:  # counts and ids: a float fails later, in torch
            optional = "None" in str(next(f.type for f in fields(self) if f.name == name))  # (eos_id)
            if (values[name] is not None or not optional) and type(values[name]) is not int:
                raise ValueError(f"{name} must be an integer, got {values[name]!r}")
        check_ranges("", values, CONFIG_RANGES)
        for f in fields(self):  # a switch given as text ("false") is true in Python: it turned biases on
            if f.type in (bool, "bool") and not isinstance(values[f.name], bool):
                raise ValueError(f"{f.name} must be true or false, got {values[f.name]!r}")
        if self.n_embd % self.n_head:
            near = next(d for d in range(self.n_head, 0, -1) if self.n_embd % d == 0)
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
                f"pick a divisor of n_embd, e.g. n_head={near}"
            )
        for name, choices in (("attn_mask", ATTN_MASKS), ("positions", POSITIONS), ("norm", NORMS), ("mlp", MLPS)):
            if values[name] not in choices:
                raise ValueError(f"unknown {name} {values[name]!r}; choose one of {', '.join(choices)}")
        if self.positions == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"positions='rope' rotates pairs of channels: the head size n_embd/n_head = "
                             f"{self.n_embd // self.n_head} must be even; change n_head or n_embd")
        if self.attn_mask == "document" and self.eos_id is None:
            raise ValueError("attn_mask='document' needs eos_id, the token that ends each packed document, and this "
                             "tokenizer has none (a char tokenizer of a text without <|endoftext|>); use attn_mask "
                             "causal, or a corpus of documents with a tokenizer that has one (bpe)")

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding / LM head: vocab_size rounded up to a multiple of pad_vocab_multiple."""
        m = self.pad_vocab_multiple
        return (self.vocab_size + m - 1) // m * m


def config_fields(*kinds: str) -> tuple[str, ...]:
    """The names of GPTConfig's fields of these kinds (KINDS), in declaration order."""
    assert set(kinds) <= KINDS.keys(), kinds
    return tuple(f.name for f in fields(GPTConfig) if f.metadata["kind"] in kinds)
