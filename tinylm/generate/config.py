"""SamplingConfig: every decoding option, declared once (type, default, meaning, valid range).

The library's `generate`, `tinylm generate`, the samples a run writes as it trains (`--samples.*`) and
`tinylm sample-report` take these options under their own spellings (``top_p``, ``--top_p``, ``samples.top_p``);
`tinylm.generate.options` derives their signatures from this class, and `check_options` names a bad value the way
the user spelled it.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from tinylm.ranges import check_ranges

Strategy = Literal["greedy", "sample", "beam", "contrastive"]
STRATEGIES: tuple[str, ...] = typing.get_args(Strategy)
CONTRASTIVE_DEFAULT_TOP_K = 4  # candidates per step when top_k is not given (the contrastive-search paper uses 4-10)
# the strategies each decoding option shapes (repetition_penalty, no_repeat_ngram_size, max_new_tokens: all)
USED_BY = {"temperature": ("sample",), "top_k": ("sample", "contrastive"), "top_p": ("sample",), "min_p": ("sample",),
           "typical_p": ("sample",), "num_beams": ("beam",), "length_penalty": ("beam",), "early_stopping": ("beam",),
           "penalty_alpha": ("contrastive",), "seed": ("sample",)}

# Upper bounds that catch a typo (an extra zero or three) before it runs for hours; memory is checked separately,
# against the machine, by strategies.check_memory.
MAX_NEW_TOKENS = 1_000_000
MAX_BEAMS = 256
MIN_TEMPERATURE = 1e-4  # colder is argmax anyway (strategy "greedy"), and logits / 1e-40 overflow float32
MIN_PENALTY = 1e-3
MAX_LENGTH_PENALTY = 10.0
MAX_DRAFT_TOKENS = 64  # a draft that long is rejected early anyway; the check costs K + 1 positions of logits
MAX_LOOKUP_NGRAM = 16
CONSTRAINTS = ("regex", "json_schema", "grammar")
SPECULATIVE = ("greedy", "sample")  # strategies speculative decoding keeps exact (one sequence per row)
RANGES = {
    "max_new_tokens": f"[1, {MAX_NEW_TOKENS}]", "top_k": "[1, inf)", "top_p": "(0, 1]", "min_p": "[0, 1]",
    "typical_p": "(0, 1]", "no_repeat_ngram_size": "[0, inf)", "repetition_penalty": f"[{MIN_PENALTY}, inf)",
    "length_penalty": f"[-{MAX_LENGTH_PENALTY:g}, {MAX_LENGTH_PENALTY:g}]", "seed": "[0, 2**63)",
    "num_beams": f"[1, {MAX_BEAMS}]", "penalty_alpha": "[0, 1]", "eos_id": "[0, inf)",
    "num_draft_tokens": f"[1, {MAX_DRAFT_TOKENS}]", "prompt_lookup": f"[0, {MAX_LOOKUP_NGRAM}]",
}
"""Valid values of SamplingConfig's numeric fields (interval notation, see tinylm.ranges); temperature's depends on
the strategy (`check_options`)."""
WHOLE = ("max_new_tokens", "top_k", "seed", "num_beams", "eos_id", "no_repeat_ngram_size", "num_draft_tokens",
         "prompt_lookup")
UNSET_IS_OFF = ("top_k", "top_p", "min_p", "typical_p", "seed", "eos_id")  # None is a value of these (off / unset)
_HINTS = {  # after "NAME must be in [..], got X"; {strategy} is how the surface spells the strategy option
    "temperature": "; for the most likely token at each step use the greedy strategy ({strategy} greedy)",
    "top_k": "; leave it unset for no limit",
    "repetition_penalty": " (1.0 is off)",
    "length_penalty": " (1.0: the mean log-probability; 0: the sum)",
}


@dataclass
class SamplingConfig:
    """How to decode; validated on creation (bad values raise ValueError naming the value)."""

    strategy: Strategy = "sample"
    """Decoding strategy: greedy (the most likely token), sample (draw from the distribution), beam (beam search),
    contrastive (contrastive search)."""
    max_new_tokens: int = 256
    """Most tokens to generate per sample (the end-of-text token and stop strings can end one earlier)."""
    temperature: float = 1.0
    """sample: divide the logits by this; < 1 sharper, > 1 flatter. Must be > 0 (the greedy strategy is
    temperature 0)."""
    top_k: int | None = None
    """sample: keep only the k most likely tokens (exactly k, ties broken by torch.topk); null keeps all.
    contrastive: candidates per step (null: 4)."""
    top_p: float | None = None
    """sample: nucleus; keep the smallest set of most likely tokens whose probability sums to >= top_p, in (0, 1]."""
    min_p: float | None = None
    """sample: drop tokens less likely than min_p x the most likely token's probability, in [0, 1]."""
    typical_p: float | None = None
    """sample: locally typical sampling (Meister et al. 2022); keep the tokens whose surprise is nearest the
    entropy until their probability sums to >= typical_p, in (0, 1] (0.2-0.95 in the paper)."""
    repetition_penalty: float = 1.0
    """All strategies: CTRL penalty on tokens already in the text (prompt included); > 1 discourages repeats,
    1 is off. A positive logit is divided by it, a negative one multiplied (beam: applied to log-probabilities)."""
    no_repeat_ngram_size: int = 0
    """All strategies: never produce an n-gram of this many tokens that the text (prompt included) already holds;
    0 is off. A row for which every token would repeat one is left free at that step."""
    num_beams: int = 1
    """beam: beams kept per prompt (the beam width)."""
    length_penalty: float = 1.0
    """beam: hypotheses are ranked by sum(log-probs) / length**length_penalty; > 0 favours longer ones."""
    early_stopping: bool = False
    """beam: stop a prompt as soon as num_beams hypotheses have ended; false stops once the best running beam,
    scored as if it ended now, ranks below them all (transformers' heuristic: exact for length_penalty <= 0; above
    0 a longer beam could still have won)."""
    penalty_alpha: float = 0.6
    """contrastive: weight of the degeneration penalty (max cosine similarity to earlier hidden states), in
    [0, 1]; 0 is greedy."""
    eos_id: int | None = None
    """Stop a row when it produces this token (the EOS is not returned)."""
    stop_strings: str | list[str] | None = None
    """Stop a row once its decoded new text contains one of these (the tokens that made it are returned);
    needs a `decode` function."""
    seed: int | None = None
    """Seed of sampling's random numbers (drawn from a generator of their own: the global RNG is untouched); null
    draws from the global RNG."""
    use_cache: bool = True
    """Reuse attention keys/values of earlier tokens (same output, many times faster); false recomputes all."""
    num_draft_tokens: int = 4
    """Speculative decoding (a draft model, or prompt_lookup): tokens drafted per step, all checked by one forward
    pass of the model; in [1, 64]."""
    prompt_lookup: int = 0
    """Speculative decoding without a draft model (greedy, sample): draft the tokens that followed the latest
    earlier occurrence of the text's last n tokens, n from this down to 1 (prompt lookup; pays on text that repeats
    its prompt); 0 is off."""
    regex: str | None = None
    """Constrained decoding: every sample's new text matches this regular expression (needs llguidance:
    pip install 'tinylm[grammar]')."""
    json_schema: str | None = None
    """Constrained decoding: every sample's new text is JSON valid under this JSON Schema (the schema, or the path
    of a .json file holding it)."""
    grammar: str | None = None
    """Constrained decoding: every sample's new text is in the language of this Lark grammar (llguidance's
    dialect, rule `start`; the grammar, or the path of a .lark file holding it)."""

    def __post_init__(self) -> None:
        check_options(vars(self))
        for f in fields(self):  # a switch given as text ("never", "no") is true in Python: early_stopping="never"
            if f.type in (bool, "bool") and not isinstance(getattr(self, f.name), bool):  # stopped beams early
                raise ValueError(f"{f.name} must be true or false, got {getattr(self, f.name)!r}")
        if isinstance(self.stop_strings, str):
            self.stop_strings = [self.stop_strings]  # a lone string would otherwise stop at any of its characters


DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(SamplingConfig)}


@dataclass(frozen=True)
class Spelling:
    """How a surface names the decoding options to its user: `form` "{}" (the library's keyword arguments), "--{}"
    (a command's flags) or "samples.{}" (a section of fit's config); `renames` for fields it calls otherwise
    (`tinylm generate` takes stop_strings as --stop)."""

    form: str = "{}"
    renames: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, name: str) -> str:
        return self.form.format(self.renames.get(name, name))

    def flag(self, name: str) -> str:
        """The option as a command-line flag: ``--top_p``, ``--samples.top_p``."""
        return "--" + self(name).removeprefix("--")


LIBRARY = Spelling()


def check_options(values: Mapping[str, Any], spell: Spelling = LIBRARY) -> None:
    """Raise ValueError naming the first bad decoding option of ``values`` (SamplingConfig fields; a missing one has
    its default) the way ``spell`` spells it: ``--top_p must be in (0, 1], got 0.0``."""
    values = {**DEFAULTS, **values}
    strategy = values["strategy"]
    if strategy not in STRATEGIES:
        where = "" if spell("strategy") == "strategy" else f"{spell('strategy')}: "
        raise ValueError(f"{where}unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    ranges = dict(RANGES)
    if strategy == "sample":  # logits / 1e-40 overflow; inf samples uniformly, whatever the model says
        ranges["temperature"] = f"[{MIN_TEMPERATURE}, inf)"
    unset = next((k for k in ranges if k not in UNSET_IS_OFF and values[k] is None), None)
    if unset is not None:  # (check_ranges passes None: unset, the default; these have no unset form)
        raise ValueError(f"{spell(unset)} needs a value, got None")
    named = {spell(k): k for k in ranges}
    try:
        check_ranges("", {spell(k): values[k] for k in ranges}, {spell(k): r for k, r in ranges.items()},
                     whole=[spell(k) for k in WHOLE])
    except ValueError as e:
        name = named[str(e).split()[0]]
        t = values["temperature"]
        hot = name == "temperature" and not (isinstance(t, (int, float)) and t < MIN_TEMPERATURE)  # inf: greedy no fix
        hint = "" if hot else _HINTS.get(name, "").format(strategy=spell.flag("strategy"))
        raise ValueError(f"{e}{hint}") from None
    if values["num_beams"] > 1 and strategy != "beam":
        raise ValueError(f"{spell('num_beams')}={values['num_beams']} needs the beam strategy "
                         f"({spell.flag('strategy')} beam), got {spell('strategy')} {strategy!r}")
    constraints = [k for k in CONSTRAINTS if values[k] is not None]
    if len(constraints) > 1:
        raise ValueError(f"{' and '.join(spell(k) for k in constraints)} both constrain the text; give one")
    bad = next((k for k in constraints if not isinstance(values[k], str) or not values[k].strip()), None)
    if bad:
        raise ValueError(f"{spell(bad)} must be a non-empty string, got {values[bad]!r}")
    check_speculative(values, spell)
    stops = values["stop_strings"]
    stops = [stops] if isinstance(stops, str) else stops
    if stops is not None and not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"{spell('stop_strings')} must be non-empty strings, got {values['stop_strings']!r}")


