"""The modern-GPT options (RoPE, RMSNorm, QK-norm, SwiGLU/ReLU², untied head, logit soft-cap, zero-init): the default
stays nanoGPT bit for bit; every option keeps causality, the KV cache and generation past block_size exact."""

import re

import pytest
import torch
from helpers import assert_cached_logits_equal_uncached

from tinylm.generate.strategies import generate
from tinylm.model import GPT, GPTConfig
from tinylm.model.layers import RMSNorm, apply_rope, rope_cos_sin, swiglu_hidden

VOCAB = 50
MODERN = {"positions": "rope", "norm": "rmsnorm", "qk_norm": True, "mlp": "swiglu", "tie_embeddings": False,
          "logit_softcap": 15.0, "zero_init_proj": True}
OPTIONS = {  # each option alone, the Llama combination, and everything at once
    "rope": {"positions": "rope"}, "rmsnorm": {"norm": "rmsnorm"}, "qk_norm": {"qk_norm": True},
    "swiglu": {"mlp": "swiglu"}, "relu2": {"mlp": "relu2"}, "untied": {"tie_embeddings": False},
    "softcap": {"logit_softcap": 5.0}, "llama": {"positions": "rope", "norm": "rmsnorm", "mlp": "swiglu"},
    "modern": MODERN,
}


