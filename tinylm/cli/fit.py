"""`tinylm fit` and `tinylm validate`: LightningCLI over `TinyLM` and `TinyLMDataModule`, with tinylm's run folders
(tinylm.cli.run_folder), Trainer checks (trainer_checks), resume (resume), the ranks of a DDP run (ranks) and the
run's config.yaml (run_config). This module holds the LightningCLI subclass and its entry point only."""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import logging
import os
import random
import sys
import warnings
import weakref
from pathlib import Path
from typing import Any

from jsonargparse._actions import _ActionPrintConfig
from lightning.pytorch.cli import LightningCLI

from tinylm.cli import console, ranks, rendezvous
from tinylm.cli.argv import home_expanded, options, use_reloadable_yaml
from tinylm.cli.callback_checks import (
    check_callback_states,
    check_recordable,
    check_time_intervals,
    check_train_monitors,
)
from tinylm.cli.config_update import config_dump, with_checkpoint_settings
from tinylm.cli.errors import with_section_hint
from tinylm.cli.resume import apply_checkpoint, complete_cut_save, requeued, resolve_ckpt_path
from tinylm.cli.resume_changes import keep_run_checkpoints, keep_run_seed
from tinylm.cli.run_config import RunConfig
from tinylm.cli.run_folder import RUNS_ROOT, RunOptions, check_run_folder, run_dir_of, with_run_config
from tinylm.cli.run_lock import release_run_folders
from tinylm.cli.trainer_checks import (
    check_checkpoint_names,
    check_exception_checkpoints,
    check_fits_in_memory,
    check_trainer_options,
    precision_plugin,
    trainer_section,
    warn_fp16_weights,
    warn_gpu_recipe_on_cpu,
    warn_small_vocab,
    with_atomic_checkpoints,
)
from tinylm.errors import TinyLMError
from tinylm.ranges import SEED_RANGE, check_ranges
from tinylm.train.loggers import exit_status, finish_wandb

log = logging.getLogger("tinylm")
use_reloadable_yaml()  # every config written or printed reads back as the same values (a run named 3e-4)


_SECTIONS = ("config", "data", "model", "trainer", "run", "samples", "eval", "guard")  # (config: a file of them)


def _named_options(argv: list, *, files: bool = True) -> set[str]:
    """The options a command sets, even to their defaults (`--data.val_batches null` evaluates the whole split,
    not the checkpoint's setting): named on the command line (`--data.KEY`, `--data.KEY=V`), or keys of the
    sections of a `--config` file (unless not ``files``) or of a section given whole (`--data '{...}'`,
    `--samples '{every_n_steps: 0}'`)."""
    import yaml

    named: set[str] = set()
    for key, value in options([arg for arg in argv if isinstance(arg, str)]):
        named.add(key)
        if value is not None and key in _SECTIONS and (files or key != "config"):
            text = value
            with contextlib.suppress(OSError, ValueError):  # a file's name, or the section itself as YAML/JSON
                if Path(value).is_file():
                    text = Path(value).read_text(encoding="utf-8")
            try:
                loaded = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            if isinstance(loaded, dict):
                sections = loaded if key == "config" else {key: loaded}
                named |= {f"{name}.{k}" for name, section in sections.items() if isinstance(section, dict)
                          for k in section}
    return named


