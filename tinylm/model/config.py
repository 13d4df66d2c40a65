"""GPTConfig: the shape and architecture options of a GPT, validated on creation."""

from __future__ import annotations

from dataclasses import dataclass

from tinylm.model.attention import ATTN_MASKS
from tinylm.ranges import check_ranges

POSITIONS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu", "relu2")
CONFIG_RANGES = {
    "vocab_size": "[1, inf)", "block_size": "[1, inf)", "n_layer": "[1, inf)", "n_head": "[1, inf)",
    "n_embd": "[1, inf)", "pad_vocab_multiple": "[1, inf)", "dropout": "[0, 1)", "eos_id": "[0, vocab_size)",
    "rope_theta": "(1, inf)", "logit_softcap": "[1, 10000]",
}
"""Valid values of GPTConfig's numeric fields (interval notation, see tinylm.ranges)."""
_FLOATS = ("dropout", "rope_theta", "logit_softcap")


@dataclass
class GPTConfig:
    """Shape and options of a GPT; validated on creation."""

    vocab_size: int
    """Number of token ids the tokenizer produces (logits have this many columns)."""
    block_size: int
    """Longest sequence the model sees, in tokens (length of the learned position table)."""
    n_layer: int = 6
    """Number of transformer blocks."""
    n_head: int = 6
    """Attention heads per block; must divide n_embd."""
    n_embd: int = 384
    """Width of the residual stream (channels)."""
    dropout: float = 0.0
    """Dropout probability on embeddings, attention weights and residual branches (0 for pretraining)."""
    bias: bool = True
    """Biases in Linear layers and LayerNorms (GPT-2 style); False is a little faster and about as good."""
    pad_vocab_multiple: int = 64
    """Pad the embedding / LM-head rows up to a multiple of this (faster matmuls); 1 = no padding."""
    attn_mask: str = "causal"
    """"causal"; "document" (causal and not across EOS boundaries of packed documents; needs eos_id);
    "prefix" (bidirectional over the first prefix_len tokens, causal after; forward needs prefix_len)."""
    eos_id: int | None = None
    """End-of-document token id; needed by attn_mask="document"."""
    positions: str = "learned"
    """"learned" (nanoGPT: a table of block_size position vectors added to the token embeddings) or "rope" (rotary
    embeddings: q and k of every head are rotated by their position; no table, relative positions)."""
    rope_theta: float = 10000.0
    """RoPE's base: pair i of a head turns by theta^(-2i/hs) radians per position (10,000 as in RoFormer/Llama)."""
    norm: str = "layernorm"
    """Residual-stream norm: "layernorm" (nanoGPT) or "rmsnorm" (no mean subtraction, no bias; Llama)."""
    qk_norm: bool = False
    """Normalise every head's queries and keys (RMS, no gain) before attention: bounded attention logits."""
    mlp: str = "gelu"
    """Feed-forward branch: "gelu" (nanoGPT, 4C wide), "swiglu" (Llama, ~8/3·C wide: same parameters) or "relu2"
    (relu(x)², 4C wide; modded-nanogpt)."""
    tie_embeddings: bool = True
    """The LM head is the token embedding matrix (nanoGPT); False gives the head its own matrix."""
    logit_softcap: float | None = None
    """Squash logits to (-cap, cap) by cap·tanh(logits/cap) (Gemma 2; modded-nanogpt uses 15-30); null: off."""
    zero_init_proj: bool = False
    """Initialise the output projections of every residual branch (attention and MLP c_proj) to zero, so each
    block starts as the identity (modded-nanogpt, nanochat); False: GPT-2's 0.02/sqrt(2·n_layer)."""

    def __post_init__(self) -> None:
        values = vars(self)
        for name in [n for n in CONFIG_RANGES if n not in _FLOATS]:  # counts and ids: a float fails later, in torch
            if values[name] is not None and type(values[name]) is not int:
                raise ValueError(f"{name} must be an integer, got {values[name]!r}")
        check_ranges("", values, CONFIG_RANGES)
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
