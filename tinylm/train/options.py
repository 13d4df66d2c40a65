"""TinyLM's options: GPTConfig's fields (the model's, declared and documented once, in tinylm/model/config.py) and
TinyLM's own (loss, optimizer, schedule, ...), as one signature; and the checks of their values (`RANGES`,
`check_options`).

LightningCLI (jsonargparse) makes ``--model.*`` of the parameters that `inspect.signature` finds on
``TinyLM.__init__``, which is the function's ``__signature__`` when it has one, with the help text of each from the
``Args:`` sections of ``TinyLM.__init__``'s and TinyLM's docstrings. TinyLM's real ``__init__`` takes its own options
by name and GPTConfig's fields as ``**config``; `config_options` gives it the merged signature (each field with its
annotation and default) and an ``Args:`` docstring made of the fields' attribute docstrings. `tinylm fit --help`,
``--print_config``, `TinyLM(n_layer=4, lr=1e-3)` and ``load_from_checkpoint`` all go through that signature.
"""

from __future__ import annotations

import inspect
import os
import textwrap
import typing
from collections.abc import Callable
from dataclasses import fields
from types import FrameType
from typing import Any

from tinylm.errors import TinyLMError
from tinylm.model import GPTConfig
from tinylm.model.config import CONFIG_RANGES
from tinylm.ranges import check_ranges
from tinylm.train.optim import OPTIMIZERS
from tinylm.train.schedules import SCHEDULES

OWN_OPTIONS = ("prefix_len", "optimizer", "muon_lr", "muon_momentum", "muon_weight_decay", "lr", "min_lr",
               "lr_schedule", "warmup_steps", "decay_steps", "decay_fraction", "weight_decay", "beta1", "beta2",
               "compile_model", "activation_checkpointing", "fsdp_reshard_after_forward", "init_from")
"""TinyLM's own options, as its ``__init__`` declares them (tests/model/test_model_options.py checks): with
GPTConfig's fields, every name a checkpoint's hyperparameters hold; known here without importing the module."""

FOLLOWS = {"prefix_len": "attn_mask"}
"""TinyLM's own options that the signature (and so `--help`) lists right after the GPTConfig field they qualify;
the others come after all the fields, in the order ``__init__`` declares them."""


def config_docs() -> dict[str, str]:
    """Field name -> its attribute docstring in GPTConfig (whitespace collapsed: argparse rewraps help anyway)."""
    import docstring_parser  # jsonargparse[signatures]'s own docstring reader

    try:
        parsed = docstring_parser.parse_from_object(GPTConfig)  # reads the source, as jsonargparse would
    except OSError:  # installed without sources (.pyc only): the options work, their --help has no text
        return {}
    return {p.arg_name: " ".join(p.description.split()) for p in parsed.params if p.description}


def config_options(init: Callable) -> Callable:
    """Decorator for an ``__init__(self, *, <own options>, **config)``: gives it the signature of its own options
    merged with GPTConfig's fields (FOLLOWS places some of its own among them) and an ``Args:`` docstring of the
    fields."""
    hints = typing.get_type_hints(GPTConfig)  # real types, not the strings `from __future__ import annotations` left
    signature = inspect.signature(init, eval_str=True)
    self_param, *own, var_keyword = signature.parameters.values()
    assert var_keyword.kind is inspect.Parameter.VAR_KEYWORD, f"{init.__qualname__} takes GPTConfig's fields as **"
    params = [self_param]
    for f in fields(GPTConfig):
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                        annotation=hints[f.name]))
        params += [p for p in own if FOLLOWS.get(p.name) == f.name]
    params += [p for p in own if p.name not in FOLLOWS]
    init.__signature__ = signature.replace(parameters=params)
    docs = config_docs()
    args = [textwrap.fill(docs.get(f.name, ""), 116, initial_indent=f"    {f.name}: ", subsequent_indent=" " * 8)
            for f in fields(GPTConfig)]
    # a first line, or docstring_parser reads "Args:" as the summary and finds no arguments
    init.__doc__ = "GPTConfig's fields, merged in by tinylm.train.options.\n\nArgs:\n" + "\n".join(args) + "\n"
    return init


def call_options(init: Callable, frame: FrameType) -> dict[str, Any]:
    """Every option of the call of ``init`` (decorated by `config_options`) running in ``frame``, in the signature's
    order: its own options, and GPTConfig's fields from ``**config`` (those not given at their defaults). An unknown
    name is a TypeError, as for any function."""
    call = inspect.getargvalues(frame)  # args: self and the own options; keywords: the name of the ** parameter
    given = {name: call.locals[name] for name in call.args[1:]} | call.locals[call.keywords]
    bound = inspect.signature(init).bind_partial(**given)
    bound.apply_defaults()
    return dict(bound.arguments)