def check_speculative(values: Mapping[str, Any], spell: Spelling = LIBRARY, draft: str | None = None) -> None:
    """Refuse, naming the options as ``spell`` spells them, what speculative decoding (``draft``: the draft
    checkpoint a surface was given, or ``values``' prompt_lookup) cannot do exactly: beams or candidates, a grammar,
    two drafters at once."""
    values = {**DEFAULTS, **values}
    using = [k for k, on in (("draft_ckpt_path", draft), ("prompt_lookup", values["prompt_lookup"])) if on]
    if not using:
        return
    if len(using) > 1:
        raise ValueError(f"{spell('draft_ckpt_path')} and {spell('prompt_lookup')} both draft tokens; give one")
    constraints = [k for k in CONSTRAINTS if values[k] is not None]
    if constraints:
        raise ValueError(f"{spell(constraints[0])} with {spell(using[0])}: speculative decoding does not take a "
                         "grammar yet; drop one")
    if values["strategy"] not in SPECULATIVE:
        raise ValueError(f"{spell(using[0])} (speculative decoding) needs the greedy or sample strategy, got "
                         f"{spell('strategy')} {values['strategy']!r}; drop {spell.flag(using[0])}")


def idle_draft_tokens(values: Mapping[str, Any], spell: Spelling = LIBRARY, draft: str | None = None) -> str | None:
    """A warning for num_draft_tokens set where nothing drafts (no ``draft`` checkpoint, no prompt lookup), as
    `unused_options` warns of a strategy's options set under another strategy; None where it is not."""
    values = {**DEFAULTS, **values}
    if draft or values["prompt_lookup"] or values["num_draft_tokens"] == DEFAULTS["num_draft_tokens"]:
        return None
    return (f"{spell('num_draft_tokens')} does nothing without a drafter (it shapes speculative decoding: "
            f"{spell('draft_ckpt_path')} or {spell('prompt_lookup')} N)")


def idle_beam_options(values: Mapping[str, Any], spell: Spelling = LIBRARY, tokenizer: str = "this") -> str | None:
    """A warning for length_penalty / early_stopping under beam search where no beam can end before max_new_tokens
    (no eos_id, stop string or constraint: all then end at one length, together); None where they can act."""
    values = {**DEFAULTS, **values}
    if values["strategy"] != "beam" or values["eos_id"] is not None or any(values[k] for k in ("stop_strings",
                                                                                             *CONSTRAINTS)):
        return None
    given = [spell(k) for k in ("length_penalty", "early_stopping") if values[k] != DEFAULTS[k]]
    if not given:
        return None
    return (f"{' and '.join(given)} {'does' if len(given) == 1 else 'do'} nothing here: the {tokenizer} tokenizer "
            f"has no end-of-text token, so every beam runs to {spell('max_new_tokens')} and they end together; give "
            f"a stop string for beams to end early")


def unused_options(strategy: str, values: Mapping[str, Any], defaults: Mapping[str, Any],
                   spell: Spelling = LIBRARY) -> str | None:
    """A warning naming the options of ``values`` set away from their ``defaults`` that ``strategy`` ignores (None
    if there are none), spelled as the user typed them."""
    given = [k for k, v in values.items() if k in USED_BY and v != defaults[k] and strategy not in USED_BY[k]]
    if not given:
        return None
    verb, they = ("does", "it shapes") if len(given) == 1 else ("do", "they shape")
    strategies = " / ".join(sorted({s for k in given for s in USED_BY[k]}))
    return (f"{', '.join(spell(k) for k in given)} {verb} nothing with {spell('strategy')} {strategy} "
            f"({they} {spell('strategy')} {strategies})")
