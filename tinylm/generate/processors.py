"""Logits processors and the decoding options: temperature, top-k, top-p, min-p, typical-p, repetition penalty,
no-repeat n-grams.

Each is a pure function of logits (B, V) -> logits (B, V); `SamplingConfig` holds and validates the options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tinylm.ranges import check_ranges

STRATEGIES = ("greedy", "sample", "beam", "contrastive")
CONTRASTIVE_DEFAULT_TOP_K = 4  # candidates per step when top_k is not given (the contrastive-search paper uses 4-10)
# the strategies each decoding option shapes (repetition_penalty, no_repeat_ngram_size, max_new_tokens: all)
USED_BY = {"temperature": ("sample",), "top_k": ("sample", "contrastive"), "top_p": ("sample",), "min_p": ("sample",),
           "typical_p": ("sample",), "num_beams": ("beam",), "length_penalty": ("beam",), "early_stopping": ("beam",),
           "penalty_alpha": ("contrastive",), "seed": ("sample",)}


def unused_options(strategy: str, values: dict[str, Any], defaults: dict[str, Any], spell: str = "--{}") -> str | None:
    """A warning naming the options of ``values`` set away from their ``defaults`` that ``strategy`` ignores (None
    if there are none); ``spell`` formats an option's name as the user typed it ("--{}", "samples.{}")."""
    given = [k for k, v in values.items() if k in USED_BY and v != defaults[k] and strategy not in USED_BY[k]]
    if not given:
        return None
    verb, they = ("does", "it shapes") if len(given) == 1 else ("do", "they shape")
    strategies = " / ".join(sorted({s for k in given for s in USED_BY[k]}))
    return (f"{', '.join(spell.format(k) for k in given)} {verb} nothing with {spell.format('strategy')} {strategy} "
            f"({they} {spell.format('strategy')} {strategies})")


# Upper bounds that catch a typo (an extra zero or three) before it runs for hours; memory is checked separately,
# against the machine, by strategies.check_memory.
MAX_NEW_TOKENS = 1_000_000
MAX_BEAMS = 256
MIN_TEMPERATURE = 1e-4  # colder is argmax anyway (strategy "greedy"), and logits / 1e-40 overflow float32
MIN_PENALTY = 1e-3
MAX_LENGTH_PENALTY = 10.0
_HINTS = {  # after "NAME must be in [..], got X"
    "temperature": "; for the most likely token at each step use the greedy strategy (--strategy greedy)",
    "top_k": "; leave it unset for no limit",
    "repetition_penalty": " (1.0 is off)",
    "length_penalty": " (1.0: the mean log-probability; 0: the sum)",
}


