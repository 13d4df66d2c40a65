"""Attention: the KV cache, the three attention masks, and causal self-attention (optionally with QK-norm and
rotary positions). Shape letters as in gpt.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinylm.model.layers import apply_rope, rms_norm

ATTN_MASKS = ("causal", "document", "prefix")


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
    _B, S = idx.shape
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
    """Multi-head self-attention through SDPA. Options: `qk_norm` (parameter-free RMSNorm of each head's queries
    and keys, as in modded-nanogpt / nanochat: bounded attention logits) and rotary positions (`rope` = the cos and
    sin of the tokens' positions, applied to q and k after the norm)."""

    def __init__(self, n_embd: int, n_head: int, *, bias: bool = True, dropout: float = 0.0,
                 qk_norm: bool = False) -> None:
        super().__init__()
        self.n_head, self.n_embd, self.dropout, self.qk_norm = n_head, n_embd, dropout, qk_norm
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, *, mask: Tensor | None, is_causal: bool, kv_cache: KVCache | None, layer: int,
        rope: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        B, T, C = x.shape
        if self.qk_norm or rope is not None:  # queries and keys normed and rotated together: one call each
            qk, v = self.c_attn(x).split([2 * C, C], dim=2)  # (B, T, 2C), (B, T, C); backward: one cat
            qk, v = qk.view(B, T, 2, self.n_head, C // self.n_head), v.view(B, T, self.n_head, C // self.n_head)
            if self.qk_norm:
                qk = rms_norm(qk)
            if rope is not None:  # cached keys were rotated by their own positions
                cos, sin = (t[:, None, None, :] for t in rope)  # (T, 1, 1, hs): broadcast over q/k and heads
                qk = apply_rope(qk, cos, sin)
            q, k, v = (t.transpose(1, 2) for t in (*qk.unbind(2), v))  # (B, nh, T, hs) each
        else:
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
