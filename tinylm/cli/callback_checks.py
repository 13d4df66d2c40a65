"""Checks of the callbacks `--trainer.callbacks` adds to a fit, where Lightning or jsonargparse would fail late or
say nothing: a value the run's config.yaml cannot record, two callbacks a checkpoint keys alike, and a timedelta
written as --trainer.max_time's DD:HH:MM:SS. (Callbacks refused by class: trainer_checks._REFUSED_CALLBACKS.)"""

from __future__ import annotations

import functools
import logging
import re
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tinylm.cli.argv import options
from tinylm.errors import TinyLMError

log = logging.getLogger("tinylm")
_UNSERIALIZABLE = "Unable to serialize instance "  # what jsonargparse writes (with a warning) for such a value


def keep_none() -> dict[str, bool]:
    """The keyword of jsonargparse's ``dump``/``save`` that writes options set to None too: ``skip_unset=False``
    since jsonargparse 4.49, where ``skip_none`` (the only one before) is deprecated, to go in 5.0."""
    from jsonargparse import __version__

    major, minor = (int(part) for part in __version__.split(".")[:2])
    return {"skip_unset" if (major, minor) >= (4, 49) else "skip_none": False}


def dumped(parser, cfg) -> str:
    """``parser.dump(cfg, **keep_none())``, the config's text that a fit writes up to three times (checked here before
    anything is built, then into config.yaml and each checkpoint): taken once per parser and content (~45 ms of a
    tiny fit's ~1 s of CPU each time); a config changed since is dumped again."""
    kept = _DUMPED.get(parser)
    if kept is None or kept[0] != cfg:
        kept = _DUMPED[parser] = (cfg.clone(), parser.dump(cfg, **keep_none()))
    return kept[1]


_DUMPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # parser -> (config, its text): the last dumped


def checked(parser, cfg) -> bool:
    """Whether ``cfg`` is, value for value, the config `dumped` last dumped (and so checked: jsonargparse validates
    a config before it dumps it, ~18 ms of a dump's ~28) with ``parser``."""
    kept = _DUMPED.get(parser)
    return kept is not None and kept[0] == cfg


