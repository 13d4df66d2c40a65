"""Speculative decoding: greedy output equal to the model's own greedy output, sampled output distributed as the
model's, with a draft model or prompt lookup, on the KV cache and past block_size."""

import math

import pytest
import torch

from tinylm.generate import SamplingConfig, generate
from tinylm.model import GPT, GPTConfig


def model(seed: int, *, vocab: int = 24, n_layer: int = 2, n_embd: int = 32, block_size: int = 24, scale: float = 8.0,
          **kw) -> GPT:
    """A random GPT whose logits are spread wide (weights x ``scale``): its greedy text is varied, not one token
    repeated, so agreeing with it token for token means something."""
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=vocab, block_size=block_size, n_layer=n_layer, n_head=2, n_embd=n_embd,
                      pad_vocab_multiple=1, **kw))
    with torch.no_grad():
        m.lm_head.weight.mul_(scale)
    return m.eval()


PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 4], [9, 9, 9, 9, 9]]


@pytest.mark.parametrize("kw", [
    {},
    {"positions": "rope", "norm": "rmsnorm"},
    {"attn_mask": "prefix"},
], ids=["learned", "rope", "prefix-lm"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_speculative_equals_greedy_token_for_token(kw, k):
    """Catches any drift from the model's own greedy text: a wrong cache rollback, an off-by-one between drafts and
    the logits that judge them, a batch row accepting another row's drafts, the window past block_size (60 tokens
    after a 5-token prompt cross block_size 24), and the processors seen at the wrong position."""
    target, draft = model(0, **kw), model(1, n_layer=1, n_embd=16, **kw)
    options = {"strategy": "greedy", "max_new_tokens": 60, "repetition_penalty": 1.3, "no_repeat_ngram_size": 4}
    want = generate(target, PROMPTS, **options)
    assert len({tuple(w) for w in want}) == 3 and all(len(set(w)) > 5 for w in want)  # guard: varied text
    with_draft = generate(target, PROMPTS, draft=draft, num_draft_tokens=k, **options)
    with_itself = generate(target, PROMPTS, draft=target, num_draft_tokens=k, **options)  # every draft kept
    with_lookup = generate(target, PROMPTS, prompt_lookup=3, num_draft_tokens=k, **options)
    assert with_draft == want and with_itself == want and with_lookup == want


def test_greedy_speculative_stops_like_greedy():
    """Catches tokens after an EOS (or past max_new_tokens) leaking out of a step that accepted several."""
    target, draft = model(0), model(1, n_layer=1, n_embd=16)
    eos = generate(target, PROMPTS[:1], strategy="greedy", max_new_tokens=6)[0][5]  # row 0's 6th token
    want = generate(target, PROMPTS, strategy="greedy", max_new_tokens=17, eos_id=eos)
    assert generate(target, PROMPTS, strategy="greedy", max_new_tokens=17, eos_id=eos, draft=draft,
                    num_draft_tokens=6) == want
    assert any(len(w) < 17 for w in want)  # guard: the EOS did end a row


def _exact_distribution(m: GPT, prompt: list[int], n: int, config: SamplingConfig) -> dict[tuple, float]:
    """P(x1..xn | prompt) of every continuation under the processed distribution at each step, by enumeration."""
    from tinylm.generate.processors import constrained_logits, sampling_logits

    probs = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, p in probs.items():
            ids = torch.tensor([prompt + list(seq)])
            logits = constrained_logits(m(ids)[:, -1].float(), ids, config)
            q = sampling_logits(logits, config).softmax(-1)[0]
            for t, qt in enumerate(q.tolist()):
                if qt > 0:
                    nxt[seq + (t,)] = p * qt
        probs = nxt
    return probs


@pytest.mark.parametrize("seq, drafts", [
    ([1, 2, 3, 1, 2, 4, 1, 2], [4, 1, 2]),  # the latest earlier "1 2", not the first
    ([1, 2, 3, 4, 3], [4, 3]),  # no 2-gram matches: the last token alone does
    ([1, 2, 3], []),  # nothing repeats
    ([5, 6, 7, 8, 6, 7], [8, 6, 7]),  # the longest match (2-gram "6 7"), its continuation cut at k
])
def test_prompt_lookup_drafts_what_followed_the_latest_longest_match(seq, drafts):
    """Catches prompt lookup drafting from the earliest match (older text, less likely to repeat now) or never
    trying a one-token match: the output stays exact either way, only the drafts (the speed) change."""
    from tinylm.generate.speculative import PromptLookup

    assert PromptLookup(max_ngram=3)._lookup(seq, 3) == drafts


@pytest.mark.parametrize("drafter", ["model", "lookup"])
def test_sampled_speculative_follows_the_models_distribution(drafter):
    """Catches an accept/reject rule that is not exact (accepting with p instead of min(1, p/q), resampling from p
    instead of max(0, p - q), a bonus token drawn from the draft): 3 new tokens over a 5-id vocabulary have 125
    outcomes whose exact probabilities are computed; 20,000 speculative samples must fit them (chi-square, 0.1 %
    level), while the draft's own samples must not (the test can fail)."""
    V, n, N = 5, 3, 20_000
    options = {"temperature": 0.9, "top_k": 4, "repetition_penalty": 1.2}
    target, draft = model(0, vocab=V, scale=2.0), model(3, vocab=V, n_layer=1, n_embd=16, scale=2.0)
    prompt = [0, 1, 2, 0, 1]  # prompt lookup finds "0 1" earlier: it drafts 2, 0, 1
    exact = _exact_distribution(target, prompt, n, SamplingConfig(**options))
    spec = {"draft": draft, "num_draft_tokens": 2} if drafter == "model" else \
        {"prompt_lookup": 2, "num_draft_tokens": 3}
    out = generate(target, [prompt] * N, strategy="sample", max_new_tokens=n, seed=0, **spec, **options)
    chi2, dof = _chi_square(out, exact, N)
    assert chi2 < _CHI2_999[min(dof // 10 * 10, 120)], (chi2, dof)
    if drafter == "model":  # guard: the draft alone is far from the model (so acceptance really was tested)
        own = generate(draft, [prompt] * N, strategy="sample", max_new_tokens=n, seed=0, **options)
        assert _chi_square(own, exact, N)[0] > 10 * _CHI2_999[120]


_CHI2_999 = {0: 30.0, 10: 45.3, 20: 59.7, 30: 73.4, 40: 86.7, 50: 99.6, 60: 112.3, 70: 124.8, 80: 137.2, 90: 149.4,
             100: 161.6, 110: 173.6, 120: 185.4}  # 0.999 quantiles of chi-square by degrees of freedom (rounded down)


def _chi_square(samples: list[list[int]], exact: dict[tuple, float], N: int) -> tuple[float, int]:
    """Pearson's chi-square of the sampled continuations against ``exact``; cells expected < 5 are pooled."""
    counts: dict[tuple, int] = {}
    for s in samples:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    if not set(counts) <= set(exact):  # a continuation the model gives probability 0
        return math.inf, 0
    chi2, small_e, small_o, cells = 0.0, 0.0, 0, 0
    for seq, p in exact.items():
        e, o = p * N, counts.get(seq, 0)
        if e < 5:
            small_e, small_o = small_e + e, small_o + o
            continue
        chi2, cells = chi2 + (o - e) ** 2 / e, cells + 1
    if small_e > 0:
        chi2, cells = chi2 + (small_o - small_e) ** 2 / small_e, cells + 1
    return chi2, cells - 1


@pytest.mark.parametrize("kwargs, message", [
    ({"strategy": "beam", "num_beams": 2}, "needs the greedy or sample strategy"),
    ({"num_draft_tokens": 0}, r"num_draft_tokens must be a whole number in \[1, 64\], got 0"),
    ({"draft_vocab": 30}, "the draft model has 30 token ids and the model 24"),
])
def test_bad_speculative_arguments_are_one_line(kwargs, message):
    """Catches a draft of another vocabulary, K = 0 or beam search with a draft failing deep inside (or worse,
    decoding something that is not the model's text)."""
    draft = model(1, vocab=kwargs.pop("draft_vocab", 24), n_layer=1, n_embd=16)
    with pytest.raises(ValueError, match=message):
        generate(model(0), PROMPTS, draft=draft, max_new_tokens=4, **kwargs)
    with pytest.raises(ValueError, match="prompt_lookup"):
        SamplingConfig(strategy="contrastive", prompt_lookup=2)


def test_a_draft_that_agrees_needs_fewer_forward_passes():
    """Catches speculative decoding that is exact but no faster: with the model as its own draft, every draft is
    kept, so K = 4 takes 1 forward of the model per 5 tokens."""
    from tinylm.generate import speculative
    from tinylm.generate.strategies import _prompt_tensor, _Rows

    target = model(0)
    config = SamplingConfig(strategy="greedy", max_new_tokens=20, num_draft_tokens=4)
    ids = _prompt_tensor(PROMPTS, target)
    rows = _Rows(config, None, None, [[]] * 3)
    with torch.no_grad():
        stats = speculative.decode(target, ids, rows, speculative.DraftModel(target, ids.size(1), True), None)
    assert stats["steps"] == 4 and stats["kept"] == stats["drafted"] == 4 * 3 * 4  # 4 steps x 3 rows x K
    assert rows.tokens == generate(target, PROMPTS, strategy="greedy", max_new_tokens=20)


def test_generate_command_with_a_draft_checkpoint(run_config, tmp_path, capsys):
    """Catches `tinylm generate --draft_ckpt_path` printing other text than plain greedy decoding, and a draft
    trained with another tokenizer (another corpus's characters) being used instead of refused in one line."""
    from tinylm.cli import main

    main(["fit", "--config", str(run_config())])
    ckpt = str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")
    main(["fit", "--config", str(run_config(model={"n_layer": 1, "n_embd": 16}, run={"name": "draft"}))])
    draft = str(tmp_path / "runs" / "draft" / "checkpoints" / "last.ckpt")
    args = ["generate", "--ckpt_path", ckpt, "--prompt", "ROMEO:", "--strategy", "greedy", "--max_new_tokens", "40"]
    capsys.readouterr()
    main(args)
    plain = capsys.readouterr().out
    main(args + ["--draft_ckpt_path", draft, "--num_draft_tokens", "3"])
    assert capsys.readouterr().out == plain and len(plain) > 40
    other = tmp_path / "other.txt"
    other.write_text("abc " * 2000)
    main(["fit", "--config", str(run_config(data={"corpus": str(other)}, run={"name": "other"}))])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(args + ["--draft_ckpt_path", str(tmp_path / "runs" / "other" / "checkpoints" / "last.ckpt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not the model's (char, " in err[0] and "same --data.tokenizer" in err[0], err


@pytest.mark.parametrize("surface, args, message", [
    ("generate", ["--strategy", "beam"], r"^--draft_ckpt_path \(speculative decoding\) needs the greedy or sample "
                                         r"strategy, got --strategy 'beam'; drop --draft_ckpt_path$"),
    ("generate", ["--prompt_lookup", "2"], r"^--draft_ckpt_path and --prompt_lookup both draft tokens; give one$"),
    ("generate", ["--regex", "a+"], r"^--regex with --draft_ckpt_path: speculative decoding does not take a grammar"),
    ("samples", {"strategy": "contrastive"}, r"^samples\.draft_ckpt_path \(speculative decoding\) needs the greedy"),
    ("samples", {"json_schema": "{}"}, r"^samples\.json_schema with samples\.draft_ckpt_path: speculative"),
])
def test_a_draft_checkpoint_is_refused_with_what_it_cannot_do_before_loading(tmp_path, surface, args, message):
    """Catches --draft_ckpt_path with beams, a grammar or prompt lookup being found only after both checkpoints were
    loaded (or, for prompt lookup, the draft silently winning), and the training samples' draft being loaded only
    to fail at the first sample step: the line names the options as that surface spells them (the checkpoints here
    do not exist: the refusal must come first)."""
    from tinylm.cli.commands import run as run_command
    from tinylm.train.samples import SampleText

    draft = str(tmp_path / "draft.ckpt")
    with pytest.raises(ValueError, match=message):
        if surface == "generate":
            run_command("generate", ["--ckpt_path", str(tmp_path / "none.ckpt"), "--draft_ckpt_path", draft, *args])
        else:
            SampleText(draft_ckpt_path=draft, **args)


def test_a_draft_that_is_no_model_is_named():
    """Catches generate(draft="draft.ckpt") (a path where the model goes) ending in an AttributeError."""
    from tinylm.generate import generate
    from tinylm.model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=1, n_embd=8)).eval()
    with pytest.raises(TypeError, match=r"draft must be a tinylm GPT \(tinylm.checkpoint.load_draft\(path, tokenizer\) "
                                        r"loads one\), got str 'draft.ckpt'"):
        generate(model, [[1, 2]], draft="draft.ckpt", max_new_tokens=2)


def test_acceptance_counts_every_rows_drafts():
    """Catches the accepted drafts counted by the row that accepted fewest (the batch's step) instead of each row's
    own test: the acceptance rate of several prompts came out low. Two copies of one prompt draft and accept exactly
    twice what the prompt alone does (prompt lookup, greedy: the rows are alike)."""
    from tinylm.generate import generate_with

    target = model(0, tie_embeddings=False)  # (tied, the scaled head made it repeat its last token: every draft kept)
    prompt = [[16, 21, 17, 13, 6, 1, 17]]
    config = SamplingConfig(strategy="greedy", max_new_tokens=12, num_draft_tokens=2, prompt_lookup=2)
    one, two = {}, {}
    generate_with(target, prompt, config, stats=one)
    generate_with(target, prompt * 2, config, stats=two)
    assert 0 < one["accepted"] < one["drafted"]  # (not vacuous: some drafts kept, some not)
    assert (two["accepted"], two["drafted"]) == (2 * one["accepted"], 2 * one["drafted"])