def save_hyperparameters(module: Any, hparams: dict[str, Any], frame: FrameType) -> None:
    """``module.save_hyperparameters()`` for an ``__init__`` decorated by `config_options`, running in ``frame``:
    saves ``hparams`` (all of its options, `call_options`) as Lightning saves the arguments of a plain ``__init__``.

    Lightning reads the arguments from the frame, by the names `inspect.signature` gives, and GPTConfig's are not
    there (they are in ``**config``). Under LightningCLI it never looks: it saves the CLI's copy of the section (with
    its ``_instantiator``, which load_from_checkpoint reads), handed over in a context variable. So ``hparams`` is
    handed over the same way where no CLI did, with what Lightning collects from the frames above (a subclass's own
    ``__init__`` arguments): the saved hyperparameters, and their name "kwargs" in checkpoints, are what they were
    with the options spelled out in ``__init__``."""
    from lightning.pytorch.core.mixins.hparams_mixin import (
        HyperparametersMixin,
        _given_hyperparameters,  # private: guarded in tests/model/test_model_options.py
    )
    from lightning.pytorch.utilities.parsing import collect_init_args

    token = None
    if _given_hyperparameters.get() is None:
        hparams = dict(hparams)
        callers = frame.f_back and collect_init_args(frame.f_back, [], inside=True, classes=(HyperparametersMixin,))
        for args in callers or []:  # a subclass's __init__, then any LightningModule's __init__ that built this one
            hparams.update(args)
        token = _given_hyperparameters.set(hparams)
    try:
        module.save_hyperparameters(frame=frame)
    finally:
        if token is not None:
            _given_hyperparameters.reset(token)


RANGES = {
    **CONFIG_RANGES, "prefix_len": "[0, block_size)", "lr": "(0, inf)", "min_lr": "[0, lr]",
    "warmup_steps": "[0, inf)", "decay_steps": "[1, inf)", "decay_fraction": "[0, 1]", "weight_decay": "[0, inf)",
    "beta1": "[0, 1)", "beta2": "[0, 1)", "muon_lr": "(0, inf)", "muon_momentum": "[0, 1)",
    "muon_weight_decay": "[0, inf)",
}
"""Valid values of TinyLM's numeric options (interval notation, see tinylm.ranges)."""
WHOLE = ("prefix_len", "warmup_steps", "decay_steps")  # (GPTConfig checks its own counts)


def check_choices(options: dict[str, Any]) -> None:
    """The options whose values are names (and the one that needs another), before anything is built."""
    if options["vocab_size"] < 1:
        raise ValueError(
            f"vocab_size must be >= 1, got {options['vocab_size']}; it is linked from the data module's tokenizer "
            "(use `tinylm fit`, or pass TinyLM(vocab_size=datamodule.vocab_size, ...))"
        )
    if options["lr_schedule"] not in SCHEDULES:
        raise ValueError(f"unknown lr_schedule {options['lr_schedule']!r}; choose one of {', '.join(SCHEDULES)}")
    if options["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"unknown model.optimizer {options['optimizer']!r}; choose one of {', '.join(OPTIMIZERS)}")
    prefix_len, attn_mask = options["prefix_len"], options["attn_mask"]
    if prefix_len and attn_mask != "prefix":
        raise ValueError(f"model.prefix_len={prefix_len} is used only with model.attn_mask: prefix (this run: "
                         f"{attn_mask!r}); pass --model.attn_mask prefix, or leave prefix_len at 0")


def check_options(options: dict[str, Any]) -> None:
    """Raise ValueError naming the first bad option of ``options`` (every TinyLM option by name): a name that is no
    choice, a value out of range, a GPT its fields cannot build. For options that come from elsewhere than the
    command line (a checkpoint's), before TinyLM blames them on a flag."""
    check_choices(options)
    check_ranges("model", options, RANGES, whole=WHOLE)
    GPTConfig(**{f.name: options[f.name] for f in fields(GPTConfig)})


def model_option_names() -> list[str]:
    """Every name a checkpoint's hyperparameters hold as a model option of this tinylm (GPTConfig's fields and
    `OWN_OPTIONS`): the checkpoint keeps the list (its ``tinylm`` section's ``options``), so that an older tinylm
    tells a newer one's option from a script's subclass's own argument."""
    return sorted({f.name for f in fields(GPTConfig)} | set(OWN_OPTIONS))


def check_known_options(saved: dict[str, Any], ckpt_path: str | os.PathLike | None, written: Any) -> None:
    """Refuse a checkpoint whose hyperparameters (``saved``) hold a model option of the tinylm that wrote it
    (``written``: the names its ``tinylm`` section lists) that this tinylm does not know: a newer tinylm's, which
    read without it builds another model than the one trained (a new architecture option changes what the same
    weights compute). generate and export dropped such an option without a word, a resume with a warning,
    `TinyLM.load_from_checkpoint` without one (``ckpt_path`` None). Other names (a subclass's own arguments,
    Lightning's ``_instantiator``) are not tinylm's to judge; a checkpoint without the list is of a tinylm whose
    options are all options still."""
    known = set(model_option_names())
    unknown = [f"{k}={v!r}" for k, v in sorted(saved.items())
               if isinstance(written, (list, tuple)) and k in written and k not in known]
    if unknown:
        what = "the checkpoint" if ckpt_path is None else f"checkpoint {str(ckpt_path)!r}"
        raise TinyLMError(f"{what} has model options this tinylm does not know: "
                          f"{', '.join(unknown)} (a newer tinylm wrote it, and without them it is another model); "
                          "upgrade tinylm (git pull, or pip install -U tinylm) to read it")
