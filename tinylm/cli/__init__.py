"""The `tinylm` command: LightningCLI's `fit`/`validate` plus `prepare`, `generate`, `export` and `sample-report`.

Every error a user can cause ends as one line on stderr and a non-zero exit (add ``--verbose`` for the traceback).
"""

from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any


log = logging.getLogger("tinylm")

LIGHTNING_COMMANDS = ("fit", "validate")
OWN_COMMANDS = ("prepare", "generate", "export", "sample-report")


@dataclass
class RunOptions:
    """Where a run lives and what it logs.

    Args:
        name: Run name: the run folder is ``<root>/<name>`` and W&B shows this name.
        root: Folder holding all runs.
        wandb_project: W&B project to log to; null disables W&B (the CSV log is always written).
        checkpoint_every: Save ``step-N.ckpt`` and ``last.ckpt`` every this many optimizer steps
            (and always at the end of training).
        keep_checkpoints: How many periodic ``step-N.ckpt`` files to keep (-1 keeps all).
    """

    name: str = "tinylm"
    root: str = "runs"
    wandb_project: str | None = "tinylm"
    checkpoint_every: int = 500
    keep_checkpoints: int = 3


def _make_cli_class():
    from tinylm.device import resolve_precision
    from lightning.pytorch.cli import LightningCLI

    from tinylm.train.callbacks import SampleText
    from tinylm.train.run import run_callbacks
    from tinylm.checkpoint import AtomicCheckpointIO
    from tinylm.train.loggers import make_loggers

    class TinyLMCLI(LightningCLI):
        def add_arguments_to_parser(self, parser) -> None:
            parser.add_class_arguments(RunOptions, "run")
            parser.add_lightning_class_args(SampleText, "samples")
            # Each fact has one source: the data side decides context length and vocabulary.
            parser.link_arguments("data.block_size", "model.block_size")
            parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
            parser.link_arguments("data.eos_id", "model.eos_id", apply_on="instantiate")

        def _parse_ckpt_path(self) -> None:
            # A resumed run continues the run as it was: model hyperparameters come from the checkpoint, for
            # `--ckpt_path last` as for a path (Lightning does this only for paths, silently; #20801). Values the
            # config or command line set differently are named in one warning instead of silently dropped.
            sub = self.config.get("subcommand")
            cfg = self.config[sub] if sub else None
            if cfg is not None and cfg.get("ckpt_path") == "last":
                last = Path(cfg.run.root) / cfg.run.name / "checkpoints" / "last.ckpt"
                if last.is_file():
                    cfg.ckpt_path = str(last)
            self._resume: tuple[int | None, str | None] = (None, None)  # (global step, W&B run id) for the loggers
            if cfg is not None and cfg.get("ckpt_path") and Path(cfg.ckpt_path).is_file():
                from tinylm.checkpoint import load_checkpoint

                ckpt = load_checkpoint(cfg.ckpt_path, mmap=True)  # mmap: only metadata is read here
                if sub == "fit":  # the CSV and W&B logs continue from the checkpoint
                    self._resume = (int(ckpt.get("global_step", 0)), ckpt["tinylm"].get("wandb_id"))
                saved = ckpt.get("hyper_parameters", {})
                linked = ("vocab_size", "block_size", "eos_id")  # come from data; checked by the data module
                ignored = [
                    f"model.{k}={cfg.model[k]!r} (checkpoint: {v!r})"
                    for k, v in saved.items()
                    if k not in linked and k in cfg.model and cfg.model[k] != v
                ]
                if ignored:
                    log.warning(
                        "resuming from %s: model hyperparameters come from the checkpoint; ignoring %s "
                        "(to change them, start a new run)", cfg.ckpt_path, ", ".join(ignored)
                    )
            super()._parse_ckpt_path()

        def instantiate_trainer(self, **kwargs: Any):
            run: RunOptions = self._get(self.config_init, "run")
            trainer_cfg = self._get(self.config_init, "trainer", default={})
            if self.subcommand == "fit":
                max_steps = trainer_cfg.get("max_steps", -1)
                if max_steps is None or max_steps <= 0:
                    raise ValueError(f"trainer.max_steps must be > 0, got {max_steps}; tinylm runs are driven by steps")
            run_dir = Path(run.root) / run.name
            ckpt_dir = run_dir / "checkpoints"
            callbacks = run_callbacks(ckpt_dir, every_n_steps=run.checkpoint_every, keep=run.keep_checkpoints,
                                      progress_bar=trainer_cfg.get("enable_progress_bar", True) is not False)
            kwargs.setdefault("default_root_dir", str(run_dir))
            resume_step, wandb_id = getattr(self, "_resume", (None, None))
            kwargs.setdefault("logger", make_loggers(run_dir, run.name, run.wandb_project, wandb_id=wandb_id, resume_step=resume_step))
            kwargs.setdefault("plugins", [AtomicCheckpointIO()])
            kwargs.setdefault("precision", resolve_precision(trainer_cfg.get("precision"), self.model.hparams.n_embd))
            kwargs.setdefault("callbacks", (trainer_cfg.get("callbacks") or []) + callbacks)
            return super().instantiate_trainer(**kwargs)

    return TinyLMCLI


