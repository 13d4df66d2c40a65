"""The GPT: init, masks, causality, weight tying, parameter counts, the KV cache, and that it can learn."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from tinylm.model import GPT, GPTConfig, GPTShape, build_attention_mask

VOCAB = 64
EOS = 0


def tiny(seed: int = 0, **overrides) -> GPT:
    """A 2-layer, 32-wide GPT in eval mode (dropout off), seeded so every test sees the same weights."""
    torch.manual_seed(seed)
    cfg = {"vocab_size": VOCAB, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, "eos_id": EOS} | overrides
    return GPT(GPTConfig(**cfg)).eval()


def random_ids(B: int, T: int, seed: int = 1, low: int = 1) -> torch.Tensor:
    """Token ids in [low, VOCAB); low=1 keeps the EOS (0) out unless a test puts it in."""
    return torch.randint(low, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


# ---- config ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"n_embd": 30, "n_head": 4}, "divisible by n_head"),
        ({"attn_mask": "sliding"}, "unknown attn_mask 'sliding'"),
        ({"attn_mask": "document", "eos_id": None}, "needs eos_id"),
        ({"eos_id": VOCAB}, "eos_id must be in"),
        ({"block_size": 0}, r"block_size must be in \[1, inf\), got 0"),
        ({"n_layer": 2.0}, "n_layer must be an integer"),
        ({"dropout": 1.0}, "dropout must be in"),
        ({"pad_vocab_multiple": 0}, "pad_vocab_multiple"),
    ],
)
def test_bad_config_raises_naming_the_value(overrides, message):
    """A typo in the config must fail at construction with a message naming it, not deep inside forward."""
    cfg = {"vocab_size": VOCAB, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32} | overrides
    with pytest.raises(ValueError, match=message):
        GPTConfig(**cfg)


def test_too_long_input_raises_with_the_fix():
    """Feeding more than block_size tokens must say how to crop, not fail with an index error in wpe."""
    model = tiny()
    with pytest.raises(ValueError, match="sequence length 17 exceeds block_size 16; crop"):
        model(random_ids(1, 17))


def test_prefix_len_and_mask_must_agree():
    """prefix_len silently ignored (causal model) or silently missing (prefix model) would train the wrong mask."""
    with pytest.raises(ValueError, match="only used with attn_mask='prefix'"):
        tiny()(random_ids(1, 4), prefix_len=2)
    with pytest.raises(ValueError, match="pass prefix_len"):
        tiny(attn_mask="prefix")(random_ids(1, 4))


# ---- init, shapes, counts -------------------------------------------------------------------------------------
def test_loss_at_init_is_ln_vocab():
    """A bad init (too large logits, untied/unscaled head) starts far above ln(V) and wastes the first steps."""
    model = tiny()
    x, y = random_ids(8, 16, seed=2, low=0), random_ids(8, 16, seed=3, low=0)
    loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    assert abs(loss.item() - math.log(VOCAB)) < 0.1


def test_padded_vocab_rows_are_sliced_off():
    """Padded LM-head rows must never reach the logits, or softmax/sampling would give mass to non-tokens."""
    model = tiny(vocab_size=65, pad_vocab_multiple=64)
    assert model.lm_head.weight.shape == (128, 32)  # 65 rounded up to a multiple of 64
    assert model(random_ids(2, 5)).shape == (2, 5, 65)
    assert tiny(vocab_size=65, pad_vocab_multiple=1).lm_head.weight.shape == (65, 32)


def test_init_follows_nanogpt():
    """Residual projections scaled by 1/sqrt(2·n_layer) and zero biases keep deep stacks stable at init."""
    model = tiny(n_layer=2, n_embd=64, n_head=2)
    c_proj = model.transformer.h[0].mlp.c_proj.weight  # 64 x 256: enough samples for a 10% std check
    assert c_proj.std().item() == pytest.approx(0.02 / math.sqrt(2 * 2), rel=0.1)
    assert model.transformer.h[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.transformer.wte.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert all(b.abs().sum() == 0 for n, b in model.named_parameters() if n.endswith("attn.c_attn.bias"))


def test_weight_tying_shares_one_matrix():
    """Untied embedding/head doubles the vocab parameters and changes what the exported model means."""
    model = tiny()
    assert model.lm_head.weight is model.transformer.wte.weight
    model(random_ids(2, 4)).sum().backward()
    assert model.transformer.wte.weight.grad is not None and model.transformer.wte.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("bias", [True, False])
def test_param_count_matches_hand_formula(bias):
    """num_params feeds MFU and the README's model sizes; it must count every tensor once."""
    V, T, L, C = 64, 16, 2, 32
    model = tiny(bias=bias)
    per_block = 12 * C * C + (13 * C if bias else 2 * C)  # qkv + proj + fc + proj weights; LN and Linear biases
    expected = V * C + T * C + L * per_block + (2 * C if bias else C)  # + final LayerNorm
    assert model.num_params() == expected
    assert model.num_params(exclude_position=True) == expected - T * C


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False, "positions": "rope", "mlp": "swiglu", "bias": True,
                                        "qk_norm": True, "norm": "rmsnorm"}])
