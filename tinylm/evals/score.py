"""Zero-shot scoring as lm-evaluation-harness does it, for any tinylm model and tokenizer.

A request (context, continuation) is scored by the sum of the model's log-probabilities of the continuation's
tokens. Its tokens are lm-eval's (`HFLM._encode_pair`): trailing spaces of the context move to the continuation, the
whole text is encoded, and the continuation is what follows the context's own tokens; an empty context is the
end-of-text token. Multiple choice: ``acc`` = the most likely choice is the right one (the first of equals, as
numpy's argmax), ``acc_norm`` = the same with each log-probability divided by its choice's characters. LAMBADA:
``acc`` = every token of the last word is the greedy one, ``ppl`` = exp(-mean log-probability of the words). And
tinylm's own ``bpb``: the right continuations' nats over their UTF-8 bytes, in bits (as val/bpb, comparable across
tokenizers).

Context longer than the model's block_size is cut from the left, as lm-eval cuts it: a request is scored on its
last block_size + 1 tokens. A continuation that does not fit that window (a char model's HellaSwag ending, say)
is scored in full all the same: its tokens before the window are scored in more windows to its left, each token
seeing the block_size tokens before it at most (lm-eval refuses it: `assert len(continuation_enc) <= max_length`).

Requests are batched longest first (right-padded rows; the causal mask keeps the padding out of every scored
position), and only the scored positions go through the softmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from tinylm.evals.tasks import Item, Task

SUMS = ("items", "acc", "acc_norm", "nats", "bytes", "logprob", "chance")
"""What each task adds up over its items (and ranks): the scores are ratios of these."""


@dataclass(frozen=True)
class EncodedItem:
    """An `Item` in token ids: (context ids, continuation ids) per request, and the right continuation's bytes."""

    requests: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    gold: int
    norm_lengths: tuple[int, ...]
    gold_bytes: int


@dataclass
class EncodedTask:
    """A task's items in a tokenizer's ids, with the ones it cannot encode counted (never silently left out)."""

    task: Task
    items: list[EncodedItem]
    read: int  # items read from the data
    source: str  # where they were read from
    skipped: int = 0
    skip_reason: str | None = None  # the first skipped item's reason

    def skip_line(self) -> str | None:
        """One line naming the items left out and why, or None when none were."""
        if not self.skipped:
            return None
        return (f"{self.task.name}: {self.skipped:,} of {self.read:,} items skipped ({self.skip_reason}); the scores "
                f"are over the other {len(self.items):,}")


@dataclass
class RequestScore:
    """A continuation's log-probability (nats, summed over its tokens) and whether each token was the argmax."""

    logprob: float = 0.0
    greedy: bool = True


@dataclass(frozen=True)
class _Row:
    """One forward row: input ids, and the targets read off its logits from position ``first`` on."""

    request: int
    ids: tuple[int, ...]
    first: int
    targets: tuple[int, ...]


@dataclass
class Ranks:
    """How items are split across the processes of a run: this process's rank, their number, and the collectives
    that join their results (sum) and keep their forward calls equal (max; a sharded model's forward is one)."""

    rank: int = 0
    world_size: int = 1
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] = field(default=lambda t: t)
    reduce_max: Callable[[torch.Tensor], torch.Tensor] = field(default=lambda t: t)


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval makes them; the continuation's ids are those of the whole text
    after the context's, so a token that spans the boundary is not split differently than in running text."""
    spaces = len(context) - len(context.rstrip())
    if spaces:  # "Answer: " + "yes" is scored as "Answer:" + " yes"
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    if not context:
        if tokenizer.eos_id is None:
            raise ValueError(f"an empty context starts from the end-of-text token, and this {tokenizer.kind} "
                             "tokenizer has none")
        ids = tokenizer.encode(continuation)
        # (an end-of-text token the continuation starts with is its own context, as in lm-eval)
        return (ids[:1], ids[1:]) if ids and ids[0] == tokenizer.eos_id else ([tokenizer.eos_id], ids)
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context)
    return ctx, whole[len(ctx):]


def encode_items(task: Task, items: Sequence[Item], tokenizer, source: str = "") -> EncodedTask:
    """``items`` in ``tokenizer``'s ids; an item any part of which the tokenizer cannot encode (a char vocabulary
    without "é") is skipped and counted."""
    out = EncodedTask(task, [], read=len(items), source=source)
    for item in items:
        try:
            pairs = tuple(tuple(map(tuple, encode_pair(tokenizer, c, x))) for c, x in item.requests)
        except ValueError as e:
            out.skipped += 1
            out.skip_reason = out.skip_reason or _reason(e, tokenizer)
            continue
        context, cont = item.requests[item.gold]
        moved = context[len(context.rstrip()):]  # the spaces encode_pair moves to the continuation
        out.items.append(EncodedItem(pairs, item.gold, item.norm_lengths, len((moved + cont).encode("utf-8"))))
    return out


