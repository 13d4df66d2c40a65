"""The command line read before jsonargparse parses it, the way jsonargparse will read it: the run folder of the
early "in use" check (tinylm.cli.early), the run a resume with no --config comes from (run_folder.with_run_config),
the --config files checked before parsing (main, commands), the options a fit names (fit), the ``true`` after a bare
boolean flag (commands), a command's own options told from its fit config's (fit_config.split_args). Imports nothing
heavy (the early check runs before torch and Lightning are imported).

jsonargparse parses with Python's argparse; its rules, which this reading follows:
- ``--key value`` and ``--key=value``; ``-c FILE``, ``-c=FILE``, ``-cFILE`` and ``--config=FILE`` name a config file;
  an option given twice: the last one counts; config files and flags apply in their order on the line
  (``--run.name x -c a.yaml``: a.yaml's run.name wins; ``-c a.yaml --run.name x``: x).
- After ``--key``, the next argument is its value unless it looks like an option: it starts with ``-`` and is not
  ``-`` alone, a negative number or text with a space in it. So ``--model.lr -1`` sets -1, while ``--run.name --x``
  is refused ("expected one argument"): write ``--run.name=--x``. ``--help`` and a bare ``--print_config`` take no
  value; ``--`` ends the options (jsonargparse refuses anything after it).
- A negative number is any decimal one, in scientific notation too: ``-1``, ``-.5``, ``-1e-3``, ``-1E5``,
  ``-1.5e+3`` (`NEGATIVE_NUMBER`). argparse's own rule is narrower and changes with the Python (3.11's takes ``-1``
  and ``-.5`` only, and refused ``--model.lr -1e-3`` with "expected one argument" before any range check could
  speak), so tinylm's entry point (tinylm.cli.main) rewrites ``--key -1e-3`` to ``--key=-1e-3`` once, before
  anything parses the line (`numbers_attached`), and every reader here and after reads it as that value.
Not followed here (`settings` says so with None, and the check after the imports reads them): an abbreviated option
(``--conf``, ``--run.na``: jsonargparse expands a unique prefix, with a deprecation warning) and a whole section
given as one value (``--run '{name: x}'``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

NO_VALUE = ("-h", "--help", "--print_config")
"""Options that never take the next argument (``--print_config=skip_null`` gives one with ``=``)."""

NEGATIVE_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
"""A negative decimal number as float() reads it (``-1``, ``-.5``, ``-2.``, ``-1e-3``, ``-1.5E+3``; matched whole):
a value, never an option (tinylm has no option spelled ``-`` and a digit)."""


def is_value(arg: str) -> bool:
    """Whether ``arg``, after an option that takes a value, is that value (not the next option): as argparse reads it
    once `numbers_attached` has attached a negative number to its option."""
    return not arg.startswith("-") or arg == "-" or bool(NEGATIVE_NUMBER.fullmatch(arg)) or " " in arg


def numbers_attached(args: list[str]) -> list[str]:
    """``args`` with each ``--key NUMBER`` whose number is negative as ``--key=NUMBER``, which every Python's argparse
    reads as that value (3.11's reads ``--key -1e-3`` as an option with no value, then a stray ``-1e-3``). Options
    that take no value (``--help``), values that are not negative numbers and everything after ``--`` are kept as
    they are; a line rewritten already is kept too."""
    out: list[str] = []
    for key, _, span in spans(args):
        if key is not None and len(span) == 2 and span[0].startswith("--") and NEGATIVE_NUMBER.fullmatch(span[1]):
            out.append("=".join(span))
        else:
            out += span
    return out


def spans(args: list[str]) -> Iterator[tuple[str | None, str | None, list[str]]]:
    """Each argument of ``args`` as jsonargparse reads it, in order, as (key, value, the arguments it spans): an
    option's key without its dashes (``-c`` is ``config``) and its value, None where none is given (the option ends
    the line, is followed by another option, or takes none); key None for what is not an option (a command's
    positional argument, and ``--`` with all after it, in one span)."""
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            yield None, None, args[i - 1:]
            return
        flag, eq, value = arg.partition("=")
        short_config = arg.startswith("-c") and len(arg) > 2 and not arg.startswith("--")  # -c=FILE, -cFILE
        if is_value(arg) and not short_config and not (arg.startswith("--") and eq and " " not in flag):
            yield None, None, [arg]  # (`--prompts+=- a`, `-c=my config.yaml`: options, as argparse reads them)
            continue
        if short_config:
            flag, eq, value = "-c", "=", arg[3:] if arg[2] == "=" else arg[2:]
        span = [arg]
        if not eq and arg not in NO_VALUE and i < len(args) and is_value(args[i]):
            eq, value, i = "=", args[i], i + 1
            span.append(value)
        yield "config" if flag == "-c" else flag.lstrip("-"), value if eq else None, span


def texts_as_typed(args: list[str], names: set[str]) -> list[str]:
    """``args`` with the options ``names`` that take one text or several (`--prompts TEXT`, `--prompts+ TEXT`) joined
    into one JSON list of their texts as typed, where the last of them was. jsonargparse reads such a value as YAML
    first: `--stop "[END]"` stopped at "END", `--prompts "- a"` prompted "a", and `--prompts A --prompts+ "Q: x"`
    dropped "A" (a "key: value" text replaced the list). `--NAME TEXT` starts the list again, `--NAME+ TEXT` adds;
    a JSON list of texts (`--prompts '["a", "b"]'`, `'[]'`) is still that list, and `--NAME null` the default."""
    texts: dict[str, list[str]] = {}
    adds: dict[str, bool] = {}  # the first was --NAME+: add to a list given before (by --config)
    out: list[str | None] = []
    where: dict[str, int] = {}  # the place in ``out`` of each joined option: its last one's
    for key, value, span in spans(args):
        name = (key or "").removesuffix("+")
        if name not in names or value is None or key == name and value == "null":  # (null: the option's default)
            out += span
            continue
        if key == name or name not in texts:
            texts[name], adds[name] = [], key != name
        listed = _json_texts(value)
        texts[name] += [value] if listed is None else listed
        if name in where:
            out[where[name]] = None
        where[name] = len(out)
        out.append(None)
    for name, i in where.items():
        out[i] = f"--{name}{'+' if adds[name] else ''}={json.dumps(texts[name], ensure_ascii=False)}"
    return [arg for arg in out if arg is not None]


def _json_texts(value: str) -> list[str] | None:
    """``value`` as a JSON list of texts (`["a", "b"]`, `[]`: several at once, as jsonargparse took them), or None."""
    try:
        texts = json.loads(value)
    except (ValueError, RecursionError):
        return None
    return texts if isinstance(texts, list) and all(isinstance(t, str) for t in texts) else None


def options(args: list[str]) -> list[tuple[str, str | None]]:
    """The options of ``args`` in order as (key, value) (`spans`); arguments that are not options are skipped."""
    return [(key, value) for key, value, _ in spans(args) if key is not None]


def values(args: list[str]) -> dict[str, str | None]:
    """Each option of ``args`` with its last value (`options`)."""
    return dict(options(args))


def config_files(args: list[str]) -> list[str]:
    """The ``--config`` files of ``args``, in order."""
    return [value for key, value in options(args) if key == "config" and value is not None]


def settings(args: list[str], wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The values of the ``wanted`` dotted keys (``"run.name"``) -> their defaults, as the flags and the --config
    files of ``args`` set them, left to right; None when ``args`` set them in a way this reading does not follow
    (a whole section as one value, an abbreviated option, an option with no value, a config file that cannot be
    read, a value not a string): the parser after the imports reads those."""
    import yaml

    found = dict(wanted)
    sections = {key.split(".")[0] for key in wanted if "." in key}
    for key, value in options(args):
        if key in sections or any(w.startswith(key) and w != key for w in (*wanted, "config")):
            return None
        if key in wanted and value is None:  # jsonargparse says "expected one argument"
            return None
        if key in wanted:
            found[key] = value
        elif key == "config":
            try:
                data = yaml.safe_load(Path(value or "").read_text(encoding="utf-8")) or {}
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                return None
            found.update((dotted, v) for dotted in wanted if (v := _at(data, dotted)) is not _ABSENT)
    return found if all(isinstance(v, str) or v is None for v in found.values()) else None