def test_a_shape_counts_what_the_gpt_of_its_config_holds(overrides):
    """Catches `tinylm plan` of a deep model (counted from one block, GPTShape) planning another model than fit
    builds: its counts equal those of the GPT built with every block."""
    model = tiny(n_layer=3, **overrides)
    shape = GPTShape.of(model.config)
    assert len(shape.one_block.transformer.h) == 1 and shape.one_block.lm_head.weight.is_meta
    assert shape.num_params() == model.num_params() and shape.flops_per_token() == model.flops_per_token()
    assert shape.num_params(exclude_position=True) == model.num_params(exclude_position=True)
    one = shape.one_block
    assert shape.count(one.transformer.h.parameters()) == sum(p.numel() for p in model.transformer.h.parameters())
    assert shape.count([one.lm_head.weight]) == model.lm_head.weight.numel()  # outside the blocks: once


def test_param_count_of_gpt2_small_is_124m():
    """Known answer: GPT-2 small (unpadded vocab) has 124,439,808 parameters as counted by Hugging Face."""
    with torch.device("meta"):  # no memory, no init cost
        cfg = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, pad_vocab_multiple=1)
        model = GPT(cfg)
    assert model.num_params() == 124_439_808
    N = 124_439_808 - 1024 * 768
    assert model.flops_per_token() == 6 * N + 12 * 12 * 12 * 64 * 1024
    with torch.device("meta"):  # untied, the input embedding is a lookup: the same FLOPs, 38.6M more parameters
        untied = GPT(dataclasses.replace(cfg, tie_embeddings=False))
    assert untied.num_params() == 124_439_808 + 50257 * 768
    assert untied.flops_per_token() == model.flops_per_token()


