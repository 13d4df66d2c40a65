"""Decoding strategies (greedy, sampling, beam search, contrastive search) over a GPT.

Everything here is a pure function of logits or of the model: no training state, no printing.
The logits processors are in `processors.py`, the options (`SamplingConfig`) in `config.py`. The one entry point
is `generate`; callers that pass the options around (CLI, sampling callback) use `generate_with(model, prompts,
config)`.

Shapes: B prompts, L tokens so far (prompt + generated), V vocab, K candidates (top-k / 2·beams), C n_embd.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tinylm.device import free_memory
from tinylm.generate.config import (
    CONSTRAINTS,
    CONTRASTIVE_DEFAULT_TOP_K,
    LIBRARY,
    SamplingConfig,
    Spelling,
    idle_beam_options,
)
from tinylm.generate.constrained import rescue, restrict
from tinylm.generate.options import sampling_options
from tinylm.generate.processors import constrained_logits, sampling_logits
from tinylm.generate.rows import CONTEXT_TOKENS, _Rows, _Runner
from tinylm.model import GPT, GPTConfig


def _greedy_or_sample(run: _Runner, ids: Tensor, rows: _Rows, generator: torch.Generator | None) -> None:
    config = rows.config
    for step in range(config.max_new_tokens):
        logits, _ = run(ids)  # (B, V)
        mask = rows.allowed()
        allowed = restrict(logits, mask)  # the grammar first: the other processors choose among its ids
        logits = rescue(constrained_logits(allowed, ids, config), allowed, mask)
        if config.strategy == "greedy":
            nxt = logits.argmax(dim=-1)  # (B,)
        else:
            probs = sampling_logits(logits, config).softmax(dim=-1)  # (B, V)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B,)
        ids = torch.cat([ids, nxt[:, None]], dim=1)  # (B, L + 1)
        rows.accept(nxt.tolist())
        rows.stepped(step + 1)
        if not any(rows.active):
            break


def _contrastive(run: _Runner, ids: Tensor, rows: _Rows) -> None:
    """Contrastive search (Su et al. 2022): among the top-k tokens pick the one maximising
    (1 - alpha) · p(token) - alpha · max cosine similarity of its hidden state to the context's."""
    config = rows.config
    B = ids.size(0)
    k = min(config.top_k or CONTRASTIVE_DEFAULT_TOP_K, run.model.config.vocab_size)
    logits, context = run(ids)  # (B, V), (B, L, C)
    context = F.normalize(context.float(), dim=-1)
    expand = torch.arange(B, device=ids.device).repeat_interleave(k)  # (B*k,): row b repeated k times
    for step in range(config.max_new_tokens):
        mask = rows.allowed()
        allowed = restrict(logits, mask)
        logits = rescue(constrained_logits(allowed, ids, config), allowed, mask)
        top_probs, top_ids = logits.softmax(dim=-1).topk(k, dim=-1)  # (B, k)
        run.reorder(expand)
        cand_logits, cand_hidden = run(torch.cat([ids[expand], top_ids.reshape(-1, 1)], dim=1))  # (B*k, V), (B*k, 1, C)
        cand_hidden = F.normalize(cand_hidden.float(), dim=-1)
        similarity = cand_hidden.view(B, k, -1) @ context.transpose(1, 2)  # (B, k, L)
        degeneration = similarity.max(dim=-1).values  # (B, k)
        score = (1 - config.penalty_alpha) * top_probs - config.penalty_alpha * degeneration  # (B, k)
        score = score.masked_fill(top_probs == 0, -math.inf)  # a candidate the grammar (or top-k's -inf) removed
        chosen = torch.arange(B, device=ids.device) * k + score.argmax(dim=-1)  # (B,) rows of the B*k batch
        run.reorder(chosen)
        nxt = top_ids.reshape(-1)[chosen]  # (B,)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        logits, context = cand_logits[chosen], torch.cat([context, cand_hidden[chosen]], dim=1)
        rows.accept(nxt.tolist())
        rows.stepped(step + 1)
        if not any(rows.active):
            break


