"""Commands that read a whole `tinylm fit` config (plan, lr-find, scaling).

Their arguments are split in two: the command's own options (its function's parameters, e.g. ``--gpu``, ``--json``)
and everything else, which LightningCLI parses exactly as `tinylm fit` would (``--config FILE``, ``--model.*``,
``--trainer.*``, ``--print_config``), so a config that trains is a config these commands understand.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tinylm.cli.argv import spans
from tinylm.cli.fit import TinyLMCLI, lightning_main
from tinylm.cli.run_folder import run_dir_of
from tinylm.cli.trainer_checks import (
    check_accelerator,
    check_trainer_options,
    check_validation_interval,
    trainer_section,
)
from tinylm.data.datamodule import TinyLMDataModule
from tinylm.errors import UnavailableError
from tinylm.model import GPTShape

log = logging.getLogger("tinylm")

FIT_ARGS = "fit_args"  # the positional-only first parameter of a command that takes a fit config
CHAR_VOCAB_ASSUMED = 256  # plan's vocabulary for a char tokenizer whose corpus is not here: one id per byte value


def split_args(fn: Callable, args: list[str]) -> tuple[list[str], list[str]]:
    """(the command's own options and ``--help``, the fit config's arguments: every other one), each option with the
    value jsonargparse would give it (tinylm.cli.argv); a bare boolean flag (``--json``) has its ``true`` already
    (`tinylm.cli.commands.run`)."""
    own_keys = {"h", "help", *inspect.signature(fn).parameters} - {FIT_ARGS}
    own: list[str] = []
    fit: list[str] = []
    for key, _, span in spans(args):
        (own if key in own_keys else fit).extend(span)
    return own, fit


class SizedData(TinyLMDataModule):
    """The data module of a command that only sizes the model (plan): the vocabulary's size without the data
    wherever it is known so (tiktoken's encodings), else the tokenizer's (trained or loaded, as fit would); a
    trained BPE whose corpus cannot be read here (offline, not downloaded) is sized at its target vocab_size."""

    __doc__ = TinyLMDataModule.__doc__  # (the options' help)
    _sizes: tuple[int, int | None] | None = None

    @property
    def vocab_size(self) -> int:
        return self.sizes()[0]

    @property
    def eos_id(self) -> int | None:
        return self.sizes()[1]

    def sizes(self) -> tuple[int, int | None]:
        """(vocab_size, eos_id), said in a line when they come from anything but the tokenizer itself."""
        if self._sizes is not None:
            return self._sizes
        import torch

        with torch.device("cpu"):  # (plan builds its model on the meta device; the tokenizer's tensors are real)
            self._sizes = self._read_sizes()
        return self._sizes

    def _read_sizes(self) -> tuple[int, int | None]:
        from tinylm.tokenize.tokenizer import known_sizes

        self._sizes = known_sizes(self.tokenizer_spec)
        if self._sizes is not None:
            log.info("vocab_size %d: %s's own size; neither the corpus nor the tokenizer's files are read (the plan "
                     "needs only the model's shape)", self._sizes[0], self.tokenizer_spec)
            return self._sizes
        try:
            self._sizes = (self.tokenizer.vocab_size, self.tokenizer.eos_id)
        except (UnavailableError, OSError) as e:  # not downloaded, offline (ConnectionError), not found
            why = str(e).split(";")[0]
            if self.tokenizer_spec == "char":
                self._sizes = (CHAR_VOCAB_ASSUMED, None)
                log.info("vocab_size %d assumed: a char tokenizer has one id per distinct character of its corpus "
                         "(65 for tinyshakespeare), and %s cannot be read here (%s); the model's size hardly depends "
                         "on it", CHAR_VOCAB_ASSUMED, self.corpus_spec, why)
                return self._sizes
            if self.tokenizer_spec not in ("bpe", "scratch-bpe"):
                raise
            self._sizes = (self.target_vocab_size, None)
            log.info("vocab_size %d: data.vocab_size, the most a %s tokenizer trained on %s has (that corpus cannot "
                     "be read here: %s)", self.target_vocab_size, self.tokenizer_spec, self.corpus_spec, why)
        return self._sizes


class _ConfigOnlyCLI(TinyLMCLI):
    """`tinylm fit`'s parsing and model/data instantiation, and nothing else: no trainer, no run folder, no run."""

    trains_here = False  # lr-find trains (on the configured accelerator); plan does not
    ladder = False  # scaling: every rung a model of its own size, from scratch, judged by its logged val/loss
    meta_model = False  # the model on the meta device: shapes only (plan)
    data_class: type | None = SizedData  # plan sizes the model: the data itself is not needed

    def _parse_ckpt_path(self) -> None:
        cfg = self._home_expanded()
        # plan, lr-find, scaling: not as configured; the last two train their own steps
        check_trainer_options(trainer_section(cfg.trainer), "fit", runs=False, own_steps=self.trains_here)
        if cfg.get("ckpt_path"):
            raise ValueError(f"--ckpt_path {cfg.ckpt_path} is an option of `tinylm fit`: plan, lr-find and scaling "
                             "take the config's model from scratch (scaling resumes its own runs); leave it out")
        if self.trains_here:
            check_accelerator(cfg.trainer.get("accelerator"))
            try:  # lr-find's next: fit trains these options (the sweep itself validates nothing)
                check_validation_interval(dict(cfg.trainer))
            except ValueError as e:
                raise ValueError(f"the fit this sweep is for would be refused: {e}") from None
        if self.ladder:
            check_ladder_options(cfg)
        self.run_dir = run_dir_of(cfg.trainer.get("default_root_dir"), cfg.run.name)
        self.run_data = self._data_of_run()
        if self.run_data:
            self.config = self.parser.parse_object({"fit": {"data": self.run_data}}, self.config)

    def _data_of_run(self) -> dict:
        """The data of the run the config names, where its folder holds one: the corpus and tokenizer it read
        (its newest config record), unless flags set them; as a resume takes them (tinylm.cli.resume.run_data).
        `tinylm fit --config X --data.corpus my.txt`, then `lr-find --config X`, reads my.txt again."""
        from tinylm.cli.resume import data_of_run
        from tinylm.cli.run_folder import run_record

        record, settings = run_record(self.run_dir)
        trained = settings.get("data")
        if record is None or not isinstance(trained, dict):
            return {}
        return data_of_run(trained, self._section(), self._flags,
                           f"{self.run_dir} holds a run: the data it read, from its {record.name}")

    def instantiate_classes(self) -> None:
        import torch

        model = self._section().model
        if not self.meta_model or model.get("init_from"):  # (pretrained weights are read whole)
            return super().instantiate_classes()
        # plan counts the model's shapes: on the meta device its tensors have no storage, so a 40B-parameter plan
        # allocates nothing and initialises nothing (it took > 120 s and 5 GB built for real); the data module's
        # work (SizedData) runs on the CPU as usual. Of the blocks, all alike, one is built (`gpt_shape` counts
        # them all): 100,000 took minutes on the meta device too. (n_layer 0 is built as given: TinyLM refuses it.)
        n_layer = model.n_layer
        model.n_layer = 1 if isinstance(n_layer, int) and n_layer > 1 else n_layer
        try:
            with torch.device("meta"):
                super().instantiate_classes()
        finally:
            model.n_layer = n_layer
        self.model.hparams.n_layer = n_layer  # the config's, as the table says; the GPT holds one block

    @property
    def gpt_shape(self) -> GPTShape:
        """The config's GPT counted (its n_layer blocks: plan's model holds one)."""
        return GPTShape.of(replace(self.model.model.config, n_layer=self.model.hparams.n_layer))

    def instantiate_trainer(self, **kwargs: Any) -> None:
        return None

    def _run_subcommand(self, subcommand: str) -> None:
        pass


class _MetaConfigCLI(_ConfigOnlyCLI):
    meta_model = True


class _TrainingConfigCLI(_ConfigOnlyCLI):
    trains_here = True
    data_class = None  # (tinylm's data module: lr-find and scaling train on the data)


class _LadderConfigCLI(_TrainingConfigCLI):
    ladder = True
    meta_model = True  # the ladder reads the config's hyperparameters, and every rung builds its own model: the
    # config's, built for real, was held through the whole ladder (gpt2-124m.yaml's: 0.5 GB; gpt2-1.5b.yaml's: 6 GB)


def check_ladder_options(cfg: Any) -> None:
    """Refuse, before a ladder trains anything, fit options that make its runs useless to it: pretrained weights
    (they bring their own size: every rung trained that one model, labelled with the rung's size) and a run that
    logs no final val/loss (the ladder read nothing back after training its first rung)."""
    init_from = cfg.model.get("init_from")
    if init_from:
        raise ValueError(f"model.init_from {init_from!r}: tinylm scaling trains each size of its ladder from scratch, "
                         "and pretrained weights bring their own size (every rung would be that one model); leave "
                         "out --model.init_from (and init_from in the config)")
    limit, logger = cfg.trainer.get("limit_val_batches"), cfg.trainer.get("logger")
    if logger is False or (limit is not None and not isinstance(limit, bool) and float(limit) == 0):
        option = "logger false" if logger is False else f"limit_val_batches {limit}"
        raise ValueError(f"trainer.{option}: tinylm scaling reads each run's final val/loss from its "
                         "csv/metrics.csv, which this run would not log; leave trainer.limit_val_batches and "
                         "trainer.logger unset (validation and the CSV log on)")


def fit_objects(fit_args: list[str], *, trains_here: bool = False, meta: bool = False,
                ladder: bool = False) -> _ConfigOnlyCLI:
    """Parse a fit config as `tinylm fit` does and build its model and data module (the tokenizer is trained or
    loaded: the model's vocabulary comes from it). ``.model``, ``.datamodule``, ``.config["fit"]`` (the resolved
    options; ``.trainer`` is a dict of Trainer options), ``.config_init["fit"]`` and ``.run_dir`` are set.
    ``trains_here``: the caller trains on the configured accelerator, which must then be there. ``meta``: the model
    is built on the meta device (shapes without weights, at any size; not with init_from, whose weights are read).
    ``ladder``: for `tinylm scaling`, which trains here too (`check_ladder_options`); its model is built on the meta
    device, as ``meta``'s (each rung builds its own)."""
    cli_class = (_LadderConfigCLI if ladder else _TrainingConfigCLI if trains_here else _MetaConfigCLI if meta
                 else _ConfigOnlyCLI)
    return lightning_main(["fit", *fit_args], cli_class=cli_class)


def trainer_options(cli: _ConfigOnlyCLI, *, gpu: str | None = None) -> dict[str, Any]:
    """The fit config's Trainer options, with the precision tinylm would pick when it is unset: on this machine, or
    on the GPU named ``gpu`` (bf16-mixed, or 16-mixed on one without bf16: V100, T4, ...)."""
    from tinylm.device import peak_flops_by_name, resolve_precision

    opts = dict(cli.config["fit"]["trainer"])
    if opts.get("precision") is None:
        if gpu is None:
            opts["precision"] = resolve_precision(None, cli.model.hparams.n_embd, opts.get("accelerator"))
        else:
            no_bf16 = peak_flops_by_name(gpu, "bf16-mixed") is None and peak_flops_by_name(gpu, "16-mixed")
            opts["precision"] = "16-mixed" if no_bf16 else "bf16-mixed"
    return opts
