"""A parsed fit/validate config with the settings its checkpoint gives applied (`with_checkpoint_settings`), and
Lightning's copy of the config as plain data (`config_dump`): the same results as jsonargparse's whole parse and
PyYAML's reader gave, at a fraction of their cost at every command's start."""

from __future__ import annotations

import math
from typing import Any


def with_checkpoint_settings(parser, sub_parser, sub: str, config, update: dict):
    """``parser.parse_object({sub: update}, config)``: ``config`` (a parsed command's) with the options ``update``
    sets (the checkpoint's model options, the run's data), checked and linked as a parse does. That parse took
    ~85 ms of a tiny resume's ~0.5 s of CPU and of a validate's ~0.3 s, re-checking every option of the command.
    A resume with the run's own config changes nothing: ``config`` is the parse's result as it is. Otherwise the
    command's own parser (``sub_parser``) parses its section alone, without merging the defaults that section
    already holds (~40 ms); where that fails, the whole parse runs, for its own error."""
    from jsonargparse._actions import _ActionPrintConfig

    section = config[sub]
    if all(key in section and _same(section.get(key), value) for key, value in _leaves(update)):
        return config
    with _ActionPrintConfig.skip_print_config():  # (parsing prints a --print_config asked)
        try:
            parsed = config.clone()
            parsed[sub] = sub_parser.parse_object(update, section.clone(), defaults=False)
            return parsed
        except Exception:  # (the error as the whole parse words it: "fit.model.nope"...)
            return parser.parse_object({sub: update}, config)


def config_dump(parser, config, sub_parser) -> dict:
    """LightningCLI's ``config_dump`` (`_dump_config`: the model's and the data module's hyperparameters that their
    checkpoints keep): the command's section of ``parser.dump(config, ...)`` read back as data, by libyaml
    (tinylm.cli.run_folder.load_yaml: PyYAML's values, ~8x faster than the ~15 ms its own parser took at every
    fit and validate). Not validated again where the command's parser (``sub_parser``) just dumped, and so checked,
    the command's section as it is (`checked`: a fit's, by check_recordable); the rest the parse checked and tinylm
    never changes (the subcommand, the --config files)."""
    from tinylm.cli.callback_checks import checked, keep_none
    from tinylm.cli.run_folder import load_yaml

    sub = config.get("subcommand")
    done = sub is not None and checked(sub_parser, config[sub])
    dump = load_yaml(parser.dump(config, skip_link_targets=False, **keep_none(), format="yaml", skip_validation=done))
    return dump[sub] if sub is not None else dump


def _leaves(update: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """``update``'s values by dotted key, into its nested mappings (data.clean.exact)."""
    found: list[tuple[str, Any]] = []
    for key, value in update.items():
        if isinstance(value, dict) and value:
            found += _leaves(value, f"{prefix}{key}.")
        else:
            found.append((f"{prefix}{key}", value))
    return found


def _same(now: Any, value: Any) -> bool:
    """Whether a parsed option's value ``now`` is ``value`` as a parse keeps it: equal and of the same type, through
    lists (``1`` is not ``1.0`` nor ``True``; a parse may make one the other), and of the same sign (``-0.0`` is
    not ``0.0``: a run's ``--model.dropout -0.0`` is what its resume records)."""
    if type(now) is not type(value):
        return False
    if isinstance(value, (list, tuple)):
        return len(now) == len(value) and all(_same(a, b) for a, b in zip(now, value))
    if isinstance(value, float):
        return now == value and math.copysign(1.0, now) == math.copysign(1.0, value)
    return now == value