_ABSENT = object()


def _at(data: Any, dotted: str) -> Any:
    """``data["run"]["name"]`` for ``"run.name"``; _ABSENT where the file does not set it."""
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return _ABSENT
        data = data[part]
    return data


HOME_PATH_OPTIONS = ("config", "ckpt_path", "draft_ckpt_path", "default_root_dir", "cache_dir", "init_from",
                     "corpus", "tokenizer", "out", "prompt_file", "prompts_file", "data_dir")
"""The options (by the last part of their dotted key) that take a path: a leading ``~`` in their value is the home
folder, as a shell would have made it, which it does not in ``--key=~/x``, in quotes or in a YAML config. Taken
literally, ``--trainer.default_root_dir=~/runs`` split a run between ./~/runs and $HOME/runs (Lightning's CSV
logger expands it) and ended in a traceback; ``--data.cache_dir`` made a folder named ``~``; eval's ``--data_dir``
(and fit's ``--eval.data_dir``) was "not a folder"."""


_SHELL_VARIABLE = re.compile(r"\$(?:([A-Za-z_]\w*)|\{([A-Za-z_]\w*)\})")


def home_expanded(key: str, value: Any) -> Any:
    """``value`` with a leading ``~`` expanded if ``key`` takes a path (`HOME_PATH_OPTIONS`); else as it is. A
    ``$NAME`` no shell expanded (quoted, or in a config file) in a path that is not there is refused: taken
    literally, ``default_root_dir: $SCRATCH/runs`` made a folder named ``$SCRATCH`` in the current one."""
    if not isinstance(value, str) or key.rsplit(".", 1)[-1] not in HOME_PATH_OPTIONS:
        return value
    if (var := _SHELL_VARIABLE.search(value)) and not os.path.lexists(os.path.expanduser(value)):
        name = var[1] or var[2]
        fix = (f"write the path out: --{key} {os.path.expanduser(os.path.expandvars(value))}"
               if name in os.environ else f"${name} is not set here either: write the path out")
        raise ValueError(f"--{key} {value!r} holds ${name}, which no shell expanded (in quotes or a config file "
                         f"tinylm takes a path as written); {fix}")
    return os.path.expanduser(value) if value.startswith("~") else value


