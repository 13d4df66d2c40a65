"""Decoding: logits processors by hand, each strategy against its definition, stopping, and bad arguments."""

import itertools
import math
import re

import pytest
import torch
from helpers import assert_cached_logits_equal_uncached
from torch import nn

from tinylm.generate.processors import (
    SamplingConfig,
    apply_repetition_penalty,
    apply_temperature,
    ban_repeated_ngrams,
    min_p_filter,
    sampling_logits,
    top_k_filter,
    top_p_filter,
    typical_filter,
)
from tinylm.generate.strategies import generate, generate_with
from tinylm.model import GPT, GPTConfig
from tinylm.tokenize import build_tokenizer

VOCAB = 48


def tiny(seed: int = 0, **overrides) -> GPT:
    """A 2-layer, 32-wide random GPT with a short block_size so generation crosses the crop boundary."""
    torch.manual_seed(seed)
    cfg = {"vocab_size": VOCAB, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, "eos_id": 0} | overrides
    return GPT(GPTConfig(**cfg)).eval()


PROMPTS = [[5, 9, 3, 17], [30, 2, 2, 41]]


def manual_loop(model: GPT, prompts, steps: int, pick) -> list[list[int]]:
    """Reference decoding written out plainly: full uncached forward over the cropped context each step."""
    ids = torch.tensor(prompts)
    for _ in range(steps):
        logits = model(ids[:, -model.config.block_size :])[:, -1]  # (B, V)
        ids = torch.cat([ids, pick(logits)[:, None]], dim=1)
    return ids[:, len(prompts[0]) :].tolist()


class TableLM(nn.Module):
    """A hand-checkable 'model': next-token probabilities depend only on the last token (a bigram table)."""

    def __init__(self, table: list[list[float]]) -> None:
        super().__init__()
        self.table = torch.tensor(table).log()  # (V, V) log-probabilities
        V = len(table)
        self.config = GPTConfig(vocab_size=V, block_size=64, n_layer=1, n_head=1, n_embd=V)
        self.lm_head = nn.Linear(V, V, bias=False)  # only tells generate which device to use

    def forward(self, idx, *, kv_cache=None, prefix_len=None, return_hidden=False, last_only=False):
        logits = self.table[idx]  # (B, T, V)
        hidden = torch.nn.functional.one_hot(idx, self.config.vocab_size).float()  # (B, T, V)
        return (logits[:, -1:] if last_only else logits), hidden