def tiny(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    cfg = {"vocab_size": VOCAB, "block_size": 16, "n_layer": 2, "n_head": 4, "n_embd": 32} | overrides
    model = GPT(GPTConfig(**cfg)).eval()
    if cfg.get("zero_init_proj"):  # zero projections make every block the identity: perturb them so tests see them
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.normal_(0, 0.02)
    return model


def ids(B: int, T: int, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def test_default_model_is_unchanged():
    """Catches any change to the nanoGPT default (module order, init draws, forward): the numbers were printed by the
    code before the modern options existed (commit c15386b: torch.manual_seed(1234); GPT(GPTConfig(vocab_size=50,
    block_size=16, n_layer=2, n_head=4, n_embd=32)); idx = ids(2, 12)), so same seed -> same weights and logits."""
    model = tiny(seed=1234)
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == 28 and names[:2] == ["transformer.wte.weight", "transformer.wpe.weight"]
    assert model.num_params() == 28032
    assert sum(float(p.detach().double().abs().sum()) for p in model.parameters()) == pytest.approx(513.8981985711313,
                                                                                                     abs=1e-6)
    assert model.transformer.h[1].mlp.c_proj.weight[3, 5].item() == pytest.approx(0.007401358801871538, abs=1e-9)
    assert model.transformer.wpe.weight[4, 2].item() == pytest.approx(0.014937024563550949, abs=1e-9)
    with torch.no_grad():
        logits = model(ids(2, 12))
    want = [-0.2886916399002075, -0.05567612498998642, 0.11742376536130905, 0.05422186106443405]
    torch.testing.assert_close(logits[0, -1, :4], torch.tensor(want), rtol=0, atol=1e-6)
    torch.testing.assert_close(logits[1, 0, 10:12], torch.tensor([0.1781034618616104, 0.1526201069355011]), rtol=0,
                               atol=1e-6)
    assert float(logits.double().sum()) == pytest.approx(9.609386245312635, abs=1e-4)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_option_is_causal_and_caches_exactly(name):
    """Catches an option that leaks future tokens (RoPE/QK-norm applied across positions) or breaks the KV cache
    (keys rotated by the wrong position): logits of earlier positions never change, cached == uncached."""
    model = tiny(**OPTIONS[name])
    x = ids(2, 16)
    with torch.no_grad():
        full = model(x)
        assert full.shape == (2, 16, VOCAB)
        changed = x.clone()
        changed[:, 9] = (changed[:, 9] + 1) % VOCAB
        after = model(changed)
        torch.testing.assert_close(after[:, :9], full[:, :9], rtol=0, atol=1e-6)
        assert (after[:, 9:] - full[:, 9:]).abs().max() > 1e-4  # not vacuous: the change is seen later on
        cache = model.new_kv_cache(2)
        pieces = [model(x[:, :5], kv_cache=cache), model(x[:, 5:9], kv_cache=cache)]
        pieces += [model(x[:, t: t + 1], kv_cache=cache) for t in range(9, 16)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["rope", "modern"])
def test_rope_generation_past_block_size_matches_uncached(name):
    """Catches RoPE positions that keep counting when the window slides past block_size (the cached path must then
    see the same window, at the same positions, as the uncached one), for every decoding strategy."""
    model = tiny(**OPTIONS[name])
    x = ids(2, 6)
    assert_cached_logits_equal_uncached(model, x)  # 6 + 14 tokens > block_size 16
    prompts = [[5, 9, 3, 17], [30, 2, 2, 41]]
    for strategy in ("greedy", "sample", "beam", "contrastive"):
        kw = {"strategy": strategy, "max_new_tokens": 20, "seed": 1, "num_beams": 3 if strategy == "beam" else 1}
        assert generate(model, prompts, use_cache=True, **kw) == generate(model, prompts, use_cache=False, **kw)


def test_rope_scores_depend_on_relative_position_only():
    """Catches a RoPE with the wrong pairing or angles: q·k after rotation must depend only on the distance between
    the two positions (and the rotation must keep vector lengths)."""
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> float:
        cq, sq = rope_cos_sin(torch.tensor([m]), 8, 10000.0)
        ck, sk = rope_cos_sin(torch.tensor([n]), 8, 10000.0)
        return float((apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum())

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5) == pytest.approx(score(2, 0), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 0), abs=1e-3)  # not vacuous: distance matters
    c, s = rope_cos_sin(torch.tensor([5]), 8, 10000.0)
    assert apply_rope(q, c, s).norm() == pytest.approx(float(q.norm()), rel=1e-5)


def test_option_shapes_and_parameters():
    """Catches options wired to the wrong modules: RMSNorm without a bias, no position table with RoPE, an untied
    head that still shares the embedding, a SwiGLU far from the GELU MLP's parameter count (must be within 10 %)."""
    base = tiny(n_embd=96, n_head=4)
    rope = tiny(positions="rope", norm="rmsnorm")
    assert "wpe" not in rope.transformer and isinstance(rope.transformer.ln_f, RMSNorm)
    assert not any(n.endswith("ln_1.bias") for n, _ in rope.named_parameters())
    untied = tiny(tie_embeddings=False)
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.num_params() == tiny().num_params() + untied.lm_head.weight.numel()
    assert swiglu_hidden(384) == 1024 and swiglu_hidden(768) == 2048 and swiglu_hidden(32) == 64
    swiglu = tiny(n_embd=96, n_head=4, mlp="swiglu")
    assert swiglu.num_params() == pytest.approx(base.num_params(), rel=0.10)
    assert tiny(mlp="relu2").num_params() == tiny().num_params()


def test_zero_init_proj_makes_every_block_the_identity():
    """Catches zero_init_proj missing a residual projection (SwiGLU's included): at init every block adds zero, so
    the logits are the LM head applied to the final norm of the embeddings alone."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=16, n_layer=2, n_head=4, n_embd=32, mlp="swiglu",
                          zero_init_proj=True)).eval()
    projections = [p for n, p in model.named_parameters() if n.endswith("c_proj.weight")]
    assert len(projections) == 4 and all(bool((p == 0).all()) for p in projections)
    x = ids(1, 8)
    t = model.transformer
    with torch.no_grad():
        expected = model.lm_head(t.ln_f(t.wte(x) + t.wpe(torch.arange(8))))[..., :VOCAB]
        torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-6)


def test_qk_norm_ignores_the_scale_of_queries_and_keys():
    """Catches QK-norm not applied (or applied after the scores): scaling the q and k projections by 10 leaves the
    output unchanged with it and changes it without it."""
    x = ids(2, 10)
    for qk_norm in (True, False):
        model = tiny(qk_norm=qk_norm, bias=False)
        with torch.no_grad():
            before = model(x)
            for block in model.transformer.h:
                block.attn.c_attn.weight[: 2 * 32].mul_(10.0)  # rows of q and k
            after = model(x)
        if qk_norm:
            torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
        else:
            assert (after - before).abs().max() > 1e-3


def test_logit_softcap_bounds_the_logits():
    """Catches a soft-cap applied nowhere or as a hard clamp: |logits| < cap, and small logits nearly unchanged."""
    model = tiny()
    capped = tiny(logit_softcap=1.0)
    with torch.no_grad():
        for p in (model.lm_head.weight, capped.lm_head.weight):
            p.mul_(50)  # large logits
        raw, out = model(ids(1, 8)), capped(ids(1, 8))
    assert raw.abs().max() > 3 and out.abs().max() <= 1.0
    torch.testing.assert_close(out, torch.tanh(raw), rtol=0, atol=1e-6)


def test_logit_softcap_runs_in_fp32_under_bf16_autocast():
    """Catches the tanh run in bf16 (up to 0.06 off near the cap): the capped logits are fp32, from the bf16 matmul."""
    model = tiny(logit_softcap=15.0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out, hidden = model(ids(1, 8), return_hidden=True)
        raw = model.lm_head(hidden)[..., :VOCAB]  # bf16 under autocast
    assert raw.dtype == torch.bfloat16 and out.dtype == torch.float32
    torch.testing.assert_close(out, 15.0 * torch.tanh(raw.float() / 15.0), rtol=0, atol=0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"positions": "alibi"}, "unknown positions 'alibi'; choose one of learned, rope"),
        ({"norm": "batchnorm"}, "unknown norm 'batchnorm'"),
        ({"mlp": "geglu"}, "unknown mlp 'geglu'; choose one of gelu, gelu_tanh, swiglu, relu2"),
        ({"positions": "rope", "n_head": 32}, "head size n_embd/n_head = 1 must be even"),
        ({"logit_softcap": 0.0}, r"logit_softcap must be in \[1, 10000\]"),
        ({"logit_softcap": 1e-300}, r"logit_softcap must be in \[1, 10000\]"),  # 0 in float32: NaN losses
        ({"rope_theta": 1.0}, r"rope_theta must be in \(1, inf\)"),
    ],
)
def test_bad_modern_options_raise_naming_the_value(overrides, message):
    """A typo in an architecture option must fail at construction naming it and the choices."""
    with pytest.raises(ValueError, match=message):
        GPTConfig(**({"vocab_size": VOCAB, "block_size": 16, "n_layer": 2, "n_head": 4, "n_embd": 32} | overrides))


def test_checkpoint_of_a_modern_model_loads_with_its_options(tmp_path):
    """Catches load_model building a nanoGPT from a modern checkpoint's hyperparameters (missing or unexpected
    weights, or the same weights run through another architecture): the loaded GPT computes the same logits."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from tinylm.checkpoint import load_model
    from tinylm.train.module import TinyLM

    torch.manual_seed(0)
    module = TinyLM(vocab_size=VOCAB, block_size=16, n_layer=2, n_head=4, n_embd=32, warmup_steps=0, **MODERN)
    data = torch.randint(0, VOCAB, (4, 17))
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=4))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    model, _, hparams = load_model(tmp_path / "m.ckpt")
    assert {k: model.config.__dict__[k] for k in MODERN} == MODERN and hparams["positions"] == "rope"
    with torch.no_grad():
        torch.testing.assert_close(model(data[:, :16]), module.model.eval()(data[:, :16]), rtol=0, atol=1e-6)