def _reason(e: ValueError, tokenizer) -> str:
    text = str(e)
    if tokenizer.kind == "char" and "character" in text:
        return f"the char tokenizer has no token for some of their characters, e.g. {text.split()[1]}"
    return f"the {tokenizer.kind} tokenizer cannot encode them: {text.split(';')[0]}"


def windows(context: Sequence[int], continuation: Sequence[int], block_size: int) -> list[tuple[list[int], int,
                                                                                                    list[int]]]:
    """(input ids, position of the first target, targets) that score ``continuation`` after ``context``.

    The first window is lm-eval's: the last block_size + 1 tokens, less the last. With block_size 4, context
    [1, 2, 3, 4, 5] and continuation [6, 7]: ([3, 4, 5, 6], 2, [6, 7]). With continuation [6, 7, 8, 9, 10, 11]:
    ([7, 8, 9, 10], 0, [8, 9, 10, 11]) then ([3, 4, 5, 6], 2, [6, 7]).
    """
    seq = list(context) + list(continuation)
    start, end, out = len(context), len(seq), []
    while end > start:
        lo = max(0, end - 1 - block_size)  # the input seq[lo:end - 1] predicts seq[lo + 1:end]
        first = max(start, end - block_size)
        out.append((seq[lo:end - 1], first - 1 - lo, seq[first:end]))
        end = first
    return out


def plan_rows(requests: Sequence[tuple[Sequence[int], Sequence[int]]], block_size: int) -> list[_Row]:
    """Every forward row of ``requests``, longest first (fewer padded positions per batch)."""
    rows = [_Row(i, tuple(ids), first, tuple(targets))
            for i, (ctx, cont) in enumerate(requests) for ids, first, targets in windows(ctx, cont, block_size)]
    return sorted(rows, key=lambda r: -len(r.ids))


@torch.no_grad()
def score_requests(model: torch.nn.Module, rows: list[_Row], n_requests: int, *, batch_size: int,
                   forward_calls: int = 0, progress: bool = False, desc: str = "") -> list[RequestScore]:
    """Each request's summed log-probability and greediness, from ``rows`` (`plan_rows`) in batches of
    ``batch_size``. At least ``forward_calls`` forwards are made (empty ones after the real): every rank of a sharded
    model must call it equally often."""
    from tinylm.progress import bar

    device = next(model.parameters()).device
    prefix_lm = getattr(getattr(model, "config", None), "attn_mask", None) == "prefix"
    scores = [RequestScore() for _ in range(n_requests)]
    batches = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
    for batch in bar(batches, desc=desc, enabled=progress, unit="batch", leave=False):
        width = max(len(r.ids) for r in batch)
        idx = torch.zeros(len(batch), width, dtype=torch.long)  # (B, T), right-padded
        for b, r in enumerate(batch):
            idx[b, :len(r.ids)] = torch.tensor(r.ids)
        # a prefix-LM sees its context both ways, as generate its prompt: the tokens before the first scored one
        prefix = {"prefix_len": torch.tensor([r.first + 1 for r in batch], device=device)} if prefix_lm else {}
        logits = model(idx.to(device), **prefix)  # (B, T, V)
        which = torch.tensor([b for b, r in enumerate(batch) for _ in r.targets], device=device)  # (N,)
        where = torch.tensor([r.first + j for r in batch for j in range(len(r.targets))], device=device)  # (N,)
        targets = torch.tensor([t for r in batch for t in r.targets], device=device)  # (N,)
        picked = logits[which, where].float()  # (N, V): only the scored positions
        logprobs = picked.log_softmax(-1).gather(1, targets[:, None])[:, 0].tolist()
        hits = (picked.argmax(-1) == targets).tolist()
        n = 0
        for r in batch:
            s = scores[r.request]
            s.logprob += math.fsum(logprobs[n:n + len(r.targets)])
            s.greedy = s.greedy and all(hits[n:n + len(r.targets)])
            n += len(r.targets)
    for _ in range(forward_calls - len(batches)):
        model(torch.zeros(1, 1, dtype=torch.long, device=device), **({"prefix_len": 0} if prefix_lm else {}))
    return scores