_HELP = {
    "ckpt_path": "`last` (this run's newest checkpoint), `best` (its best.ckpt by val/loss) or the path of a .ckpt "
                 "written by `tinylm fit`: fit resumes from it, validate evaluates it",
    "verbose": "Show full tracebacks on errors (tinylm's flag, as for every command; the metrics are always "
               "printed)",
    "weights_only": "Not used: tinylm always loads checkpoints with weights_only=True (tensors and plain values, "
                    "never code); false is refused",
    "trainer.default_root_dir": "The folder of all runs: a run lives in DIR/<run.name>/",
    "trainer.precision": "32-true, bf16-mixed, 16-mixed, bf16-true, 64-true, ... Unset: bf16-mixed on GPUs "
                         "(16-mixed where bf16 is missing); on CPUs bf16-mixed for models at least 256 wide where "
                         "the CPU has native bf16, else 32-true",
    "trainer.max_steps": "Optimizer steps of the run (required: tinylm runs are driven by steps)",
    "trainer.max_epochs": "Refused by tinylm: runs are driven by --trainer.max_steps (an epoch is a notional pass "
                          "over random windows)",
    "trainer.min_epochs": "Not useful in tinylm: its epochs are notional; use --trainer.min_steps",
    "trainer.barebones": "Refused by tinylm: a run is made of the logging, checkpoints and callbacks it turns off",
    "trainer.model_registry": "Refused by tinylm: Lightning uploads only through the checkpoint callback it adds to a "
                              "run without one, and a tinylm run has its own",
    "trainer.overfit_batches": "Refused by tinylm (its loader draws windows by step); to see a model overfit, train "
                               "on a tiny corpus",
    "trainer.gradient_clip_algorithm": "Leave unset (or norm): tinylm clips by the gradients' global norm alone (its "
                                       "grad_norm logging and the stability guard read it); 'value' is refused",
    "trainer.limit_train_batches": "Refused by tinylm but for 1.0 (its epochs are notional): stop a run with "
                                   "--trainer.max_steps",
    "trainer.val_check_interval": "Validate every this many batches (micro-batches: a multiple of "
                                  "accumulate_grad_batches) or after this much time (DD:HH:MM:SS); a fraction of "
                                  "an epoch only with --trainer.check_val_every_n_epoch (tinylm's epochs are "
                                  "notional)",
    "trainer.check_val_every_n_epoch": "Validate every N notional epochs (an epoch: the train split's tokens / "
                                       "(batch_size x block_size) batches); unset (tinylm's default): validation "
                                       "follows --trainer.val_check_interval alone",
    "trainer.logger": "Loggers added to tinylm's own (a CSV in the run folder, W&B when run.wandb_project is set), "
                      "e.g. lightning.pytorch.loggers.TensorBoardLogger; false turns all logging off",
}
"""Help texts of Trainer options whose Lightning docstring says other than what they do in tinylm."""