def _composite(name: str):
    """The textbook formulas the one-node autograd Functions in layers.py replace (plain autograd, no shortcuts)."""
    def rms(x, w=None):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return y if w is None else y * w

    def rope(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    return {"rms": rms, "rope": rope, "relu2": lambda x: torch.relu(x) ** 2}[name]


def test_fused_layers_match_autograd_of_the_plain_formulas():
    """rms_norm, apply_rope and relu_squared have hand-written backwards (fewer passes on CPU): values and gradients
    equal the plain formulas' (float64, gradcheck), including RoPE's broadcast over the (B, T, 2, nh, hs) q/k layout
    that attention uses."""
    from tinylm.model.layers import relu_squared, rms_norm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 2, 3, 8, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, generator=g, requires_grad=True)
    cos, sin = (t.double()[:, None, None, :] for t in rope_cos_sin(torch.arange(3, 8), 8, 10000.0))  # (T, 1, 1, hs)
    cases = [(lambda x, w: rms_norm(x, w), _composite("rms"), (x, w)), (rms_norm, _composite("rms"), (x,)),
             (lambda x: apply_rope(x, cos, sin), lambda x: _composite("rope")(x, cos, sin), (x,)),
             (relu_squared, _composite("relu2"), (x,))]
    for fused, plain, inputs in cases:
        assert torch.autograd.gradcheck(fused, inputs)
        y = fused(*inputs)  # (randn_like's generator= is torch 2.10's: the suite runs from 2.9)
        out = torch.randn(y.shape, dtype=y.dtype, generator=g)
        grads = torch.autograd.grad((fused(*inputs) * out).sum(), inputs)
        want = torch.autograd.grad((plain(*inputs) * out).sum(), inputs)
        torch.testing.assert_close(fused(*inputs), plain(*inputs))
        for a, b in zip(grads, want):
            torch.testing.assert_close(a, b)