def item_sums(task: Task, item: EncodedItem, scores: Sequence[RequestScore]) -> list[float]:
    """This item's share of `SUMS`."""
    lls = [s.logprob for s in scores]
    if task.kind == "word":
        acc = acc_norm = float(scores[0].greedy)
        chance = 0.0
    else:
        acc = float(max(range(len(lls)), key=lls.__getitem__) == item.gold)  # first of equals, as np.argmax
        # a choice empty after preprocessing (a HellaSwag ending "[step]"): lm-eval's numpy ll / 0 is -inf, never picked
        normed = [ll / n if n else -math.inf for ll, n in zip(lls, item.norm_lengths)]
        acc_norm = float(max(range(len(normed)), key=normed.__getitem__) == item.gold)
        chance = 1 / len(lls)
    return [1.0, acc, acc_norm, -lls[item.gold], float(item.gold_bytes), lls[item.gold], chance]


def metrics(task: Task, sums: Sequence[float]) -> dict[str, float]:
    """The task's scores from its `SUMS`, with ``random``: the expected acc of guessing."""
    s = dict(zip(SUMS, sums))
    n = max(s["items"], 1.0)
    nll = -s["logprob"] / n  # a model that scores the answers at below e^-709 has an infinite ppl, not an error
    out = {"acc": s["acc"] / n, "acc_norm": s["acc_norm"] / n, "ppl": math.exp(nll) if nll < 709 else math.inf,
           "bpb": s["nats"] / math.log(2) / max(s["bytes"], 1.0)}
    return {**{k: out[k] for k in task.metrics}, "random": s["chance"] / n, "items": s["items"]}


def score_items(model: torch.nn.Module, task: EncodedTask, *, block_size: int, batch_size: int,
                forward_calls: int = 0, progress: bool = False) -> list[list[RequestScore]]:
    """Each item's request scores, in the items' order."""
    flat = [req for item in task.items for req in item.requests]
    scores = score_requests(model, plan_rows(flat, block_size), len(flat), batch_size=batch_size,
                            forward_calls=forward_calls, progress=progress, desc=task.task.name)
    out, n = [], 0
    for item in task.items:
        out.append(scores[n:n + len(item.requests)])
        n += len(item.requests)
    return out


def check_batch_memory(model: torch.nn.Module, tasks: Sequence[EncodedTask], batch_size: int) -> None:
    """Refuse a batch_size whose first (longest) batch's logits would not fit in the device's free memory: a
    forward makes (B, T, V) logits, 13 GiB at batch 64 for GPT-2's vocabulary and 1024 tokens, and the CUDA OOM
    (or, on the CPU, the machine swapping) came mid-eval as a traceback."""
    from tinylm.device import free_memory

    c, p = model.config, next(model.parameters())
    rows = [row for t in tasks for row in plan_rows([r for i in t.items for r in i.requests], c.block_size)]
    if not rows:
        return
    width = max(len(r.ids) for r in rows)  # the longest row: the first batch is the widest
    need = min(batch_size, len(rows)) * width * (c.padded_vocab_size + 4 * c.n_embd) * p.element_size()
    free = free_memory(p.device)
    if free is not None and need > 0.8 * free:
        raise ValueError(f"scoring {min(batch_size, len(rows)):,} rows of up to {width:,} tokens at once needs "
                         f"~{need / 2**30:.1f} GiB (their logits) but {p.device} has {free / 2**30:.1f} GiB free; use "
                         "a smaller batch_size (--batch_size, --eval.batch_size; default 16)")


def evaluate(model: torch.nn.Module, tasks: Sequence[EncodedTask], *, batch_size: int = 16, progress: bool = False,
             ranks: Ranks | None = None) -> dict[str, dict[str, float]]:
    """Task name -> its scores (`metrics`). Under several ranks each scores every world_size-th item and the sums
    are joined, so every rank returns the same result."""
    ranks = ranks or Ranks()
    block = model.config.block_size
    was_training = model.training
    model.eval()  # no dropout; no random numbers are drawn, so the training's random stream is untouched
    try:
        mine = [EncodedTask(t.task, t.items[ranks.rank::ranks.world_size], t.read, t.source) for t in tasks]
        calls = [math.ceil(len(plan_rows([r for i in t.items for r in i.requests], block)) / batch_size) for t in mine]
        calls = ranks.reduce_max(torch.tensor(calls, dtype=torch.float64)).long().tolist() if ranks.world_size > 1 \
            else calls
        sums = torch.zeros(len(tasks), len(SUMS), dtype=torch.float64)
        for k, (t, n_calls) in enumerate(zip(mine, calls)):
            per_item = score_items(model, t, block_size=block, batch_size=batch_size, forward_calls=n_calls,
                                   progress=progress)
            for item, scores in zip(t.items, per_item):
                sums[k] += torch.tensor(item_sums(t.task, item, scores), dtype=torch.float64)
        sums = ranks.reduce_sum(sums) if ranks.world_size > 1 else sums
    finally:
        model.train(was_training)
    return {t.task.name: metrics(t.task, sums[k].tolist()) for k, t in enumerate(tasks)}