class TinyLMCLI(LightningCLI):
    """LightningCLI with tinylm's run folders, loggers, checkpoints and monitors."""

    def subcommands(self) -> dict[str, set[str]]:  # the parser of the command that runs only (~0.1 s each to build)
        both = {"fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
                "validate": {"model", "dataloaders", "datamodule"}}  # (lightning_main passes the one's parser_kwargs)
        return {k: v for k, v in both.items() if k in getattr(self, "parser_kwargs", {})} or both

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        # --help says what these do in tinylm, not Lightning's docstrings (its defaults are tinylm's to choose)
        parsers = self._subcommand_parsers.values() if add_subcommands else [self.parser]
        for parser in parsers:
            for action in parser._actions:
                action.help = _HELP.get(action.dest, action.help)
                if action.dest == "verbose":  # tinylm's flag (tracebacks), off unless given; not validate's table
                    action.default = False

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        if "verbose" in kwargs:  # Trainer.validate's own verbose: its table of the metrics, always printed
            kwargs["verbose"] = True
        return kwargs

    def parse_arguments(self, parser, args) -> None:
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, (list, tuple)):
            check_time_intervals(list(argv))
        self._named = _named_options(list(argv)) if isinstance(argv, (list, tuple)) else set()
        self._flags = _named_options(list(argv), files=False) if isinstance(argv, (list, tuple)) else set()
        # from a run's checkpoint with no --config: the run's own settings first (not named by the user: the
        # checkpoint's tokenizer and data still apply where the command sets none). Each rank reads the same files:
        # rank zero writes a resume's record once every rank has joined, long after they parsed this.
        # --print_config of a command from a checkpoint prints what it runs: the checkpoint's model (and the run's
        # data) applied (`_parse_ckpt_path`), not the config's and the defaults' that the command ignores
        later = "ckpt_path" in self._named and isinstance(argv, (list, tuple)) and \
            any(str(a).split("=")[0] == "--print_config" for a in argv)
        try:
            with _ActionPrintConfig.skip_print_config() if later else contextlib.nullcontext():
                super().parse_arguments(parser, with_run_config(list(argv)) if isinstance(argv, (list, tuple))
                                        else args)
        except argparse.ArgumentError as e:  # an option it does not know: where one of that name lives
            if (hinted := with_section_hint(str(e), self._option_names())) != str(e):
                raise TinyLMError(hinted) from e  # (one_line would say the cause's message, without the hint)
            raise
        seed = self._section().get("seed_everything")
        if not isinstance(seed, bool):  # true: a random seed; false: none set
            check_ranges("", {"seed_everything": seed}, {"seed_everything": SEED_RANGE}, whole={"seed_everything"})
        elif seed:  # Lightning's "true: a random seed" set 0 (seed_everything(None) without PL_GLOBAL_SEED), always
            # (the ranks a DDP launcher starts find the seed drawn here in PL_GLOBAL_SEED, which seeding sets)
            drawn = int(os.environ.get("PL_GLOBAL_SEED") or random.SystemRandom().randrange(2**32))
            self._section()["seed_everything"] = drawn
            self.seed_drawn = True  # (tinylm scaling: a rerun of a ladder takes the seed its runs recorded)

    def _option_names(self) -> set[str]:
        """Every option of fit's and validate's parsers, dotted (``model.lr``, ``data.clean.exact``,
        ``seed_everything``): the keys of their defaults, less ``config`` (the files) and the options linked from
        another (``model.block_size``, set from data.block_size)."""
        names: set[str] = set()
        for sub in self._subcommand_parsers.values():
            linked = {a.dest for a in sub._actions if not a.option_strings or not a.option_strings[0].startswith("-")}
            names |= set(sub.get_defaults().keys()) - linked - {"config"}
        return names

    def add_arguments_to_parser(self, parser) -> None:
        from tinylm.train.eval_callback import EvalTasks
        from tinylm.train.guard import StabilityGuard
        from tinylm.train.samples import SampleText

        parser.add_class_arguments(RunOptions, "run")
        parser.add_lightning_class_args(SampleText, "samples")
        parser.add_lightning_class_args(EvalTasks, "eval")
        parser.add_lightning_class_args(StabilityGuard, "guard")
        parser.link_arguments("data.block_size", "model.block_size")  # the data side decides context and vocabulary
        # (on instantiate: the built data module's vocab_size, the tokenizer's real size, not the option's target)
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.eos_id", "model.eos_id", apply_on="instantiate")

    def _dump_config(self) -> None:  # Lightning's, read back by libyaml (tinylm.cli.config_update.config_dump)
        if not hasattr(self, "config_dump"):
            self.config_dump = config_dump(self.parser, self.config, self._parser(self.config.subcommand))

    # ---- the run folder ----------------------------------------------------------------------------------------
    def _section(self):
        return self.config[self.config["subcommand"]]

    def _home_expanded(self):
        """The section's options that take a path with a leading ``~`` expanded (a --config file's
        ``default_root_dir: ~/runs``; the flags' were, tinylm.cli.argv.expand_home); returns the section."""
        cfg = self._section()
        for key, value in cfg.items():
            if (home := home_expanded(key, value)) is not value:
                cfg[key] = home
        return cfg

    def _parse_ckpt_path(self) -> None:
        """Resolve ``--ckpt_path last`` to this run's file, check the run folder, and take the model's
        hyperparameters from the checkpoint (tinylm.cli.resume).

        Overrides LightningCLI's private hook (the only place between parsing and instantiation; see
        tests/cli/test_lightning_private_api.py). Lightning applies checkpoint hyperparameters for paths but not for
        ``last`` (#20801), silently, and reads the whole file; here both behave the same, every ignored override is
        named in one warning, and only the metadata is read (mmap).
        """
        from tinylm.data.prepared import check_data_ranges

        sub = self.config.get("subcommand")
        cfg = self._home_expanded()
        self._check_nulls(cfg)
        check_data_ranges(_options(cfg.data))  # (before the model, given data.block_size, names it model.block_size)
        check_trainer_options(trainer_section(cfg.trainer), sub)
        self.run_dir = run_dir_of(cfg.trainer.get("default_root_dir"), cfg.run.name)
        if sub == "fit":
            check_checkpoint_names(cfg.trainer.get("callbacks"), self.run_dir / "checkpoints",
                                   logger=cfg.trainer.get("logger"))
        RunOptions(**_options(cfg.run))  # its checks, before the data is built (a tokenizer trained, a corpus packed)
        self.resume_step, self.finish_at = None, None  # (int | None: _take_checkpoint's, from resume.Start)
        self.wandb_id: str | None = None
        self.wandb_project: str | None = None  # the W&B project of the run it resumes (its checkpoint's)
        asked = requeued(cfg.get("ckpt_path"), self.run_dir, sub)
        cfg.ckpt_path = ckpt_path = resolve_ckpt_path(asked, self.run_dir, sub)
        # a resume in the checkpoint's own run folder (not a branch into another): it continues the run's records
        self.continues = bool(ckpt_path) and self.run_dir.resolve() in Path(ckpt_path).resolve().parents
        if getattr(self, "seed_drawn", False):  # said now: a resume keeps the run's seed instead
            keep_run_seed(cfg, ckpt_path if sub == "fit" else None, cfg["seed_everything"], recorded=sub == "fit")
        keep_run_checkpoints(cfg.run, ckpt_path if sub == "fit" and self.continues else None, self._named)
        printing = _ActionPrintConfig.is_print_config_requested(self.parser)  # (put off by parse_arguments)
        if sub == "fit" and ranks.rank_zero() and not printing:  # other ranks (launched by rank zero) share its folder
            self._lock = check_run_folder(self.run_dir, ckpt_path, asked, continues=self.continues)
            if asked == "last" and ckpt_path and self.continues:  # (in the run's folder, which it now holds)
                cfg.ckpt_path = ckpt_path = complete_cut_save(ckpt_path, self.run_dir, cfg.run,
                                                              cfg.trainer.get("max_steps"))
        if sub == "fit" and asked == "last" and not ckpt_path:  # (after the check: a folder of logs is refused)
            # (runs/NAME is under the folder the command runs in: a run's config.yaml used from elsewhere, or a
            # mistyped --run.name, starts a new run, which the line says where)
            where = self.run_dir if self.run_dir.is_absolute() else f"{self.run_dir} (in {Path.cwd()})"
            log.warning("--ckpt_path last: %s has no checkpoint yet; starting a new run from step 0", where)
        if ckpt_path:
            self._take_checkpoint(sub, cfg, ckpt_path, printing)
        if printing:
            self._section().ckpt_path = asked
            _ActionPrintConfig.print_config_if_requested(self.parser, self.config)  # (and exits)
        self._check_parsed(sub)

    def _check_nulls(self, cfg) -> None:
        """Refuse ``null`` for an option that takes no None (a --config file's ``lr: null``): jsonargparse lets it
        through from a file, and it ended in a traceback deep in AdamW or in "unsupported operand type(s)"."""
        from tinylm.train.eval_callback import EvalTasks
        from tinylm.train.guard import StabilityGuard
        from tinylm.train.samples import SampleText

        classes = {"model": self.model_class, "data": self.datamodule_class, "run": RunOptions,
                   "samples": SampleText, "eval": EvalTasks, "guard": StabilityGuard}
        for section, cls in classes.items():
            params = inspect.signature(cls).parameters
            for key, value in _options(cfg.get(section) or {}).items():
                p = params.get(key)
                if value is None and p is not None and p.default is not None and not _takes_none(p.annotation):
                    raise TinyLMError(f"{section}.{key} is null, which it cannot be (a --config file's `{key}: "
                                      f"null`?); give it a value, or leave it out for its default, {p.default!r}")

    def _take_checkpoint(self, sub: str, cfg, ckpt_path: str, printing: bool) -> None:
        """The model options (and the run's data) the checkpoint gives the command; for fit, the resume's checks
        (not for --print_config: what a refused resume would run is printed, to change it)."""
        start = apply_checkpoint(ckpt_path, cfg, sub, defaults=self._parser(sub).get_defaults(), named=self._named,
                                 flags=self._flags, continues=self.continues, check=not printing)
        self.ckpt_step, self.resume_step, self.wandb_id = start.step, start.resume_step, start.wandb_id
        self.wandb_project, self.ckpt_threads, self.finish_at = start.wandb_project, start.cpu_threads, start.finish_at
        self.config = with_checkpoint_settings(self.parser, self._parser(sub), sub, self.config, start.update)
        text = {f for f in self._flags if f in ("data", "data.corpus", "data.streaming", "data.max_documents")
                or f.startswith("data.clean")}
        if start.data_state and text and not printing:  # before a tokenizer trains on it
            from tinylm.data import TinyLMDataModule

            TinyLMDataModule.check_text_before_preparing(start.data_state, _options(self.config[sub].data))

    def _check_parsed(self, sub: str) -> None:
        """The options that do nothing in the mode chosen, and the model's own checks, before anything is built."""
        if self._section().get("weights_only") is False:  # (Lightning's: load the checkpoint's pickled code too)
            if "weights_only" in self._flags:
                raise ValueError("--weights_only false is not taken by tinylm: it always loads checkpoints with "
                                 "weights_only=True (tensors and plain values, never code); leave it out")
            # from a config: a run's own record (config.yaml, the checkpoint's kept settings) of a run started with
            # it when it was accepted and ignored: it resumes and validates as before
            log.warning("weights_only: false in the config does nothing: tinylm always loads checkpoints with "
                        "weights_only=True (tensors and plain values, never code)")
        from tinylm.train.options import RANGES, WHOLE

        # the model's numbers before the data is built (a tokenizer trained, a corpus tokenized: minutes, for a
        # typo) and before the warnings: a value out of its range is refused alone, not after "does nothing"
        model = dict(self._section().get("model") or {})
        check_ranges("model", model, RANGES, whole=WHOLE)
        _check_shape(model)
        if sub == "fit":  # (after the checkpoint's model options: what the run trains with)
            from tinylm.cli.unused import warn_unused_options

            # (a resume of the run's own folder reads its config.yaml: what it set was named when the run started)
            warn_unused_options(self._section(), self._parser(sub).get_defaults(), self._flags,
                                only=self._flags if self.continues else None)
            check_recordable(self._parser(sub), self._section())
        else:
            from tinylm.cli.unused import warn_training_flags

            warn_training_flags(self._flags)

    # ---- the trainer -------------------------------------------------------------------------------------------
    def instantiate_trainer(self, **kwargs: Any):
        from lightning.pytorch.callbacks import ModelSummary
        from lightning.pytorch.callbacks import ProgressBar as AnyProgressBar

        from tinylm.device import resolve_precision
        from tinylm.train.parallel import resolve_strategy
        from tinylm.train.progress_bar import without_epoch_total
        from tinylm.train.run import run_callbacks

        sub = self.subcommand
        trainer_cfg = dict(self.config_init[sub]["trainer"])
        run: RunOptions = self.config_init[sub]["run"]
        checkpointing = trainer_cfg.get("enable_checkpointing") is not False
        user_callbacks = trainer_cfg.get("callbacks") or []
        user_callbacks = user_callbacks if isinstance(user_callbacks, list) else [user_callbacks]
        # a user's progress bar or model summary takes the place of tinylm's, as of Lightning's defaults
        bar = trainer_cfg.get("enable_progress_bar") is not False and \
            not any(isinstance(cb, AnyProgressBar) for cb in user_callbacks)
        if sub == "fit":
            callbacks = run_callbacks(self.run_dir / "checkpoints" if checkpointing else None,
                                      every_n_steps=run.checkpoint_every, keep=run.keep_checkpoints,
                                      progress_bar=bar, continues=self.continues, finish_at=self.finish_at,
                                      model_summary=trainer_cfg.get("enable_model_summary") is not False and
                                      not any(isinstance(cb, ModelSummary) for cb in user_callbacks))
        else:
            from tinylm.train.progress_bar import ProgressBar

            callbacks = [ProgressBar()] if bar else []
        if trainer_cfg.get("min_steps") is not None and trainer_cfg.get("min_epochs") is None:
            trainer_cfg["min_epochs"] = 0  # Lightning's default with min_steps is 1: a whole notional epoch more
        check_callback_states(user_callbacks)
        without_epoch_total(user_callbacks)  # a RichProgressBar's "Epoch 0/-2"
        check_train_monitors(user_callbacks, trainer_cfg.get("log_every_n_steps"),
                             trainer_cfg.get("val_check_interval"), trainer_cfg.get("accumulate_grad_batches"))
        trainer_cfg["callbacks"] = user_callbacks + callbacks
        trainer_cfg["default_root_dir"] = str(self.run_dir)
        trainer_cfg["logger"] = self._loggers(trainer_cfg.get("logger"), run)
        trainer_cfg["plugins"] = with_atomic_checkpoints(trainer_cfg.get("plugins"))
        trainer_cfg["strategy"] = resolve_strategy(trainer_cfg.get("strategy", "auto"))  # `fsdp`: FSDP2
        if not precision_plugin(trainer_cfg["plugins"]) or "trainer.precision" in self._flags:
            trainer_cfg["precision"] = resolve_precision(trainer_cfg.get("precision"), self.model.hparams.n_embd,
                                                         trainer_cfg.get("accelerator"))
        else:  # a Precision plugin on the command line is the precision (Lightning refused both: "Received both ...")
            trainer_cfg.pop("precision", None)
        if sub == "fit":
            warn_gpu_recipe_on_cpu(trainer_cfg, self.model.hparams, self.datamodule)
            warn_fp16_weights(trainer_cfg)
            self.model.wandb_id, self.model.wandb_project = self.wandb_id, self.wandb_project
            self.model.read_step = getattr(self, "ckpt_step", None)  # the step its settings were checked at
        extra = [self.config_init[sub][c] for c in self._parser(sub).callback_keys]
        return self._instantiate_trainer({**trainer_cfg, **kwargs}, extra)

    def _loggers(self, user: Any, run: RunOptions) -> Any:
        """tinylm's CSV (+ W&B) loggers joined by the user's; ``--trainer.logger false`` turns all logging off.
        `validate` logs nothing by default: its result goes to ``<run dir>/validate/metrics.csv``."""
        from lightning.pytorch.loggers import Logger

        if user is False:
            log.info("--trainer.logger false: no metrics are logged (no csv/metrics.csv, no W&B)")
            return False
        theirs = [] if user in (None, True) else list(user) if isinstance(user, (list, tuple)) else [user]
        mine: list[Logger] = []
        from tinylm.train.loggers import adopt_users_loggers, make_loggers, offline_quietly, wandb_loggers

        if self.subcommand == "fit":
            theirs, project = adopt_users_loggers(theirs, run.wandb_project, wandb_id=self.wandb_id,
                                                  resume_step=self.resume_step if self.continues else None,
                                                  run_dir=self.run_dir)
            flagged = bool({"run", "run.wandb_project"} & self._flags)
            if project is None and self.wandb_project and not flagged and not wandb_loggers(theirs):
                # a W&B run resumed under a config without a project (the laptop recipe's; the run's own record of a
                # resume that did so): it stopped logging to W&B without a word
                log.info("W&B project %s, the run's own, from its checkpoint (run.wandb_project is null; "
                         "--run.wandb_project null logs without W&B)", self.wandb_project)
                project = self.wandb_project
            mine = make_loggers(self.run_dir, run.name, project, wandb_id=self.wandb_id,
                                resume_step=self.resume_step, project_flag=flagged, run_project=self.wandb_project)
        elif users := wandb_loggers(theirs):  # validate with a WandbLogger of the user's: offline without credentials
            offline_quietly(users)  # or network, as fit's (wandb asked for a key: a UsageError traceback)
        return mine + theirs or False

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        from lightning.pytorch.strategies.launchers import subprocess_script

        # LightningCLI adds its SaveConfigCallback here; ours writes <run dir>/config.yaml (fit only)
        self.save_config_callback = None
        trainer = super()._instantiate_trainer(config, callbacks)
        self._set_cpu_threads(trainer)
        from lightning.pytorch.strategies import ModelParallelStrategy

        if not isinstance(trainer.strategy, ModelParallelStrategy):
            # TinyLM.configure_model shards the model under FSDP2 (a ModelParallelStrategy) only: elsewhere
            # EMAWeightAveraging's "doesn't support sharding model layers, so you may run out of memory" is untrue
            warnings.filterwarnings("ignore", message="You're using the WeightAveraging callback with a model that "
                                                      "overrides the configure_model")
        if trainer.world_size > 1:  # a signal while the ranks connect ends it; they start from one checkpoint
            rendezvous.watch_waits(trainer.strategy, (getattr(self, "ckpt_step", None), self.run_dir, self.subcommand))
        if isinstance(trainer.strategy.launcher, subprocess_script._SubprocessScriptLauncher):
            # ddp's launcher starts it with the ranks it ran (a weak reference: the module outlives the trainer)
            subprocess_script._launch_process_observer = functools.partial(ranks.watch_ranks,
                                                                           trainer=weakref.ref(trainer))
            # the ranks it starts (from this environment) say no torch warning of their own, as they say no Python
            # warning (rank 0 says the same): also none when rank 0 left on a SIGTERM while they connected
            # ("sendBytes failed ... Broken pipe" and its C++ stack); their errors are still said
            os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
            if not trainer.strategy.cluster_environment.creates_processes_externally:
                os.environ[ranks.RANK0_PID] = str(os.getpid())  # this process starts the ranks: they watch it
            elif (rank0 := ranks.rank0_pid()) is not None:
                ranks.watch_rank0(rank0, weakref.ref(trainer))
        if self.subcommand == "fit":
            check_exception_checkpoints(trainer.callbacks, self._section().ckpt_path)
            saver = RunConfig(self._parser("fit"), self.config["fit"], run_dir=self.run_dir,
                              resume_step=self.resume_step, continues=self.continues, **self.save_config_kwargs)
            trainer.callbacks.append(saver)
        return trainer

    def _set_cpu_threads(self, trainer) -> None:
        """A run in one CPU process takes torch's thread count from the CPUs free now (tinylm.device); under DDP
        Lightning divides the CPUs among the ranks itself."""
        if trainer.strategy.root_device.type != "cpu" or trainer.world_size != 1:
            return
        import torch

        from tinylm.device import choose_cpu_threads

        threads, why = choose_cpu_threads(self.config_init[self.subcommand]["run"].threads,
                                          resumed=getattr(self, "ckpt_threads", None))
        torch.set_num_threads(threads)
        log.info("CPU threads: %s", why)

    # ---- after the command -------------------------------------------------------------------------------------
    def before_fit(self) -> None:
        check_fits_in_memory(self.trainer, self.model, self.datamodule.batch_size)  # before a step can be killed
        warn_small_vocab(self.datamodule, resumed=bool(self._section().ckpt_path))
        self.model.check_init_data(self.datamodule)  # before the run writes
        self._record_architecture_from_weights()

    def _record_architecture_from_weights(self) -> None:
        """model.init_from takes the architecture from the weights: name the options set otherwise (a config's or
        the command line's) that it overrides, and have config.yaml (written at setup) record the model built."""
        from tinylm.train.init_from import architecture_fields

        cfg = self.config["fit"]
        if cfg.model.get("init_from") is None:  # also on resume: the checkpoint gave the architecture
            return
        built, defaults = self.model.hparams, self._parser("fit").get_defaults().model
        overridden = [f"model.{k}={cfg.model[k]!r} (weights: {built[k]!r})" for k in architecture_fields()
                      if k in cfg.model and cfg.model[k] != built[k]
                      # (a value at its default that the command names is the user's too: --model.qk_norm false)
                      and (cfg.model[k] != defaults.get(k) or f"model.{k}" in self._named)]
        if overridden:
            log.warning("model.init_from %s: the architecture comes from the weights; ignoring %s",
                        cfg.model.init_from, ", ".join(overridden))
        for k in architecture_fields():
            if k in cfg.model:
                cfg.model[k] = built[k]

    def after_validate(self) -> None:
        """Print the result and append it to ``<run dir>/validate/metrics.csv`` at the checkpoint's step."""
        if not self.trainer.is_global_zero:
            return
        from tinylm.evals.results import append_row, local_time

        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items() if k.startswith("val/")}
        # the text validated: rows of one checkpoint on the run's data and on other text (--data.corpus) told apart
        corpus = getattr(self.datamodule, "corpus_spec", None)
        row = {"time": local_time(), "checkpoint": str(self._section().ckpt_path),
               # the step of the weights validated: the file Lightning loaded, which a running fit may have
               # replaced since the command read it for the run's settings (ckpt_step)
               "step": getattr(self.model, "loaded_step", getattr(self, "ckpt_step", 0)),
               **({"corpus": corpus} if corpus else {}), **metrics}
        if self.model.val_bytes is not None:  # how much text: a split, data.val_batches of it
            row["val_bytes"] = self.model.val_bytes
        ckpt = Path(self._section().ckpt_path).resolve()
        # the checkpoint's own run folder (runs/NAME/checkpoints/x.ckpt), whatever run the config names; for one
        # outside a run folder, the run the command names, else its own folder (the default run name's folder,
        # runs/tinylm/, mixed a loose file's results into that run's, or made a folder that looked like a run)
        named = self._named & {"config", "run", "run.name", "trainer.default_root_dir"}
        run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else self.run_dir if named else ckpt.parent
        path = run_dir.resolve() / "validate" / "metrics.csv"
        self.validate_result, self.validate_csv = row, path
        if self.trainer.fast_dev_run:  # a batch or a few: a check of the command, not the checkpoint's result
            log.info("--trainer.fast_dev_run: validated %s batch(es) only; not recorded in %s",
                     int(self.trainer.fast_dev_run), path)
            self.validate_csv = None
            return
        if path.parent.is_symlink() or path.is_symlink():  # a shared run folder's link: rows appended to a file
            # outside the run folder
            log.warning("not recording the result in %s: %s is a link out of the run folder; remove it to keep "
                        "validation results there", path, path.parent if path.parent.is_symlink() else path)
            self.validate_csv = None
            return
        try:
            append_row(path, row)
        except (OSError, ValueError) as e:  # a read-only or full disk, a damaged file: printed all the same
            log.warning("could not append the result to %s (%s)", path, getattr(e, "strerror", None) or e)
            self.validate_csv = None


