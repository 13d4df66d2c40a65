"""Speculative decoding (Leviathan et al. 2023, Chen et al. 2023): a cheap drafter proposes K tokens, the model
checks all of them in one forward pass, keeps the ones it agrees with and adds one token of its own.

Exact: greedy output is the model's own greedy output, token for token; sampled output follows the model's
distribution. Draft token d, drawn from the drafter's distribution q, is kept with probability min(1, p(d) / q(d));
the first one rejected is replaced by a draw from max(0, p - q) renormalised, and when all K are kept the model's
distribution after them gives one more token free. Every processor (temperature, top-k/p, min-p, typical-p,
repetition penalty, no-repeat n-grams) shapes p and q alike, at each position with the text before it.

Drafters: a small model with the same tokenizer (`draft`), or the text itself (prompt lookup: the tokens that
followed the latest earlier occurrence of the last n tokens; a point mass, q(d) = 1). Rows of a batch keep as many
tokens as the row that kept fewest (each row's token at that position is its own accept-or-resample outcome, so every
row stays exact) and the KV caches roll back to the kept text.

Shapes: B rows, L tokens so far, K draft tokens, V vocab.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinylm.generate.config import SamplingConfig
from tinylm.generate.processors import constrained_logits, sampling_logits
from tinylm.generate.rows import _Rows, _Runner
from tinylm.model import GPT


class _Target:
    """Feeds the model the tokens it has not seen and returns the logits of the last n positions, (B, n, V).

    Within block_size one KV cache holds the text, rolled back after each step to the tokens kept. Past it each
    position is scored on its own window of the last block_size tokens, as plain decoding does past block_size."""

    def __init__(self, model: GPT, prompt_len: int) -> None:
        self.model, self.block = model, model.config.block_size
        self.prefix_abs = prompt_len if model.config.attn_mask == "prefix" else None  # a prefix-LM's prompt
        self.cache = None
        self.fed = 0  # tokens of each row in the cache
        self.sliding = False  # past block_size: windows, no cache

    def _forward(self, feed: Tensor, start: Tensor | int, **kw) -> Tensor:
        prefix = None
        if self.prefix_abs is not None:  # the prompt left in a window that starts at `start`
            prefix = (self.prefix_abs - torch.as_tensor(start, device=feed.device)).clamp(min=0)
        return self.model.forward(feed, prefix_len=prefix, **kw)

    def __call__(self, ext: Tensor, n: int) -> Tensor:
        B, L = ext.shape
        if not self.sliding and L <= self.block:
            if self.cache is None:
                self.cache = self.model.new_kv_cache(B)
            if self.fed < L - n:  # the first step: the prompt in one call (a prefix-LM's must be), its last logits
                out = self._forward(ext[:, self.fed : L - n + 1], 0, kv_cache=self.cache, last_only=True)
                if n > 1:
                    out = torch.cat([out, self._forward(ext[:, L - n + 1 :], 0, kv_cache=self.cache)], dim=1)
            else:
                out = self._forward(ext[:, L - n :], 0, kv_cache=self.cache)  # (B, n, V)
            self.fed = L
            return out.float()
        self.sliding = True  # L only grows: every later step is past block_size too
        logits = torch.empty(B, n, self.model.config.vocab_size, device=ext.device)
        full = [p for p in range(L - n, L) if p + 1 >= self.block]  # position p predicts token p + 1
        if full:  # whole windows, all positions in one batch: (len(full) * B, block)
            starts = torch.tensor(full, device=ext.device) + 1 - self.block
            windows = ext[:, starts[:, None] + torch.arange(self.block, device=ext.device)]  # (B, F, block)
            out = self._forward(windows.reshape(-1, self.block), starts.repeat(B), last_only=True)  # (B*F, 1, V)
            logits[:, n - len(full) :] = out.view(B, len(full), -1).float()
        for i, p in enumerate(range(L - n, L - len(full))):  # (only where the text crosses block_size)
            logits[:, i] = self._forward(ext[:, : p + 1], 0, last_only=True)[:, -1].float()
        return logits

    def keep(self, length: int) -> None:
        """Forget cached tokens past the first ``length`` (drafts that were not kept)."""
        if self.cache is not None and not self.sliding and self.fed > length:
            self.cache.pos, self.fed = length, length


class DraftModel:
    """Drafts with a smaller model: K tokens, one forward each, from its processed distribution q (its argmax for
    greedy decoding)."""

    def __init__(self, model: GPT, prompt_len: int, use_cache: bool) -> None:
        self.run = _Runner(model, use_cache=use_cache, prompt_len=prompt_len, rollback=True)

    def propose(self, ids: Tensor, k: int, config: SamplingConfig, generator) -> tuple[Tensor, Tensor, Tensor | None]:
        """(drafts (B, k), valid (B, k), q (B, k, V) or None for greedy)."""
        drafts, qs = [], []
        ext = ids
        for _ in range(k):
            logits = constrained_logits(self.run(ext)[0], ext, config)  # (B, V)
            if config.strategy == "greedy":
                d = logits.argmax(dim=-1)
            else:
                q = sampling_logits(logits, config).softmax(dim=-1)
                d = torch.multinomial(q, 1, generator=generator).squeeze(1)
                qs.append(q)
            drafts.append(d)
            ext = torch.cat([ext, d[:, None]], dim=1)
        drafts_t = torch.stack(drafts, dim=1)
        return drafts_t, torch.ones_like(drafts_t, dtype=torch.bool), torch.stack(qs, dim=1) if qs else None

    def keep(self, length: int) -> None:
        """Roll the draft's cache back to the first ``length`` tokens."""
        run = self.run
        extra = run.fed - length
        if extra <= 0:
            return
        if run.cache is not None and extra <= run.cache.pos:
            run.cache.pos -= extra
            run.fed -= extra
        else:  # (its window moved past block_size: refilled on the next call)
            if run.cache is not None:
                run.cache.reset()
            run.fed = run.cache_start = 0