@dataclass
class SamplingConfig:
    """How to decode; validated on creation (bad values raise ValueError naming the value)."""

    strategy: str = "sample"
    """"greedy" (argmax), "sample" (multinomial), "beam" (beam search), "contrastive" (contrastive search)."""
    max_new_tokens: int = 256
    """Most tokens to generate per prompt (EOS and stop strings can end a row earlier)."""
    temperature: float = 1.0
    """sample: divide logits by this; < 1 sharper, > 1 flatter. Must be > 0 (use strategy="greedy" for 0)."""
    top_k: int | None = None
    """sample: keep only the k most likely tokens (exactly k; ties broken by torch.topk). contrastive: candidates per
    step (default 4)."""
    top_p: float | None = None
    """sample: nucleus; keep the smallest set of most likely tokens whose probability sums to >= top_p, in (0, 1]."""
    min_p: float | None = None
    """sample: drop tokens less likely than min_p × the top token's probability, in [0, 1]."""
    typical_p: float | None = None
    """sample: locally typical sampling (Meister et al. 2022); keep the tokens whose surprise is closest to the
    distribution's entropy until their probability sums to >= typical_p, in (0, 1]."""
    repetition_penalty: float = 1.0
    """All strategies: CTRL penalty on tokens already in the sequence (prompt included); > 1 discourages
    repeats, 1 is off. Positive logits are divided by it, negative ones multiplied. Beam search applies it to the
    log-probabilities instead (all <= 0, so a seen token's log p is multiplied by it), as transformers does."""
    no_repeat_ngram_size: int = 0
    """All strategies: never produce an n-gram of this many tokens that the sequence (prompt included) already holds;
    0 is off. A row for which every token would repeat one is left free at that step."""
    num_beams: int = 1
    """beam: beams kept per prompt."""
    length_penalty: float = 1.0
    """beam: hypotheses are ranked by sum(log-probs) / length**length_penalty; > 0 favours longer ones."""
    early_stopping: bool = False
    """beam: stop a prompt as soon as num_beams hypotheses ended; False stops when no running beam can still win."""
    penalty_alpha: float = 0.6
    """contrastive: weight of the degeneration penalty (max cosine similarity to earlier hidden states), in
    [0, 1]; 0 is greedy."""
    eos_id: int | None = None
    """Stop a row when it produces this token (the EOS is not returned)."""
    stop_strings: list[str] | None = None
    """Stop a row once its decoded new text contains one of these (the tokens that made it are returned);
    needs a `decode` function."""
    seed: int | None = None
    """Seed for sampling (a private torch.Generator, so the global RNG is untouched); None uses the global RNG."""
    use_cache: bool = True
    """Reuse attention keys/values of earlier tokens (same output, many times faster); False recomputes all."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        ranges = {"max_new_tokens": f"[1, {MAX_NEW_TOKENS}]", "top_k": "[1, inf)", "top_p": "(0, 1]", "min_p": "[0, 1]",
                  "typical_p": "(0, 1]", "no_repeat_ngram_size": "[0, inf)",
                  "repetition_penalty": f"[{MIN_PENALTY}, inf)", "length_penalty": f"[-{MAX_LENGTH_PENALTY:g},"
                  f" {MAX_LENGTH_PENALTY:g}]", "seed": "[0, 2**63)", "num_beams": f"[1, {MAX_BEAMS}]",
                  "penalty_alpha": "[0, 1]", "eos_id": "[0, inf)"}
        if self.strategy == "sample":  # logits / 1e-40 overflow; inf samples uniformly, whatever the model says
            ranges["temperature"] = f"[{MIN_TEMPERATURE}, inf)"
        unset = next((k for k in ranges if k not in ("top_k", "top_p", "min_p", "typical_p", "seed", "eos_id")
                      and getattr(self, k) is None), None)
        if unset is not None:  # (check_ranges passes None: unset, the default; these have no unset form)
            raise ValueError(f"{unset} needs a value, got None")
        try:
            check_ranges("", vars(self), ranges, whole=("max_new_tokens", "top_k", "seed", "num_beams", "eos_id",
                                                            "no_repeat_ngram_size"))
        except ValueError as e:
            name = str(e).split()[0]
            hot = name == "temperature" and not (isinstance(self.temperature, (int, float)) and
                                                 self.temperature < MIN_TEMPERATURE)  # inf: greedy is no fix
            raise ValueError(f"{e}{'' if hot else _HINTS.get(name, '')}") from None
        if self.num_beams > 1 and self.strategy != "beam":
            raise ValueError(f"num_beams={self.num_beams} needs the beam strategy (--strategy beam), got strategy "
                             f"{self.strategy!r}")
        if isinstance(self.stop_strings, str):
            self.stop_strings = [self.stop_strings]  # a lone string would otherwise stop at any of its characters
        if self.stop_strings is not None and not all(isinstance(s, str) and s for s in self.stop_strings):
            raise ValueError(f"stop_strings must be non-empty strings, got {self.stop_strings!r}")


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


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus: keep the most likely tokens until their probabilities sum to >= top_p (always at least one)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above each one
    remove_sorted = mass_before >= top_p
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
    ban &= ~ban.all(dim=-1, keepdim=True)
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
