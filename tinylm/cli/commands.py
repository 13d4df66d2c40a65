"""tinylm's own subcommands (the ones LightningCLI does not provide): prepare, generate, export, sample-report.

Each takes the argument list after its name, talks to the terminal (library code never does), and raises on
user errors; `tinylm.cli.main` turns those into one line and a non-zero exit.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# Sections of a `tinylm fit` config that `prepare` reads past (it only needs `data`).
_FIT_SECTIONS = ("seed_everything", "trainer", "model", "run", "samples", "ckpt_path", "optimizer", "lr_scheduler")


def prepare(args: list[str]) -> None:
    """`tinylm prepare --config FILE [--data.KEY VALUE ...]`: tokenizer + packed dataset, then a summary."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from tinylm.data import TinyLMDataModule

    parser = ArgumentParser(
        prog="tinylm prepare",
        description="Train/load the tokenizer and pack the corpus into token memmaps; print what was made. "
        "Takes the same config file and --data.* overrides as `tinylm fit`.",
    )
    parser.add_argument("--config", action=ActionConfigFile, help="a tinylm fit config (YAML); only `data` is used")
    parser.add_class_arguments(TinyLMDataModule, "data")
    for key in _FIT_SECTIONS:
        parser.add_argument(f"--{key}", type=Any, default=None, help=argparse.SUPPRESS)
    cfg = parser.parse_args(args)
    dm = TinyLMDataModule(**cfg.data.as_dict())
    dm.prepare_data()
    print(format_summary(dm.summary()))


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


STRATEGIES = ("greedy", "sample", "beam", "contrastive")


def _generate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tinylm generate",
        description="Continue a prompt with a trained model. Needs only the checkpoint: the tokenizer travels inside it.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--ckpt_path", required=True, help="a .ckpt written by `tinylm fit` (e.g. runs/NAME/checkpoints/best.ckpt)")
    p.add_argument("--prompt", default="", help="text to continue; empty starts from the end-of-text token")
    p.add_argument("--strategy", default="sample", choices=STRATEGIES, help="decoding strategy")
    p.add_argument("--max_new_tokens", type=int, default=256, help="tokens to generate per sample")
    p.add_argument("--num_samples", type=int, default=1, help="independent samples of the same prompt (one batch)")
    p.add_argument("--temperature", type=float, default=1.0, help="sample: divide logits by this (<1 sharper)")
    p.add_argument("--top_k", type=int, default=None, help="sample: keep only the k most likely tokens; contrastive: candidates per step (default 4)")
    p.add_argument("--top_p", type=float, default=None, help="sample: keep the smallest set with probability >= p")
    p.add_argument("--min_p", type=float, default=None, help="sample: drop tokens below min_p x the top probability")
    p.add_argument("--repetition_penalty", type=float, default=1.0, help="> 1 discourages tokens already present")
    p.add_argument("--num_beams", type=int, default=4, help="beam: beam width")
    p.add_argument("--length_penalty", type=float, default=1.0, help="beam: score / length**this (>0 favours longer)")
    p.add_argument("--penalty_alpha", type=float, default=0.6, help="contrastive: degeneration penalty weight")
    p.add_argument("--early_stopping", action="store_true", help="beam: stop once num_beams hypotheses have ended")
    p.add_argument("--stop", action="append", default=None, help="stop a sample at this string (repeatable)")
    p.add_argument("--seed", type=int, default=None, help="random seed, for reproducible samples")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (auto: cuda when available)")
    p.add_argument("--no_cache", action="store_true", help="recompute the whole context each step (slow; for checking)")
    return p


def generate(args: list[str]) -> None:
    """`tinylm generate --ckpt_path PATH --prompt TEXT [strategy flags]`: stream a continuation to stdout."""
    import warnings


    from tinylm.checkpoint import load_model
    from tinylm.device import resolve_device
    from tinylm.generate import SamplingConfig, generate_with

    opts = _generate_parser().parse_args(args)
    if opts.num_samples < 1:
        raise ValueError(f"--num_samples must be >= 1, got {opts.num_samples}")
    device = resolve_device(opts.device)
    model, tokenizer, _ = load_model(opts.ckpt_path, map_location=device)
    if tokenizer is None:
        raise ValueError(f"checkpoint {opts.ckpt_path!r} carries no tokenizer; use a checkpoint written by `tinylm fit`")
    config = SamplingConfig(
        strategy=opts.strategy,
        max_new_tokens=opts.max_new_tokens,
        temperature=opts.temperature,
        top_k=(opts.top_k or 4) if opts.strategy == "contrastive" else opts.top_k,
        top_p=opts.top_p,
        min_p=opts.min_p,
        repetition_penalty=opts.repetition_penalty,
        num_beams=opts.num_beams if opts.strategy == "beam" else 1,
        length_penalty=opts.length_penalty,
        early_stopping=opts.early_stopping,
        penalty_alpha=opts.penalty_alpha,
        eos_id=tokenizer.eos_id,
        stop_strings=opts.stop,
        seed=opts.seed,
        use_cache=not opts.no_cache,
    )
    prompt = tokenizer.encode(opts.prompt)
    if not prompt:
        if tokenizer.eos_id is None:
            raise ValueError("the prompt is empty and this tokenizer has no end-of-text token to start from; pass --prompt TEXT")
        prompt = [tokenizer.eos_id]
    block = model.config.block_size
    if len(prompt) > block:
        warnings.warn(f"the prompt is {len(prompt)} tokens but the model's context is {block}; using its last {block} tokens")
    stream = opts.num_samples == 1 and opts.strategy != "beam"
    printer = _StreamPrinter(tokenizer.decode) if stream else None
    _stdout_write(opts.prompt)
    out = generate_with(model, [prompt] * opts.num_samples, config, decode=tokenizer.decode, on_token=printer)
    if stream:
        printer.finish(out[0])
        _stdout_write("\n")
        return
    for i, ids in enumerate(out):
        if i:
            _stdout_write(f"\n\n----- sample {i + 1} -----\n{opts.prompt}")
        _stdout_write(tokenizer.decode(ids))
    _stdout_write("\n")


class _StreamPrinter:
    """Prints text as tokens arrive. Decodes the whole continuation each time and prints what is new, holding
    back an incomplete UTF-8 character (shown as U+FFFD) until the token that completes it arrives."""

    def __init__(self, decode) -> None:
        self.decode, self.ids, self.shown = decode, [], 0

    def __call__(self, row: int, token: int) -> None:
        self.ids.append(token)
        text = self.decode(self.ids)
        if text.endswith("\ufffd"):
            return
        _stdout_write(text[self.shown :])
        self.shown = len(text)

    def finish(self, ids: list[int]) -> None:
        text = self.decode(ids)  # the final ids (a stop string may have trimmed the tail)
        if len(text) > self.shown:
            _stdout_write(text[self.shown :])


def export(args: list[str]) -> None:
    """`tinylm export --ckpt_path PATH --out DIR`: a Hugging Face transformers GPT-2 directory."""
    from tinylm.hf import export_command

    export_command(args)


def sample_report(args: list[str]) -> None:
    """`tinylm sample-report --ckpt_path PATH --out DIR`: decoding strategies compared."""
    from tinylm.generate.report import sample_report_command

    sample_report_command(args)


def _stdout_write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