def expand_home(args: list[str]) -> list[str]:
    """``args`` with `home_expanded` applied to the value of each option that takes a path (``--key VALUE``,
    ``--key=VALUE``, ``-cFILE``, read as `spans` reads them: ``-c~/a.yaml`` and ``--config=~/my runs.yaml`` too)."""
    out: list[str] = []
    for key, value, span in spans(args):
        if key is None or value is None:
            out += span
        elif len(span) == 2:  # --key VALUE
            out += [span[0], home_expanded(key, value)]
        else:  # --key=VALUE, -c=FILE, -cFILE: the value ends the argument
            out.append(span[0][: len(span[0]) - len(value)] + home_expanded(key, value))
    return out


def spelled(key: str, value: str) -> list[str]:
    """``--key value`` as arguments that read back as that value, whatever reads them: ``--key=value`` where the value
    starts with ``-`` (``--data.corpus=-notes.txt``, ``--model.lr=-1e-3``)."""
    return [f"--{key}", value] if not value.startswith("-") else [f"--{key}={value}"]


# jsonargparse's YAML loader reads 1e-3 (no dot) as a float, as YAML 1.2 does; PyYAML's dumper (YAML 1.1) knows
# only floats with a dot and writes such a string plain
_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


def reloadable_yaml(data: Any) -> str:
    """``data`` as YAML that jsonargparse reads back as the same values: a string that its loader would read as a
    number is quoted. PyYAML wrote ``name: 3e-4`` plain, which jsonargparse reads as 0.0003, so a run named
    ``--run.name 3e-4`` (a sweep named by its LR) trained and then could not resume, validate or plan from its own
    config.yaml or checkpoint ("expected a str, got 0.0003"). The dumper of every config tinylm writes and prints
    (`use_reloadable_yaml`)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))
    return yaml.dump(data, Dumper=Dumper, default_flow_style=False, allow_unicode=True, sort_keys=False)


def use_reloadable_yaml() -> None:
    """jsonargparse's YAML dumper (its config files, --print_config, the run's config records) is
    `reloadable_yaml`."""
    from jsonargparse import set_dumper, set_parsing_settings

    set_dumper("yaml", reloadable_yaml)
    # a {class_path: ...} given where a signature says Any/object (RichProgressBar's console_kwargs, a DDPStrategy's
    # ddp_comm_state) was instantiated, whatever class it named: subprocess.Popen ran a shared config's command
    set_parsing_settings(instantiate_subclass_spec_in_any=False)


_FIT_TOP = ("seed_everything", "ckpt_path", "weights_only", "optimizer", "lr_scheduler")  # besides the sections


def check_fit_configs(command: str, args: list[str]) -> None:
    """A --config of another command (``tinylm generate --print_config > g.yaml`` then ``tinylm fit --config
    g.yaml``) is named as that, with the file: jsonargparse said "Subcommand 'fit' does not accept option 'prompt'"
    (for plan too), naming neither the file nor the fix. A fit config with one misspelled section stays the
    parser's (its line offers the nearest option): two keys of no fit section at least, and no section."""
    from tinylm.cli.table import FIT_GROUPS

    for path, keys in config_keys(args):
        foreign = sorted(keys - set(FIT_GROUPS) - set(_FIT_TOP))
        if len(foreign) > 1 and not keys & set(FIT_GROUPS):
            raise ValueError(f"config file {str(path)!r} is no `tinylm fit` config: it sets {', '.join(foreign[:4])}"
                             f"{', ...' if len(foreign) > 4 else ''} and none of the sections {', '.join(FIT_GROUPS)} "
                             f"(a config of another command?); `tinylm {command} --config` takes a `tinylm fit` "
                             "config such as configs/shakespeare-char-cpu.yaml")


