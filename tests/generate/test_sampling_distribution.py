"""End-to-end sampling distributions against transformers' LogitsProcessors (an independent reference): one new
token drawn 20,000 times through `generate` must fit the exact processed distribution (chi-square, 0.1 % level)."""

from __future__ import annotations

import pytest
import torch

from tinylm.generate.strategies import generate
from tinylm.model import GPT, GPTConfig

_CHI2_999 = {1: 10.8, 2: 13.8, 3: 16.2, 4: 18.4, 5: 20.5, 6: 22.4, 7: 24.3, 8: 26.1, 9: 27.8, 10: 29.5, 11: 31.2}


def _hf_processors(options: dict):
    tf = pytest.importorskip("transformers")
    order = [("repetition_penalty", tf.RepetitionPenaltyLogitsProcessor), ("no_repeat_ngram_size",
             tf.NoRepeatNGramLogitsProcessor), ("temperature", tf.TemperatureLogitsWarper),
             ("top_k", tf.TopKLogitsWarper), ("top_p", tf.TopPLogitsWarper), ("min_p", tf.MinPLogitsWarper),
             ("typical_p", tf.TypicalLogitsWarper)]  # transformers' own order (GenerationMixin._get_logits_processor)
    return tf.LogitsProcessorList([cls(options[name]) for name, cls in order if name in options])


@pytest.mark.parametrize("options", [
    {"temperature": 0.7}, {"top_k": 3}, {"top_p": 0.6}, {"min_p": 0.1}, {"typical_p": 0.5},
    {"repetition_penalty": 1.8}, {"no_repeat_ngram_size": 2},
    {"repetition_penalty": 1.5, "temperature": 1.3, "top_k": 5, "top_p": 0.8, "min_p": 0.05},
])
def test_one_sampled_token_follows_transformers_processed_distribution(options):
    """Catches a processor that differs from transformers' (a kept set, a penalty's sign, the order of temperature and
    the filters) or a sampling step that does not draw from the processed softmax."""
    V, N = 12, 20_000
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, block_size=32, n_layer=2, n_head=2, n_embd=32, pad_vocab_multiple=1)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)  # tied: logits with a spread (std ~1), not near-uniform
    prompt = [1, 2, 3, 1, 2]
    with torch.no_grad():
        logits = model(torch.tensor([prompt]))[:, -1].float()
    exact = _hf_processors(options)(torch.tensor([prompt]), logits).softmax(-1)[0].double()
    out = generate(model, [prompt] * N, strategy="sample", max_new_tokens=1, seed=0, **options)
    counts = torch.bincount(torch.tensor([row[0] for row in out]), minlength=V).double()
    assert counts[exact == 0].sum() == 0, "drew a token the processors remove"
    e, o = exact[exact > 0] * N, counts[exact > 0]
    small = e < 5
    e, o = torch.cat([e[~small], e[small].sum()[None]]), torch.cat([o[~small], o[small].sum()[None]])
    e, o = e[e > 0], o[e > 0]
    chi2, dof = float(((o - e) ** 2 / e).sum()), len(e) - 1
    if dof:
        assert chi2 < _CHI2_999[dof], (chi2, dof, exact.tolist(), (counts / N).tolist())