def _takes_none(annotation: Any) -> bool:
    """Whether an option's annotation (a type, or its text under ``from __future__ import annotations``) takes None
    (``int | None``, ``Optional[str]``, ``Any``)."""
    import types
    import typing

    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    if isinstance(annotation, str):
        return any(word in annotation for word in ("None", "Optional", "Any"))
    return annotation is type(None) or (typing.get_origin(annotation) in (typing.Union, types.UnionType)
                                        and type(None) in typing.get_args(annotation))


def _options(section: Any) -> dict:
    """A parsed section's options as keyword arguments: less the ``__path__`` jsonargparse adds to one read from a
    file (``--run run.yaml``), there and in the options it holds (data.clean)."""
    items = section.as_dict() if hasattr(section, "as_dict") else dict(section)
    return {k: _options(v) if isinstance(v, dict) else v for k, v in items.items() if not k.startswith("__")}


def _check_shape(model: dict) -> None:
    """The GPT's own checks of the model options (n_embd divisible by n_head, ...) before the data module is built:
    they ran after it had trained a tokenizer and packed the corpus (the vocabulary comes from the data: any here)."""
    from dataclasses import fields

    from tinylm.model.config import GPTConfig

    names = {f.name for f in fields(GPTConfig)}
    GPTConfig(**{**{k: v for k, v in model.items() if k in names}, "vocab_size": 1, "eos_id": 0})


