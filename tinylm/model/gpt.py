"""The GPT: nanoGPT's architecture with SDPA attention, three attention masks and a KV cache. No training code here.

Shape letters used in the comments:
    B  batch size                 T   tokens fed in this call (queries)
    S  tokens visible as keys     (S = T without a cache; cached tokens + T with one)
    C  n_embd (channels)          nh  n_head             hs  head size = C // nh
    V  vocab_size                 Vp  vocab_size padded up to a multiple of pad_vocab_multiple
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from tinylm.ranges import check_ranges

ATTN_MASKS = ("causal", "document", "prefix")
CONFIG_RANGES = {
    "vocab_size": "[1, inf)", "block_size": "[1, inf)", "n_layer": "[1, inf)", "n_head": "[1, inf)",
    "n_embd": "[1, inf)", "pad_vocab_multiple": "[1, inf)", "dropout": "[0, 1)", "eos_id": "[0, vocab_size)",
}
"""Valid values of GPTConfig's numeric fields (interval notation, see tinylm.ranges)."""


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

    def __post_init__(self) -> None:
        values = vars(self)
        for name in [n for n in CONFIG_RANGES if n != "dropout"]:  # counts and ids: a float fails later, in torch
            if values[name] is not None and type(values[name]) is not int:
                raise ValueError(f"{name} must be an integer, got {values[name]!r}")
        check_ranges("", values, CONFIG_RANGES)
        if self.n_embd % self.n_head:
            near = next(d for d in range(self.n_head, 0, -1) if self.n_embd % d == 0)
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
                f"pick a divisor of n_embd, e.g. n_head={near}"
            )
        if self.attn_mask not in ATTN_MASKS:
            raise ValueError(f"unknown attn_mask {self.attn_mask!r}; choose one of {', '.join(ATTN_MASKS)}")
        if self.attn_mask == "document" and self.eos_id is None:
            raise ValueError("attn_mask='document' needs eos_id (the token that ends each packed document)")

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding / LM head: vocab_size rounded up to a multiple of pad_vocab_multiple."""
        m = self.pad_vocab_multiple
        return (self.vocab_size + m - 1) // m * m


class KVCache:
    """Keys and values of every layer for the tokens fed so far, preallocated to `max_len` positions.

    `pos` counts the cached tokens; the next forward writes at [pos, pos + T) and its positions continue from pos.
    The token ids are kept too, so the document mask can see where earlier documents ended.
    """

    def __init__(
        self, *, n_layer: int, batch_size: int, n_head: int, head_size: int, max_len: int,
        device: torch.device | str | None = None, dtype: torch.dtype | None = None,
    ) -> None:
        shape = (batch_size, n_head, max_len, head_size)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.idx = torch.zeros(batch_size, max_len, dtype=torch.long, device=device)  # (B, max_len)
        self.pos = 0

    @property
    def batch_size(self) -> int:
        return self.idx.size(0)

    @property
    def max_len(self) -> int:
        return self.idx.size(1)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new tokens' keys/values of `layer` at [pos, pos + T); return all S = pos + T of them."""
        end = self.pos + k.size(2)
        self.k[layer][:, :, self.pos : end] = k  # k: (B, nh, T, hs)
        self.v[layer][:, :, self.pos : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]  # (B, nh, S, hs) each

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` of the batch, in that order (beam search; may also grow or shrink the batch)."""
        self.k = [k.index_select(0, index) for k in self.k]
        self.v = [v.index_select(0, index) for v in self.v]
        self.idx = self.idx.index_select(0, index)

    def reset(self) -> None:
        """Forget every cached token (the buffers stay allocated)."""
        self.pos = 0


def build_attention_mask(
    idx: Tensor, *, q_len: int | None = None, attn_mask: str = "causal",
    eos_id: int | None = None, prefix_len: int | Tensor | None = None,
) -> Tensor:
    """Which keys each query may attend to: a boolean (B or 1, 1, T, S) mask for SDPA, True = visible.

    idx: (B, S) token ids of all key positions; the queries are its last `q_len` positions (default all S),
    so with a KV cache pass the cached ids followed by the new ones.
    - causal: key j is visible from query i when j <= i.
    - document: causal, and i and j lie in the same document; a document starts after each eos_id and
      the EOS belongs to the document it ends.
    - prefix: causal, plus every position < prefix_len sees every other position < prefix_len.
    """
    B, S = idx.shape
    T = S if q_len is None else q_len
    k_pos = torch.arange(S, device=idx.device)  # (S,)
    q_pos = k_pos[S - T :]  # (T,) absolute positions of the queries
    visible = (k_pos[None, :] <= q_pos[:, None])[None]  # (1, T, S)
    if attn_mask == "document":
        if eos_id is None:
            raise ValueError("attn_mask='document' needs eos_id")
        is_eos = (idx == eos_id).long()  # (B, S)
        doc = torch.cumsum(is_eos, dim=1) - is_eos  # for [a b EOS c d] the document ids are [0 0 0 1 1]
        visible = visible & (doc[:, S - T :, None] == doc[:, None, :])  # (B, T, S)
    elif attn_mask == "prefix":
        if prefix_len is None:
            raise ValueError("attn_mask='prefix' needs prefix_len (an int or a (B,) tensor of prefix lengths)")
        p = torch.as_tensor(prefix_len, device=idx.device).reshape(-1, 1)  # (B or 1, 1)
        in_prefix_q, in_prefix_k = q_pos[None] < p, k_pos[None] < p  # (B, T), (B, S)
        visible = visible | (in_prefix_q[:, :, None] & in_prefix_k[:, None, :])  # (B, T, S)
    elif attn_mask != "causal":
        raise ValueError(f"unknown attn_mask {attn_mask!r}; choose one of {', '.join(ATTN_MASKS)}")
    return visible.unsqueeze(1)  # (B or 1, 1, T, S): one mask shared by all heads


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Tensor, *, mask: Tensor | None, is_causal: bool, kv_cache: KVCache | None, layer: int
    ) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # (B, T, C) each
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if kv_cache is not None:
            k, v = kv_cache.update(layer, k, v)  # (B, nh, S, hs)
            k, v = k.to(q.dtype), v.to(q.dtype)  # under autocast the cache may hold another dtype
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (B, T, 4C) inside, (B, T, C) out


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, **attn_kwargs) -> Tensor:
        x = x + self.attn(self.ln_1(x), **attn_kwargs)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT: token + learned position embeddings, pre-LN blocks, final LayerNorm, LM head tied to the embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying: one matrix embeds and un-embeds
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                # GPT-2: residual branches add up over 2 per layer, so shrink them to keep the stream's variance flat
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, *, exclude_position: bool = False) -> int:
        """Parameter count (the tied embedding counted once, padded rows included, as they are computed).

        exclude_position: leave out the position table, as nanoGPT's count and the FLOP estimate do.
        """
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if exclude_position else n

    def flops_per_token(self) -> float:
        """Training FLOPs per token, forward + backward: 6N + 12·L·H·Q·T (PaLM appendix B; nanoGPT's estimate_mfu).

        N excludes the position table; L layers, H heads, Q head size, T = block_size.
        """
        c = self.config
        return 6.0 * self.num_params(exclude_position=True) + 12.0 * c.n_layer * c.n_head * (
            c.n_embd // c.n_head
        ) * c.block_size

    def new_kv_cache(
        self, batch_size: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> KVCache:
        """An empty KV cache for `batch_size` sequences of up to block_size tokens (default: model's device/dtype)."""
        p = self.lm_head.weight
        c = self.config
        return KVCache(
            n_layer=c.n_layer, batch_size=batch_size, n_head=c.n_head, head_size=c.n_embd // c.n_head,
            max_len=c.block_size, device=device or p.device, dtype=dtype or p.dtype,
        )

    def forward(
        self, idx: Tensor, *, prefix_len: int | Tensor | None = None, kv_cache: KVCache | None = None,
        return_hidden: bool = False, last_only: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Next-token logits (B, T, V) for token ids idx (B, T).

        prefix_len: with attn_mask="prefix", how many leading tokens see each other both ways (int or (B,) tensor).
        kv_cache: append these tokens to the cache and attend over everything cached (positions continue
            from kv_cache.pos); create one with `new_kv_cache`.
        return_hidden: also return the final-LayerNorm output (B, T, C): `(logits, hidden)`.
        last_only: compute logits for the last position only, (B, 1, V) (generation skips the LM head elsewhere).
        """
        c = self.config
        B, T = idx.shape
        start = kv_cache.pos if kv_cache is not None else 0
        if start + T > c.block_size:
            if kv_cache is None:
                raise ValueError(
                    f"sequence length {T} exceeds block_size {c.block_size}; crop the prompt or keep its last "
                    f"{c.block_size} tokens (idx[:, -block_size:])"
                )
            raise ValueError(
                f"the KV cache holds {start} tokens and {T} more would exceed block_size {c.block_size}; "
                f"reset the cache and re-prefill it from the last {c.block_size} tokens"
            )
        if kv_cache is not None and kv_cache.batch_size != B:
            raise ValueError(f"idx has batch size {B} but the KV cache {kv_cache.batch_size}; reorder or renew it")
        if prefix_len is not None and c.attn_mask != "prefix":
            raise ValueError(f"prefix_len is only used with attn_mask='prefix' (this model: {c.attn_mask!r})")
        if c.attn_mask == "prefix" and prefix_len is None:
            raise ValueError("this model uses attn_mask='prefix': pass prefix_len (0 makes it plain causal)")
        if c.attn_mask == "prefix" and start > 0 and int(torch.as_tensor(prefix_len).max()) > start:
            raise ValueError(
                f"prefix_len {prefix_len} reaches past the {start} cached tokens: the cached ones were computed "
                "without seeing the rest of the prefix; feed the whole prefix in the first call"
            )

        if kv_cache is not None:
            kv_cache.idx[:, start : start + T] = idx
            key_idx = kv_cache.idx[:, : start + T]  # (B, S): ids of every key position
        else:
            key_idx = idx
        mask, is_causal = None, False
        if c.attn_mask == "causal":
            is_causal = start == 0 and T > 1  # no cache, or the first chunk into it: SDPA's (flash) causal kernel
            if start > 0 and T > 1:  # a chunk after cached tokens: SDPA's is_causal would align it top-left
                mask = build_attention_mask(key_idx, q_len=T)
            # start > 0 and T == 1: one new token sees every cached one, no mask needed
        else:
            mask = build_attention_mask(
                key_idx, q_len=T, attn_mask=c.attn_mask, eos_id=c.eos_id, prefix_len=prefix_len
            )

        pos = torch.arange(start, start + T, device=idx.device)  # (T,)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, mask=mask, is_causal=is_causal, kv_cache=kv_cache, layer=layer)  # (B, T, C)
        if kv_cache is not None:
            kv_cache.pos = start + T
        hidden = self.transformer.ln_f(x)  # (B, T, C)
        logits = self.lm_head(hidden[:, -1:] if last_only else hidden)  # (B, T or 1, Vp)
        logits = logits[..., : c.vocab_size]  # (B, T or 1, V): padded rows are never targets
        return (logits, hidden) if return_hidden else logits
