"""`tinylm sample-report`: sample one checkpoint with several decoding strategies and compare them side by side.

For each strategy it generates samples from the same prompts and measures
- distinct-n: unique n-grams / all n-grams over all of the strategy's samples (diversity across samples);
- repetition rate: fraction of each sample's 4-grams that already occurred earlier in that sample (loops);
- entropy: mean entropy of the model's untruncated next-token distribution (T = 1) along the generated text;
- NLL: the model's own mean per-token negative log-likelihood of the generated text (teacher-forced, prompt
  excluded), under the untruncated distribution at T = 1, in nats.
and writes `report.md`, `metrics.json` and `diversity_vs_likelihood.png` into one folder.

The metric functions at the top are pure functions of token ids, checkable by hand.
Shapes: B rows (samples), L tokens (prompt + generated), T window length (<= block_size), V vocab.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tinylm.generate.config import CONSTRAINTS, SamplingConfig
from tinylm.generate.prompts import encode_prompt
from tinylm.generate.rows import decode_after
from tinylm.generate.strategies import generate_with
from tinylm.model import GPT
from tinylm.paths import check_output_path, naming, not_utf8
from tinylm.ranges import check_ranges


# ---- metrics: pure functions of token ids -----------------------------------------------------------------------
def ngrams(seq: Sequence[int], n: int) -> list[tuple[int, ...]]:
    """The n-grams of one sequence in order: ngrams([1, 2, 3], 2) == [(1, 2), (2, 3)]."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def distinct_n(seqs: Sequence[Sequence[int]], n: int) -> float:
    """Unique n-grams / total n-grams, pooled over all sequences (n-grams never span two sequences).

    distinct_n([[1, 2, 1, 2]], 2) == 2/3: (1,2) (2,1) (1,2). NaN when there is no n-gram at all.
    """
    grams = [g for s in seqs for g in ngrams(s, n)]
    return len(set(grams)) / len(grams) if grams else math.nan


def repeated_ngrams(seq: Sequence[int], n: int = 4) -> tuple[int, int]:
    """(n-grams that already occurred earlier in seq, all n-grams of seq); earlier occurrences may overlap."""
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    grams = ngrams(seq, n)
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats, len(grams)


def repetition_rate(seq: Sequence[int], n: int = 4) -> float:
    """Fraction of seq's n-grams that already occurred earlier in seq: [1,2,3,4,1,2,3,4] has 4-grams
    1234 2341 3412 4123 1234, one repeat of five, so 0.2. NaN for a sequence shorter than n."""
    repeats, total = repeated_ngrams(seq, n)
    return repeats / total if total else math.nan


def pooled_repetition_rate(seqs: Sequence[Sequence[int]], n: int = 4) -> float:
    """Repetition rate over many sequences, each checked against itself: sum of repeats / sum of n-grams
    (longer samples weigh more, as in a per-token mean)."""
    counts = [repeated_ngrams(s, n) for s in seqs]
    total = sum(t for _, t in counts)
    return sum(r for r, _ in counts) / total if total else math.nan


def mean_of(values: Sequence[Sequence[float]]) -> float:
    """Mean over every number in a list of lists (per-token values of several samples); NaN when empty."""
    flat = [v for vs in values for v in vs]
    return sum(flat) / len(flat) if flat else math.nan


# ---- teacher-forced scoring -------------------------------------------------------------------------------------
SCORE_CHUNK_LOGITS = 2**25  # most logits (rows x positions x vocab) scored at once: 128 MB of fp32
SLIDE_CHUNK_TOKENS = 16384  # past block_size: most tokens (windows x rows x block_size) in one forward pass