def config_keys(args: list[str]) -> Iterator[tuple[Path, set[str]]]:
    """Each ``--config FILE`` of ``args`` with its top-level keys (files that cannot be read are left to the
    parser, which says what is wrong with them)."""
    import yaml

    for path in map(Path, config_files(args)):
        try:
            yield path, set(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
        except (OSError, yaml.YAMLError, TypeError, ValueError):
            continue


def not_utf8_argument(message: str, args: list[str]) -> str | None:
    """The line for jsonargparse's parse error ``message`` that a value of ``args`` in bytes that are not UTF-8 caused
    (`tinylm plot` of a run folder named in Latin-1: "--runs: 'utf-8' codec can't encode character '\\udce9'...",
    naming neither the value nor the fix); None for another error."""
    from tinylm.paths import not_utf8

    key = re.match(r'Parser key "([^"]+)"', message)
    if "codec can't encode" not in message or key is None:
        return None
    fix = "rename it in UTF-8 (convmv -f latin1 -t utf8 --notest NAME, or mv) and pass the new name"
    texts = [arg.split("=", 1)[-1] if arg.startswith("--") else arg for arg in args]  # (--runs=VALUE: the value)
    bad = next(((text, why) for text in texts if (why := not_utf8(text, fix))), None)
    return None if bad is None else f"--{key[1]} {bad[0]!r} is no UTF-8 text: {bad[1]}"