class _Hypotheses:
    """The best `num_beams` finished hypotheses of one prompt, scored sum(log p) / length**length_penalty."""

    def __init__(self, config: SamplingConfig) -> None:
        self.config = config
        self.best: list[tuple[float, list[int]]] = []
        self.done = False

    def add(self, tokens: list[int], sum_logprobs: float, length: int) -> None:
        self.best.append((sum_logprobs / max(length, 1) ** self.config.length_penalty, tokens))
        self.best.sort(key=lambda h: -h[0])
        del self.best[self.config.num_beams :]

    def is_done(self, best_running: float, length: int) -> bool:
        if len(self.best) < self.config.num_beams:
            return False
        if self.config.early_stopping:
            return True
        # the best running beam, scored as if it ended now, cannot enter the list: stop (Hugging Face's heuristic)
        return self.best[-1][0] >= best_running / length**self.config.length_penalty


def _next_beams(run: _Runner, ids: Tensor, src: list[int], tok: list[int], scores: list[float], grammar) -> Tensor:
    """The beams kept: rows ``src`` of ``ids`` extended by ``tok``; the cache and the grammar states follow."""
    index = torch.tensor(src, device=ids.device)
    run.reorder(index)
    if grammar is not None:
        grammar.reorder(src)
        for row, (t, s) in enumerate(zip(tok, scores, strict=True)):
            if s == -math.inf:  # a row riding along dead: its filler token (id 0 without an EOS) is no text of it
                grammar.live[row] = False
            else:
                grammar.consume(row, t)
    return torch.cat([ids[index], torch.tensor(tok, device=ids.device)[:, None]], dim=1)


def _beam_search(run: _Runner, ids: Tensor, rows: _Rows, grammar=None) -> None:
    """Beam search; ``grammar`` (constrained.Grammar) holds one matcher per beam row, B*nb."""
    config = rows.config
    nb = config.num_beams
    B, L0 = ids.shape
    ids = ids.repeat_interleave(nb, dim=0)  # (B*nb, L): the beams of a prompt are adjacent rows
    scores = torch.zeros(B, nb, device=ids.device)  # sum of log-probs of each running beam
    scores[:, 1:] = -math.inf  # only the first copy runs at the start, or all nb would pick the same tokens
    hyps = [_Hypotheses(config) for _ in range(B)]
    for step in range(config.max_new_tokens):
        logits, _ = run(ids)  # (B*nb, V)
        # as in transformers' beam search, the penalty scales log-probabilities (all <= 0: a seen token's log p is
        # multiplied by it) and they are not renormalised, so beams and their scores match Hugging Face's
        mask = None if grammar is None else grammar.allowed(beams=True)  # a beam no id continues dies alone
        logprobs = restrict(logits.log_softmax(dim=-1), mask)
        logprobs = rescue(constrained_logits(logprobs, ids, config), logprobs, mask)  # (B*nb, V)
        V = logprobs.size(-1)
        cand = (scores.view(-1, 1) + logprobs).view(B, nb * V)  # every (beam, token) extension
        # 2·nb candidates: even if nb of them end (EOS), nb can keep running
        top_scores, top_flat = cand.topk(min(2 * nb, nb * V), dim=-1)  # (B, K)
        generated = ids[:, L0:].tolist()  # (B*nb) lists of the tokens each beam generated so far
        src, tok, new_scores = [], [], []
        for b in range(B):
            kept: list[tuple[int, int, float]] = []
            if not hyps[b].done:
                for rank, (s, flat) in enumerate(zip(top_scores[b].tolist(), top_flat[b].tolist())):
                    if s == -math.inf or len(kept) == nb:
                        break
                    beam, t = b * nb + flat // V, flat % V
                    if t == config.eos_id:
                        if rank < nb:  # only an EOS among the top nb candidates is as good as a running beam
                            hyps[b].add(generated[beam], s, step + 1)
                    elif rows.hits_stop_string(generated[beam] + [t], b) or grammar and grammar.ends_after(beam, t):
                        if rank < nb:
                            hyps[b].add(generated[beam] + [t], s, step + 1)
                    else:
                        kept.append((beam, t, s))
                # at the last step the running beams end too, and compete with the ones that ended on EOS there
                last = step == config.max_new_tokens - 1
                hyps[b].done = not kept or (not last and hyps[b].is_done(kept[0][2], step + 1))
            kept = [] if hyps[b].done else kept  # finished prompts (their beams go no further: not into a grammar)
            kept += [(b * nb, config.eos_id or 0, -math.inf)] * (nb - len(kept))  # and missing beams ride along dead
            for beam, t, s in kept:
                src.append(beam), tok.append(t), new_scores.append(s)
        ids = _next_beams(run, ids, src, tok, new_scores, grammar)  # (B*nb, L + 1)
        scores = torch.tensor(new_scores, device=ids.device).view(B, nb)
        rows.stepped(step + 1)
        if all(h.done for h in hyps):
            break
    generated = ids[:, L0:].tolist()
    for b in range(B):
        if not hyps[b].done:  # ran out of max_new_tokens: the running beams compete too
            for j in range(nb):
                if scores[b, j] > -math.inf:
                    hyps[b].add(generated[b * nb + j], float(scores[b, j]), len(generated[b * nb + j]))
        best = hyps[b].best[0][1] if hyps[b].best else _no_beam_left(grammar, b, nb)
        rows.tokens[b] = list(best)
        if rows.on_token is not None:
            for t in best:
                rows.on_token(b, t)