def score_tokens(model: GPT, prompt: Sequence[int], outputs: Sequence[Sequence[int]]
                 ) -> tuple[list[list[float]], list[list[float]]]:
    """(NLL, entropy) of every generated token of each output, in nats, under the model at T = 1, untruncated.

    NLL is -log p(token | context); entropy is that of the whole distribution p(· | context) the token was drawn
    from. The context is what generation saw: the last block_size tokens before the token (prompt included).
    Tokens past block_size are scored one window each, exactly as generation (with or without the KV cache)
    computed them. Rows go through the model in groups small enough to bound the logits' memory.
    """
    if not len(prompt) and any(len(o) for o in outputs):
        raise ValueError("score_tokens needs a prompt of at least one token: the first output token has no context "
                         "to be scored from; start the prompt with the end-of-text token (tokenizer.eos_id), as "
                         "generation from an empty prompt does")
    T = min(model.config.block_size, len(prompt) + max((len(o) for o in outputs), default=0))
    rows = max(1, SCORE_CHUNK_LOGITS // (max(T, 1) * model.config.vocab_size))
    nll: list[list[float]] = []
    ent: list[list[float]] = []
    for start in range(0, len(outputs), rows):
        n, e = _score_rows(model, prompt, outputs[start : start + rows])
        nll += n
        ent += e
    return nll, ent


@torch.no_grad()
def _score_rows(model: GPT, prompt: Sequence[int], outputs: Sequence[Sequence[int]]
                ) -> tuple[list[list[float]], list[list[float]]]:
    """score_tokens for one group of rows; they are padded at the end, which a causal model never looks at."""
    block = model.config.block_size
    P = len(prompt)
    lengths = [P + len(o) for o in outputs]
    L = max(lengths)
    device = model.lm_head.weight.device
    ids = torch.zeros(len(outputs), L, dtype=torch.long, device=device)  # (B, L), 0-padded
    for row, out in enumerate(outputs):
        ids[row, : lengths[row]] = torch.tensor(list(prompt) + list(out), dtype=torch.long, device=device)
    is_prefix = model.config.attn_mask == "prefix"

    nll = torch.zeros(len(outputs), L, device=device)  # (B, L): nll[:, j] scores target ids[:, j]
    ent = torch.zeros(len(outputs), L, device=device)
    # window 0: ids[:, :T] predicts targets 1..T in one pass
    T = min(L - 1, block)
    if T > 0:
        logits = model(ids[:, :T], prefix_len=P if is_prefix else None).float()  # (B, T, V)
        nll[:, 1 : T + 1], ent[:, 1 : T + 1] = _nll_and_entropy(logits, ids[:, 1 : T + 1])
    # targets j > block: window ids[:, j-block:j], last position only; a batch holds many windows
    starts = list(range(1, L - block))  # window start s predicts target s + block
    chunk = max(1, SLIDE_CHUNK_TOKENS // (block * len(outputs)))  # windows per pass
    for c in range(0, len(starts), chunk):
        s = torch.tensor(starts[c : c + chunk], device=device)  # (W,)
        windows = ids[:, s[:, None] + torch.arange(block, device=device)]  # (B, W, block)
        flat = windows.reshape(-1, block)  # (B*W, block)
        prefix = (P - s).clamp(min=0).repeat(len(outputs)) if is_prefix else None  # (B*W,) prompt left in window
        logits = model(flat, prefix_len=prefix, last_only=True)[:, -1].float()  # (B*W, V)
        targets = ids[:, s + block]  # (B, W)
        n, e = _nll_and_entropy(logits.view(len(outputs), len(s), -1), targets)
        nll[:, s + block], ent[:, s + block] = n, e
    nll_rows = [nll[row, P : lengths[row]].tolist() for row in range(len(outputs))]
    ent_rows = [ent[row, P : lengths[row]].tolist() for row in range(len(outputs))]
    return nll_rows, ent_rows


def _nll_and_entropy(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """logits (B, T, V), targets (B, T) -> per-token NLL and entropy, (B, T) each."""
    logp = logits.log_softmax(dim=-1)  # (B, T, V)
    nll = -logp.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return nll, entropy


# ---- the strategies compared ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReportStrategy:
    """One row of the report: a name and the SamplingConfig options that make it."""

    name: str
    """Short label used in the table, the plot and metrics.json."""
    options: dict[str, Any] = field(default_factory=dict)
    """SamplingConfig keyword arguments (strategy, temperature, top_k, ...)."""

    draft: bool = False
    """Speculative decoding with the report's draft model (`sample_report`'s ``draft``)."""

    @property
    def deterministic(self) -> bool:
        """Greedy, beam and contrastive give the same text every time: one sample per prompt is enough."""
        return self.options.get("strategy", "sample") != "sample"

    @property
    def speculative(self) -> bool:
        """Drafts tokens (a draft model or prompt lookup): the report gives its acceptance and tokens per pass."""
        return self.draft or bool(self.options.get("prompt_lookup"))

    @property
    def constraint(self) -> dict[str, str]:
        """{regex | json_schema | grammar: value} of a constrained strategy; empty for free text."""
        return {k: v for k, v in self.options.items() if k in CONSTRAINTS and v}


STRATEGIES: tuple[ReportStrategy, ...] = (
    ReportStrategy("greedy", {"strategy": "greedy"}),
    ReportStrategy("sample T=1.0", {"strategy": "sample", "temperature": 1.0}),
    ReportStrategy("sample T=0.7", {"strategy": "sample", "temperature": 0.7}),
    ReportStrategy("top-k 40", {"strategy": "sample", "top_k": 40}),
    ReportStrategy("top-p 0.9", {"strategy": "sample", "top_p": 0.9}),
    ReportStrategy("min-p 0.05", {"strategy": "sample", "min_p": 0.05}),
    ReportStrategy("rep-penalty 1.3", {"strategy": "sample", "repetition_penalty": 1.3}),
    ReportStrategy("beam 4", {"strategy": "beam", "num_beams": 4}),
    ReportStrategy("contrastive k=4 a=0.6", {"strategy": "contrastive", "top_k": 4, "penalty_alpha": 0.6}),
)


def report_strategies(*, draft: bool = False, prompt_lookup: int = 0, num_draft_tokens: int = 4,
                      constraint: dict[str, str] | None = None) -> tuple[ReportStrategy, ...]:
    """STRATEGIES, and beside greedy and sampling at T = 1 their speculative twins (with the draft model when
    ``draft``; with prompt lookup of ``prompt_lookup``-grams), which must write text of the same quality, and their
    constrained ones (``constraint``: {regex | json_schema | grammar: value}; beam search too)."""
    twins = [("greedy", {"strategy": "greedy"}), ("sample T=1.0", {"strategy": "sample", "temperature": 1.0})]
    extra = []
    if draft:
        extra += [ReportStrategy(f"{name} + draft K={num_draft_tokens}", {**o, "num_draft_tokens": num_draft_tokens},
                                 draft=True) for name, o in twins]
    if prompt_lookup:
        extra += [ReportStrategy(f"{name} + lookup n={prompt_lookup} K={num_draft_tokens}",
                                 {**o, "prompt_lookup": prompt_lookup, "num_draft_tokens": num_draft_tokens})
                  for name, o in twins]
    for kind, value in (constraint or {}).items():
        beam = ("beam 4", {"strategy": "beam", "num_beams": 4})
        extra += [ReportStrategy(f"{name} + {kind}", {**o, kind: value}) for name, o in [*twins, beam]]
    return STRATEGIES + tuple(extra)


def check_report_inputs(model: GPT, tokenizer, prompts: Sequence[str] | str | None,
                        strategies: Sequence[ReportStrategy] = STRATEGIES, draft: GPT | None = None) -> list:
    """`sample_report`'s checks of its prompts and strategies against the model and its tokenizer, before any
    sampling (`tinylm sample-report` runs them before its line of CPU threads too): a draft the strategies need, a
    grammar the tokenizer cannot write, a prompt it cannot encode. Returns the prompts encoded (`encode_prompt`)."""
    if isinstance(prompts, str):  # one prompt (iterated, it was one prompt per character)
        prompts = [prompts]
    if prompts is not None and not (prompts := list(prompts)):  # (it reported on the default prompt, as if None)
        raise ValueError("prompts is empty: give at least one (e.g. prompts=['ROMEO:']), or None to start every "
                         "sample from a fresh document")
    if any(s.draft for s in strategies) and draft is None:
        raise ValueError("a strategy drafts with the draft model, and none was given (draft=)")
    constraints = {(k, v) for s in strategies for k, v in s.constraint.items()}
    if constraints:  # a grammar the tokenizer cannot write is refused now, before the other strategies run
        from tinylm.generate.constrained import check_writable, constraint_name, grammar_text

        for kind, value in sorted(constraints):
            check_writable(grammar_text(**{**dict.fromkeys(CONSTRAINTS), kind: value}), tokenizer,
                           model.config.vocab_size, constraint_name(kind, value))
    return [encode_prompt(tokenizer, p) for p in (prompts or [""])]


def sample_report(
    model: GPT,
    tokenizer,
    *,
    prompts: Sequence[str] | None = None,
    num_samples: int = 50,
    max_new_tokens: int = 100,
    seed: int = 0,
    strategies: Sequence[ReportStrategy] = STRATEGIES,
    draft: GPT | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Generate with every strategy and measure it; returns the metrics.json content.

    prompts: texts to continue, or one text (None or "": a fresh document, see `prompts.default_prompt`).
    num_samples: samples per prompt for sampling strategies, generated as one batch. Deterministic ones run once
        per prompt and count as num_samples identical samples, so every strategy's distinct-n pools the same
        number of samples (what asking it num_samples times would give).
    max_new_tokens: most tokens per sample (EOS ends a sample earlier).
    seed: sampling seed; prompt i uses seed + i for every strategy, so strategies differ by their rule and not by
        their luck (common random numbers).
    strategies: the rows of the report (`report_strategies` adds speculative and constrained ones).
    draft: the draft model of the strategies whose ``draft`` is set (same tokenizer as ``model``).
    progress: show progress over (strategy, prompt) pairs (a bar on a terminal, lines in a log).
    """
    check_ranges("", {"num_samples": num_samples}, {"num_samples": "[1, inf)"}, whole=("num_samples",))  # 2.5: range()
    encoded = check_report_inputs(model, tokenizer, prompts, strategies, draft)
    results = _generate_all(model, tokenizer, draft, strategies, encoded, num_samples, max_new_tokens, seed,
                            progress)
    report: dict[str, Any] = {
        "prompts": [text for text, _ in encoded],
        "num_samples": num_samples,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "strategies": {},
    }
    constrained = any(s.constraint for s in strategies)  # a column of matches for every row
    for strat in strategies:
        r = results[strat.name]
        outs = r["outputs"]
        report["strategies"][strat.name] = {
            "options": dict(strat.options),
            "deterministic": strat.deterministic,
            "samples": len(outs),
            "mean_tokens": sum(map(len, outs)) / len(outs),
            "distinct_1": distinct_n(outs, 1),
            "distinct_2": distinct_n(outs, 2),
            "distinct_3": distinct_n(outs, 3),
            "repetition_rate_4": pooled_repetition_rate(outs, 4),
            "entropy": mean_of(r["entropy"]),
            "nll": mean_of(r["nll"]),
            **_speculative_metrics(r["stats"] if strat.speculative else None),
            **({"matches": sum(r["matches"]) / len(r["matches"])} if constrained else {}),
            "example": r["example"],
        }
    return report


def _speculative_metrics(stats: dict[str, int] | None) -> dict[str, Any]:
    """acceptance (drafts each row's test kept / drafts proposed) and tokens_per_pass (tokens per forward pass of
    the model: 1 for plain decoding); {} for a strategy that drafts nothing."""
    if stats is None:
        return {}
    return {"acceptance": stats["accepted"] / stats["drafted"] if stats["drafted"] else math.nan,
            "tokens_per_pass": stats["tokens"] / stats["steps"] if stats["steps"] else math.nan}


def _generate_all(model, tokenizer, draft, strategies, encoded, num_samples, max_new_tokens, seed, progress
                  ) -> dict[str, dict[str, Any]]:
    """{strategy name: outputs, per-token NLL and entropy, speculative counts, full matches of the report's
    constraint, example} over every prompt."""
    constraint = next((s.constraint for s in strategies if s.constraint), {})
    jobs = [(s, i) for s in strategies for i in range(len(encoded))]
    if progress:
        from tinylm.progress import bar

        jobs = bar(jobs, desc="sample-report", unit="run")
    results: dict[str, dict[str, Any]] = {}
    for strat, i in jobs:
        text, ids = encoded[i]
        config = SamplingConfig(**strat.options, max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id, seed=seed + i)
        rows = 1 if strat.deterministic else num_samples
        r = results.setdefault(strat.name, {"outputs": [], "nll": [], "entropy": [], "stats": {}, "matches": [],
                                            "example": None})
        outputs = generate_with(model, [ids] * rows, config, draft=draft if strat.draft else None,
                                tokenizer=tokenizer, stats=r["stats"])
        nll, ent = score_tokens(model, ids, outputs)
        copies = num_samples if strat.deterministic else 1
        r["outputs"] += [o for o in outputs for _ in range(copies)]
        r["nll"] += nll
        r["entropy"] += ent
        if constraint:
            from tinylm.generate.constrained import full_matches, grammar_text

            grammar = grammar_text(**{**dict.fromkeys(CONSTRAINTS), **constraint})
            r["matches"] += [m for m in full_matches(grammar, tokenizer, model.config.vocab_size, outputs)
                             for _ in range(copies)]
        if r["example"] is None:
            r["example"] = text + decode_after(tokenizer.decode, ids, outputs[0])
    return results


# ---- writing ---------------------------------------------------------------------------------------------------
COLUMNS = (  # (metrics key, table header)
    ("samples", "samples"), ("mean_tokens", "tokens/sample"), ("distinct_1", "distinct-1"),
    ("distinct_2", "distinct-2"), ("distinct_3", "distinct-3"), ("repetition_rate_4", "rep-4"),
    ("entropy", "entropy"), ("nll", "NLL"),
)
OPTIONAL_COLUMNS = (  # shown when some strategy has them: speculative ones, and any when a constraint is given
    ("acceptance", "accept"), ("tokens_per_pass", "tokens/pass"), ("matches", "matches"),
)


def columns(report: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """COLUMNS, and the OPTIONAL_COLUMNS some strategy of ``report`` has."""
    present = {k for m in report["strategies"].values() for k in m}
    return COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if c[0] in present)

HOW_TO_READ = """\
**How to read this.** *NLL* is how likely the model finds its own output (nats per token, teacher-forced, at
T = 1 without truncation); *entropy* is how unsure it was at each step of that output. For plain sampling at
T = 1 the two agree on average (each token is a draw from the distribution whose entropy is measured), so a gap
there means something is off; truncation (lower T, top-k, top-p, min-p) and search (greedy, beam) pull NLL below
entropy by keeping only the likely tokens. Compare NLL with the run's `val/loss`: output much *more* likely than
real text (NLL far below val loss) is bland or looping, output much *less* likely is drifting into noise.
*distinct-n* is unique n-grams / all n-grams pooled over all of a strategy's samples: higher means more varied
text. Greedy, beam and contrastive are deterministic, so they count as that many identical samples and score low
by construction: that is the variety you get by asking them again. *rep-4* is the fraction of 4-grams that
repeat an earlier 4-gram of the same sample: the signature of degenerate loops (n-grams are of tokens, so for a
char-level model normal text repeats many 4-grams too: compare strategies with each other, not with zero).
In the plot, good strategies sit up and to the left of the rest: varied (high distinct-2) yet likely (low NLL);
bottom-left is repetitive, far right is incoherent.
"""

HOW_TO_READ_SPECULATIVE = """\
**Speculative decoding** (`+ draft`, `+ lookup`) writes the model's own text, only in fewer forward passes of it:
greedy's twin gives greedy's text token for token, sampling's twin samples the same distribution, so their columns
should match their plain twins' (within sampling noise). *accept* is the fraction of drafted tokens the model's
accept/reject test kept; *tokens/pass* is tokens written per forward pass of the model (plain decoding: 1). The
samples of a sampling strategy run as one batch, which keeps at each step only what its least lucky row accepted:
there tokens/pass is the batch's, while *accept* is each row's own.
"""

HOW_TO_READ_CONSTRAINED = """\
**Constrained decoding** (`+ regex`, `+ json_schema`, `+ grammar`) masks every token the constraint does not allow;
*matches* is the fraction of samples whose new text is a whole match (the others were cut by max_new_tokens, or,
for free text, left the constraint). The NLL of a constrained strategy is the model's, unconstrained: how far the
constraint pushed the model from what it would write.
"""


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:  # a metric this strategy has not (acceptance of plain decoding)
        return "–"
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def format_markdown(report: dict[str, Any], *, plot_name: str | None) -> str:
    """The report.md text: settings, the metrics table, one example per strategy, how to read it."""
    prompts = ", ".join(_code(repr(p)) if p else "(empty: starts from end-of-text)" for p in report["prompts"])
    cols = columns(report)
    lines = [
        "# Sample report",
        "",
        (f"Checkpoint: `{report.get('checkpoint', '?')}`. Prompts: {prompts}. {report['num_samples']} samples per "
         f"prompt, up to {report['max_new_tokens']} new tokens each, seed {report['seed']}."),
        "",
        "| strategy | " + " | ".join(h for _, h in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for name, m in report["strategies"].items():
        samples = f"{m['samples']} (1 run/prompt)" if m["deterministic"] else str(m["samples"])
        cells = [samples, _fmt(m["mean_tokens"], 1)] + [_fmt(m.get(k)) for k, _ in cols[2:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "NLL and entropy in nats per generated token; rep-4 is the 4-gram repetition rate.", ""]
    if plot_name:
        lines += [f"![diversity vs likelihood]({plot_name})", ""]
    lines += [HOW_TO_READ]
    present = {k for k, _ in cols}
    lines += [HOW_TO_READ_SPECULATIVE] if "acceptance" in present else []
    lines += [HOW_TO_READ_CONSTRAINED] if "matches" in present else []
    lines += ["## One sample per strategy", ""]
    for name, m in report["strategies"].items():
        text = m["example"]
        fence = "`" * max(3, _longest_run(text, "`") + 1)  # a fence longer than any backtick run inside
        lines += [f"### {name}", "", fence + "text", text, fence, ""]
    return "\n".join(lines)


def _code(text: str) -> str:
    """``text`` as a Markdown code span, shown as it is: a prompt's ``*hi*``, ``<b>`` or backticks were read as
    emphasis, HTML and code. (Its delimiter is longer than any backtick run inside; a repr starts with a quote.)"""
    ticks = "`" * (_longest_run(text, "`") + 1)
    return ticks + text + ticks


def _longest_run(text: str, char: str) -> int:
    best = run = 0
    for c in text:
        run = run + 1 if c == char else 0
        best = max(best, run)
    return best


def plot_diversity_vs_likelihood(report: dict[str, Any], path: Path) -> bool:
    """Scatter x = NLL, y = distinct-2, one numbered point per strategy; False (and a warning) without matplotlib."""
    try:
        fig = diversity_figure(report)
    except ImportError:
        warnings.warn("matplotlib is not installed, so no plot was drawn; pip install 'tinylm[plots]'")
        return False
    fig.savefig(path)
    return True


LABEL_DPI = 120


def diversity_figure(report: dict[str, Any]):
    """The matplotlib Figure of `plot_diversity_vs_likelihood`: numbered points, a legend of the names, and number
    labels that never overlap (`_place_labels`). Raises ImportError without matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # a bare Figure on the Agg canvas: no pyplot, so the caller's backend and open figures are untouched
    fig = Figure(figsize=(9, 5), dpi=LABEL_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    points = []
    colour = _colours(len(report["strategies"]))
    for i, (name, m) in enumerate(report["strategies"].items(), start=1):
        x, y = m["nll"], m["distinct_2"]
        if x is None or y is None or math.isnan(x) or math.isnan(y):
            continue
        # numbered points and a legend: strategies often land on top of each other, full names would overlap
        ax.scatter(x, y, marker="s" if m["deterministic"] else "o", color=colour(i), label=f"{i}  {name}")
        points.append((x, y, i))
    ax.margins(0.12)
    ax.set_xlabel("model NLL of its own output (nats/token, lower = more likely)")
    ax.set_ylabel("distinct-2 across samples (higher = more varied)")
    ax.set_title("Diversity vs likelihood per decoding strategy (squares: deterministic)")
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8, frameon=False)
    fig.canvas.draw()  # the layout is settled (labels take no part in it): screen positions are final
    _place_labels(fig, ax, points, colour)
    return fig


def _colours(n: int):
    """Point i's colour: matplotlib's 10-colour cycle, or tab20's 20 where there are more strategies (a draft and a
    grammar make 14: points 1 and 11 were one colour)."""
    if n <= 10:
        return lambda i: f"C{(i - 1) % 10}"
    from matplotlib import colormaps

    return lambda i: colormaps["tab20"]((i - 1) % 20)


def _place_labels(fig, ax, points: list[tuple[float, float, int]], colour) -> None:
    """Number each point. Points whose markers touch share one label ("1,10": a speculative twin sits on its plain
    strategy); a label that would overlap one placed before it moves up past it, in the order of the points'
    heights, so no two labels overlap."""
    pixels = ax.transData.transform([(x, y) for x, y, _ in points]) if points else []
    groups: list[tuple[Any, list[int]]] = []  # (screen position, numbers)
    for (px, py), (_, _, n) in zip(pixels, points, strict=True):
        near = next((g for g in groups if abs(g[0][0] - px) < 8 and abs(g[0][1] - py) < 8), None)
        if near is None:
            groups.append(((px, py), [n]))
        else:
            near[1].append(n)
    renderer = fig.canvas.get_renderer()
    placed = []
    per_point = 72 / fig.dpi  # points per pixel
    for (px, py), numbers in sorted(groups, key=lambda g: (g[0][1], g[0][0])):
        x, y = ax.transData.inverted().transform((px, py))
        label = ax.annotate(",".join(map(str, numbers)), (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=8, color=colour(numbers[0]), annotation_clip=False)
        label.set_in_layout(False)
        for _ in range(len(placed) + 1):  # each move clears one label at least
            box = label.get_window_extent(renderer).expanded(1.0, 1.0)
            hit = next((b for b in placed if b.overlaps(box)), None)
            if hit is None:
                break
            dx, dy = label.xyann
            label.xyann = (dx, dy + (hit.y1 - box.y0 + 2) * per_point)
        placed.append(label.get_window_extent(renderer))


REPORT_FILES = ("report.md", "metrics.json", "diversity_vs_likelihood.png")
PARTIAL = ".tinylm-report.partial"  # the report being written, inside the folder; left only by a killed report


def check_report_folder(out_dir: str | Path, checkpoint: str | Path | None = None) -> None:
    """Refuse a path that is no folder to write (`check_output_path`), and a folder holding anything but an earlier
    report (whose metrics.json names its checkpoint): a user's report.md or notes there are not ours to replace. And
    a ``checkpoint`` name metrics.json cannot record (bytes that are not UTF-8: a UnicodeEncodeError traceback after
    all the sampling)."""
    check_output_path(out_dir, folder=True)
    if checkpoint is not None and (why := not_utf8(str(checkpoint), "rename it in UTF-8 (convmv -f latin1 -t utf8 "
                                                   "--notest NAME, or mv) and pass --ckpt_path NEW_NAME")):
        raise ValueError(f"--ckpt_path {str(checkpoint)!r} is no UTF-8 text, which the report records: {why}")
    out = Path(out_dir)
    if not out.is_dir():
        return
    names = sorted(p.name for p in out.iterdir() if p.name != PARTIAL)
    foreign = [n for n in names if n not in REPORT_FILES]
    if not foreign and names:
        try:
            earlier = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            earlier = None
        if not (isinstance(earlier, dict) and "checkpoint" in earlier and "strategies" in earlier):
            foreign = [n for n in names if n != "diversity_vs_likelihood.png"] or names
    if foreign:
        raise FileExistsError(f"--out {str(out)!r} holds files that are not a tinylm sample report "
                              f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); pass a new or "
                              "empty folder")


REPORT_KEYS = {"prompts", "num_samples", "max_new_tokens", "seed", "strategies"}  # what write_report reads


def write_report(report: dict[str, Any], out_dir: str | Path) -> Path:
    """Write report.md, metrics.json and diversity_vs_likelihood.png into out_dir (created); returns report.md.

    They are written whole into a folder inside out_dir first, then moved in place of an earlier report's: a full
    disk or a kill leaves the earlier report as it was, never a mix of the two."""
    missing = REPORT_KEYS - set(report) if isinstance(report, dict) else REPORT_KEYS
    if missing:  # before the folder is made: a KeyError midway left it behind
        raise ValueError(f"report must be what sample_report returns; this one has no {', '.join(sorted(missing))}")
    out = Path(out_dir)
    check_report_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / PARTIAL
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        plot = "diversity_vs_likelihood.png"
        drawn = plot_diversity_vs_likelihood(report, tmp / plot)
        # NaN is not JSON: empty outputs are written as null
        clean = json.loads(json.dumps(report), parse_constant=lambda c: None if c == "NaN" else float(c))
        (tmp / "metrics.json").write_text(json.dumps(clean, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (tmp / "report.md").write_text(format_markdown(report, plot_name=plot if drawn else None), encoding="utf-8")
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise naming(e, out) from None  # a full disk: PIL's and close()'s errors name no file
    if not drawn:
        (out / plot).unlink(missing_ok=True)  # a plot left from an earlier report would not match these numbers
    for new in sorted(tmp.iterdir(), key=lambda p: p.name == "metrics.json"):  # metrics.json, which marks a
        new.replace(out / new.name)  # report as ours, comes last
    tmp.rmdir()
    return out / "report.md"