def test_fused_layers_keep_bf16_and_compute_in_fp32():
    """Under bf16 (autocast's activations) the outputs and gradients stay bf16, computed in fp32 as Llama does."""
    from tinylm.model.layers import rms_norm

    x32 = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(1))
    x = x32.bfloat16().requires_grad_()
    cos, sin = rope_cos_sin(torch.arange(6), 16, 10000.0)
    for fn in (rms_norm, lambda t: apply_rope(t, cos, sin)):
        y = fn(x)
        (grad,) = torch.autograd.grad(y.float().sum(), x)
        assert y.dtype == grad.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), fn(x.detach().float()), atol=1e-2, rtol=1e-2)


def test_modern_model_compiles_in_one_graph_and_matches_eager():
    """`compile_model: true` with every modern option: the one-node layers trace into a single graph (no graph break,
    no in-place writes into views, which AOT autograd refuses), with eager's logits and gradients. aot_eager runs
    dynamo and AOT autograd without generating kernels, so this stays fast on a CPU."""
    model = tiny(**MODERN, n_layer=1)
    x = ids(2, 16)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    want = model(x)
    (want_grad,) = torch.autograd.grad(want.square().sum(), model.transformer.wte.weight)
    got = compiled(x)
    (got_grad,) = torch.autograd.grad(got.square().sum(), model.transformer.wte.weight)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


def test_logit_softcap_keeps_a_float64_model_in_float64():
    """Catches the soft-cap's upcast to exactly float32 turning a `64-true` model's logits into float32 (agreement
    with a float64 reference capped at ~1e-7)."""
    model = tiny(logit_softcap=15.0).double()
    with torch.no_grad():
        out = model(ids(1, 8))
    assert out.dtype == torch.float64


def test_rope_turns_a_float64_models_queries_and_keys_in_float64():
    """Catches RoPE's angles taken in float32 in a `64-true` model: a document's logits depended on where it sat in
    the window by ~1e-7, where the float64 model holds them to ~1e-15 (RoPE's scores depend on relative positions
    only, and the document mask hides what came before). Sharpened attention (q and k 30x) makes it show."""
    model = tiny(block_size=64, positions="rope", attn_mask="document", eos_id=0).double()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(30)
        doc = ids(1, 8).clamp(min=1)  # (no EOS inside it)
        alone = model(doc)
        later = model(torch.cat([ids(1, 40, seed=8).clamp(min=1), torch.zeros(1, 1, dtype=torch.long), doc], 1))
    torch.testing.assert_close(later[:, -8:], alone, rtol=0, atol=1e-12)
    assert alone.dtype == torch.float64


@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_weight", "rope"])
def test_one_node_layers_compile_with_eager_gradients(op):
    """The hand-written autograd.Functions under torch.compile: torch 2.11 gave one whose forward ended in a no-op
    `.to(x.dtype)` a zero gradient (RMSNorm, RoPE: every modern model compiled trained on wrong gradients)."""
    from tinylm.model.layers import apply_rope, rms_norm, rope_cos_sin

    torch.manual_seed(0)
    cos, sin = rope_cos_sin(torch.arange(8), 16, 10000.0)
    fn = {"rms_norm": lambda x, w: rms_norm(x * 2), "rms_norm_weight": lambda x, w: rms_norm(x * 2, w),
          "rope": lambda x, w: apply_rope(x * 2, cos, sin)}[op]
    x, w = torch.randn(2, 2, 8, 16, requires_grad=True), torch.randn(16, requires_grad=True)
    g = torch.randn(2, 2, 8, 16)
    want = torch.autograd.grad((fn(x, w) * g).sum(), (x, w), allow_unused=True)
    got = torch.autograd.grad((torch.compile(fn, backend="aot_eager", fullgraph=True)(x, w) * g).sum(), (x, w),
                              allow_unused=True)
    for a, b in zip(got, want):
        if b is not None:
            torch.testing.assert_close(a, b)


def test_compile_is_refused_on_a_torch_that_compiles_wrong_gradients():
    """torch.compile of torch 2.3 failed on RMSNorm and RoPE, and 2.6's inductor gave every tinylm model wrong
    gradients, silently: model.compile_model is refused below 2.7 in one line (NVIDIA's 2.7.0a0 builds count; 2.7.1
    to 2.10 were measured right, 2.11 with the fix above)."""
    from tinylm.device import check_compile_torch
    from tinylm.errors import UnavailableError

    for fine in ("2.7.0a0+git1234", "2.7.1+cu126", "2.10.0+cu128", "2.11.0+cu130", "2.13.0+cpu", "3.0.0"):
        check_compile_torch(fine)
    for old in ("2.6.0+cu124", "2.3.1"):
        with pytest.raises(UnavailableError, match=rf"needs torch >= 2.7 .* this is torch {re.escape(old)}: upgrade"):
            check_compile_torch(old)
