"""What every decoding strategy shares (tinylm.generate.strategies, tinylm.generate.speculative): feeding the model
with or without its KV cache (`_Runner`), the rows being generated and where each stops (`_Rows`), and decoding a
continuation's text after the tokens before it (`decode_after`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from tinylm.generate.config import SamplingConfig
from tinylm.model import GPT


# ---- feeding the model ---------------------------------------------------------------------------------------
class _Runner:
    """Feeds a growing batch of sequences (B, L) to the model; returns the last position's logits (and the new
    tokens' hidden states).

    Without the cache every call runs the last block_size tokens (nanoGPT's sliding window). With it only the
    tokens not fed yet run until the text passes block_size; from then on each call runs the whole window, as
    without the cache (learned absolute positions shift with the window, so no cached key stays valid), and the
    cache is dropped rather than rewritten at every token. ``rollback``: the caller may roll the cache back
    (speculative decoding's draft, `speculative.DraftModel.keep`): past block_size the window is then still written
    to the cache, which a rollback continues from.
    """

    def __init__(self, model: GPT, *, use_cache: bool, prompt_len: int, rollback: bool = False) -> None:
        self.model, self.use_cache, self.rollback = model, use_cache, rollback
        self.block_size = model.config.block_size
        # a prefix-LM sees its prompt bidirectionally: the prefix is the prompt, wherever the window starts
        self.prefix_abs = prompt_len if model.config.attn_mask == "prefix" else None
        self.cache = None
        self.cache_start = 0  # absolute position of the cache's first token
        self.fed = 0  # tokens of each sequence the model has seen
        self.sliding = False  # past block_size without rollback: whole windows, no cache

    def reorder(self, index: Tensor) -> None:
        """Rows of the batch were selected/reordered (beams, contrastive candidates): follow in the cache."""
        if self.cache is not None:
            self.cache.reorder(index)

    def __call__(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        L = ids.size(1)
        n_new = L - self.fed
        assert n_new >= 1, "every call must bring at least one new token"
        if self.use_cache and not self.sliding and self.cache is None:
            self.cache = self.model.new_kv_cache(ids.size(0))
        if self.cache is not None and self.cache.pos + n_new > self.block_size and not self.rollback:
            self.sliding, self.cache = True, None  # ids only grow: every later call is past block_size too
        if self.cache is not None:
            first = L - n_new  # the first token the cache has not seen
            if self.cache.pos + n_new > self.block_size:
                self.cache.reset()
                self.cache_start = first = max(0, L - self.block_size)
            start, feed = self.cache_start, ids[:, first:]
        else:
            start = max(0, L - self.block_size)
            feed = ids[:, start:]
        prefix_len = None if self.prefix_abs is None else max(0, self.prefix_abs - start)
        # .forward, not __call__: a model compiled in place (module.compile()) would recompile for every cache length
        logits, hidden = self.model.forward(
            feed, kv_cache=self.cache, prefix_len=prefix_len, return_hidden=True, last_only=True
        )  # (B, 1, V), (B, T, C)
        self.fed = L
        return logits[:, -1].float(), hidden[:, -min(n_new, hidden.size(1)) :]


# ---- decoding a continuation -----------------------------------------------------------------------------------
CONTEXT_TOKENS = 4  # tokens decoded before a continuation, for the text they give its first token


def decode_after(decode: Callable[[list[int]], str], context: Sequence[int], ids: Sequence[int]) -> str:
    """The text ``ids`` add after ``context``: decode(context + ids) less decode(context). A token decoded alone
    can lose what its left neighbour gives it (SentencePiece's "▁" is a space only after a word; WordPiece's "##"
    joins it to one), so a continuation is decoded after the tokens before it. Falls back to decoding ``ids``
    alone if the context's text is not a prefix (a decoder that rewrites across the boundary)."""
    context = list(context)[-CONTEXT_TOKENS:]
    if not context:
        return decode(list(ids))
    before, text = decode(context), decode(context + list(ids))
    return text[len(before):] if text.startswith(before) else decode(list(ids))


# ---- stopping -----------------------------------------------------------------------------------------------
class _Rows:
    """The new tokens of each row, and which rows still run (EOS, stop strings). ``contexts``: the last tokens of
    each prompt, before which its first new tokens are decoded."""

    def __init__(self, config: SamplingConfig, decode, on_token, contexts: list[list[int]], grammar=None) -> None:
        self.tokens: list[list[int]] = [[] for _ in contexts]
        self.active = [True] * len(contexts)
        self.config, self.decode, self.on_token, self.contexts = config, decode, on_token, contexts
        self.grammar = grammar  # constrained.Grammar, one matcher per row (None: free text)
        self.on_step: Callable[[int], None] | None = None  # told the tokens decoded so far after each step
        # a stop string that the newest token completes ends in it, and spans at most 4 tokens per character
        # (each token adds a byte or more): decoding that tail, not the whole continuation, keeps each check short
        self.tail = 4 * max(map(len, config.stop_strings or [""])) + 1

    def hits_stop_string(self, tokens: list[int], prompt: int) -> bool:
        """Whether the new ``tokens`` of the row of prompt ``prompt`` have made a stop string (text of the prompt
        is not searched)."""
        if not self.config.stop_strings:
            return False
        cut = max(0, len(tokens) - self.tail)
        before = (self.contexts[prompt] + tokens[max(0, cut - CONTEXT_TOKENS):cut])[-CONTEXT_TOKENS:]
        text = decode_after(self.decode, before, tokens[cut:])
        return any(s in text for s in self.config.stop_strings)

    def accept(self, next_tokens: list[int]) -> None:
        for row, tok in enumerate(next_tokens):
            if not self.active[row]:
                continue
            if tok == self.config.eos_id:
                self.active[row] = False
                continue
            self.tokens[row].append(tok)
            if self.on_token is not None:
                self.on_token(row, tok)
            if self.grammar is not None:
                self.grammar.consume(row, tok)
            if self.hits_stop_string(self.tokens[row], row) or self.grammar is not None and self.grammar.stopped(row):
                self.active[row] = False
            if not self.active[row] and self.grammar is not None:
                self.grammar.live[row] = False

    def stepped(self, n: int) -> None:
        """A decoding step ended with ``n`` new tokens per row so far (the most a row has): told to on_step."""
        if self.on_step is not None:
            self.on_step(n)

    def allowed(self) -> Tensor | None:
        """(B, V) mask of the ids the grammar allows each row next; None without a grammar."""
        return None if self.grammar is None else self.grammar.allowed()


# ---- strategies -----------------------------------------------------------------------------------------------