def _no_beam_left(grammar, prompt: int, nb: int) -> list[int]:
    """The output of a prompt that ended with no hypothesis: refused with why its beams died where none could go
    on (a grammar the tokenizer cannot write, as greedy decoding refuses it); else none."""
    stuck = sorted(grammar.stuck.items()) if grammar is not None else []
    why = next((w for row, w in stuck if row // nb == prompt), None)  # (a prompt's beams are rows prompt * nb ...)
    if why is not None:
        raise ValueError(why)
    return []


# ---- entry points -----------------------------------------------------------------------------------------------
def _prompt_tensor(prompt_ids: Sequence[Sequence[int]] | Sequence[int] | Tensor, model: GPT) -> Tensor:
    if isinstance(prompt_ids, (str, bytes)):
        raise ValueError("prompt_ids are token ids, not text; encode the text first: tokenizer.encode(text)")
    if hasattr(prompt_ids, "__array__") and not isinstance(prompt_ids, Tensor):  # a numpy array of ids
        prompt_ids = torch.as_tensor(np.asarray(prompt_ids))
    if isinstance(prompt_ids, Tensor):
        if prompt_ids.is_floating_point() or prompt_ids.is_complex() or prompt_ids.dtype == torch.bool:
            raise ValueError(f"prompt_ids must be integer token ids, got a {prompt_ids.dtype} tensor (a float id "
                             "would be cut to an integer); pass .long() ids")
        ids = prompt_ids.long()
        if ids.dim() == 1:
            ids = ids[None]
    else:
        prompts = list(prompt_ids)
        if prompts and isinstance(prompts[0], numbers.Integral):
            prompts = [prompts]  # one prompt given as a flat list of ids
        for p in prompts:  # each a list (or a 1-D numpy array) of integer ids: a float was cut to an int silently
            listed = (isinstance(p, Sequence) or hasattr(p, "__array__")) and not isinstance(p, (str, bytes, Tensor))
            # (a list, not next(..., None): a None id, e.g. a tokenizer's eos_id where it has none, is one too)
            odd = [t for t in p if not isinstance(t, numbers.Integral) or isinstance(t, bool)] if listed else [p]
            if odd:
                raise ValueError(f"prompt_ids must be lists of integer token ids (one flat list: one prompt), got "
                                 f"{odd[0]!r} among them; encode text with tokenizer.encode, and pass ids as ints")
        lengths = sorted({len(p) for p in prompts})
        if len(lengths) > 1:
            raise ValueError(
                f"prompts in a batch must have equal lengths, got lengths {lengths}; "
                "generate them in separate calls or group them by length"
            )
        ids = torch.tensor(prompts, dtype=torch.long)
    if ids.dim() != 2 or ids.size(0) == 0 or ids.size(1) == 0:
        raise ValueError(
            f"prompt_ids must be a non-empty (B, L) batch of token ids, got shape {tuple(ids.shape)}; "
            "start an empty prompt with the EOS id"
        )
    vocab = model.config.vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"prompt token ids must be in [0, {vocab}), got min {int(ids.min())} max {int(ids.max())}")
    return ids.to(model.lm_head.weight.device)


def batch_rows(config: SamplingConfig, prompts: int, vocab_size: int) -> int:
    """Sequences decoded at once: prompts x beams (beam search) or x candidates (contrastive: top_k, at most the
    vocabulary)."""
    if config.strategy == "beam":
        return prompts * config.num_beams
    if config.strategy == "contrastive":
        return prompts * min(config.top_k or CONTRASTIVE_DEFAULT_TOP_K, vocab_size)
    return prompts


def check_memory(model: GPT, rows: int, strategy: str = "sample") -> None:
    """Refuse a batch whose KV cache and logits would not fit in the device's free memory, naming the sizes:
    better one line now than the machine swapping or the OOM killer later."""
    c, p = model.config, model.lm_head.weight
    per_row = c.n_layer * 2 * c.block_size * c.n_embd * p.element_size() + 3 * c.padded_vocab_size * 4
    need = rows * per_row
    free = free_memory(p.device)
    if free is not None and need > 0.8 * free:
        fix = (f"use fewer --num_samples / {'--top_k' if strategy == 'contrastive' else '--num_beams'}" if rows > 1
               else f"the model's context, block_size {c.block_size:,} tokens, is too long for this device (a "
                    "checkpoint or config.json that was edited?): use another device (--device) or model")
        raise ValueError(f"generating {rows:,} sequence{'s' * (rows > 1)} at once needs ~{need / 2**30:.1f} GiB (KV "
                         f"cache and logits) but {p.device} has {free / 2**30:.1f} GiB free; {fix}")


def check_decoding(model: GPT, config: SamplingConfig, num_samples: int = 1, tokenizer=None,
                   spell: Spelling = LIBRARY) -> None:
    """What `generate_with` refuses of ``config`` for ``num_samples`` samples of one prompt as it starts, checked
    before any output (`tinylm generate` says its line of CPU threads after it): the batch's memory, and a regex,
    JSON schema or grammar that ``tokenizer`` cannot write; and a warning for beam options that cannot act
    (`idle_beam_options`; ``spell``: how the options are named)."""
    if tokenizer is not None and (idle := idle_beam_options(vars(config), spell, tokenizer.kind)):
        warnings.warn(idle, stacklevel=2)
    check_memory(model, batch_rows(config, num_samples, model.config.vocab_size), config.strategy)
    kind = next((k for k in CONSTRAINTS if getattr(config, k, None)), None)
    if kind is not None and tokenizer is not None:
        from tinylm.generate.constrained import check_writable, constraint_name, grammar_text

        check_writable(grammar_text(config.regex, config.json_schema, config.grammar), tokenizer,
                       model.config.vocab_size, constraint_name(kind, getattr(config, kind)))


def generate_with(
    model: GPT,
    prompt_ids: Sequence[Sequence[int]] | Sequence[int] | Tensor,
    config: SamplingConfig,
    *,
    decode: Callable[[list[int]], str] | None = None,
    on_token: Callable[[int, int], None] | None = None,
    draft: GPT | None = None,
    tokenizer=None,
    stats: dict[str, int] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """`generate` with the options in a SamplingConfig. ``stats``: speculative decoding adds its counts to this dict
    (steps, tokens, drafted, kept, accepted: see `speculative.decode`). ``on_step(n)``: called after each decoding
    step of every strategy with the new tokens so far (the longest row's; a progress bar: beam search's
    ``on_token`` fires only at its end)."""
    _check_arguments(model, decode=decode, on_token=on_token, on_step=on_step)
    config = replace(config)  # its checks again: a field changed after it was made (temperature = 0) skipped them
    speculative = draft is not None or config.prompt_lookup > 0
    if speculative:
        _check_speculative(model, draft, config)
    if config.stop_strings and decode is None:
        raise ValueError("stop_strings need decode (a function from token ids to text, e.g. tokenizer.decode)")
    if config.eos_id is not None and config.eos_id >= model.config.vocab_size:
        raise ValueError(f"eos_id must be < vocab_size {model.config.vocab_size}, got {config.eos_id}")
    ids = _prompt_tensor(prompt_ids, model)  # (B, L)
    check_memory(model, batch_rows(config, ids.size(0), model.config.vocab_size), config.strategy)
    grammar = _grammar(model, config, tokenizer, batch_rows(config, ids.size(0), 1) if config.strategy == "beam"
                       else ids.size(0), speculative)
    if grammar is not None and config.eos_id is None:
        config = replace(config, eos_id=tokenizer.eos_id)  # EOS only where the grammar may end
    rows = _Rows(config, decode, on_token, [row[-CONTEXT_TOKENS:] for row in ids.tolist()],
                 grammar if config.strategy != "beam" else None)
    rows.on_step = on_step
    generator = None
    if config.seed is not None:
        # (int: a numpy integer passes the seed's check, and torch's manual_seed refuses it)
        generator = torch.Generator(device=ids.device).manual_seed(int(config.seed))
    models = [m for m in (model, draft) if m is not None]
    # each submodule's own mode, restored as it was: a dropout the user had put in eval mode (train() would have
    # turned it back on)
    was_training = [(sub, sub.training) for m in models for sub in m.modules()]
    for m in models:
        m.eval()
        # a tokenizer of fewer ids than the model's vocabulary: the ids it cannot write are never generated
        m.sample_vocab = getattr(tokenizer, "vocab_size", None)
    try:
        with torch.inference_mode():  # not no_grad: the same kernels, less work per op (nothing made here is kept)
            counts = _decode(model, ids, rows, generator, draft, grammar)
    finally:
        for sub, mode in was_training:
            sub.training = mode
        for m in models:
            m.sample_vocab = None
    if stats is not None:
        for key, n in (counts or {}).items():
            stats[key] = stats.get(key, 0) + n
    return rows.tokens


FUNCTIONS = {"decode": "decode(ids) -> text (e.g. tokenizer.decode)", "on_token": "on_token(row, token_id)",
             "on_step": "on_step(new_tokens)"}  # generate_with's function arguments, as messages show them


def _check_arguments(model, **functions) -> None:
    """Refuse the LightningModule as the model, and a function argument (`FUNCTIONS`) that is no function, in one
    line: each failed deep in decoding ("'TinyLM' object has no attribute 'config'", "'int' object is not
    callable")."""
    if not isinstance(model, GPT) and isinstance(getattr(model, "model", None), GPT):  # (torch.compile's wrapper
        raise TypeError(f"model must be a tinylm GPT, got a {type(model).__name__} (the LightningModule: pass its "
                        ".model)")  # of a GPT passes)
    for name, f in functions.items():
        if f is not None and not callable(f):
            raise TypeError(f"{name} must be a function {FUNCTIONS[name]}, or None; got {type(f).__name__} {f!r:.40}")


def _decode(model: GPT, ids: Tensor, rows: _Rows, generator, draft: GPT | None, grammar) -> dict[str, int] | None:
    config = rows.config
    run = _Runner(model, use_cache=config.use_cache, prompt_len=ids.size(1))
    if draft is not None or config.prompt_lookup:
        from tinylm.generate import speculative as spec

        drafter = spec.PromptLookup(config.prompt_lookup) if draft is None else \
            spec.DraftModel(draft, ids.size(1), config.use_cache)
        return spec.decode(model, ids, rows, drafter, generator)
    elif config.strategy == "beam":
        _beam_search(run, ids, rows, grammar)
    elif config.strategy == "contrastive":
        _contrastive(run, ids, rows)
    else:
        _greedy_or_sample(run, ids, rows, generator)
    return None


def _grammar(model: GPT, config: SamplingConfig, tokenizer, rows: int, speculative: bool):
    """The constrained.Grammar of config's regex / json_schema / grammar for ``rows`` rows; None when none is set."""
    if not any(getattr(config, k) for k in CONSTRAINTS):
        return None
    from tinylm.tokenize import Tokenizer  # (here: plain decoding needs no tokenizer library)

    if not isinstance(tokenizer, Tokenizer):  # (a spec, tokenizer="char": "'str' object has no attribute 'eos_id'")
        raise ValueError(f"regex, json_schema and grammar need tokenizer= the model's Tokenizer (load_model's, or "
                         f"build_tokenizer(spec)'s), got {tokenizer!r:.60}: the grammar is over text, and the "
                         "tokenizer says which text each id writes")
    if speculative:
        raise ValueError("speculative decoding does not take a grammar yet; drop the draft model or the grammar")
    if config.eos_id is not None and tokenizer.eos_id is not None and config.eos_id != tokenizer.eos_id:
        # the grammar ends a row at the tokenizer's EOS: under another eos_id that one was generated as text, and the
        # row went on unconstrained ('ab<|endoftext|>dach...' for regex [ab]{1,5})
        raise ValueError(f"eos_id {config.eos_id} with a regex, json_schema or grammar: constrained decoding ends a "
                         f"row at the tokenizer's end-of-text id {tokenizer.eos_id}; leave eos_id unset")
    from tinylm.generate.constrained import Grammar, constraint_name, grammar_text

    kind = next(k for k in CONSTRAINTS if getattr(config, k))
    name = constraint_name(kind, getattr(config, kind))
    return Grammar(grammar_text(config.regex, config.json_schema, config.grammar), tokenizer,
                   model.config.vocab_size, rows, name=name)


def _check_speculative(model: GPT, draft: GPT | None, config: SamplingConfig) -> None:
    """Refuse what speculative decoding cannot keep exact: beams or candidates, a draft of another vocabulary."""
    if draft is not None and not isinstance(getattr(draft, "config", None), GPTConfig):  # (a path: load_draft)
        raise TypeError(f"draft must be a tinylm GPT (tinylm.checkpoint.load_draft(path, tokenizer) loads one), got "
                        f"{type(draft).__name__} {draft!r:.60}")
    from tinylm.generate.config import SPECULATIVE

    if config.strategy not in SPECULATIVE:
        raise ValueError(f"speculative decoding (a draft model) needs the greedy or sample strategy, got strategy "
                         f"{config.strategy!r}")
    if draft is not None and draft.config.vocab_size != model.config.vocab_size:
        raise ValueError(f"the draft model has {draft.config.vocab_size} token ids and the model "
                         f"{model.config.vocab_size}; a draft must use the model's tokenizer")
    if draft is not None and draft.lm_head.weight.device != model.lm_head.weight.device:
        raise ValueError(f"the draft model is on {draft.lm_head.weight.device} and the model on "
                         f"{model.lm_head.weight.device}; put both on one device")


@sampling_options()
def generate(
    model: GPT,
    prompt_ids: Sequence[Sequence[int]] | Sequence[int] | Tensor,
    *,
    decode: Callable[[list[int]], str] | None = None,
    on_token: Callable[[int, int], None] | None = None,
    draft: GPT | None = None,
    tokenizer=None,
    **options: Any,
) -> list[list[int]]:
    """Continue each prompt; return the new token ids per prompt (without the EOS that ended a row). Runs in eval
    mode under torch.inference_mode and restores the model's mode.

    Args:
        prompt_ids: (B, L) tensor or B lists of ids of equal length (one flat list = one prompt). Prompts longer
            than block_size are cropped to their last block_size tokens, as is the context while generating.
        decode: token ids -> text; needed for stop_strings.
        on_token: streaming callback `on_token(row, token_id)`, called as each token is accepted (for beam search,
            once the best hypothesis is known).
        draft: a smaller model with the same tokenizer, for speculative decoding (greedy and sample; the output
            is the model's own, faster when the draft guesses well; see tinylm/generate/speculative.py).
        tokenizer: the model's Tokenizer; needed for regex, json_schema and grammar (tinylm/generate/constrained.py).
        options: SamplingConfig's fields (`tinylm.generate.options` lists them here).
    """
    return generate_with(model, prompt_ids, SamplingConfig(**options), decode=decode, on_token=on_token, draft=draft,
                         tokenizer=tokenizer)
