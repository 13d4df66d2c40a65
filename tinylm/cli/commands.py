"""tinylm's own commands (the ones LightningCLI does not provide), each a typed function parsed by jsonargparse.

A command's signature and docstring are its `--help`; `--config FILE` (YAML of the same options) and
`--print_config` come with every one. Commands call library functions that return values and print here: the
library never prints.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from tinylm.cli import console
from tinylm.cli.argv import config_files, config_keys
from tinylm.cli.prompts import read_prompt_file, read_prompts_file, stdin_is_terminal, unescape
from tinylm.cli.table import COMMANDS, FIT_GROUPS
from tinylm.errors import TinyLMError
from tinylm.generate.config import check_speculative
from tinylm.generate.options import Option, sampling_options
from tinylm.ranges import check_ranges

MAX_SAMPLES = 10_000  # samples of one prompt generated as one batch

# Sections of a `tinylm fit` config that `prepare` reads past (it only needs `data`).
_FIT_SECTIONS = (*(g for g in FIT_GROUPS if g != "data"), "seed_everything", "ckpt_path", "weights_only")


def parser_for(fn: Callable, prog: str):
    """A jsonargparse parser for ``fn``'s keyword arguments (types, defaults and help from its signature and
    docstring), with ``--config FILE`` and ``--print_config``."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from tinylm.cli.argv import use_reloadable_yaml

    use_reloadable_yaml()  # (its --print_config)
    doc = (fn.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    parser = ArgumentParser(prog=prog, description=doc, exit_on_error=False, env_prefix="TINYLM",
                            default_env=False)
    fit_config = "fit_args" in inspect.signature(fn).parameters  # see tinylm.cli.fit_config
    parser.add_argument("-c", "--config", action=ActionConfigFile, help="a `tinylm fit` config (YAML), as for fit"
                        if fit_config else "a YAML file of these options")
    parser.add_function_arguments(fn, as_group=False, skip={"fit_args"})  # fit_args: see tinylm.cli.fit_config
    if name := _positional_list(fn):  # jsonargparse would show "--runs [ITEM,...]", which takes a JSON list only
        parser.usage = f"{prog} {_word(name)} [{_word(name)} ...] [options]"
    return parser


def run(command: str, args: list[str]) -> Any:
    """Parse ``args`` for ``command`` and run it."""
    if command == "prepare":
        return prepare(args)
    from tinylm.cli.argv import check_fit_configs, home_expanded, not_utf8_argument

    fn, given = COMMANDS[command].function(), args
    args = _texts_as_typed(fn, _bare_booleans(fn, _leading_positionals(fn, args)))
    fit_args = None
    # (tinylm.cli.fit_config imports Lightning: only for the commands that take a fit config, not plot's)
    if "fit_args" in inspect.signature(fn).parameters:  # plan, lr-find, scaling: the fit config goes to LightningCLI
        from tinylm.cli.fit_config import split_args

        args, fit_args = split_args(fn, args)
        _refuse_own_options_in_fit_configs(fn, command, fit_args)
        check_fit_configs(command, fit_args)  # (after: a file of the command's own options is said as that)
    else:
        _refuse_fit_configs(fn, command, args)
    parser = parser_for(fn, f"tinylm {command}")
    try:
        cfg = parser.parse_args(args)
    except argparse.ArgumentError as e:  # an option it does not know: the nearest it has; a required one: its flag
        from tinylm.cli.errors import with_section_hint

        message = not_utf8_argument(str(e), given) or \
            with_section_hint(str(e), {a.dest for a in parser._actions if a.option_strings})
        if str(e).startswith("Option '") and (files := config_files(args)):  # an option of a --config file
            message = f"--config {', '.join(files)}: {message}"
        if required := re.fullmatch(r"the following arguments are required: (.*)", message):
            positional = _positional_list(fn)  # (plot's RUN: a word, not an option)
            names = ", ".join(_word(n.strip()) if n.strip() == positional else f"--{n.strip()}"
                              for n in required[1].split(","))
            message = f"{names} {'are' if ',' in names else 'is'} required (tinylm {command} --help says what it takes)"
        if message == str(e):
            raise
        raise TinyLMError(message) from e
    kwargs = {key: home_expanded(key, value) for key, value in cfg.as_dict().items()}  # (a --config file's)
    kwargs.pop("config", None)
    _refuse_nulls(fn, kwargs)
    return fn(**kwargs) if fit_args is None else fn(fit_args, **kwargs)


def _refuse_nulls(fn: Callable, kwargs: dict) -> None:
    """Refuse ``null`` for an option that takes no None (a --config file's ``prompt: null``), as fit does for its
    sections: jsonargparse lets it through from a file, and it ended in a traceback or a bare TypeError."""
    for name, p in inspect.signature(fn).parameters.items():
        if name in kwargs and kwargs[name] is None and p.default is not None and \
                not any(word in str(p.annotation) for word in ("None", "Optional", "Any")):
            default = "" if p.default is inspect.Parameter.empty else f", or leave it out (default {p.default!r})"
            raise TinyLMError(f"--{name} is null, which it cannot be (a --config file's `{name}: null`?); give it a "
                              f"value{default}")


def _bare_booleans(fn: Callable, args: list[str]) -> list[str]:
    """``args`` with ``true`` after each bare boolean flag of ``fn`` (``--json``, ``--no_cache``): jsonargparse's
    booleans take a value ("argument --no_cache: expected one argument"). Bare: followed by nothing, or by what
    jsonargparse would read as the next option (tinylm.cli.argv.is_value; ``--prompt="a b"`` too: one of ``fn``'s
    options with its value attached, which argparse reads as an option whatever the value holds)."""
    from tinylm.cli.argv import is_value

    params = inspect.signature(fn).parameters
    flags = {f"--{name}" for name, p in params.items() if p.annotation in (bool, "bool")}
    out: list[str] = []
    for i, arg in enumerate(args):
        out.append(arg)
        nxt = args[i + 1] if i + 1 < len(args) else "--"
        if arg in flags and (not is_value(nxt) or nxt.partition("=")[0].removeprefix("--") in params):
            out.append("true")
    return out


_TEXTS = ("str | list[str] | None", str | list[str] | None)  # one text or several: --stop S --stop+ S2


def _texts_as_typed(fn: Callable, args: list[str]) -> list[str]:
    """``args`` with the options of ``fn`` that take one text or several (`--prompts TEXT`, `--prompts+ TEXT`) read
    as typed (tinylm.cli.argv.texts_as_typed)."""
    from tinylm.cli.argv import texts_as_typed

    params = inspect.signature(fn).parameters.items()
    return texts_as_typed(args, {name for name, p in params if p.annotation in _TEXTS})


def _refuse_own_options_in_fit_configs(fn: Callable, command: str, fit_args: list[str]) -> None:
    """A --config file of plan, lr-find or scaling is the `tinylm fit` config they work on: one that sets the
    command's own options (``gpu: A100``) gets this line, not the fit parser's "does not accept option"."""
    own = set(inspect.signature(fn).parameters) - {"fit_args"}
    for path, keys in config_keys(fit_args):
        if found := sorted(own & keys):
            raise ValueError(f"{path} sets {', '.join(found)}, which `tinylm {command}` takes as flags: pass "
                             f"{' '.join('--' + k + ' ...' for k in found)} on the command line (--config takes "
                             "the `tinylm fit` config it works on)")


def _refuse_fit_configs(fn: Callable, command: str, args: list[str]) -> None:
    """A `tinylm fit` config given to a command that reads its model from a checkpoint (generate, export, ...): this
    line, not the parser's "Option 'run.name' is not accepted"."""
    own = set(inspect.signature(fn).parameters)
    for path, keys in config_keys(args):
        if found := sorted((keys & {*_FIT_SECTIONS, "data"}) - own):
            source = "takes the model, its tokenizer and its settings from --ckpt_path, and its" if "ckpt_path" in own \
                else "reads no fit config: its"
            raise ValueError(f"{path} is a `tinylm fit` config ({', '.join(found)}); `tinylm {command}` {source} "
                             f"--config holds only its own options (`tinylm {command} --print_config` shows them)")


def _positional_list(fn: Callable) -> str | None:
    """The name of ``fn``'s first parameter if it is a required ``list[str]``: the command takes it as leading
    positional arguments (`tinylm plot RUN [RUN ...]`)."""
    first = next(iter(inspect.signature(fn).parameters.values()), None)
    if (first is None or first.default is not inspect.Parameter.empty
            or first.annotation not in ("list[str]", list[str])):
        return None
    return first.name


def _word(name: str) -> str:
    """How usage lines and messages spell a positional list (``runs``: ``RUN``)."""
    return name.upper().rstrip("S")


def _leading_positionals(fn: Callable, args: list[str]) -> list[str]:
    """The positional arguments of a command that takes them (`_positional_list`) as ``--NAME=[...]`` for
    jsonargparse: before its options, between or after them (`tinylm plot --out p.png RUN`, as argparse takes
    them: it was "unrecognized arguments: RUN"), read as tinylm.cli.argv.spans reads the line."""
    from tinylm.cli.argv import spans

    name = _positional_list(fn)
    if name is None:
        return args
    lead, rest = [], []
    for key, value, span in spans(args):
        if key is None and span[0] != "--":  # a word that is neither an option nor an option's value
            lead += span
        elif key == name and value is not None and not value.startswith("["):  # `--runs A B`, `--runs=A`
            lead.append(value)  # (not a JSON list: jsonargparse would refuse them; B is a word of its own)
        else:
            rest += span
    # (as typed: ASCII-escaped, an emoji's "\\ud83d\\ude80" pair is no YAML jsonargparse reads: "expected a list")
    return ([f"--{name}={json.dumps(lead, ensure_ascii=False)}"] if lead else []) + rest


# ---- prepare ----------------------------------------------------------------------------------------------------
def prepare(args: list[str]) -> dict[str, Any]:
    """`tinylm prepare --config FILE [--data.KEY VALUE ...]`: tokenizer + packed dataset, then a summary."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from tinylm.cli.argv import use_reloadable_yaml
    from tinylm.data.prepared import PreparedData  # (the data module without Lightning: no torch imported)

    use_reloadable_yaml()  # (its --print_config)

    parser = ArgumentParser(
        prog="tinylm prepare", exit_on_error=False,
        description="Train/load the tokenizer and pack the corpus into token memmaps; print what was made. "
        "Takes the same config file and --data.* overrides as `tinylm fit` (other sections are ignored).",
    )
    parser.add_argument("-c", "--config", action=ActionConfigFile,
                        help="a tinylm fit config (YAML); only `data` is used")
    parser.add_class_arguments(PreparedData, "data")
    for key in _FIT_SECTIONS:
        # (SUPPRESS: absent unless given, so that --print_config writes no `trainer: null`, which no command reads)
        parser.add_argument(f"--{key}", type=Any, default=argparse.SUPPRESS, help="(a fit section; ignored by prepare)")
    cfg = parser.parse_args(args)
    from tinylm.cli.argv import home_expanded, options
    from tinylm.cli.unused import warn_loader_flags, warn_unused_options

    # the data options of one table with fit's (`--data.vocab_size 100` with the char tokenizer was silently ignored)
    typed = {key for key, _ in options(args)}
    # (built first: an option out of its range is refused alone, not after a warning that it does nothing)
    dm = PreparedData(**{key: home_expanded(key, value) for key, value in cfg.data.as_dict().items()
                         if not key.startswith("__")})  # (the __path__ of `--data data.yaml`, a section's own file)
    warn_unused_options({"data": cfg.data}, {"data": parser.get_defaults().data}, typed)
    warn_loader_flags(typed)
    dm.prepare_data()
    dm.setup("fit")  # a split too short for one window is refused here, as fit would
    summary = dm.summary()
    print(format_summary(summary))
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """Aligned `key: value` lines, integers with thousands separators."""
    width = max(len(k) for k in summary)

    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return str(v)
        if isinstance(v, int):
            return f"{v:,}"
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, dict):
            return ", ".join(f"{k}={fmt(x)}" for k, x in v.items())
        return str(v)

    return "\n".join(f"{k:<{width}}  {fmt(v)}" for k, v in summary.items())


# ---- generate ---------------------------------------------------------------------------------------------------
# Option(): a decoding option, its type, default and help SamplingConfig's (tinylm/generate/config.py)
@sampling_options("--{}")
def generate(
    ckpt_path: str,
    prompt: str = "",
    prompt_file: str | None = None,
    strategy=Option(),
    max_new_tokens=Option(),
    num_samples: int = 1,
    temperature=Option(),
    top_k=Option(),
    top_p=Option(),
    min_p=Option(),
    typical_p=Option(),
    repetition_penalty=Option(),
    no_repeat_ngram_size=Option(),
    num_beams=Option(default=4),  # the width --strategy beam uses (SamplingConfig's 1 is "no beams")
    length_penalty=Option(),
    early_stopping=Option(),
    penalty_alpha=Option(),
    stop=Option("stop_strings"),
    seed=Option(),
    device: str = "auto",
    no_cache: bool = False,
    draft_ckpt_path=Option(),
    num_draft_tokens=Option(),
    prompt_lookup=Option(),
    regex=Option(),
    json_schema=Option(),
    grammar=Option(),
) -> list[str]:
    r"""Continue a prompt with a trained model and stream the text. Needs only the checkpoint: the tokenizer travels
    inside it.

    Args:
        ckpt_path: A .ckpt written by `tinylm fit` (runs/NAME/checkpoints/best.ckpt), a Hugging Face model's dir, gpt2
        prompt: Text to continue (escapes such as \n are understood); empty starts from the end-of-text token
            (a newline where the tokenizer has none).
        prompt_file: Read the prompt from this UTF-8 file (`-`: piped stdin), as written less one final newline.
        num_samples: Independent samples of the same prompt (one batch).
        stop: Stop a sample at this string (escapes such as "\n\n" are understood); `--stop+ S` adds more.
        device: cpu, cuda, cuda:1, ... (auto: cuda when available).
        no_cache: Recompute the whole context each step (slow; for checking the KV cache).
    """
    import warnings

    from tinylm.checkpoint import load_draft
    from tinylm.device import resolve_device
    from tinylm.generate.prompts import encode_prompt
    from tinylm.hf import load_any

    config = _generate_config(generate.options.values(locals()), num_samples, stop, no_cache, draft_ckpt_path)
    prompt = _prompt_text(prompt, prompt_file)  # before loading, too
    model, tokenizer = load_any(ckpt_path, map_location=(on := resolve_device(device)))
    config = replace(config, eos_id=tokenizer.eos_id)
    draft = load_draft(draft_ckpt_path, tokenizer, on) if draft_ckpt_path else None
    prompt, ids = encode_prompt(tokenizer, prompt)  # empty: the end-of-text token, else a newline
    if len(ids) > (block := model.config.block_size):
        warnings.warn(f"the prompt is {len(ids)} tokens but the model's context is {block}; using its last {block}")
    return _print_samples(model, tokenizer, prompt, ids, num_samples, config, draft)


def _prompt_text(prompt: str, prompt_file: str | None) -> str:
    """generate's prompt: ``prompt`` with its escapes read, or the text of ``prompt_file`` (`read_prompt_file`).
    ``--prompt -`` with text piped in warns: the pipe is not read (it was ignored without a word)."""
    import warnings

    if prompt_file is not None:
        return read_prompt_file(prompt_file, prompt)
    if prompt == "-" and not stdin_is_terminal():
        warnings.warn("--prompt - continues the text '-' (standard input is not read); to read the prompt from "
                      "standard input use --prompt_file -")
    return unescape(prompt)


def _generate_config(options: dict[str, Any], num_samples: int, stop: str | list[str] | None, no_cache: bool,
                     draft_ckpt_path: str | None):
    """The SamplingConfig of generate's flags (``options``: {field: value}), checked before anything is loaded (with
    the draft checkpoint's speculative decoding)."""
    import warnings

    from tinylm.generate.config import idle_draft_tokens, unused_options

    surface, strategy = generate.options, options["strategy"]
    check_ranges("--", {"num_samples": num_samples}, {"num_samples": f"[1, {MAX_SAMPLES}]"}, whole=("num_samples",))
    if num_samples > 1 and strategy != "sample":
        raise ValueError(f"--num_samples {num_samples} with --strategy {strategy} would print {num_samples} identical "
                         f"texts ({strategy} is deterministic); use --strategy sample, or --num_samples 1")
    unused = unused_options(strategy, options, surface.defaults, surface.spell)  # said once the ranges pass
    if strategy != "beam":
        options["num_beams"] = 1  # the beam width of a strategy that has no beams
    if stop is not None:
        options["stop_strings"] = [unescape(s) for s in ([stop] if isinstance(stop, str) else stop)]
    config = surface.config({**options, "use_cache": not no_cache})
    if config.regex or config.json_schema or config.grammar:
        from tinylm.generate.constrained import grammar_text

        grammar_text(config.regex, config.json_schema, config.grammar)  # a bad one now, not after the prompt
    check_speculative(vars(config), surface.spell, draft_ckpt_path)
    if unused:
        warnings.warn(unused)
    if idle := idle_draft_tokens(vars(config), surface.spell, draft_ckpt_path):
        warnings.warn(idle)
    return config


def _print_samples(model, tokenizer, prompt: str, ids: list[int], num_samples: int, config, draft) -> list[str]:
    """Generate and print: one sample streams as it comes, beam search's best at the end, several one by one (a
    progress bar on stderr until then). The options are checked against the model first (`check_decoding`), then
    torch's CPU threads chosen and said: a refused command prints its one line alone."""
    from tinylm.device import use_free_cpus
    from tinylm.generate.rows import decode_after
    from tinylm.generate.strategies import check_decoding, generate_with
    from tinylm.progress import bar

    check_decoding(model, config, num_samples, tokenizer, generate.options.spell)
    use_free_cpus(model.lm_head.weight.device)
    stream = num_samples == 1 and config.strategy != "beam"
    printer = _StreamPrinter(tokenizer.decode, ids, prompt) if stream else None
    with bar(total=config.max_new_tokens, desc="generating", unit="tok", enabled=not stream, leave=False) as progress:
        out = generate_with(model, [ids] * num_samples, config, decode=tokenizer.decode, on_token=printer,
                            draft=draft, tokenizer=tokenizer, on_step=lambda n: progress.update(n - progress.n))
    texts = [decode_after(tokenizer.decode, ids, row) for row in out]
    if stream:
        printer.finish(out[0])
    elif num_samples == 1:  # beam: the one best
        console.write(prompt + texts[0])
    else:
        for i, text in enumerate(texts):
            console.write(("\n\n" if i else "") + f"----- sample {i + 1} -----\n{prompt}{text}")
    console.write("\n")
    _warn_cut_short(model, tokenizer, config, out)
    return texts


def _warn_cut_short(model, tokenizer, config, out: list[list[int]]) -> None:
    """A constrained sample that max_new_tokens ended before its text matched whole (a JSON object without its
    closing brace): said in a line, not printed as if it were a match (exit 0, nothing on stderr)."""
    import logging

    from tinylm.generate.config import CONSTRAINTS

    given = next((k for k in CONSTRAINTS if getattr(config, k, None)), None)
    if given is None:
        return
    from tinylm.generate.constrained import full_matches, grammar_text

    grammar = grammar_text(**{k: getattr(config, k, None) for k in CONSTRAINTS})
    # a row shorter than max_new_tokens that is no whole match ended at a --stop string the user asked for: raising
    # --max_new_tokens would not change it
    whole = full_matches(grammar, tokenizer, model.config.vocab_size, out)
    cut = [i + 1 for i, row in enumerate(out) if not whole[i] and len(row) >= config.max_new_tokens]
    if cut:
        which = "the sample" if len(out) == 1 else f"sample(s) {', '.join(map(str, cut))}"
        logging.getLogger("tinylm").warning(
            "%s ended at --max_new_tokens %d before its text matched the --%s whole (it is cut short); raise "
            "--max_new_tokens", which, config.max_new_tokens, given)


class _StreamPrinter:
    """Prints text as tokens arrive: each time, the tokens not yet shown are decoded after the few before them
    (`decode_after`: a SentencePiece "▁" is a space only after a word), so the cost of a token does not grow with
    the text, and an incomplete UTF-8 character (decoded as U+FFFD) is held back until the token that completes it
    arrives. The prompt is printed with the first token: a refusal before it (a grammar the vocabulary cannot
    write) leaves nothing on standard output (`> out.txt` held the prompt)."""

    def __init__(self, decode, context: list[int], prompt: str) -> None:
        from tinylm.generate.rows import CONTEXT_TOKENS, decode_after

        self.text_after = lambda ids, end: decode_after(decode, ids[max(0, end - CONTEXT_TOKENS):end], ids[end:])
        self.ids = list(context)
        self.start = self.shown = len(self.ids)  # ids[start:] are the new ones; ids[shown:] are not printed yet
        self.printed = 0  # characters printed
        self.prompt: str | None = prompt  # None once printed

    def _prompt(self) -> None:
        if self.prompt is not None:
            console.write(self.prompt)
            self.prompt = None

    def __call__(self, row: int, token: int) -> None:
        self._prompt()
        self.ids.append(token)
        text = self.text_after(self.ids, self.shown)
        if text.endswith("\ufffd"):
            return
        console.write(text)
        self.shown, self.printed = len(self.ids), self.printed + len(text)

    def finish(self, ids: list[int]) -> None:
        self._prompt()  # (no token came: max_new_tokens 0, an end-of-text first)
        text = self.text_after(self.ids[:self.start] + list(ids), self.start)  # the final ids (a stop may trim)
        if len(text) > self.printed:
            console.write(text[self.printed:])


# ---- export -----------------------------------------------------------------------------------------------------
def export(ckpt_path: str, out: str, dtype: Literal["float32", "bfloat16", "float16"] = "float32") -> Path:
    """Write a Hugging Face transformers model directory (config.json, model.safetensors, tokenizer) from a tinylm
    checkpoint: GPT2LMHeadModel for nanoGPT's architecture, LlamaForCausalLM for rope + rmsnorm + swiglu; load it
    with transformers.AutoModelForCausalLM.from_pretrained(DIR).

    Args:
        ckpt_path: Checkpoint written by `tinylm fit` (.ckpt).
        out: Output directory (created if missing).
        dtype: dtype of the saved weights.
    """
    from tinylm.hf import export_hf

    folder = export_hf(ckpt_path, out, dtype=dtype)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    size = sum((folder / f).stat().st_size for f in files)

    def get(gpt2_key: str, llama_key: str):  # the two families name their sizes differently
        return config[gpt2_key] if gpt2_key in config else config[llama_key]

    print(f"wrote {folder}: {config['architectures'][0]} {get('n_layer', 'num_hidden_layers')} layers, "
          f"{get('n_head', 'num_attention_heads')} heads, {get('n_embd', 'hidden_size')} wide, vocab "
          f"{config['vocab_size']:,}, context {get('n_positions', 'max_position_embeddings'):,}, {dtype}")
    print(f"files ({size / 1e6:.1f} MB): {', '.join(files)}")
    print(f"load with: transformers.AutoModelForCausalLM.from_pretrained({str(folder)!r})")
    return folder


# ---- sample-report ----------------------------------------------------------------------------------------------
def _report_prompts(prompts: str | list[str] | None, seed: int, prompts_file: str | None = None) -> list[str] | None:
    """sample-report's prompts, escapes read (None: the default), or those of ``prompts_file`` (`read_prompts_file`),
    and its seed checked against their number."""
    if prompts_file is not None:
        if prompts is not None:
            raise ValueError(f"--prompts and --prompts_file {prompts_file!r} both give the prompts; give one")
        prompts = read_prompts_file(prompts_file)
    elif prompts is not None:
        prompts = [unescape(p) for p in ([prompts] if isinstance(prompts, str) else prompts)]
        if not prompts:  # (it reported on the default prompt, as if --prompts were not given)
            raise ValueError("--prompts is empty: give at least one (e.g. --prompts 'ROMEO:'), or leave it out to "
                             "start every sample from a fresh document")
    last = 2**63 - len(prompts or [""])  # prompt i samples with seed + i
    if not 0 <= seed <= last:
        raise ValueError(f"--seed must be in [0, 2**63 - {len(prompts or [''])}] (prompt i samples with seed + i), "
                         f"got {seed}")
    return prompts


@sampling_options("--{}")
def sample_report(
    ckpt_path: str,
    out: str,
    prompts: str | list[str] | None = None,
    prompts_file: str | None = None,
    num_samples: int = 50,
    max_new_tokens=Option(default=100),
    seed=Option(default=0, annotation=int),  # prompt i samples with seed + i: not null
    device: str = "auto",
    draft_ckpt_path=Option(),
    prompt_lookup=Option(),
    num_draft_tokens=Option(),
    regex=Option(),
    json_schema=Option(),
    grammar=Option(),
) -> dict[str, Any]:
    r"""Sample a checkpoint with several decoding strategies (greedy, temperature, top-k, top-p, min-p, repetition
    penalty, beam, contrastive; speculative and constrained decoding when asked) and compare their diversity,
    repetition, entropy and likelihood in DIR/report.md, DIR/metrics.json and DIR/diversity_vs_likelihood.png.

    Args:
        ckpt_path: A .ckpt written by `tinylm fit`, a Hugging Face GPT-2/Llama folder, or a Hub model's name (gpt2).
        out: Folder to write the report into (created).
        prompts: Text to continue (escapes such as \n are understood); `--prompts+ TEXT` adds more (default: a
            fresh document from the end-of-text token, else a newline).
        prompts_file: Read the prompts from this UTF-8 file (`-`: piped stdin), one a line, escapes such as \n
            understood, blank lines skipped.
        num_samples: Samples per prompt for each sampling strategy.
        seed: Sampling seed (same seed, same report).
        device: cpu, cuda, cuda:1, ... (auto: cuda when available).
        draft_ckpt_path: Adds greedy and sampling (T = 1) drafted by this model (speculative decoding; a .ckpt with
            the same tokenizer), with acceptance rate and tokens per forward pass (prompt_lookup N: by prompt lookup).
        regex: Adds greedy, sampling (T = 1) and beam search constrained to this regular expression (json_schema,
            grammar: to this JSON Schema, Lark grammar or its file), and a column of the samples that match whole.
    """
    from tinylm.checkpoint import load_draft
    from tinylm.device import resolve_device, use_free_cpus
    from tinylm.generate.report import check_report_folder, check_report_inputs, report_strategies, write_report
    from tinylm.generate.report import sample_report as make_report
    from tinylm.hf import load_any

    check_ranges("--", {"num_samples": num_samples}, {"num_samples": f"[1, {MAX_SAMPLES}]"}, whole=("num_samples",))
    constraint = _check_report_options(sample_report.options.values(locals()), draft_ckpt_path)  # before loading
    prompts = _report_prompts(prompts, seed, prompts_file)
    check_report_folder(out, ckpt_path)  # before the sampling, not after
    model, tokenizer = load_any(ckpt_path, map_location=(on := resolve_device(device)))
    draft = load_draft(draft_ckpt_path, tokenizer, on) if draft_ckpt_path else None
    strategies = report_strategies(draft=draft is not None, prompt_lookup=prompt_lookup,
                                   num_draft_tokens=num_draft_tokens, constraint=constraint)
    check_report_inputs(model, tokenizer, prompts, strategies, draft)  # a refusal: its one line, no line of threads
    use_free_cpus(on)
    report = make_report(model, tokenizer, prompts=prompts, num_samples=num_samples, max_new_tokens=max_new_tokens,
                         seed=seed, strategies=strategies, draft=draft, progress=True)
    report = {"checkpoint": str(ckpt_path), **report}
    path = write_report(report, out)
    _print_report_table(report)
    written = [path.name] + [n for n in ("metrics.json", "diversity_vs_likelihood.png") if (path.parent / n).is_file()]
    print(f"wrote {', '.join(written)} to {path.parent}")
    return report


def _check_report_options(options: dict[str, Any], draft_ckpt_path: str | None) -> dict[str, str]:
    """Check sample-report's decoding options (``options``: {field: value}; ``draft_ckpt_path``: its draft); return
    its constraint ({kind: value}, compiled once here so that a bad one stops the report before the checkpoint
    loads). The speculative and the constrained strategies are rows of their own: a draft and a grammar may both be
    given."""
    import warnings

    from tinylm.generate.config import idle_draft_tokens

    check = sample_report.options.check
    check({k: options[k] for k in ("max_new_tokens", "prompt_lookup", "num_draft_tokens")})
    if idle := idle_draft_tokens(options, sample_report.options.spell, draft_ckpt_path):
        warnings.warn(idle)
    constraint = {k: options[k] for k in ("regex", "json_schema", "grammar") if options[k]}
    check(constraint)
    if constraint:
        from tinylm.generate.constrained import grammar_text

        grammar_text(options["regex"], options["json_schema"], options["grammar"])
    return constraint


def _print_report_table(report: dict[str, Any]) -> None:
    """The report's main columns on the terminal (and acceptance, tokens per pass, matches when it has them)."""
    from tinylm.generate.report import _fmt, columns

    width = max(len("strategy"), *map(len, report["strategies"]))
    extra = [(k, h) for k, h in columns(report) if k in ("acceptance", "tokens_per_pass", "matches")]
    nll = max(3, *(len(_fmt(m["nll"])) for m in report["strategies"].values()))  # (an untrained model's 10.825)
    print(f"{'strategy':<{width}}  distinct-2  {'NLL':>{nll}}  rep-4" + "".join(f"  {h:>11}" for _, h in extra))
    for name, m in report["strategies"].items():
        cells = "".join(f"  {_fmt(m.get(k)):>11}" for k, _ in extra)
        print(f"{name:<{width}}  {_fmt(m['distinct_2']):>10}  {_fmt(m['nll']):>{nll}}  "
              f"{_fmt(m['repetition_rate_4']):>5}" + cells)