class PromptLookup:
    """Drafts without a model (prompt lookup decoding, Saxena 2023): the k tokens that followed the latest earlier
    occurrence of the text's last n tokens, n from ``max_ngram`` down to 1; none when nothing matches."""

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram

    def _lookup(self, seq: list[int], k: int) -> list[int]:
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            tail = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):  # latest match first; it must be followed by something
                if seq[start : start + n] == tail:
                    return seq[start + n : start + n + k]
        return []

    def propose(self, ids: Tensor, k: int, config: SamplingConfig, generator) -> tuple[Tensor, Tensor, None]:
        found = [self._lookup(row, k) for row in ids.tolist()]
        drafts = torch.zeros(ids.size(0), k, dtype=torch.long, device=ids.device)
        valid = torch.zeros(ids.size(0), k, dtype=torch.bool, device=ids.device)
        for b, toks in enumerate(found):
            drafts[b, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            valid[b, : len(toks)] = True
        return drafts, valid, None  # q is a point mass on each draft

    def keep(self, length: int) -> None:
        pass


def _target_probs(logits: Tensor, ext: Tensor, L: int, config: SamplingConfig) -> Tensor:
    """The model's processed next-token logits (greedy) or probabilities (sample) at each of the n positions,
    each with the text before it: (B, n, V)."""
    out = []
    for i in range(logits.size(1)):  # position i follows ext[:, :L + i]
        x = constrained_logits(logits[:, i], ext[:, : L + i], config)
        out.append(x if config.strategy == "greedy" else sampling_logits(x, config).softmax(dim=-1))
    return torch.stack(out, dim=1)


def _verify(p: Tensor, drafts: Tensor, valid: Tensor, q: Tensor | None, config: SamplingConfig,
            generator) -> tuple[Tensor, Tensor]:
    """(kept (B,): drafts each row accepts before its first rejection, token (B, K + 1): the row's own outcome at each
    position, a draft it accepted or the model's replacement)."""
    B, K = drafts.shape
    if config.strategy == "greedy":
        best = p.argmax(dim=-1)  # (B, K + 1)
        ok = (best[:, :K] == drafts) & valid
        return _first_false(ok), best
    pd = p[:, :K].gather(-1, drafts[..., None]).squeeze(-1)  # (B, K): p(d)
    qd = q.gather(-1, drafts[..., None]).squeeze(-1) if q is not None else torch.ones_like(pd)
    r = torch.rand(B, K, generator=generator, device=p.device)
    ok = (r * qd < pd) & valid  # accept with probability min(1, p(d) / q(d))
    residual = p.clone()  # (B, K + 1, V): where a row has no draft, the model's own distribution
    q_full = q if q is not None else torch.zeros_like(p[:, :K]).scatter_(-1, drafts[..., None], 1.0)
    residual[:, :K] = torch.where(valid[..., None], (p[:, :K] - q_full).clamp(min=0), p[:, :K])
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p)  # p == q: rejection had probability 0
    fresh = torch.multinomial(residual.view(-1, residual.size(-1)), 1, generator=generator).view(B, K + 1)
    token = torch.cat([torch.where(ok, drafts, fresh[:, :K]), fresh[:, K:]], dim=1)
    return _first_false(ok), token


