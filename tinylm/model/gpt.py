"""The GPT: nanoGPT's architecture (the default) or a modern one (RoPE, RMSNorm, QK-norm, SwiGLU/ReLU², untied head,
logit soft-cap), SDPA attention, three attention masks and a KV cache. No training code here.

Shape letters used in the comments:
    B  batch size                 T   tokens fed in this call (queries)
    S  tokens visible as keys     (S = T without a cache; cached tokens + T with one)
    C  n_embd (channels)          nh  n_head             hs  head size = C // nh
    V  vocab_size                 Vp  vocab_size padded up to a multiple of pad_vocab_multiple
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from tinylm.model.attention import (
    ATTN_MASKS,
    CausalSelfAttention,
    KVCache,
    build_attention_mask,
)
from tinylm.model.config import CONFIG_RANGES, GPTConfig
from tinylm.model.layers import MLP, make_norm, rope_cos_sin

__all__ = ["ATTN_MASKS", "CONFIG_RANGES", "GPT", "GPTConfig", "GPTShape", "KVCache", "build_attention_mask"]


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)) (ln: LayerNorm or RMSNorm)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        c = config
        self.ln_1 = make_norm(c.norm, c.n_embd, bias=c.bias)
        self.attn = CausalSelfAttention(c.n_embd, c.n_head, bias=c.bias, dropout=c.dropout, qk_norm=c.qk_norm)
        self.ln_2 = make_norm(c.norm, c.n_embd, bias=c.bias)
        self.mlp = MLP(c.n_embd, kind=c.mlp, bias=c.bias, dropout=c.dropout)

    def forward(self, x: Tensor, **attn_kwargs) -> Tensor:
        x = x + self.attn(self.ln_1(x), **attn_kwargs)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT by default: token + learned position embeddings, pre-LN blocks, final LayerNorm, LM head tied to the
    embedding. The config's options swap in rotary positions, RMSNorm, QK-norm, other MLPs, an untied head, a logit
    soft-cap and zero-initialised residual projections. The default builds and initialises its modules in nanoGPT's
    order, so a seed gives the same weights as before the options existed (tests/model/test_modern.py pins it)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        modules = {"wte": nn.Embedding(c.padded_vocab_size, c.n_embd)}
        if c.positions == "learned":
            modules["wpe"] = nn.Embedding(c.block_size, c.n_embd)
        modules |= {
            "drop": nn.Dropout(c.dropout),
            "h": nn.ModuleList([Block(c) for _ in range(c.n_layer)]),
            "ln_f": make_norm(c.norm, c.n_embd, bias=c.bias),
        }
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(c.n_embd, c.padded_vocab_size, bias=False)
        # while generating with a tokenizer of fewer ids than vocab_size (an imported model's padded vocabulary):
        # the ids it has no text for get no probability (set by tinylm.generate around a generation)
        self.sample_vocab: int | None = None
        if c.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight  # weight tying: one matrix embeds and un-embeds
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                if c.zero_init_proj:  # each block starts as the identity; its gradients still reach c_proj
                    nn.init.zeros_(p)
                else:  # GPT-2: residual branches add up over 2 per layer; shrink them to keep the variance flat
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

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
        if exclude_position and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self) -> float:
        """Training FLOPs per token, forward + backward: 6N + 12·L·H·Q·T (PaLM appendix B; nanoGPT's estimate_mfu).

        N counts the parameters that multiply: not the position table, nor an untied token embedding (a lookup;
        tied, the same matrix is the LM head's matmul). L layers, H heads, Q head size, T = block_size.
        """
        return training_flops(self.config, self.num_params(exclude_position=True), self.transformer.wte.weight.numel())

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
        return_hidden: also return the final norm's output (ln_f: LayerNorm, or RMSNorm with norm rmsnorm), (B, T,
            C): `(logits, hidden)`.
        last_only: compute logits for the last position only, (B, 1, V) (generation skips the LM head elsewhere).
        """
        c = self.config
        if idx.dim() != 2 or idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise ValueError(f"idx must be integer token ids of shape (B, T), got {idx.dtype} of shape "
                             f"{tuple(idx.shape)}" + ("; one sequence is idx[None]" if idx.dim() == 1 else ""))
        T = idx.size(1)
        start = kv_cache.pos if kv_cache is not None else 0
        self._check_inputs(idx, start, prefix_len, kv_cache)
        mask, is_causal = self._attention_mask(idx, start, prefix_len, kv_cache)

        pos = torch.arange(start, start + T, device=idx.device)  # (T,)
        x = self.transformer.wte(idx)  # (B, T, C)
        rope = None
        if c.positions == "learned":
            x = x + self.transformer.wpe(pos)
        else:  # positions continue from the cache, so cached keys and new queries turn by their true positions
            # (T, hs) each, in fp32 at least: a float64 model's (64-true) in float64, as the rest of it computes
            rope = rope_cos_sin(pos, c.n_embd // c.n_head, c.rope_theta, torch.promote_types(x.dtype, torch.float32))
        x = self.transformer.drop(x)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, mask=mask, is_causal=is_causal, kv_cache=kv_cache, layer=layer, rope=rope)  # (B, T, C)
        if kv_cache is not None:
            kv_cache.pos = start + T
        hidden = self.transformer.ln_f(x)  # (B, T, C)
        logits = self.lm_head(hidden[:, -1:] if last_only else hidden)  # (B, T or 1, Vp)
        logits = logits[..., : c.vocab_size]  # (B, T or 1, V): padded rows are never targets
        if c.logit_softcap is not None:
            # smooth clamp to (-cap, cap), in fp32 at least: under bf16 autocast the tanh was off by up to 0.06
            wide = torch.promote_types(logits.dtype, torch.float32)  # (a float64 model's stay float64)
            logits = c.logit_softcap * torch.tanh(logits.to(wide) / c.logit_softcap)
        if self.sample_vocab is not None and self.sample_vocab < c.vocab_size:
            logits = logits.index_fill(-1, torch.arange(self.sample_vocab, c.vocab_size, device=logits.device),
                                       float("-inf"))
        return (logits, hidden) if return_hidden else logits

    def _check_inputs(self, idx: Tensor, start: int, prefix_len, kv_cache: KVCache | None) -> None:
        """Refuse what forward cannot compute: too many tokens, a cache of other rows, a prefix mask misused."""
        c, (B, T) = self.config, idx.shape
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
        # ids past the embedding: torch's "index out of range in self" on a CPU, a device-side assert on a GPU.
        # Checked on CPU tensors outside a compiled graph only (on a GPU it would wait for the device every step)
        if idx.device.type == "cpu" and idx.numel() and not torch.compiler.is_compiling():
            low, high = int(idx.min()), int(idx.max())
            if low < 0 or high >= c.vocab_size:
                raise ValueError(f"idx holds id {low if low < 0 else high}, outside the model's vocabulary of "
                                 f"{c.vocab_size:,} ids (0..{c.vocab_size - 1}); encode with the model's own tokenizer")
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

    def _attention_mask(self, idx: Tensor, start: int, prefix_len,
                        kv_cache: KVCache | None) -> tuple[Tensor | None, bool]:
        """(mask, is_causal) for SDPA: the queries idx (B, T) after ``start`` cached tokens (whose ids the cache
        records here, as the document mask needs them)."""
        c, T = self.config, idx.size(1)
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
        return mask, is_causal


def training_flops(config: GPTConfig, params: int, token_table: int) -> float:
    """Training FLOPs per token of a GPT of ``config`` (see GPT.flops_per_token) with ``params`` parameters besides the
    position table, ``token_table`` of them in the token embedding."""
    c = config
    n = params if c.tie_embeddings else params - token_table  # untied, the token table is a lookup
    return 6.0 * n + 12.0 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size


@dataclass(frozen=True)
class GPTShape:
    """A GPT of ``config`` counted without building its n_layer blocks: the parameters outside the blocks and one
    block's, which the others repeat (each is Block(config)). `tinylm plan` of a 100,000-layer model takes as long as
    one of a layer (building 100,000 blocks took minutes, on the meta device too)."""

    config: GPTConfig
    one_block: GPT  # the GPT of config with one block, on the meta device (shapes, no storage)

    @classmethod
    def of(cls, config: GPTConfig) -> GPTShape:
        with torch.device("meta"):
            return cls(config, GPT(replace(config, n_layer=1)))

    def count(self, params: Iterable[nn.Parameter]) -> int:
        """Elements that ``params`` (one_block's) stand for in the whole GPT: a block's n_layer times."""
        blocks = {id(p) for p in self.one_block.transformer.h.parameters()}
        return sum(p.numel() * (self.config.n_layer if id(p) in blocks else 1) for p in params)

    def num_params(self, *, exclude_position: bool = False) -> int:
        """As GPT.num_params."""
        block = sum(p.numel() for p in self.one_block.transformer.h.parameters())
        return self.one_block.num_params(exclude_position=exclude_position) + (self.config.n_layer - 1) * block

    def flops_per_token(self) -> float:
        """As GPT.flops_per_token."""
        return training_flops(self.config, self.num_params(exclude_position=True),
                              self.one_block.transformer.wte.weight.numel())