def check_recordable(parser, cfg) -> None:
    """Refuse an option that the run's config.yaml (and each checkpoint's copy of it) cannot record: jsonargparse
    writes `Unable to serialize instance X` in its place (ModelPruning's `pruning_fn: l1_unstructured`,
    StochasticWeightAveraging's default `device`), and every resume, which reads those settings back, failed on it
    ("The provided `pruning_fn` unable to serialize instance l1_unstructured isn't available") or ran with it. So is
    text that is not UTF-8 (a --data.cache_dir named in Latin-1 bytes): config.yaml held "cach\\uDCE9", which no
    resume or validate could read ("while parsing a quoted scalar")."""
    import yaml

    from tinylm.paths import not_utf8

    for key, value in _leaves(cfg.as_dict() if hasattr(cfg, "as_dict") else cfg):
        if isinstance(value, str) and (why := not_utf8(value, "rename the file or folder in UTF-8 (convmv -f latin1 -t "
                                                       f"utf8 --notest NAME, or mv) and pass --{key.split('[')[0]} "
                                                       "NEW_NAME")):
            raise TinyLMError(f"{key} {value!r} is no UTF-8 text: {why}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = dumped(parser, cfg)
    if _UNSERIALIZABLE not in text:
        return

    for key, value in _leaves(yaml.safe_load(text)):
        if not (isinstance(value, str) and value.startswith(_UNSERIALIZABLE)):
            continue
        value = value[len(_UNSERIALIZABLE):]
        raise TinyLMError(f"{key} {value!r} cannot be written into the run's config.yaml (jsonargparse writes "
                          f"'{_UNSERIALIZABLE}{value}' there: it made an object of the value given), so a resume, "
                          "which reads the run's settings back, would fail on it; leave that option at a value "
                          "jsonargparse keeps as written, or leave that callback out")


def check_callback_states(callbacks: list) -> None:
    """Two of the user's callbacks whose states a checkpoint would key alike (a config file's EarlyStopping and the
    same one added with `+=`): Lightning's check of them was a RuntimeError traceback ("Found more than one stateful
    callback of type `EarlyStopping`")."""
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.utilities.model_helpers import is_overridden

    seen: set[str] = set()
    for cb in callbacks:
        if not is_overridden("state_dict", instance=cb, parent=Callback):
            continue
        if cb.state_key in seen:
            raise TinyLMError(f"--trainer.callbacks holds {cb.state_key} twice: a checkpoint keys a callback's state "
                              "by these settings, so it could not tell them apart; drop one of them, or give it "
                              "other settings (e.g. another monitor or mode)")
        seen.add(cb.state_key)


def keep_own_patience(callbacks: list) -> None:
    """A user's EarlyStopping keeps the patience its command gives it on a resume: Lightning's load_state_dict put
    the checkpoint's in its place, so a run that EarlyStopping stopped, resumed with a larger patience to go on,
    stopped again at its next validation without improvement (its config.resume-step<N>.yaml recording the new
    patience). Its count of validations without improvement and its best score go on from the checkpoint."""
    from lightning.pytorch.callbacks import EarlyStopping

    for cb in callbacks:
        if isinstance(cb, EarlyStopping) and "load_state_dict" not in vars(cb):
            cb.load_state_dict = functools.partial(_load_keeping_patience, cb, cb.load_state_dict)


def _load_keeping_patience(cb, load, state: dict) -> None:
    if "patience" in state and state["patience"] != cb.patience:
        log.info("EarlyStopping(monitor=%s): patience %s as given (the checkpoint's: %s), counting on from its %s "
                 "validation(s) without improvement", cb.monitor, cb.patience, state["patience"],
                 state.get("wait_count", 0))
        state = {**state, "patience": cb.patience}
    load(state)


def check_time_intervals(argv: list) -> None:
    """A callback's timedelta option (ModelCheckpoint's train_time_interval) written as --trainer.max_time's
    DD:HH:MM:SS: jsonargparse reads a timedelta as H:MM:SS and dropped the last field without a word
    (`00:00:30:00`, 30 minutes, saved a checkpoint every 30 s; `00:00:00:01` after every step). And a
    --trainer.val_check_interval time whose first field has no leading zero: YAML reads `1:00:00:00` (a day) or
    `2:00:00` as a base-60 number, 216000 or 7200, which the option takes as batches without a word (and max_time's,
    in a config file, ended in "expected a str, got 216000")."""
    argv = [arg for arg in argv if isinstance(arg, str)]
    in_files = _file_options(argv)
    for key, value in in_files:  # (the command line's 1:00:00:00 reaches max_time as text)
        if key.endswith("max_time") and _base_60(value):
            raise TinyLMError(f"{key}: {value} in a config file: YAML reads this as a base-60 number, not a time; "
                              f"write it as DD:HH:MM:SS with its leading zero, e.g. {_padded(value)}")
    for key, value in [*options(argv), *in_files]:
        if key.endswith("train_time_interval") and isinstance(value, str) and value.count(":") == 3:
            d, h, m, s = (part.strip() for part in value.split(":"))
            raise TinyLMError(f"--{key} {value}: this option is a timedelta, read as H:MM:SS (not --trainer.max_time's "
                              f"DD:HH:MM:SS: it would be read as {d}:{h}:{m}); write " +
                              (f"'{int(d)} days, {h}:{m}:{s}'" if d.isdigit() and int(d) else f"{h}:{m}:{s}"))
        if key.endswith("val_check_interval") and _base_60(value):
            batches = functools.reduce(lambda n, part: n * 60 + int(part), value.strip().replace("_", "").split(":"), 0)
            raise TinyLMError(f"--{key} {value}: YAML reads this as a base-60 number ({batches}: 1:30 is 90), so a "
                              f"validation every {batches:,} batches; write a time as DD:HH:MM:SS with its leading "
                              f"zero, e.g. {_padded(value)} (or batches as one number)")


_BASE_60 = re.compile(r"[1-9][0-9_]*(:[0-5]?[0-9])+")  # YAML 1.1's base-60 int (PyYAML's and jsonargparse's loaders)


def _base_60(value: Any) -> bool:
    """Whether YAML reads `value` (a config file's text, or the command line's) as a base-60 number."""
    return isinstance(value, str) and not isinstance(value, _Quoted) and bool(_BASE_60.fullmatch(value.strip()))


def _padded(value: str) -> str:
    """A base-60 number's text as the DD:HH:MM:SS time it was meant as (2:00:00 is 00:02:00:00)."""
    parts = value.strip().replace("_", "").split(":")
    padded = ":".join(part.zfill(2) for part in ["0"] * (4 - len(parts)) + parts)
    return padded if padded.startswith("0") else f"0{padded}"  # (10:00:00:00 is base 60 too; 010:... not)


def check_train_monitors(callbacks: list, log_every_n_steps: Any, val_check_interval: Any = None,
                         accumulate: Any = 1) -> None:
    """A ModelCheckpoint that monitors a train/ metric every N steps, where tinylm logs train/ metrics on logging
    steps only (every --trainer.log_every_n_steps: tinylm.train.module.logging_step), unlike Lightning's every step:
    a check between two logging steps read a value up to that many steps old, and one before the first logging step
    found none (Lightning's MisconfigurationException mid-run, no checkpoint saved). So with an EarlyStopping, or a
    ModelCheckpoint without every_n_train_steps, checking at each validation (`val_check_interval` batches of
    `accumulate` micro-batches a step; a time or a share of an epoch: at any step): EarlyStopping's RuntimeError."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from tinylm.cli.trainer_checks import _METRICS  # (a user's own train/ metric may be logged every step)

    every = log_every_n_steps if isinstance(log_every_n_steps, int) and log_every_n_steps > 0 else 50  # (Lightning's)
    whole = isinstance(val_check_interval, int) and not isinstance(val_check_interval, bool)
    steps = val_check_interval // max(int(accumulate or 1), 1) if whole else None  # (a validation's steps)
    for cb in callbacks:
        monitor = getattr(cb, "monitor", None)
        if every == 1 or not isinstance(cb, (ModelCheckpoint, EarlyStopping)) or \
                not str(monitor or "").startswith("train/"):
            continue
        n = getattr(cb, "_every_n_train_steps", 0)
        if n and n % every:
            raise TinyLMError(f"ModelCheckpoint(monitor={cb.monitor!r}, every_n_train_steps={n}) checks every {n} "
                              f"steps, and tinylm logs {cb.monitor} every {every} (--trainer.log_every_n_steps: "
                              "train metrics are logged on logging steps only), so it would read a value up to "
                              f"{every - 1} steps old, and none before step {every}; set --trainer.log_every_n_steps "
                              f"to a divisor of {n} (e.g. 1), or every_n_train_steps to a multiple of {every}")
        timed = getattr(cb, "_train_time_interval", None) is not None  # (its own time: at any step)
        at_end = next((f"{k}_on_train_epoch_end" for k in ("check", "save")  # (EarlyStopping's, ModelCheckpoint's:
                       if getattr(cb, f"_{k}_on_train_epoch_end", None)), None)  # at an epoch's end, not a step count)
        if not n and monitor in _METRICS and (timed or at_end or not steps or steps % every):
            when = "after each train_time_interval, at any step" if timed else \
                f"at each notional epoch's end ({at_end}=True), at steps not set in advance" if at_end else \
                f"at each validation, every {steps} steps (--trainer.val_check_interval {val_check_interval})" \
                if steps else "at each validation, at steps not set in advance (a time, or a share of an epoch)"
            divisor = f" (or a divisor of {steps})" if steps and not (timed or at_end) else ""
            raise TinyLMError(f"{type(cb).__name__}(monitor={monitor!r}) checks {when}, and tinylm logs {monitor} "
                              f"every {every} steps (--trainer.log_every_n_steps: train metrics are logged on logging "
                              f"steps only), so it would read a value up to {every - 1} steps old, and none before "
                              f"step {every}; set --trainer.log_every_n_steps "
                              f"1{divisor}, or monitor a val/ metric")


def _leaves(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """The (dotted key, value) of each leaf of a YAML document (`trainer.callbacks[0].init_args.monitor`)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{key}[{i}]")
    else:
        yield key, node


def _file_options(argv: list) -> list:
    """The (dotted key, value) leaves of the --config files of ``argv``, and of the sections' own files that they or
    the command line name, and of the YAML files named inside those (a callback's own, `- cb.yaml` under
    trainer.callbacks: its time was read without the check) (`train_time_interval: 00:00:30:00` in a callback's
    init_args is a string to YAML, read by jsonargparse as 0:00:30 as from the command line)."""
    import yaml

    from tinylm.cli.argv import config_files
    from tinylm.cli.table import FIT_GROUPS

    class TextLoader(yaml.BaseLoader):  # every value as the text it is (1:00:00 is no number here), quoted or not
        def construct_scalar(self, node: Any) -> str:
            text = super().construct_scalar(node)
            return _Quoted(text) if node.style in ("'", '"') else text

    def names_file(key: str, name: Any, folder: Path) -> bool:  # `trainer: trainer.yaml`, `- cb.yaml`: beside it
        try:
            return isinstance(name, str) and (key in FIT_GROUPS or name.lower().endswith((".yaml", ".yml"))) and \
                (folder / name).is_file()
        except OSError:  # a section inline, `--trainer '{...}'`, longer than a file's name may be (ENAMETOOLONG)
            return False

    files = [("", path) for path in config_files(argv)] + \
        [(key.rstrip("+"), Path(value)) for key, value in options(argv) if key != "config" and
         names_file(key, value, Path())]  # --trainer F, --trainer.callbacks+=cb.yaml
    found, read = [], set()
    while files:
        section, path = files.pop(0)
        if (real := Path(path).resolve()) in read:  # (a file that names itself)
            continue
        read.add(real)
        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.load(f, Loader=TextLoader)  # noqa: S506 (a loader of strings only)
        except (OSError, ValueError, yaml.YAMLError):  # (check_config_files names an unreadable file)
            continue
        leaves = list(_leaves(data, section))
        files += [(key, Path(path).parent / name) for key, name in leaves if names_file(key, name, Path(path).parent)]
        found += leaves
    return found


class _Quoted(str):
    """A config file's quoted text: a string to YAML whatever it holds ('1:00:00:00' is no base-60 number)."""
