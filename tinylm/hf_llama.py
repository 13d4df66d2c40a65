"""To and from Hugging Face transformers' Llama format (`LlamaForCausalLM`).

A tinylm GPT with ``positions: rope``, ``norm: rmsnorm`` and ``mlp: swiglu`` computes what Llama computes:
- c_attn (3C, C) is q, k and v stacked: it splits into q_proj, k_proj, v_proj (all heads are query heads and
  key/value heads: num_key_value_heads = n_head); c_proj is o_proj.
- RoPE uses Llama's layout (pair i = channels i and i + hs/2) and theta = rope_theta; RMSNorm's eps is 1e-6; tinylm
  multiplies the gain into the fp32 normalised value and then casts, LlamaRMSNorm casts and then multiplies: the
  same numbers in fp32, a rounding apart in bf16.
- the MLP's c_gate, c_fc, c_proj are gate_proj, up_proj, down_proj; `bias: true` sets attention_bias and mlp_bias
  (the norms never have biases).
- padded embedding rows are dropped; an untied head is exported as lm_head, a tied one ties in transformers too.
What Llama cannot express (qk_norm, logit_softcap, other norms/MLPs/positions) is refused by `tinylm.hf.hf_family`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tinylm.model import GPT, GPTConfig
from tinylm.model.layers import RMS_NORM_EPS, swiglu_hidden

# GPTConfig fields Llama's config cannot express; kept under "tinylm" in config.json for an exact import
EXTRA_FIELDS = ("pad_vocab_multiple", "attn_mask", "eos_id")
LLAMA_OPTIONS = {"positions": "rope", "norm": "rmsnorm", "mlp": "swiglu"}  # the architecture Llama computes
_LINEAR = {  # tinylm module -> Llama module, per block (c_attn is split three ways)
    "attn.c_proj": "self_attn.o_proj", "mlp.c_gate": "mlp.gate_proj", "mlp.c_fc": "mlp.up_proj",
    "mlp.c_proj": "mlp.down_proj",
}
_VOCAB_ROWS = ("transformer.wte.weight", "lm_head.weight")  # padded up to pad_vocab_multiple in tinylm


def llama_config(config: GPTConfig, *, eos_id: int | None) -> Any:
    from transformers import LlamaConfig

    hc = LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.n_embd, intermediate_size=swiglu_hidden(config.n_embd),
        num_hidden_layers=config.n_layer, num_attention_heads=config.n_head, num_key_value_heads=config.n_head,
        hidden_act="silu", max_position_embeddings=config.block_size, rms_norm_eps=RMS_NORM_EPS,
        rope_theta=config.rope_theta, attention_bias=config.bias, mlp_bias=config.bias,
        attention_dropout=config.dropout, tie_word_embeddings=config.tie_embeddings, bos_token_id=eos_id,
        eos_token_id=eos_id, tinylm={k: getattr(config, k) for k in EXTRA_FIELDS},
    )
    hc.rope_theta = config.rope_theta  # 5 keeps it in rope_parameters alone; 4.x reads it here (else 10,000)
    return hc


def llama_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """tinylm GPT weights under `LlamaForCausalLM`'s names (embedding and head without their padded rows)."""
    c, sd, out = model.config, model.state_dict(), {}
    for ours, theirs in _names(c).items():
        tensor = sd[ours][: c.vocab_size] if ours in _VOCAB_ROWS else sd[ours]
        for name, part in zip(theirs, tensor.split(c.n_embd, dim=0) if len(theirs) == 3 else [tensor]):
            out[name] = part.contiguous()  # c_attn: q, k, v stacked along dim 0
    return out


