"""Options that do nothing in the mode a run chose: one table, checked once after `tinylm fit` parsed its config
(and took what a resume takes from the checkpoint), warning in one line for each such option the run sets away
from its default. ``--model.muon_lr 0.05`` with ``optimizer: adamw`` trained exactly as without it, silently.

The decoding options of ``--samples.*`` that their strategy ignores are warned of by the same rule, by the
sampling surfaces themselves (tinylm.generate.config.USED_BY: one table for generate, samples and sample-report)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from tinylm.data.clean import RULES as CLEAN_RULES

log = logging.getLogger("tinylm")


@dataclass(frozen=True)
class Needs:
    """An option has an effect only when ``control`` (a config key) has a value for which ``active`` is true;
    ``hint`` says how to give it one."""

    control: str
    active: Callable[[Any], bool]
    hint: str
    also: tuple[str, ...] = ()  # other config keys that give it its effect just as well (by the same ``active``)


_MUON = Needs("model.optimizer", lambda v: v == "muon", "--model.optimizer muon")
_DECAYS = Needs("model.lr_schedule", lambda v: v != "constant",
                "--model.lr_schedule cosine or wsd (constant holds model.lr after warmup)")
_TRAINED = Needs("data.tokenizer", lambda v: v in ("bpe", "scratch-bpe"),
                 "--data.tokenizer bpe or scratch-bpe (a trained tokenizer; the others bring their own vocabulary)")
_GUARD = Needs("guard.enabled", lambda v: v is not False, "--guard.enabled true")
_SAMPLES = Needs("samples.every_n_steps", lambda v: bool(v), "--samples.every_n_steps N (0 turns sampling off)")
_EVAL = Needs("eval.tasks", lambda v: bool(v), "--eval.tasks hellaswag,... (no tasks: no in-loop evaluation)")
_MINHASH = Needs("data.clean.near", lambda v: v is True, "--data.clean.near true or --data.clean.decontaminate true",
                 also=("data.clean.decontaminate",))
def _reads_a_dataset(corpus: Any) -> bool:
    """Whether `data.corpus` may read a `datasets` dataset: hf:NAME, a .jsonl/.parquet/.csv file, or a folder or
    glob (which may hold such files); a text file or a named corpus never does."""
    from pathlib import Path

    from tinylm.data.hf_corpus import LOCAL_DATASET_BUILDERS

    specs = [corpus] if isinstance(corpus, str) else list(corpus or [])
    return any(not isinstance(s, str) or s.startswith("hf:") or Path(s).suffix.lower() in LOCAL_DATASET_BUILDERS
               or any(c in s for c in "*?[") or Path(s).expanduser().is_dir() for s in specs)


def _fsdp2(strategy: Any) -> bool:
    """Whether `trainer.strategy` is FSDP2 as tinylm.train.parallel reads it (`fsdp`, `fsdp2`, any case)."""
    from tinylm.train.parallel import FSDP2_NAMES  # (only for a run that sets the option: fit has Lightning already)

    return isinstance(strategy, str) and strategy.lower() in FSDP2_NAMES


_DATASET = Needs("data.corpus", _reads_a_dataset,
                 "a dataset corpus (hf:NAME, a .jsonl/.parquet/.csv file: text files have no splits or columns)")
_VALIDATES = Needs("trainer.limit_val_batches", lambda v: v is None or isinstance(v, bool) or float(v) > 0,
                   "validation on (trainer.limit_val_batches unset or above 0: the tasks are scored at validation "
                   "time)")
_CHECKPOINTS = Needs("trainer.enable_checkpointing", lambda v: v is not False,
                     "trainer.enable_checkpointing left on")

UNUSED_UNLESS: dict[str, Needs] = {
    "model.muon_lr": _MUON, "model.muon_momentum": _MUON, "model.muon_weight_decay": _MUON,
    "model.min_lr": _DECAYS, "model.decay_steps": _DECAYS,
    "model.decay_fraction": Needs("model.lr_schedule", lambda v: v == "wsd", "--model.lr_schedule wsd"),
    "model.rope_theta": Needs("model.positions", lambda v: v == "rope", "--model.positions rope"),
    "model.fsdp_reshard_after_forward": Needs("trainer.strategy", _fsdp2, "--trainer.strategy fsdp"),
    "data.max_documents": Needs("data.streaming", lambda v: bool(v),
                                "--data.streaming true (a corpus read whole is read whole)"),
    "data.vocab_size": _TRAINED, "data.tokenizer_train_chars": _TRAINED,
    **{f"data.{k}": _DATASET for k in ("split", "val_split", "text_column", "data_files", "hf_config", "hf_revision")},
    "data.weights": Needs("data.corpus", lambda v: isinstance(v, (list, tuple)) and len(v) > 1,
                          "a list of corpora to mix (--data.corpus '[a.txt, b.txt]')"),
    **{f"data.clean.{k}": _MINHASH for k in ("near_threshold", "shingle_words", "num_perm")},
    "data.clean.examples": Needs("data.clean.exact", lambda v: v is not None and v is not False,  # (0: the strictest)
                                 "a --data.clean.* rule (exact, near, min_words, ...): no rule, no clean.json report",
                                 also=tuple(f"data.clean.{r}" for r in CLEAN_RULES if r != "exact")),
    **{f"guard.{k}": _GUARD for k in ("loss_z", "grad_norm_z", "window", "min_history", "rollback_skips",
                                      "rollback_loss_rise", "lr_factor", "max_rollbacks")},
    **{f"samples.{k}": _SAMPLES for k in ("prompts", "max_new_tokens", "strategy", "temperature", "top_k", "top_p",
                                          "min_p", "typical_p", "repetition_penalty", "no_repeat_ngram_size",
                                          "num_beams", "seed", "draft_ckpt_path", "prompt_lookup",
                                          "num_draft_tokens", "regex", "json_schema", "grammar")},
    "eval.tasks": _VALIDATES,
    **{f"eval.{k}": _EVAL for k in ("every_n_steps", "limit", "batch_size", "data_dir")},
    "run.checkpoint_every": _CHECKPOINTS, "run.keep_checkpoints": _CHECKPOINTS,
}
"""Option -> when it has an effect. (model.prefix_len without attn_mask prefix is refused, not warned of: a prefix
the user asked for and did not get changes what the loss counts.)"""


def _get(cfg: Any, key: str) -> Any:
    """``cfg``'s value at a dotted key (``data.clean.near``: a section's option, or an option of an option)."""
    value = cfg
    for name in key.split("."):
        try:
            value = value[name]
        except (KeyError, TypeError, AttributeError):
            value = getattr(value, name, None)
        if value is None:
            return None
    return value


def unused_options(cfg: Any, defaults: Any, typed: AbstractSet[str] = frozenset(), *,
                   only: set[str] | None = None) -> list[str]:
    """One line for each option of UNUSED_UNLESS that ``cfg`` (a parsed fit config) sets away from ``defaults``
    while the option that gives it its effect is set so that it has none; not when that option was ``typed`` on
    the command line and this one was not: a mode turned off there leaves the config's settings of it idle, as
    meant (`--samples.every_n_steps 0` under a recipe that sets samples.prompts, and every rung of `scaling`).
    ``only``: name no other options (a resume: the run's own config was warned of when it started)."""
    lines = []
    for key, needs in UNUSED_UNLESS.items():
        if only is not None and key not in only:
            continue
        value, control = _get(cfg, key), _get(cfg, needs.control)
        if value == _get(defaults, key) or any(needs.active(_get(cfg, k)) for k in (needs.control, *needs.also)):
            continue
        if key not in typed and any(k in typed for k in (needs.control, *needs.also)):
            continue
        lines.append(f"{key}={value!r} does nothing with {needs.control}={control!r}: it is used only with "
                     f"{needs.hint}; drop it, or turn that on")
    return lines


def warn_unused_options(cfg: Any, defaults: Any, typed: AbstractSet[str] = frozenset(), *,
                        only: set[str] | None = None) -> None:
    for line in unused_options(cfg, defaults, typed, only=only):
        log.warning("%s", line)


TRAINING_ONLY = ("trainer.max_steps", "trainer.min_steps", "trainer.max_time", "trainer.max_epochs",
                 "trainer.min_epochs", "trainer.accumulate_grad_batches", "trainer.gradient_clip_val",
                 "trainer.gradient_clip_algorithm", "trainer.val_check_interval", "trainer.check_val_every_n_epoch",
                 "trainer.num_sanity_val_steps", "trainer.limit_train_batches", "trainer.log_every_n_steps",
                 "trainer.enable_checkpointing", "trainer.reload_dataloaders_every_n_epochs",
                 "run.checkpoint_every", "run.keep_checkpoints", "data.seed")
"""Options of training alone: given to `tinylm validate`, they change nothing."""

TRAINING_SECTIONS = {"guard": "it judges training steps", "samples": "it samples while training",
                     "eval": "in-loop evals run in fit; tinylm eval --ckpt_path PATH scores a checkpoint"}
"""Sections of training alone, and why each does nothing in `tinylm validate`."""


def warn_training_flags(flags: set[str]) -> None:
    """`tinylm validate --trainer.max_steps 5` (a fit command edited into a validate one): said, not silently
    ignored. Only options typed on the command line: a config file is fit's and validate's alike."""
    _say_idle(TRAINING_ONLY, flags, "validate", "it sets training")
    for section, why in TRAINING_SECTIONS.items():
        if keys := sorted(k for k in flags if k.startswith(f"{section}.")):
            log.warning("--%s %s nothing in tinylm validate (%s); drop %s", ", --".join(keys),
                        "does" if len(keys) == 1 else "do", why, "it" if len(keys) == 1 else "them")


LOADER_ONLY = ("data.batch_size", "data.num_workers", "data.seed", "data.val_batches")
"""Data options of the batches alone: the dataset `tinylm prepare` writes is the same whatever they say."""


def warn_loader_flags(flags: set[str]) -> None:
    """`tinylm prepare --data.batch_size 999`: said, not silently ignored. Only options typed on the command line: a
    config file is fit's and prepare's alike."""
    _say_idle(LOADER_ONLY, flags, "prepare", "it sets the batches training draws")


def _say_idle(keys: tuple[str, ...], flags: set[str], command: str, why: str) -> None:
    """One warning for each of ``keys`` typed on the command line (``flags``) that ``command`` does not use."""
    for key in sorted(set(keys) & flags):
        log.warning("--%s does nothing in tinylm %s (%s); drop it", key, command, why)
