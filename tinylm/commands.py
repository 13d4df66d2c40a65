"""tinylm's own subcommands (the ones LightningCLI does not provide): prepare, generate, export, sample-report.

Each takes the argument list after its name, talks to the terminal (library code never does), and raises on
user errors; `tinylm.cli.main` turns those into one line and a non-zero exit.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# Sections of a `tinylm fit` config that `prepare` reads past (it only needs `data`).
_FIT_SECTIONS = ("seed_everything", "trainer", "model", "run", "ckpt_path", "optimizer", "lr_scheduler")


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


def _not_yet(name: str) -> None:
    raise NotImplementedError(f"`tinylm {name}` is not available in this version")


def generate(args: list[str]) -> None:
    _not_yet("generate")


def export(args: list[str]) -> None:
    _not_yet("export")


def sample_report(args: list[str]) -> None:
    _not_yet("sample-report")


def _stdout_write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