_ABOUT = {"fit": "Train a model: tinylm fit --config configs/NAME.yaml [--trainer.max_steps N] [--ckpt_path last]",
          "validate": "Evaluate a checkpoint on the validation split: tinylm validate --ckpt_path PATH (the data it "
                      "was trained on), or --config configs/NAME.yaml --ckpt_path PATH|last|best"}


def lightning_main(args: list[str], cli_class: type[TinyLMCLI] = TinyLMCLI) -> TinyLMCLI:
    """Run `fit` or `validate` with tinylm's model and data module; returns the CLI object. (``cli_class``: a
    subclass that stops earlier, for commands that only read a fit config: tinylm.cli.fit_config.)"""
    from tinylm.data import TinyLMDataModule
    from tinylm.train.module import TinyLM

    ranks.COMMAND[:] = args
    console.ignore_lightning_advice()
    failed = False
    try:
        cli = cli_class(
            TinyLM,
            getattr(cli_class, "data_class", None) or TinyLMDataModule,
            args=args,
            seed_everything_default=1337,
            # the optimizer and schedule are TinyLM's (--model.lr, --model.lr_schedule)
            auto_configure_optimizers=False,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={"max_epochs": None, "check_val_every_n_epoch": None, "use_distributed_sampler": False,
                              "default_root_dir": RUNS_ROOT},
            parser_kwargs={"prog": "tinylm", "exit_on_error": False, args[0]: {"description": _ABOUT[args[0]]}},
        )
    except BaseException as e:
        finish_wandb(exit_code=exit_status(e))  # (143: stopped by SIGTERM and saved, as the command's own status)
        failed = True
        if isinstance(e, SystemExit) and isinstance(e.__context__, KeyboardInterrupt):
            # Lightning ends its handling of a Ctrl+C (one before training, or a second one) in sys.exit(1), as a
            # failure; main() reports it as every command's Ctrl+C: "interrupted", exit 130
            raise e.__context__ from None
        raise
    else:
        finish_wandb(exit_code=0)
        return cli
    finally:
        release_run_folders(failed=failed)