def _first_false(ok: Tensor) -> Tensor:
    """Per row, how many leading entries are True: [[T, T, F, T]] -> [2]."""
    return ok.long().cumprod(dim=1).sum(dim=1)


def decode(model: GPT, ids: Tensor, rows: _Rows, drafter, generator: torch.Generator | None) -> dict[str, int]:
    """Greedy or sampled decoding of every row of ``ids`` (B, L) with ``drafter`` (a DraftModel or PromptLookup);
    tokens go to ``rows``. Returns counts: steps (forward passes of the model), tokens (positions every row
    advanced: tokens / steps is the tokens per forward pass, 1 for plain decoding), drafted (drafts proposed to the
    running rows), kept (drafts kept: a batch keeps at each step what its row that accepted fewest did) and accepted
    (drafts each row's own accept/reject test passed: accepted / drafted is the drafter's acceptance rate, whatever
    the batch)."""
    config = rows.config
    target = _Target(model, prompt_len=ids.size(1))
    stats = {"steps": 0, "tokens": 0, "drafted": 0, "kept": 0, "accepted": 0}
    produced = 0
    while produced < config.max_new_tokens and any(rows.active):
        L = ids.size(1)
        k = min(config.num_draft_tokens, config.max_new_tokens - produced - 1)
        drafts, valid, q = drafter.propose(ids, k, config, generator) if k else (ids[:, :0], ids[:, :0].bool(), None)
        ext = torch.cat([ids, drafts], dim=1)  # (B, L + k)
        p = _target_probs(target(ext, k + 1), ext, L, config)  # (B, k + 1, V)
        kept, token = _verify(p, drafts, valid, q, config, generator)
        active = torch.tensor(rows.active, device=ids.device)
        a = int(kept[active].min())  # every row keeps a drafts and its own token at position a
        new = torch.cat([drafts[:, :a], token[:, a : a + 1]], dim=1)  # (B, a + 1)
        for j in range(a + 1):
            rows.accept(new[:, j].tolist())
        ids = torch.cat([ids, new], dim=1)
        target.keep(L + a)  # the cache holds every kept token but the newest, which the next step feeds
        drafter.keep(L + a)
        produced += a + 1
        rows.stepped(produced)
        stats["steps"] += 1
        stats["tokens"] += a + 1
        stats["drafted"] += int(valid[active].sum()) if k else 0
        stats["kept"] += a * int(active.sum())
        stats["accepted"] += int(kept[active].sum()) if k else 0
    return stats