@pytest.mark.parametrize("options", [
    {}, {"tie_embeddings": False}, {"mlp": "swiglu"}, {"mlp": "relu2"}, {"vocab_size": 100, "n_head": 4},
    {"positions": "rope", "norm": "rmsnorm", "qk_norm": True, "bias": False, "logit_softcap": 15.0,
     "tie_embeddings": False, "mlp": "swiglu"},
])
def test_flops_per_token_matches_torchs_flop_counter(options):
    """Catches flops_per_token (train/mfu, plan's FLOPs, scaling's per-rung budgets) miscounting a real matmul: an
    untied input embedding counted (a lookup), the LM head's padded rows or SwiGLU's third matrix left out, or an
    attention term other than the QKᵀ and AV products. torch's FlopCounterMode counts the matmuls of one real
    forward + backward; the formula (PaLM's 6N + 12·L·H·Q·T, nanoGPT's estimate_mfu) also counts 6 FLOPs per
    bias and norm gain (not matmuls), and nothing else differs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = tiny(**options).train()
    B, T = 2, model.config.block_size
    idx = random_ids(B, T)
    # SDPA's math kernel: its QKᵀ and AV are bmm's the counter sees (it has no rule for the CPU flash kernel)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        logits = model(idx)
        F.cross_entropy(logits.flatten(0, 1).float(), idx.flatten()).backward()
    counted = counter.get_total_flops()
    assert counter.get_flop_counts()["Global"][torch.ops.aten.bmm] > 0  # guard: the attention products were counted
    vectors = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    assert model.flops_per_token() * B * T - counted == 6 * vectors * B * T


def test_hidden_and_last_only_match_the_full_forward():
    """Generation uses last_only/return_hidden; they must be the same numbers as the training forward."""
    model = tiny()
    x = random_ids(2, 7)
    seen = []
    model.transformer.ln_f.register_forward_hook(lambda module, args, out: seen.append(out))
    full = model(x)
    logits, hidden = model(x, return_hidden=True, last_only=True)
    assert logits.shape == (2, 1, VOCAB) and hidden.shape == (2, 7, 32)
    torch.testing.assert_close(logits[:, 0], full[:, -1])
    torch.testing.assert_close(hidden, seen[0])  # the final-LayerNorm output, as contrastive search expects


# ---- masks ----------------------------------------------------------------------------------------------------
def test_causal_mask_pattern():
    """Query i sees keys 0..i: the lower triangle; with q_len, the last queries of a longer key list."""
    mask = build_attention_mask(torch.zeros(1, 4, dtype=torch.long))[0, 0]
    assert mask.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    tail = build_attention_mask(torch.zeros(1, 4, dtype=torch.long), q_len=2)[0, 0]
    assert tail.int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def test_document_mask_pattern():
    """Packed docs [a b EOS][c d]: the EOS belongs to the doc it ends; doc 2 sees only itself, causally."""
    idx = torch.tensor([[5, 6, EOS, 7, 8], [5, EOS, EOS, 7, 8]])
    mask = build_attention_mask(idx, attn_mask="document", eos_id=EOS)[:, 0].int().tolist()
    assert mask[0] == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    # an empty document (EOS right after EOS) is a document of one token
    assert mask[1] == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]


def test_prefix_mask_pattern():
    """The first prefix_len tokens see each other both ways; later ones are causal; per-row lengths work."""
    idx = torch.zeros(2, 4, dtype=torch.long)
    mask = build_attention_mask(idx, attn_mask="prefix", prefix_len=torch.tensor([2, 0]))[:, 0].int().tolist()
    assert mask[0] == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert mask[1] == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]  # prefix 0 = causal


@pytest.mark.parametrize("attn_mask", ["causal", "document"])
def test_changing_a_token_never_changes_earlier_logits(attn_mask):
    """A future-token leak makes training loss look great and generation useless."""
    model = tiny(attn_mask=attn_mask)
    x = random_ids(2, 12)
    x[:, 4] = EOS  # two documents, so the document mask is exercised
    base = model(x)
    for t in (2, 6, 11):
        changed = x.clone()
        changed[:, t] = changed[:, t] % (VOCAB - 1) + 1  # another non-EOS token
        out = model(changed)
        torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=1e-6)
        assert (out[:, t] - base[:, t]).abs().max() > 1e-4  # the change is visible where it should be


def test_document_mask_isolates_packed_documents():
    """Packed documents must not attend across EOS; the causal mask (guard) does let doc 1 leak into doc 2."""
    x = random_ids(1, 12)
    x[0, 5] = EOS  # doc 1 = positions 0..5, doc 2 = 6..11
    changed = x.clone()
    changed[0, 2] += 1
    doc_model = tiny(attn_mask="document")
    a, b = doc_model(x), doc_model(changed)
    torch.testing.assert_close(a[:, 6:], b[:, 6:], rtol=0, atol=1e-6)
    assert (a[:, 2:6] - b[:, 2:6]).abs().max() > 1e-4
    causal_model = tiny(attn_mask="causal")
    assert (causal_model(x)[:, 6:] - causal_model(changed)[:, 6:]).abs().max() > 1e-4


def test_prefix_mask_is_bidirectional_inside_the_prefix_only():
    """A prefix LM must let the prefix see its future, and nothing after the prefix leak backwards."""
    model = tiny(attn_mask="prefix")
    x = random_ids(1, 10)
    base = model(x, prefix_len=4)
    inside, after = x.clone(), x.clone()
    inside[0, 3] += 1
    after[0, 6] += 1
    assert (model(inside, prefix_len=4)[:, 0] - base[:, 0]).abs().max() > 1e-4  # position 0 sees position 3
    torch.testing.assert_close(model(after, prefix_len=4)[:, :6], base[:, :6], rtol=0, atol=1e-6)


# ---- KV cache -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("attn_mask", ["causal", "document", "prefix"])
def test_cached_logits_equal_uncached(attn_mask):
    """Incremental decoding with the cache (prefill, a chunk, then single tokens) must give the same logits."""
    model = tiny(attn_mask=attn_mask)
    kw = {"prefix_len": 5} if attn_mask == "prefix" else {}
    x = random_ids(3, 16)
    x[:, 7] = EOS
    full = model(x, **kw)
    cache = model.new_kv_cache(3)
    pieces = [model(x[:, :5], kv_cache=cache, **kw), model(x[:, 5:9], kv_cache=cache, **kw)]
    pieces += [model(x[:, t : t + 1], kv_cache=cache, **kw) for t in range(9, 16)]
    assert cache.pos == 16
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)


def test_full_cache_raises_with_the_fix():
    """Writing past the preallocated cache must say to re-prefill, not corrupt memory or index out of range."""
    model = tiny()
    cache = model.new_kv_cache(1)
    model(random_ids(1, 16), kv_cache=cache)
    with pytest.raises(ValueError, match="reset the cache and re-prefill"):
        model(random_ids(1, 1), kv_cache=cache)
    cache.reset()
    assert model(random_ids(1, 16), kv_cache=cache).shape == (1, 16, VOCAB)


def test_cache_reorder_follows_the_selected_rows():
    """Beam search reorders and duplicates rows; the cache must then continue each row's own history."""
    model = tiny(attn_mask="document")
    x = random_ids(3, 10)
    x[1, 3] = EOS
    cache = model.new_kv_cache(3)
    model(x[:, :8], kv_cache=cache)
    order = torch.tensor([2, 1, 1, 0])  # reorder and grow the batch to 4
    cache.reorder(order)
    step = model(x[order, 8:10], kv_cache=cache)
    torch.testing.assert_close(step, model(x[order])[:, 8:10], rtol=0, atol=1e-5)


# ---- learning -------------------------------------------------------------------------------------------------
def test_overfits_one_batch():
    """If the model cannot memorise 4 sequences, gradients, masks or the head are broken."""
    model = tiny().train()
    x, y = random_ids(4, 16, seed=4, low=0), random_ids(4, 16, seed=5, low=0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.05:
            break
    assert loss.item() < 0.1


def test_forward_names_ids_it_cannot_embed():
    """Catches GPT.forward on one unbatched sequence or an id past the vocabulary failing with torch's IndexError
    ("index out of range in self"; a device-side assert on a GPU) instead of naming the input."""
    model = tiny()
    V = model.config.vocab_size
    with pytest.raises(ValueError, match=r"shape \(B, T\), got torch.int64 of shape \(3,\); one sequence is "
                                         r"idx\[None\]"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"got torch.float32 of shape \(1, 2\)"):
        model(torch.zeros(1, 2))
    for bad in (V, -1):
        with pytest.raises(ValueError, match=rf"idx holds id {bad}, outside the model's vocabulary of {V} ids"):
            model(torch.tensor([[1, bad, 2]]))
    assert model(torch.tensor([[0, V - 1]])).shape == (1, 2, V)
