"""tinylm's commands, one table: the usage line of each and where its function lives, read by dispatch
(tinylm.cli.main), `tinylm --help` and each own command's parser (tinylm.cli.commands)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One command: its usage line and the function that runs it, as ``module:function`` (imported when the command
    runs: `tinylm --help` imports nothing heavy). `fit` and `validate` are LightningCLI's (``lightning``)."""

    usage: str
    target: str
    lightning: bool = False

    def function(self) -> Callable:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


FIT_GROUPS = ("trainer", "model", "data", "run", "samples", "eval", "guard")
"""The sections of a `tinylm fit` config that hold options (each a mapping)."""

COMMANDS: dict[str, Command] = {
    "fit": Command("train: tinylm fit --config configs/NAME.yaml [--trainer.max_steps N] [--ckpt_path last]",
                   "tinylm.cli.fit:lightning_main", lightning=True),
    "validate": Command("evaluate: tinylm validate --ckpt_path PATH [--config configs/NAME.yaml]",
                        "tinylm.cli.fit:lightning_main", lightning=True),
    "prepare": Command("tokenize and pack the data only: tinylm prepare --config configs/NAME.yaml",
                       "tinylm.cli.commands:prepare"),
    "generate": Command("sample from a checkpoint: tinylm generate --ckpt_path PATH --prompt TEXT",
                        "tinylm.cli.commands:generate"),
    "export": Command("write a Hugging Face transformers model: tinylm export --ckpt_path PATH --out DIR",
                      "tinylm.cli.commands:export"),
    "eval": Command("zero-shot HellaSwag, PIQA, ARC, WinoGrande, LAMBADA scores: tinylm eval --ckpt_path PATH "
                    "[--tasks T,...]", "tinylm.cli.eval:evaluate"),
    "sample-report": Command("compare decoding strategies: tinylm sample-report --ckpt_path PATH --out DIR",
                             "tinylm.cli.commands:sample_report"),
    "plan": Command("size, FLOPs, tokens, memory and time of a run, no training: tinylm plan --config FILE "
                    "[--gpu H100] [--out PNG]", "tinylm.cli.plan:plan"),
    "plot": Command("loss, LR, grad norm, tokens/s and health alerts of runs, one PNG: tinylm plot RUN [RUN ...]",
                    "tinylm.cli.plot:plot"),
    "lr-find": Command("LR range test with the size rule of thumb beside it: tinylm lr-find --config FILE",
                       "tinylm.cli.lr_find:lr_find"),
    "scaling": Command("compute-matched ladder, scaling-law fit, checked prediction: tinylm scaling --config FILE",
                       "tinylm.cli.scaling:scaling"),
}


def usage() -> str:
    width = max(map(len, COMMANDS)) + 2
    lines = [f"  {name:<{width}} {c.usage}" for name, c in COMMANDS.items()]
    return ("usage: tinylm COMMAND [options]   (tinylm COMMAND --help for each; --config FILE and --print_config "
            "work everywhere)\n\n" + "\n".join(lines) + f"\n\n  {'--verbose':<{width}} show full tracebacks on errors"
            f"\n  {'--version':<{width}} print tinylm's version (also -V)")
