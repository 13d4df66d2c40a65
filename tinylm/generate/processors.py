"""Logits processors: temperature, top-k, top-p, min-p, typical-p, repetition penalty, no-repeat n-grams.

Each is a pure function of logits (B, V) -> logits (B, V); the options that choose them are `SamplingConfig`'s
(tinylm/generate/config.py).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tinylm.generate.config import SamplingConfig


# ---- logits processors: (B, V) logits in, (B, V) logits out; removed tokens get -inf ---------------------------
def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """Divide logits by temperature (> 0): below 1 sharpens the distribution, above 1 flattens it."""
    return logits if temperature == 1.0 else logits / temperature


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep exactly the k largest logits per row (ties broken by torch.topk, never more than k)."""
    if k >= logits.size(-1):
        return logits
    values, indices = torch.topk(logits, k, dim=-1)  # (B, k)
    # scatter the kept values back rather than thresholding at the k-th value, which would keep every tie
    return torch.full_like(logits, -math.inf).scatter(-1, indices, values)


TOP_P_SLACK = 1e-6  # a nucleus that sums to within this of top_p is whole (float32's running sum is off by ~1e-7)


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus: keep the most likely tokens until their probabilities sum to >= top_p (always at least one), within
    float32's rounding of the running sum (TOP_P_SLACK): 50 equally likely tokens at top_p 0.1 keep 5 (the sum of
    five 0.02s came to 0.099999994, and a sixth was kept)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above each one
    remove_sorted = mass_before >= top_p - TOP_P_SLACK
    remove_sorted[..., 0] = False  # the top token always stays (a top_p of 1e-46 is 0 in float32: 0 >= 0)
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, -math.inf)


def min_p_filter(logits: Tensor, min_p: float) -> Tensor:
    """Drop tokens whose probability is below min_p times the most likely token's probability."""
    if min_p <= 0.0:
        return logits
    probs = logits.softmax(dim=-1)  # (B, V)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values  # (B, 1)
    return logits.masked_fill(probs < threshold, -math.inf)


def typical_filter(logits: Tensor, typical_p: float) -> Tensor:
    """Locally typical sampling: rank tokens by how far their surprise (-log p) is from the entropy, and keep them in
    that order until their probability sums to >= typical_p (always at least one; ties at the cut are kept)."""
    if typical_p >= 1.0:
        return logits
    logp = logits.log_softmax(dim=-1)  # (B, V)
    entropy = -(logp * logp.exp()).nansum(dim=-1, keepdim=True)  # (B, 1); -inf * 0 is nan, not counted
    distance, order = (-logp - entropy).abs().sort(dim=-1)  # (B, V), most typical first
    mass = logits.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
    last = (mass < typical_p).sum(dim=-1, keepdim=True).clamp(max=logits.size(-1) - 1)  # (B, 1): the last kept
    remove_sorted = distance > distance.gather(-1, last)
    remove_sorted[..., 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, -math.inf)


def ban_repeated_ngrams(logits: Tensor, ids: Tensor, n: int) -> Tensor:
    """Give -inf to every token that would complete an n-gram already in ids (B, L): the last n - 1 tokens are
    matched against every window of the sequence, and each matching window bans the token that followed it. A row
    that would have no token left keeps its logits (sampling from nothing would fail)."""
    B, L = ids.shape
    V = logits.size(-1)
    if n <= 0 or L < n:
        return logits
    windows = ids.unfold(1, n, 1)  # (B, L - n + 1, n)
    follows = (windows[..., :-1] == ids[:, L - n + 1 :].unsqueeze(1)).all(dim=-1)  # (B, W): same n - 1 tokens
    banned = torch.where(follows, windows[..., -1], V)  # non-matching windows go to a spare column
    ban = torch.zeros(B, V + 1, dtype=torch.bool, device=logits.device).scatter_(1, banned, True)[:, :V]
    # ids already at -inf (a tokenizer shorter than the vocabulary, a grammar) are gone too: left to them, greedy
    # took id 0 (argmax of all -inf), contrastive an id the tokenizer lacks, and sampling failed
    ban &= ~(ban | torch.isneginf(logits)).all(dim=-1, keepdim=True)
    return logits.masked_fill(ban, -math.inf)


def apply_repetition_penalty(logits: Tensor, ids: Tensor, penalty: float) -> Tensor:
    """CTRL repetition penalty: for each token already in ids (B, L), divide a positive logit by penalty and
    multiply a negative one, so penalty > 1 always makes it less likely (once per token, however often seen)."""
    if penalty == 1.0:
        return logits
    seen = torch.gather(logits, 1, ids)  # (B, L)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, ids, seen)


def sampling_logits(logits: Tensor, config: SamplingConfig) -> Tensor:
    """The sampling warpers in Hugging Face's order: temperature, top-k, top-p, min-p, typical-p."""
    logits = apply_temperature(logits, config.temperature)
    if config.top_k is not None:
        logits = top_k_filter(logits, config.top_k)
    if config.top_p is not None:
        logits = top_p_filter(logits, config.top_p)
    if config.min_p is not None:
        logits = min_p_filter(logits, config.min_p)
    if config.typical_p is not None:
        logits = typical_filter(logits, config.typical_p)
    return logits


def constrained_logits(logits: Tensor, ids: Tensor, config: SamplingConfig) -> Tensor:
    """The processors every strategy applies, in Hugging Face's order: repetition penalty, then no-repeat n-grams
    (beam search passes log-probabilities, as transformers does)."""
    logits = apply_repetition_penalty(logits, ids, config.repetition_penalty)
    return ban_repeated_ngrams(logits, ids, config.no_repeat_ngram_size)