# Llama config fields that change the function, with the one value tinylm computes: (field, accepts, supported)
_IMPORTABLE = (
    ("hidden_act", lambda v, hc: v == "silu", "'silu' (SwiGLU)"),
    ("num_key_value_heads", lambda v, hc: v in (None, hc.num_attention_heads), "= num_attention_heads (no GQA)"),
    ("intermediate_size", lambda v, hc: v == swiglu_hidden(hc.hidden_size), "8/3·hidden_size rounded to 64"),
    ("rms_norm_eps", lambda v, hc: v == RMS_NORM_EPS, f"{RMS_NORM_EPS}"),
    ("head_dim", lambda v, hc: v in (None, hc.hidden_size // hc.num_attention_heads), "hidden_size / heads"),
    ("mlp_bias", lambda v, hc: bool(v) == bool(hc.attention_bias), "= attention_bias"),
    ("rope_type", lambda v, hc: v in (None, "default"), "'default' (no RoPE scaling)"),
)


def _rope(hc: Any) -> dict:
    """RoPE settings of a LlamaConfig: transformers 5 keeps them in rope_parameters, 4.x in rope_theta/rope_scaling."""
    params = dict(getattr(hc, "rope_parameters", None) or getattr(hc, "rope_scaling", None) or {})
    return {"rope_type": params.get("rope_type", params.get("type")),
            "rope_theta": params.get("rope_theta", getattr(hc, "rope_theta", None))}


def import_llama(path: Any, weights: Callable[[Any, Any], dict[str, torch.Tensor]]) -> GPT:
    """A tinylm GPT (eval, fp32) from a transformers Llama directory whose config tinylm computes exactly;
    ``weights(LlamaForCausalLM, path)`` loads its fp32 state_dict (tinylm.hf.hf_weights: weights that fit the
    config, or one line)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hc = LlamaConfig.from_pretrained(path)
    rope = _rope(hc)
    values = {f: rope["rope_type"] if f == "rope_type" else getattr(hc, f, None) for f, _, _ in _IMPORTABLE}
    unsupported = [f"{f}={values[f]!r} (tinylm supports {what})" for f, ok, what in _IMPORTABLE
                   if not ok(values[f], hc)]
    if unsupported:
        raise ValueError(f"cannot import {str(path)!r}: its config.json has {'; '.join(unsupported)}; tinylm's GPT "
                         "would predict differently from this model, so use it with transformers instead")
    extra = dict(getattr(hc, "tinylm", None) or {})
    config = GPTConfig(
        vocab_size=hc.vocab_size, block_size=hc.max_position_embeddings, n_layer=hc.num_hidden_layers,
        n_head=hc.num_attention_heads, n_embd=hc.hidden_size, bias=bool(hc.attention_bias),
        rope_theta=float(rope["rope_theta"]), tie_embeddings=bool(hc.tie_word_embeddings), **LLAMA_OPTIONS,
        **{k: extra[k] for k in EXTRA_FIELDS if k in extra},  # a folder from elsewhere: GPTConfig's defaults
    )
    theirs = weights(LlamaForCausalLM, path)
    if "lm_head.weight" not in theirs:  # tied: saved once
        theirs["lm_head.weight"] = theirs["model.embed_tokens.weight"]
    model = GPT(config)
    ours = model.state_dict()
    with torch.no_grad():
        for name, sources in _names(config).items():
            if name == "lm_head.weight" and config.tie_embeddings:
                continue  # the embedding, already copied
            tensor = torch.cat([theirs[n] for n in sources], dim=0)  # q, k, v -> c_attn; else one tensor
            ours[name][: tensor.size(0)].copy_(tensor)  # embeddings: only the real rows
            ours[name][tensor.size(0):].zero_()  # padded rows: never inputs nor targets
    return model.eval()


def _names(config: GPTConfig) -> dict[str, list[str]]:
    """tinylm weight name -> the Llama weight names it is made of (three for c_attn: q, k, v stacked on dim 0)."""
    names = {"transformer.wte.weight": ["model.embed_tokens.weight"], "transformer.ln_f.weight": ["model.norm.weight"],
             "lm_head.weight": ["lm_head.weight"]}
    for i in range(config.n_layer):
        src, dst = f"transformer.h.{i}.", f"model.layers.{i}."
        names[src + "ln_1.weight"] = [dst + "input_layernorm.weight"]
        names[src + "ln_2.weight"] = [dst + "post_attention_layernorm.weight"]
        for kind in ("weight", "bias") if config.bias else ("weight",):
            names[f"{src}attn.c_attn.{kind}"] = [f"{dst}self_attn.{p}.{kind}" for p in ("q_proj", "k_proj", "v_proj")]
            for ours, theirs in _LINEAR.items():
                names[f"{src}{ours}.{kind}"] = [f"{dst}{theirs}.{kind}"]
    return names