# ---- processors, by hand --------------------------------------------------------------------------------------
def test_top_k_keeps_exactly_k_even_with_ties():
    """A threshold at the k-th value keeps every tie, silently sampling from more than k tokens."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0]])
    kept = torch.isfinite(top_k_filter(logits, 2))
    assert kept.sum() == 2 and kept[0, [1, 2, 3]].sum() == 2
    assert torch.isfinite(top_k_filter(logits, 10)).all()  # k >= V keeps everything


def test_top_p_keeps_the_smallest_nucleus():
    """Probabilities .5 .3 .15 .05: top_p 0.8 keeps two tokens, 0.81 three; the top token always stays."""
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    assert torch.isfinite(top_p_filter(logits, 0.8)).tolist() == [[False, True, False, True]]
    assert torch.isfinite(top_p_filter(logits, 0.81)).tolist() == [[False, True, True, True]]
    assert torch.isfinite(top_p_filter(logits, 0.01)).tolist() == [[False, True, False, False]]
    # a top_p below float32's range is 0 there: "mass before >= 0" removed the top token too, and sampling crashed
    assert torch.isfinite(top_p_filter(logits, 1e-46)).tolist() == [[False, True, False, False]]


def test_min_p_scales_with_the_top_probability():
    """min_p 0.5 with top prob .5 drops tokens under .25: keeps .5 and .3 only."""
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert torch.isfinite(min_p_filter(logits, 0.5)).tolist() == [[True, True, False, False]]


def test_top_p_boundary_keeps_the_smallest_set_reaching_p():
    """Catches a nucleus that stops only once the mass *exceeds* top_p (`>` for `>=`): with two equally likely
    tokens, top_p 0.5 is reached by one of them, so exactly one stays; of four, 0.5 keeps two."""
    assert torch.isfinite(top_p_filter(torch.zeros(1, 2), 0.5)).sum() == 1
    assert torch.isfinite(top_p_filter(torch.zeros(1, 4), 0.5)).sum() == 2
    # float32's running sum of equal probabilities lands just under top_p (five 0.02s: 0.099999994): one more was
    # kept (6, 16, 26), where transformers' TopPLogitsWarper and the definition keep 5, 15, 25
    assert [int(torch.isfinite(top_p_filter(torch.zeros(1, 50), p)).sum()) for p in (0.1, 0.3, 0.5)] == [5, 15, 25]


def test_min_p_1_keeps_the_top_token_and_samples_greedily():
    """Catches min_p dropping tokens at exactly the threshold (`<=` for `<`): min_p=1.0 is allowed and keeps only the
    most likely token (sampling becomes greedy); dropping every token gave NaN probabilities and a crash."""
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert torch.isfinite(min_p_filter(logits, 1.0)).tolist() == [[True, False, False, False]]
    model = tiny()
    greedy = generate(model, PROMPTS, strategy="greedy", max_new_tokens=12)
    assert generate(model, PROMPTS, strategy="sample", min_p=1.0, seed=7, max_new_tokens=12) == greedy


def test_temperature_is_applied_before_top_p_and_min_p():
    """Catches temperature applied after the filters (transformers applies it first): probabilities .7 .25 .05 at
    T=1 need two tokens to reach top_p 0.8, but at T=0.5 (.88 .11 .005) the top token alone does, so sampling at
    temperature 0.5, top_p 0.8 must keep one token, the logits being those of logits / 0.5."""
    logits = torch.tensor([[0.25, 0.7, 0.05]]).log()
    assert torch.isfinite(top_p_filter(logits, 0.8)).sum() == 2  # guard: at T=1 the nucleus has two tokens
    out = sampling_logits(logits, SamplingConfig(temperature=0.5, top_p=0.8))
    assert torch.isfinite(out).tolist() == [[False, True, False]]
    torch.testing.assert_close(out, top_p_filter(logits / 0.5, 0.8), rtol=0, atol=0)
    # min-p sees the tempered logits too: min_p 0.15 keeps .25 at T=1 (threshold .105), not its tempered .11 (.13)
    tempered = sampling_logits(logits, SamplingConfig(temperature=0.5, min_p=0.15))
    assert torch.isfinite(tempered).tolist() == [[False, True, False]]


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    """Dividing a negative logit would make a seen token MORE likely (the CTRL sign rule)."""
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    out = apply_repetition_penalty(logits, torch.tensor([[0, 1, 1]]), 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_typical_p_keeps_the_tokens_nearest_the_entropy():
    """Probabilities .5 .3 .15 .05 have entropy 1.142 nats; surprises .693 1.204 1.897 2.996 are 0.45, 0.06, 0.76,
    1.85 from it, so the most typical token is the .3 one, not the likeliest: typical_p 0.3 keeps it alone, 0.35
    adds the .5 one (mass .8), 0.85 the .15 one as well, 1.0 everything. Catches a filter that ranks by probability
    (top-p) or keeps the least typical tokens."""
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert torch.isfinite(typical_filter(logits, 0.3)).tolist() == [[False, True, False, False]]
    assert torch.isfinite(typical_filter(logits, 0.35)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(typical_filter(logits, 0.85)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(typical_filter(logits, 1.0)).all()
    assert torch.isfinite(typical_filter(logits, 1e-9)).sum() == 1  # one token always stays


def test_no_repeat_ngram_bans_what_would_repeat_an_ngram():
    """In 5 6 7 5 6 a 3-gram (5, 6, x) exists once, with x = 7: only 7 is banned; a 2-gram ban takes every token
    that followed a 6 (7); a 1-gram ban takes every token seen. Catches bans taken from the wrong window (the last
    n tokens instead of the last n - 1) or a sequence shorter than n banning anything."""
    ids = torch.tensor([[5, 6, 7, 5, 6], [1, 2, 3, 4, 5]])
    logits = torch.zeros(2, 10)
    banned = lambda n: [torch.isinf(row).nonzero().flatten().tolist() for row in ban_repeated_ngrams(logits, ids, n)]
    assert banned(3) == [[7], []]
    assert banned(2) == [[7], []]
    assert banned(1) == [[5, 6, 7], [1, 2, 3, 4, 5]]
    assert banned(6) == [[], []] and banned(0) == [[], []]
    # a row that every token would repeat keeps them all: sampling from nothing would fail
    assert torch.isfinite(ban_repeated_ngrams(torch.zeros(1, 3), torch.tensor([[0, 1, 2]]), 1)).all()


def test_no_repeat_ngram_counts_ids_already_removed_when_it_would_leave_none():
    """Catches the ban's "every token would repeat one: left free" missing ids already at -inf: with a tokenizer of
    17 ids over a 58-id model (the ids it lacks at -inf) and no_repeat_ngram_size 1, once the 17 were written every
    finite logit was banned: sampling raised torch.multinomial's RuntimeError, greedy wrote id 0 again and again
    (argmax of all -inf), contrastive an id the tokenizer has no text for, and beam search returned nothing."""
    logits = torch.tensor([[0.0, 1.0, -math.inf, -math.inf]])  # by hand: 0 and 1 left, both seen
    assert ban_repeated_ngrams(logits, torch.tensor([[1, 0]]), 1).tolist() == logits.tolist()
    assert ban_repeated_ngrams(logits, torch.tensor([[1, 3]]), 1).tolist() == [[0.0, -math.inf, -math.inf, -math.inf]]
    tok = build_tokenizer("char", documents=lambda: ["abcdefghij klmnop"])
    model = tiny(vocab_size=58, pad_vocab_multiple=1)
    for options in ({"strategy": "sample", "seed": 0}, {"strategy": "greedy"}, {"strategy": "contrastive"},
                    {"strategy": "beam", "num_beams": 2}):
        out = generate(model, [[0, 1]], max_new_tokens=30, tokenizer=tok, no_repeat_ngram_size=1, **options)[0]
        assert len(out) == 30 and max(out) < tok.vocab_size, options  # (eos_id 0 of tiny(): none here)
        assert len(set(out)) >= tok.vocab_size - 2, options  # guard: every id was written before the ban let go


def test_typical_p_and_no_repeat_ngram_equal_transformers_processors():
    """tinylm's typical-p and no-repeat n-gram processors give the -inf masks of transformers' TypicalLogitsWarper
    and NoRepeatNGramLogitsProcessor on random logits and sequences (ties included: logits rounded to 0.5)."""
    transformers = pytest.importorskip("transformers")
    g = torch.Generator().manual_seed(0)
    for trial in range(50):
        logits = (torch.randn(4, 23, generator=g) * 2).round(decimals=trial % 2)  # odd trials: ties
        ids = torch.randint(0, 4, (4, 12), generator=g)  # few ids: many repeated n-grams
        for mass in (0.2, 0.5, 0.9, 0.95):
            theirs = transformers.TypicalLogitsWarper(mass=mass)(ids, logits.clone())
            assert torch.equal(torch.isinf(typical_filter(logits, mass)), torch.isinf(theirs)), (trial, mass)
        for n in (1, 2, 3, 4):
            theirs = transformers.NoRepeatNGramLogitsProcessor(n)(ids, logits.clone())
            assert torch.equal(ban_repeated_ngrams(logits, ids, n), theirs), (trial, n)


def test_no_repeat_ngram_size_holds_in_every_strategy():
    """No generated sequence (prompt included) holds a 2-gram twice under any strategy; a random model left free
    repeats them. Catches a strategy that skips the constraint."""
    model = tiny()
    options = {"greedy": {}, "sample": {"seed": 0, "temperature": 0.2}, "beam": {"num_beams": 3},
               "contrastive": {"top_k": 4}}
    repeats = lambda seq: len(seq) - 1 - len(set(itertools.pairwise(seq)))
    for strategy, kw in options.items():
        free = generate(model, PROMPTS, strategy=strategy, max_new_tokens=30, **kw)
        assert any(repeats(p + f) for p, f in zip(PROMPTS, free)), strategy  # not vacuous
        out = generate(model, PROMPTS, strategy=strategy, max_new_tokens=30, no_repeat_ngram_size=2, **kw)
        assert [repeats(p + o) for p, o in zip(PROMPTS, out)] == [0] * len(PROMPTS), strategy


def test_higher_temperature_gives_higher_entropy():
    """Temperature must flatten (T > 1) or sharpen (T < 1) the next-token distribution, not the reverse."""
    logits = tiny()(torch.tensor(PROMPTS))[:, -1].detach() * 20  # sharpen the random model so the effect is large

    def entropy(t: float) -> float:
        p = apply_temperature(logits, t).softmax(-1)
        return float(-(p * p.log()).sum(-1).mean())

    assert entropy(0.5) < entropy(1.0) < entropy(2.0)


# ---- strategies against their definitions -----------------------------------------------------------------------
def test_greedy_is_deterministic_and_is_argmax():
    """Greedy must be the argmax chain (past the block_size crop) and repeat exactly."""
    model = tiny()
    out = generate(model, PROMPTS, strategy="greedy", max_new_tokens=20)
    assert out == generate(model, PROMPTS, strategy="greedy", max_new_tokens=20)
    assert out == manual_loop(model, PROMPTS, 20, lambda logits: logits.argmax(-1))


def test_top_k_1_equals_greedy():
    """Sampling from the single most likely token is greedy decoding, whatever the seed."""
    model = tiny()
    greedy = generate(model, PROMPTS, strategy="greedy", max_new_tokens=12)
    assert generate(model, PROMPTS, strategy="sample", top_k=1, seed=7, max_new_tokens=12) == greedy


def test_top_p_1_equals_plain_multinomial_sampling():
    """top_p=1 must not alter the distribution: same tokens as torch.multinomial on the softmax, same seed."""
    model = tiny()
    gen = torch.Generator().manual_seed(3)
    plain = manual_loop(model, PROMPTS, 12, lambda lg: torch.multinomial(lg.softmax(-1), 1, generator=gen)[:, 0])
    assert generate(model, PROMPTS, strategy="sample", top_p=1.0, seed=3, max_new_tokens=12) == plain
    assert generate(model, PROMPTS, strategy="sample", seed=4, max_new_tokens=12) != plain  # the seed matters


def test_beam_width_1_equals_greedy():
    """One beam is greedy search; anything else means the beam bookkeeping scores or reorders wrongly."""
    model = tiny()
    greedy = generate(model, PROMPTS, strategy="greedy", max_new_tokens=12)
    assert generate(model, PROMPTS, strategy="beam", num_beams=1, max_new_tokens=12) == greedy


def test_contrastive_with_alpha_0_equals_greedy():
    """Without the degeneration penalty, contrastive search picks the most likely candidate: greedy."""
    model = tiny()
    greedy = generate(model, PROMPTS, strategy="greedy", max_new_tokens=12)
    assert generate(model, PROMPTS, strategy="contrastive", penalty_alpha=0.0, top_k=4, max_new_tokens=12) == greedy
    assert generate(model, PROMPTS, strategy="contrastive", penalty_alpha=0.6, top_k=4, max_new_tokens=12) != greedy


def test_contrastive_penalises_candidates_similar_to_the_context():
    """Catches the degeneration penalty's sign flipped (a bonus for repeating the context). TableLM's hidden state is
    the one-hot of the token, so a candidate's max cosine similarity to the context is 1 if it already occurred, else
    0. Prompt [A, C], from C: A .5, B .4. Scores with alpha .5: A .5·.5 - .5·1 = -.25, B .5·.4 - 0 = .2, so B; then,
    from B, C .6 (seen) and D .3 (new): C .3 - .5 = -.2, D .15, so D. Greedy (and a flipped sign) say [A, ...]."""
    _EOS, A, B, C, D = range(5)
    table = [[0.2] * 5, [0.2] * 5, [0.05, 0.0, 0.05, 0.6, 0.3], [0.05, 0.5, 0.4, 0.05, 0.0], [0.2] * 5]
    kw = {"max_new_tokens": 2, "use_cache": False}
    out = generate(TableLM(table), [[A, C]], strategy="contrastive", penalty_alpha=0.5, top_k=2, **kw)
    assert out == [[B, D]]
    assert generate(TableLM(table), [[A, C]], strategy="greedy", **kw)[0][0] == A  # guard: the penalty decides
    # the probability weighs (1 - alpha): from C, A .85 (seen) and B .07 (new): A .5·.85 - .5 = -.075, B .035, so B
    # (without the weight, A .35 against B .07)
    table[C] = [0.04, 0.85, 0.07, 0.0, 0.04]
    assert generate(TableLM(table), [[A, C]], strategy="contrastive", penalty_alpha=0.5, top_k=2,
                    max_new_tokens=1, use_cache=False) == [[B]]


def test_beam_search_finds_the_better_sequence_greedy_misses():
    """From C, greedy takes A (0.6) then a 0.25 coin; beams find B→C (0.4·0.95): the point of beam search."""
    A, B, C, EOS = 1, 2, 3, 0
    table = [[0.25] * 4, [0.25] * 4, [0.01, 0.02, 0.02, 0.95], [0.0001, 0.6, 0.3999, 0.0]]
    model = TableLM(table)
    assert generate(model, [[C]], strategy="greedy", max_new_tokens=2, use_cache=False)[0][0] == A
    assert generate(model, [[C]], strategy="beam", num_beams=2, max_new_tokens=2, use_cache=False) == [[B, C]]
    # with B→EOS likely, the finished hypothesis [B] wins and the EOS is not returned
    table[B] = [0.95, 0.02, 0.02, 0.01]
    out = generate(TableLM(table), [[C]], strategy="beam", num_beams=2, max_new_tokens=5, eos_id=EOS, use_cache=False)
    assert out == [[B]]


@pytest.mark.parametrize("early_stopping", [True, False])
def test_beams_running_at_max_new_tokens_compete_with_the_last_steps_finished_ones(early_stopping):
    """Catches early stopping dropping the running beams at the last step: there [A, A] (log .5 + log .9, -0.40 a
    token) and [B] + EOS (log .2 + log .9, -0.86) are its two best candidates, and the EOS one fills the list beside
    step 0's [] + EOS (-1.20); [A, A] must still win, as in transformers' generate, not [B]."""
    EOS, A, _B, C = range(4)
    table = [[0.25] * 4, [0.1, 0.9, 0.0, 0.0], [0.9, 0.0, 0.0, 0.1], [0.3, 0.5, 0.2, 0.0]]
    out = generate(TableLM(table), [[C]], strategy="beam", num_beams=2, max_new_tokens=2, eos_id=EOS,
                   early_stopping=early_stopping, use_cache=False)
    assert out == [[A, A]]


@pytest.mark.parametrize("after_c, length_penalty, early_stopping, want", [
    ([0.4, 0.3, 0.3], 1.0, False, "BD"),  # per token: [B, D] (-1.204 / 3 = -0.401) beats [A] (-1.204 / 2 = -0.602)
    ([0.4, 0.3, 0.3], 1.0, True, "A"),  # stops once 2 hypotheses ended ([] and [A], at step 1): [A] is the better
    ([0.4, 0.3, 0.3], 0.0, False, ""),  # sums: [] (log .4 = -0.916) beats both (-1.204); no running beam can pass it
    # [] -0.511, [A] log .3 / 2² = -0.301; the running [B] (log .1 = -2.303) scored at its length now, 2, is
    # -0.576 < -0.511: done, as transformers decides (at length 3 it would be -0.256: on to [B, D], -2.303 / 9)
    ([0.6, 0.3, 0.1], 2.0, False, "A"),
], ids=["per-token", "early-stopping", "sum", "heuristic"])
def test_beam_length_penalty_and_early_stopping_by_hand(after_c, length_penalty, early_stopping, want):
    """Catches length_penalty or early_stopping ignored, a hypothesis' length counted without its EOS, or the stop
    heuristic scoring the running beam at another length than transformers'. From C, 2 beams: EOS ends [] at once
    (length 1); A then EOS 1.0 ends [A] (length 2); B then D 1.0 then EOS 1.0 ends [B, D] (length 3). Scores are
    sum(log p) / length**length_penalty. Without early stopping the search goes on while the best running beam,
    scored as if it ended now, beats the worst ended one."""
    ids = {"EOS": 0, "A": 1, "B": 2, "C": 3, "D": 4}
    table = [[0.2] * 5, [1.0, 0, 0, 0, 0], [0, 0, 0, 0, 1.0], [*after_c, 0, 0], [1.0, 0, 0, 0, 0]]  # row: after
    out = generate(TableLM(table), [[ids["C"]]], strategy="beam", num_beams=2, max_new_tokens=4, eos_id=ids["EOS"],
                   length_penalty=length_penalty, early_stopping=early_stopping, use_cache=False)
    assert out == [[ids[c] for c in want]]


def test_training_samples_with_the_beam_strategy_use_their_beams():
    """Catches the samples a run writes as it trains (SampleText) decoding strategy beam with one beam, which is
    greedy: they must be what `generate` gives with their num_beams (here different from greedy's)."""
    from tinylm.tokenize import build_tokenizer
    from tinylm.train.samples import SampleText

    letters = "".join(chr(ord("A") + i) for i in range(VOCAB - 1))  # 47 letters and <|endoftext|>: 48 ids
    tok = build_tokenizer("char", documents=lambda: [letters, letters])
    model, prompt = tiny(), tok.encode("AB")
    kw = {"max_new_tokens": 12, "eos_id": tok.eos_id}
    want = tok.decode(generate(model, [prompt], strategy="beam", num_beams=3, **kw)[0])
    assert want != tok.decode(generate(model, [prompt], strategy="greedy", **kw)[0])  # guard: beams matter here
    assert SampleText(strategy="beam", num_beams=3, max_new_tokens=12)._sample(model, tok, "AB") == want


def test_training_samples_with_the_contrastive_strategy_weigh_its_default_candidates():
    """Catches SampleText passing its sampling top_k (200) to contrastive search, where it is the candidates per
    step: 200 model rows per prompt and step, and other text than `tinylm generate --strategy contrastive` gives."""
    from tinylm.tokenize import build_tokenizer
    from tinylm.train.samples import SampleText

    letters = "".join(chr(ord("A") + i) for i in range(VOCAB - 1))
    tok = build_tokenizer("char", documents=lambda: [letters, letters])
    model, prompt = tiny(), tok.encode("AB")
    kw = {"strategy": "contrastive", "max_new_tokens": 12, "eos_id": tok.eos_id}
    want = tok.decode(generate(model, [prompt], top_k=4, **kw)[0])
    assert want != tok.decode(generate(model, [prompt], top_k=40, **kw)[0])  # guard: the candidates matter here
    sampler = SampleText(strategy="contrastive", max_new_tokens=12)
    assert sampler.config.top_k is None and sampler._sample(model, tok, "AB") == want


def test_beam_repetition_penalty_scales_log_probs_without_renormalising():
    """Catches beam search penalising raw logits and renormalising (transformers' beam search multiplies the seen
    tokens' log-probs by the penalty and keeps the sum as it is). Prompt [C], penalty 2, 2 beams, 2 steps:
    [A, C] scores 0.5 · 0.9² = 0.405 (A and C seen) and [B, D] 0.5 · 0.85 = 0.425, so [B, D] wins; renormalising the
    A row would lift C to 0.81 / 0.82 and make [A, C] (0.494) win."""
    _EOS, A, B, C, D = range(5)
    table = [[0.2] * 5, [0, 0.1, 0, 0.9, 0], [0.15, 0, 0, 0, 0.85], [0, 0.5, 0.5, 0, 0], [0.2] * 5]
    beam = {"strategy": "beam", "num_beams": 2, "max_new_tokens": 2, "use_cache": False}
    assert generate(TableLM(table), [[C]], repetition_penalty=2.0, **beam) == [[B, D]]
    assert generate(TableLM(table), [[C]], **beam) == [[A, C]]  # guard: unpenalised, [A, C] (0.45) wins


def test_training_samples_keep_their_ids_past_block_size():
    """Catches a change to how samples are decoded (the cache, the processors SampleText's defaults leave idle,
    the grad mode) changing the text a seed gives: SampleText's sample of each prompt (seed + index, temperature
    0.8, top_k above the vocabulary), three block_size long, equals a plain loop of whole-window forwards with its
    own generator, and the ids pinned here."""
    from tinylm.tokenize import build_tokenizer
    from tinylm.train.samples import SampleText

    tok = build_tokenizer("char", documents=lambda: ["ROMEO: the quick brown fox jumps over a lazy dog\n"])
    model = tiny(seed=3, vocab_size=tok.vocab_size, eos_id=None)
    samples = SampleText(prompts=["ROMEO:", "\n"], max_new_tokens=40)
    got = [tok.encode(samples._sample(model, tok, prompt, i)) for i, prompt in enumerate(samples.prompts)]
    for i, prompt in enumerate(samples.prompts):
        gen = torch.Generator().manual_seed(1234 + i)
        with torch.no_grad():
            plain = manual_loop(model, [tok.encode(prompt)], 40,
                                lambda lg, gen=gen: torch.multinomial((lg / 0.8).softmax(-1), 1, generator=gen)[:, 0])
        assert got[i] == plain[0], prompt
    assert got == PINNED_SAMPLE_IDS


PINNED_SAMPLE_IDS = [  # tinylm's samples of the test above (torch 2.13 CPU)
    [25, 22, 25, 5, 27, 30, 2, 13, 0, 10, 8, 11, 18, 18, 23, 15, 5, 18, 1, 3, 6, 9, 1, 15, 5, 4, 22, 20, 6, 9, 13, 16,
     2, 0, 4, 4, 30, 2, 23, 24],
    [12, 26, 24, 18, 4, 4, 0, 26, 26, 31, 21, 21, 26, 1, 10, 22, 11, 24, 8, 24, 22, 11, 17, 22, 28, 20, 25, 29, 11, 16,
     6, 10, 28, 11, 4, 15, 12, 30, 2, 10],
]


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam", "contrastive"])
def test_cache_gives_the_same_tokens_across_the_crop_boundary(strategy):
    """The cache (with its re-prefill past block_size) must not change what any strategy generates."""
    model = tiny(attn_mask="document")
    kw = {"strategy": strategy, "max_new_tokens": 24, "seed": 1, "num_beams": 3 if strategy == "beam" else 1}
    assert generate(model, PROMPTS, use_cache=True, **kw) == generate(model, PROMPTS, use_cache=False, **kw)


@pytest.mark.parametrize("attn_mask", ["causal", "document", "prefix"])
def test_cached_logits_equal_uncached_across_the_crop_boundary(attn_mask):
    """Same next-token logits (1e-5) with and without the cache, before and after the context passes block_size
    (for a prefix LM, the prompt stays the prefix as the window slides over it)."""
    model = tiny(attn_mask=attn_mask)
    ids = torch.tensor([[5, 9, 0, 3, 17, 8], [30, 2, 2, 41, 0, 7]])  # EOS (0) inside: two documents per row
    assert_cached_logits_equal_uncached(model, ids)  # 6 + 14 tokens > block_size 16


def test_prefix_lm_generation_matches_without_cache():
    """A prefix-LM model sees its prompt bidirectionally; the cached path must keep that prefix as well."""
    model = tiny(attn_mask="prefix")
    kw = {"strategy": "greedy", "max_new_tokens": 16}
    assert generate(model, PROMPTS, use_cache=True, **kw) == generate(model, PROMPTS, use_cache=False, **kw)


def test_batched_prompts_equal_one_at_a_time():
    """Batching must not mix rows (cache rows, per-row stopping)."""
    model = tiny()
    batched = generate(model, PROMPTS, strategy="beam", num_beams=2, max_new_tokens=8)
    assert batched == [generate(model, [p], strategy="beam", num_beams=2, max_new_tokens=8)[0] for p in PROMPTS]


def test_a_finished_prompts_beams_go_no_further_into_its_grammar():
    """Catches beam search refusing a batch over a prompt it had finished: the step that finished "c" (its two beams
    ended as "ab" and "ac", early_stopping) still moved its running beam "a" on to "a\\n", and its dead filler rows
    took id 0 ("\\n") into their grammar; at the next step, for "d" still running, "a\\n" (the regex then needs a
    "z" this tokenizer lacks) was refused as a grammar the tokenizer cannot write. Each prompt alone decodes fine."""
    pytest.importorskip("llguidance")
    tok = build_tokenizer("char", documents=lambda: ["ab\ncd"])  # ids \n a b c d: no EOS, no "z"
    _NL, A, B, C, D = range(5)
    table = [[0.2] * 5 for _ in range(5)]  # row: the next token's probabilities after that token
    table[C], table[D] = [0, 0.9, 0.1, 0, 0], [0, 0, 1.0, 0, 0]  # the prompts: "c" takes a (or b), "d" takes b
    table[A], table[B] = [0.1, 0, 0.5, 0.4, 0], [0, 0, 1.0, 0, 0]  # after a: b or c end the match, \n dies
    kw = {"strategy": "beam", "num_beams": 2, "early_stopping": True, "max_new_tokens": 4, "regex": r"ab|ac|a\nz|b+",
          "tokenizer": tok, "use_cache": False}
    alone = [generate(TableLM(table), [[p]], **kw)[0] for p in (C, D)]
    assert alone == [[A, B], [B, B, B, B]]
    assert generate(TableLM(table), [[C], [D]], **kw) == alone


def test_a_beam_no_id_continues_dies_alone():
    """Catches beam search refusing a regex greedy decoding and the other beams write: the beam "a\\n" (the regex then
    needs a "z" this tokenizer lacks) ended the whole search in "needs text this char tokenizer cannot write", beside
    the running "bb" and the ended "ab". That beam dies; a search whose every beam dies so is still refused."""
    pytest.importorskip("llguidance")
    tok = build_tokenizer("char", documents=lambda: ["ab\ncd"])  # ids \n a b c d: no EOS, no "z"
    _NL, A, B, C, _D = range(5)
    table = [[0.2] * 5 for _ in range(5)]  # row: the next token's probabilities after that token
    table[C], table[A], table[B] = [0, 0.9, 0.1, 0, 0], [0.5, 0, 0.25, 0.25, 0], [0, 0, 1.0, 0, 0]
    kw = {"strategy": "beam", "max_new_tokens": 4, "regex": r"ab|ac|a\nz|b+", "tokenizer": tok, "use_cache": False}
    assert generate(TableLM(table), [[C]], num_beams=2, **kw) == [[B, B, B, B]]  # log .1 / 4 beats "ab": log .225 / 2
    with pytest.raises(ValueError, match=r"no id continues it after 'a\\n' \(it needs 'z' there\)"):
        generate(TableLM(table), [[C]], num_beams=1, **kw)  # its one beam took "\\n"


def test_seed_makes_sampling_reproducible():
    """The same seed must give the same sample (and not depend on the global RNG)."""
    model = tiny()
    a = generate(model, PROMPTS, max_new_tokens=10, seed=11, temperature=1.5, top_k=20, top_p=0.9, min_p=0.01)
    torch.manual_seed(123)
    assert a == generate(model, PROMPTS, max_new_tokens=10, seed=11, temperature=1.5, top_k=20, top_p=0.9, min_p=0.01)


def test_repetition_penalty_lowers_repeated_ngrams():
    """Greedy on a random model loops; the penalty must break loops (fewer repeated bigrams)."""
    model = tiny(seed=2)

    def repeated_bigrams(penalty: float) -> int:
        out = generate(model, PROMPTS, strategy="greedy", max_new_tokens=40, repetition_penalty=penalty)
        return sum(len(o) - 1 - len(set(itertools.pairwise(o))) for o in out)

    plain = repeated_bigrams(1.0)
    assert plain > 10  # guard: without the penalty the model does repeat
    assert repeated_bigrams(2.0) < 0.8 * plain


# ---- stopping, streaming, modes ----------------------------------------------------------------------------------
def test_eos_stops_a_row_and_is_not_returned():
    """A row must end at EOS (others go on), and the EOS must not leak into the output."""
    model = tiny()
    greedy = generate(model, PROMPTS, strategy="greedy", max_new_tokens=10)
    eos = greedy[0][3]
    assert eos not in greedy[0][:3]
    out = generate(model, PROMPTS, strategy="greedy", max_new_tokens=10, eos_id=eos)
    assert out[0] == greedy[0][:3]
    expected_second = greedy[1][: greedy[1].index(eos)] if eos in greedy[1] else greedy[1]
    assert out[1] == expected_second


def test_stop_string_stops_generation():
    """Generation must stop once the decoded text contains a stop string, keeping the tokens that made it."""
    model = tiny()
    decode = lambda ids: "".join(chr(ord("a") + i % 26) for i in ids)
    full = generate(model, [PROMPTS[0]], max_new_tokens=20, seed=5)[0]
    stop = decode(full[6:8])
    cut = next(n for n in range(1, 21) if stop in decode(full[:n]))
    out = generate(model, [PROMPTS[0]], max_new_tokens=20, seed=5, stop_strings=[stop], decode=decode)[0]
    assert out == full[:cut] and cut < len(full)


def test_on_token_streams_in_order_and_eval_mode_is_restored():
    """Streaming must deliver every token once, in order; generation runs in eval and restores train mode."""
    model = tiny(dropout=0.5).train()
    streamed: list[tuple[int, int, bool]] = []
    record = lambda row, tok: streamed.append((row, tok, model.training))
    out = generate(model, PROMPTS, strategy="greedy", max_new_tokens=6, on_token=record)
    assert [t for r, t, _ in streamed if r == 0] == out[0] and [t for r, t, _ in streamed if r == 1] == out[1]
    assert not any(training for _, _, training in streamed)  # dropout off while generating
    assert model.training


def test_generate_restores_eval_mode_and_train_mode_after_an_error():
    """Catches generate leaving a model in train mode that came in eval (dropout on at the next evaluation: it
    restored train mode unconditionally), or in eval mode when the generation raised (a callback's error: a
    training run then went on without dropout)."""
    model = tiny(dropout=0.5).eval()
    generate(model, PROMPTS, strategy="greedy", max_new_tokens=2)
    assert not model.training

    def fail(row, tok):
        assert not model.training  # guard: it did switch to eval while generating
        raise KeyboardInterrupt

    model.train()
    with pytest.raises(KeyboardInterrupt):
        generate(model, PROMPTS, strategy="greedy", max_new_tokens=2, on_token=fail)
    assert model.training and all(m.training for m in model.modules())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": 0.0}, r"temperature must be in \[0.0001, inf\), got 0.0; .*--strategy greedy"),
        ({"temperature": float("inf")}, r"temperature must be in \[0.0001, inf\), got inf$"),  # was: uniform samples
        ({"top_p": 0.0}, "top_p must be in \\(0, 1\\], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in"),
        ({"top_k": 0}, "top_k must be a whole number in \\[1, inf\\), got 0; leave it unset for no limit"),
        ({"top_k": 2.5}, "top_k must be a whole number"),  # was a TypeError inside torch
        ({"max_new_tokens": None}, "max_new_tokens needs a value, got None"),  # was a TypeError mid-generation
        ({"temperature": "a"}, "temperature must be in"),
        ({"seed": 1.5}, "seed must be a whole number"),
        ({"min_p": 1.5}, "min_p must be in \\[0, 1\\]"),
        ({"typical_p": 0.0}, "typical_p must be in \\(0, 1\\]"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be a whole number in \\[0, "),
        ({"no_repeat_ngram_size": 2.5}, "no_repeat_ngram_size must be a whole number"),
        ({"strategy": "beam", "num_beams": 0}, r"num_beams must be a whole number in \[1, "),
        ({"num_beams": 4}, "needs the beam strategy \\(--strategy beam\\)"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty must be in \[0.001, inf\)"),
        ({"max_new_tokens": 0}, r"max_new_tokens must be a whole number in \[1, "),
        ({"strategy": "nucleus"}, "unknown strategy 'nucleus'"),
        ({"penalty_alpha": 2.0}, "penalty_alpha must be in"),
        ({"stop_strings": ["x"]}, "stop_strings need decode"),
        ({"eos_id": VOCAB}, "eos_id must be < vocab_size"),
        ({"eos_id": 2.5}, "eos_id must be a whole number"),  # was accepted, and never ended a row
    ],
)
def test_bad_arguments_raise(kwargs, message):
    """Out-of-range options must fail up front with the value named, not produce NaNs or silent defaults."""
    with pytest.raises(ValueError, match=message):
        generate(tiny(), PROMPTS, **kwargs)


@pytest.mark.parametrize("functions, message", [
    ({"on_token": 1}, "on_token must be a function on_token(row, token_id), or None; got int 1"),
    ({"decode": "x"}, "decode must be a function decode(ids) -> text (e.g. tokenizer.decode), or None; got str 'x'"),
    ({"on_step": True}, "on_step must be a function on_step(new_tokens), or None; got bool True"),
])
def test_a_function_argument_that_is_no_function_is_named(functions, message):
    """Catches on_token=1 or decode="x" (with stop strings) failing mid-generation in "'int' object is not callable",
    which names neither the argument nor what it takes."""
    config = SamplingConfig(strategy="greedy", max_new_tokens=2, stop_strings=["x"])
    with pytest.raises(TypeError, match=re.escape(message)):
        generate_with(tiny(), PROMPTS, config, **{"decode": lambda ids: "", **functions})


def test_numpy_prompts_are_prompts():
    """Catches a 1-D numpy array of ids (or a list of numpy ints, as `np.array(...).tolist()` is not) failing with
    "object of type 'numpy.int64' has no len()"."""
    import numpy as np

    model = tiny()
    want = generate(model, [[1, 2, 3]], strategy="greedy", max_new_tokens=4)
    assert generate(model, np.array([1, 2, 3]), strategy="greedy", max_new_tokens=4) == want
    assert generate(model, list(np.array([1, 2, 3])), strategy="greedy", max_new_tokens=4) == want


def test_bad_prompts_raise():
    """Ragged batches and out-of-vocab ids must be rejected with the fix, not padded silently or crash in wte."""
    model = tiny()
    with pytest.raises(ValueError, match="equal lengths"):
        generate(model, [[1, 2], [3]])
    with pytest.raises(ValueError, match="must be in \\[0, 48\\)"):
        generate(model, [[1, VOCAB]])
    with pytest.raises(ValueError, match="non-empty"):
        generate(model, [[]])
    assert SamplingConfig(strategy="greedy", temperature=0.0).strategy == "greedy"  # temperature unused by greedy


def _utf8(ids) -> str:
    """A byte-level decoder: token i is byte i (an incomplete character decodes as U+FFFD)."""
    return bytes(ids).decode("utf-8", "replace")


def test_a_stop_string_of_multibyte_characters_stops_byte_level_tokens():
    """Catches a stop string of non-ASCII characters never matching: with byte-level tokens a character takes up to
    4 tokens, so the text searched after each token must reach back 4 tokens per character of the string."""
    from tinylm.generate.processors import SamplingConfig
    from tinylm.generate.strategies import _Rows

    rows = _Rows(SamplingConfig(stop_strings=["東京"]), _utf8, None, [[97]])
    for byte in "x東京".encode():
        assert rows.active == [True]
        rows.accept([byte])
    assert rows.active == [False]


def test_a_lone_stop_string_is_one_string_not_its_characters():
    """Catches `stop_strings="vs"` stopping at the first v or s (a string iterated as its characters)."""
    model = tiny()
    decode = lambda ids: "".join(chr(ord("a") + i % 26) for i in ids)  # row 0 goes on "vvvsss..."
    kw = {"strategy": "greedy", "max_new_tokens": 12, "decode": decode}
    lone = generate(model, PROMPTS, stop_strings="vs", **kw)
    assert lone == generate(model, PROMPTS, stop_strings=["vs"], **kw)
    assert lone != generate(model, PROMPTS, stop_strings=["v", "s"], **kw)


@pytest.mark.parametrize("options", [{"strategy": "greedy"}, {"strategy": "sample", "seed": 1},
                                     {"strategy": "beam", "num_beams": 3}, {"strategy": "contrastive"},
                                     {"strategy": "greedy", "prompt_lookup": 2}])
def test_every_strategy_tells_each_step(options):
    """Catches a progress bar that stood still: `tinylm generate --strategy beam` (or several samples) prints
    nothing until the end, so its bar counts the steps that on_step tells; beam search's on_token fires only once
    the best beam is known, at its end. Each strategy says the new tokens so far after each step, up to the tokens
    of its longest row, in order."""
    from tinylm.generate import SamplingConfig, generate_with

    told: list[int] = []
    config = SamplingConfig(max_new_tokens=12, eos_id=None, **options)
    out = generate_with(tiny(), PROMPTS, config, on_step=told.append)
    assert told and told == sorted(set(told)) and told[-1] == max(map(len, out)) == 12
    if "prompt_lookup" not in options:  # (speculative decoding may take several tokens a step)
        assert told == list(range(1, 13))


@pytest.mark.parametrize("prompt, says", [
    ([[1.9, 2.9]], "got 1.9 among them"), ("ROMEO", "not text; encode the text first"),
    (torch.tensor([[1.0, 2.0]]), "got a torch.float32 tensor"), ([[True, 2]], "got True among them"),
    ([[1, None]], "got None among them"), ([None, 2], "got None among them"), ([None], "got None among them"),
])
def test_prompt_ids_that_are_no_integer_ids_are_refused(prompt, says):
    """Catches generate cutting float ids to integers without a word ([[1.9, 2.9]] decoded as [[1, 2]]), and text or
    bools passed as ids ending in torch's "too many dimensions 'str'"."""
    with pytest.raises(ValueError, match=re.escape(says)):
        generate(tiny(), prompt, strategy="greedy", max_new_tokens=2)


def test_generate_given_the_lightning_module_names_its_gpt():
    """Catches `generate(module, ...)` with the TinyLM LightningModule ending in "'TinyLM' object has no attribute
    'config'"."""
    from tinylm.train.module import TinyLM

    with pytest.raises(TypeError, match=re.escape("got a TinyLM (the LightningModule: pass its .model)")):
        generate(TinyLM(vocab_size=VOCAB, block_size=16, n_layer=1, n_head=2, n_embd=16), [[1, 2]], max_new_tokens=2)


def test_switches_take_true_or_false_and_a_changed_config_is_checked_again():
    """Catches a switch given as text turned on by Python's truth ("false" gave a model biases, early_stopping="never"
    stopped beams early), and a SamplingConfig changed after it was made skipping its checks (temperature = 0 ended
    in torch.multinomial's "probability tensor contains inf")."""
    from tinylm.generate import SamplingConfig, generate_with

    with pytest.raises(ValueError, match="bias must be true or false, got 'false'"):
        GPTConfig(vocab_size=VOCAB, block_size=16, n_layer=1, n_head=2, n_embd=32, bias="false")
    with pytest.raises(ValueError, match="early_stopping must be true or false, got 'never'"):
        SamplingConfig(early_stopping="never")
    config = SamplingConfig(max_new_tokens=2)
    config.temperature = 0
    with pytest.raises(ValueError, match="temperature"):
        generate_with(tiny(), [[1, 2]], config)


def test_generate_leaves_every_submodule_in_the_mode_it_found_it():
    """Catches generate restoring only the top-level train()/eval() mode: a dropout the user had put in eval mode
    while fine-tuning (model.train(); model.transformer.drop.eval()) came back in train mode."""
    model = tiny(dropout=0.1).train()
    model.transformer.drop.eval()
    before = {name: m.training for name, m in model.named_modules()}
    generate(model, [[1, 2]], strategy="greedy", max_new_tokens=2)
    assert {name: m.training for name, m in model.named_modules()} == before and not model.transformer.drop.training


def test_prefix_lm_window_past_block_size_keeps_only_the_prompt_as_its_prefix():
    """Catches generated tokens read as prefix once the window slides past block_size (they then saw each other
    both ways): the runner's logits, cached and not, equal an independent forward of the window with the prompt
    left in it as its prefix. Cached-vs-uncached alone cannot catch it (both shared the error), greedy ids neither
    (the logits moved by ~2e-3)."""
    from tinylm.generate.rows import _Runner

    model = tiny(attn_mask="prefix")
    B = model.config.block_size
    ids = torch.randint(1, VOCAB, (1, B + 6), generator=torch.Generator().manual_seed(0))
    P = 6
    for cache in (False, True):
        run = _Runner(model, use_cache=cache, prompt_len=P)
        with torch.no_grad():
            for L in range(P, ids.size(1) + 1):
                start = max(0, L - B)
                want = model(ids[:, start:L], prefix_len=max(0, P - start))[:, -1]
                torch.testing.assert_close(run(ids[:, :L])[0], want, atol=1e-5, rtol=0, msg=f"{cache=} {L=}")


def test_past_block_size_the_runner_drops_the_cache_no_step_can_use():
    """Catches the KV cache refilled with the whole window at every token past block_size (every layer's keys and
    values copied, and reordered for each beam, for a cache no later step reads: learned positions shift with the
    window). A speculative draft, which rolls its cache back, keeps it. The logits stay the uncached window's."""
    from tinylm.generate.rows import _Runner

    model = tiny()
    B = model.config.block_size
    ids = torch.randint(1, VOCAB, (2, B + 3), generator=torch.Generator().manual_seed(0))
    run, draft, plain = (_Runner(model, use_cache=cache, prompt_len=4, rollback=rollback)
                         for cache, rollback in ((True, False), (True, True), (False, False)))
    with torch.no_grad():
        for L in range(4, ids.size(1) + 1):
            want = plain(ids[:, :L])[0]
            torch.testing.assert_close(run(ids[:, :L])[0], want, atol=1e-5, rtol=0, msg=f"{L=}")
            torch.testing.assert_close(draft(ids[:, :L])[0], want, atol=1e-5, rtol=0, msg=f"{L=}")
            assert (run.cache is None) == (L > B) and draft.cache is not None, L
    run.reorder(torch.tensor([1, 0]))  # (beam search's, past block_size: nothing to follow)


def test_generate_runs_the_model_in_inference_mode():
    """Catches generation under no_grad alone, where autograd's per-op bookkeeping (version counters, view
    tracking) cost ~15 % of a training sample of the laptop recipe's model on a CPU; the model trains after."""
    model = tiny()
    modes = []
    model.transformer.h[0].register_forward_hook(lambda *_: modes.append(torch.is_inference_mode_enabled()))
    generate(model, PROMPTS, max_new_tokens=20, seed=0)
    assert modes and all(modes) and not torch.is_inference_mode_enabled()
    model.train()
    model(torch.tensor(PROMPTS)).sum().backward()  # nothing generate made is kept in the model
    assert model.lm_head.weight.grad is not None


def test_the_default_sample_prompt_fits_a_char_corpus_without_line_breaks():
    """Catches `tinylm fit --data.corpus dna.txt` (char tokenizer, every other option at its default) stopping
    before its first step with "samples.prompts: '\\n' cannot be encoded by the run's tokenizer ...; change
    --samples.prompts": a prompt the user never gave. One the user gave is still refused."""
    from tinylm.tokenize import build_tokenizer
    from tinylm.train.samples import SampleText

    one_doc = build_tokenizer("char", documents=lambda: ["ACGTTGCA" * 8])  # no end-of-text id
    two_docs = build_tokenizer("char", documents=lambda: ["ACGT", "TGCA"])  # one
    for tok, prompt in ((one_doc, "A"), (two_docs, "")):
        samples = SampleText()
        samples._check_prompts(tok)
        assert samples.prompts == [prompt]
    with pytest.raises(ValueError, match=r"samples.prompts: '\\n' cannot be encoded .* change --samples.prompts"):
        SampleText(prompts=["\n"])._check_prompts(one_doc)


def test_a_numpy_integer_seed_samples_as_the_same_int_seed():
    """SamplingConfig accepts any whole number as the seed (numbers.Integral); a numpy one (np.random's, a
    DataFrame's) must seed the generator too, not end in torch's "TypeError: an integer is required"."""
    import numpy as np

    model = tiny()
    expected = generate(model, PROMPTS, strategy="sample", seed=3, max_new_tokens=8)
    assert generate(model, PROMPTS, strategy="sample", seed=np.int64(3), max_new_tokens=8) == expected


def test_training_samples_skip_weights_holding_nan(tmp_path):
    """Catches the samples a run writes as it trains (SampleText) decoding from weights that hold NaN (a step the
    guard skipped, a callback that broke them): the run ended in torch.multinomial's traceback ("probability tensor
    contains either inf, nan or element < 0") before the guard could roll it back. The sample step is skipped with
    one line naming the step and the tensor, and nothing is written to samples.txt; finite weights still sample."""
    from types import SimpleNamespace

    from tinylm.tokenize import build_tokenizer
    from tinylm.train.samples import SampleText

    letters = "".join(chr(ord("A") + i) for i in range(VOCAB - 1))
    tok = build_tokenizer("char", documents=lambda: [letters, letters])
    model = tiny()
    trainer = SimpleNamespace(global_step=5, is_global_zero=True, callbacks=[], loggers=[],
                              default_root_dir=str(tmp_path), datamodule=SimpleNamespace(tokenizer=tok))
    module = SimpleNamespace(model=model)
    SampleText(every_n_steps=5, prompts=["AB"], max_new_tokens=4).on_train_batch_end(trainer, module, None, None, 0)
    assert (tmp_path / "samples.txt").read_text().startswith("--- step 5 | 'AB'")  # guard: finite weights sample
    (tmp_path / "samples.txt").unlink()
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.weight.fill_(float("nan"))
    with pytest.warns(UserWarning, match=r"samples at step 5 skipped: the model's weights hold NaN or inf in 1 "
                                         r"tensors, e.g. 'transformer.h.0.attn.c_attn.weight'"):
        SampleText(every_n_steps=5, prompts=["AB"], max_new_tokens=4).on_train_batch_end(trainer, module, None, None,
                                                                                          0)
    assert not (tmp_path / "samples.txt").exists()