def lightning_main(args: list[str]):
    """Run a LightningCLI subcommand (fit/validate) with tinylm's model and data module; returns the CLI object."""
    from tinylm.data import TinyLMDataModule
    from tinylm.train.module import TinyLM

    cli_class = _make_cli_class()
    # we always pass args explicitly (main() strips --verbose first), which Lightning warns about
    warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python.*")
    return cli_class(
        TinyLM,
        TinyLMDataModule,
        args=args,
        seed_everything_default=1337,
        save_config_kwargs={"overwrite": True},  # re-running or resuming in the same folder must not fail
        trainer_defaults={"max_epochs": None, "check_val_every_n_epoch": None, "use_distributed_sampler": False},
        parser_kwargs={"prog": "tinylm", "description": __doc__.splitlines()[0]},
    )


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not argv or argv[0] in ("-h", "--help"):
        _print_usage()
        return
    command, rest = argv[0], argv[1:]
    try:
        if command in LIGHTNING_COMMANDS:
            lightning_main([command, *rest])
        elif command in OWN_COMMANDS:
            from tinylm.cli import commands

            getattr(commands, command.replace("-", "_"))(rest)
        else:
            raise ValueError(f"unknown command {command!r}; choose one of {', '.join(LIGHTNING_COMMANDS + OWN_COMMANDS)}")
    except KeyboardInterrupt:
        print("tinylm: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # every user error: one line, non-zero exit; --verbose shows the traceback
        if verbose:
            raise
        lines = str(e).strip().splitlines() or [""]
        more = " (more with --verbose)" if len(lines) > 1 else ""
        print(f"tinylm {command}: error: {type(e).__name__}: {lines[0]}{more}", file=sys.stderr)
        sys.exit(1)


def _print_usage() -> None:
    print(
        "usage: tinylm COMMAND [options]   (tinylm COMMAND --help for each)\n\n"
        "  fit            train: tinylm fit --config configs/NAME.yaml [--trainer.max_steps N] [--ckpt_path last]\n"
        "  validate       evaluate: tinylm validate --config configs/NAME.yaml --ckpt_path PATH\n"
        "  prepare        tokenize and pack the data only: tinylm prepare --config configs/NAME.yaml\n"
        "  generate       sample from a checkpoint: tinylm generate --ckpt_path PATH --prompt TEXT\n"
        "  export         write a Hugging Face transformers model: tinylm export --ckpt_path PATH --out DIR\n"
        "  sample-report  compare decoding strategies: tinylm sample-report --ckpt_path PATH --out DIR\n\n"
        "  --verbose      show full tracebacks on errors"
    )


if __name__ == "__main__":
    main()
