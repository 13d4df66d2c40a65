"""Every bad input a user can give the CLI ends as one clear line and a non-zero exit, and damages nothing."""

import json
import os
import re

import pytest
import torch
from helpers import _one_line_error

from tinylm.checkpoint import CHECKPOINT_FORMAT, CheckpointError, load_model
from tinylm.cli import main
from tinylm.cli.resume import resolve_ckpt_path
from tinylm.cli.run_folder import with_run_config
from tinylm.model import GPT, GPTConfig
from tinylm.tokenize.tokenizer import _train_char


@pytest.fixture
def config(run_config):
    return run_config()


@pytest.mark.parametrize(
    "override, needles",
    [
        (["--data.corpus", "nope.txt"], ["nope.txt", "--data.corpus"]),
        (["--data.tokenizer", "sentencepiece"], ["sentencepiece"]),
        (["--data.block_size", "50000"], ["block_size"]),
        # named as the model's option it is linked to (which the user cannot set) / --ckpt_path, which would resume
        (["--data.block_size", "0"], ["data.block_size must be a whole number in [1, inf), got 0"]),
        (["--trainer.gradient_clip_val", "abc"], ["--trainer.gradient_clip_val: expected a number, got abc"]),
        # empty (an unset shell variable): the run landed in ./NAME, the data in ./data_cache, without a word
        (["--trainer.default_root_dir", ""], ["--trainer.default_root_dir is empty (an unset shell variable?)"]),
        (["--data.cache_dir", ""], ["data.cache_dir is empty (an unset shell variable?)"]),
        (["--samples.every_n_steps", "-1"], ["samples.every_n_steps must be >= 0"]),  # (eval.every_n_steps too)
        (["--model.init_from", "tiny.yaml"], ["'tiny.yaml' is not a checkpoint", "pass --model.init_from PATH"]),
        (["--trainer.max_steps", "0"], ["max_steps", "driven by steps"]),
        (["--trainer.max_steps", "-1"], ["max_steps is not set", "--config configs/NAME.yaml"]),
        (["--model.lr_schedule", "linear"], ["lr_schedule", "cosine"]),
        (["--model.n_embd", "33"], ["n_embd"]),
        (["--data.corpus", ""], ["--data.corpus is empty"]),
        (["--trainer.overfit_batches", "1"], ["trainer.overfit_batches=1", "tiny corpus"]),
        (["--trainer.limit_train_batches", "0"], ["trainer.limit_train_batches=0 trains nothing", "max_steps"]),
        (["--trainer.devices", "two"], ["trainer.devices must be a number of devices", "got 'two'"]),
        (["--trainer.devices", "-3"], ["trainer.devices must be a number of devices", "got -3"]),
        (["--trainer.devices", "0"], ["trainer.devices must be a number of devices", "got 0"]),
        (["--trainer.devices", "-1", "--trainer.accelerator", "cpu"],  # (it said "... or -1 for every GPU, got -1")
         ["trainer.devices -1 means every GPU, and this run is on the CPU", "--trainer.devices 1"]),
        (["--trainer.devices", "[0,1]", "--trainer.accelerator", "cpu"],
         ["trainer.devices [0, 1] lists GPU indices", "--trainer.devices 2"]),
        (["--trainer.devices", "[]", "--trainer.accelerator", "cpu"],  # (not --trainer.devices 0: refused too)
         ["trainer.devices [] lists GPU indices", "--trainer.devices 1"]),
        (["--trainer.devices", "0,1,", "--trainer.accelerator", "cpu"],  # Lightning's other form of a list
         ["trainer.devices [0, 1] lists GPU indices", "--trainer.devices 2"]),
        (["--data.tokenizer", "bpe", "--data.vocab_size", "2147483647"],
         ["data.vocab_size must be a whole number in [1, 2**21]"]),
        # Lightning ignored the stop at max_steps (no final validation, no best.ckpt) / stopped at step 0 saying
        # last.ckpt was saved there
        (["--trainer.min_steps", "3"], ["trainer.min_steps 3 is above trainer.max_steps 2", "leave min_steps out"]),
        (["--trainer.max_time", "00:00:00:00"], ["trainer.max_time 00:00:00:00 is no time", "DD:HH:MM:SS"]),
        (["--trainer.max_time", "{minutes: 0}"], ["trainer.max_time {'minutes': 0} is no time"]),
        (["--trainer.max_time", "{minutes: -1}"], ["trainer.max_time {'minutes': -1} is no time"]),  # (stopped at 0)
        (["--trainer.max_time", "{sec: 1}"], ["trainer.max_time {'sec': 1} names what timedelta does not take"]),
        (["--trainer.callbacks+=LearningRateFinder"], ["LearningRateFinder is not taken by tinylm", "tinylm lr-find"]),
        (["--trainer.callbacks+=BatchSizeFinder"], ["BatchSizeFinder is not taken by tinylm", "--data.batch_size"]),
        (["--trainer.check_val_every_n_epoch", "1", "--trainer.val_check_interval", "0.5",
          "--trainer.accumulate_grad_batches", "2"],  # (it said "(a time)")
         ["trainer.val_check_interval=0.5 (a share of an epoch) under trainer.accumulate_grad_batches=2"]),
        # longer than tinylm's notional epoch (known once the data is there): Lightning's ValueError traceback
        (["--trainer.check_val_every_n_epoch", "1", "--trainer.val_check_interval", "100000"],
         ["`val_check_interval` (100000) must be less than or equal to the number of the training batches"]),
        # tinylm logs train/ metrics on logging steps only: Lightning's MisconfigurationException at step 3
        (["--trainer.log_every_n_steps", "10", "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor",
          "train/loss", "--trainer.callbacks.every_n_train_steps", "3"],
         ["ModelCheckpoint(monitor='train/loss', every_n_train_steps=3) checks every 3 steps", "log_every_n_steps"]),
        # taken, and nothing uploaded: Lightning's uploading checkpoint callback is added only to a run without one
        (["--trainer.model_registry", "my-model"], ["trainer.model_registry 'my-model' is not used by tinylm"]),
        (["--trainer.callbacks+=StochasticWeightAveraging", "--trainer.callbacks.swa_lrs", "0.01",
          "--trainer.callbacks.swa_epoch_start", "1"], ["StochasticWeightAveraging is not taken by tinylm",
                                                         "EMAWeightAveraging"]),
        # jsonargparse read it as H:MM:SS, dropping the last field: a checkpoint every 30 s
        (["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.train_time_interval", "00:00:30:00"],
         ["--trainer.callbacks.train_time_interval 00:00:30:00: this option is a timedelta, read as H:MM:SS",
          "write 00:30:00"]),
        # two callbacks whose checkpoint states are keyed alike: Lightning's RuntimeError traceback
        (["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/loss",
          "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/loss"],
         ["--trainer.callbacks holds EarlyStopping{'monitor': 'val/loss', 'mode': 'min'} twice", "drop one"]),
        # written into config.yaml as "Unable to serialize instance ...": a resume from the run's records failed
        (["--trainer.callbacks+=ModelPruning", "--trainer.callbacks.pruning_fn", "l1_unstructured",
          "--trainer.callbacks.amount", "0.5"],
         ["trainer.callbacks[0].init_args.pruning_fn 'l1_unstructured' cannot be written into the run's config.yaml"]),
        (["--trainer.callbacks+=BackboneFinetuning"], ["BackboneFinetuning is not taken by tinylm",
                                                       "--model.init_from"]),
        (["--trainer.barebones", "true"], ["trainer.barebones=true turns off logging, checkpoints and callbacks"]),
        (["--trainer.default_root_dir", "/proc/nope"], ["cannot make the run folder /proc/nope", "default_root_dir"]),
        (["--data.cache_dir", "/proc/nope"], ["cannot make the data cache folder /proc/nope", "--data.cache_dir"]),
        # a named corpus's download folder: FileNotFoundError's traceback
        (["--data.corpus", "tinyshakespeare", "--data.cache_dir", "/proc/nope"],
         ["cannot make the data cache folder /proc/nope", "--data.cache_dir"]),
        # found at the first sample step, these ended the run there, before that step's checkpoint
        (["--samples.every_n_steps", "2", "--samples.prompts", '["é"]'],
         ["samples.prompts: 'é' cannot be encoded", "change --samples.prompts"]),
        (["--samples.every_n_steps", "2", "--samples.prompts", '[""]'],
         ["an empty prompt starts from the end-of-text token, and this char tokenizer has none"]),
        (["--samples.every_n_steps", "2", "--samples.prompts", "[]"],
         ["samples.prompts is empty", "--samples.every_n_steps 0"]),
        # LightningCLI's flags for a torch class: the hint was "optimizer is an option of model: --model.optimizer
        # torch.optim.SGD", which fails again (model.optimizer is adamw or muon)
        (["--optimizer", "torch.optim.SGD"], ["unrecognized arguments: --optimizer torch.optim.SGD; tinylm's optimizer "
                                              "and LR schedule are set with --model.* (optimizer adamw or muon"]),
        (["--lr_scheduler", "StepLR"], ["--lr_scheduler StepLR; tinylm's optimizer and LR schedule are set with"]),
        # a user's callbacks that ended in tracebacks deep in the run, or trained other than the run said
        (["--trainer.callbacks+=StabilityGuard"], ["--trainer.callbacks+=StabilityGuard: tinylm adds its "
                                                   "StabilityGuard to every run itself; set it with --guard.*"]),
        (["--trainer.callbacks+=RNGState"], ["tinylm adds its RNGState to every run itself; set it with nothing"]),
        (["--trainer.callbacks+=GradientAccumulationScheduler", "--trainer.callbacks.scheduling", "{0: 2}"],
         ["GradientAccumulationScheduler is not taken by tinylm: set --trainer.accumulate_grad_batches N"]),
        (["--trainer.callbacks+=GradientAccumulationScheduler"],  # (not asked first for its `scheduling`)
         ["--trainer.callbacks+=GradientAccumulationScheduler is not taken by tinylm: set "
          "--trainer.accumulate_grad_batches N"]),
        # one callback given alone (no +=, no list) skipped these checks: Lightning's "Found more than one stateful
        # callback" traceback, or "expected a list, got Namespace(...Timer...)"
        (["--trainer.callbacks=StabilityGuard"], ["tinylm adds its StabilityGuard to every run itself"]),
        (["--trainer.callbacks=Timer"], ["Timer is not taken by tinylm: set --trainer.max_time DD:HH:MM:SS"]),
        # a class given without += (one callback, not a list): the line was "expected a list, got ..."
        (["--trainer.callbacks", "GradientAccumulationScheduler"],
         ["--trainer.callbacks+=GradientAccumulationScheduler is not taken by tinylm"]),
        (["--trainer.callbacks", "EarlyStopping"], ["class_path 'lightning.pytorch.callbacks.EarlyStopping': the "
                                                    "following arguments are required: monitor"]),
        (["--trainer.callbacks", "Earlystopping"], ["Earlystopping is not a class of lightning.pytorch.callbacks: "
                                                    "did you mean EarlyStopping?", "my_package.MyClass"]),
        (["--trainer.logger", "CSVlogger"], ["CSVlogger is not a class of lightning.pytorch.loggers: did you mean "
                                             "CSVLogger?"]),
        (["--trainer.callbacks+=Timer"], ["Timer is not taken by tinylm: set --trainer.max_time DD:HH:MM:SS"]),
        (["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val_loss"],
         ["--trainer.callbacks.monitor val_loss: tinylm logs no such metric; did you mean val/loss?"]),
        (["--trainer.limit_train_batches", "3"], ["trainer.limit_train_batches=3 changes nothing a tinylm run trains",
                                                  "--trainer.max_steps N"]),
        # 1 == 1.0 let it through: epochs of one batch, and Lightning steps at each epoch's end, so under accumulation
        # every micro-batch stepped alone (the losses of accumulation 1, the gradient halved)
        (["--trainer.limit_train_batches", "1", "--trainer.accumulate_grad_batches", "2"],
         ["trainer.limit_train_batches=1 (a whole number) is one batch an epoch", "--trainer.max_steps"]),
        # DD:HH:MM:SS without the leading zero is YAML's base-60 number: a validation every 216,000 batches, silently
        (["--trainer.val_check_interval", "1:00:00:00"],
         ["--trainer.val_check_interval 1:00:00:00: YAML reads this as a base-60 number (216000", "e.g. 01:00:00:00"]),
        # a time that is none: a validation after every batch (as 0 batches is refused)
        (["--trainer.val_check_interval", "00:00:00:00"], ["trainer.val_check_interval 00:00:00:00 is no time",
                                                           "validate after every batch", "e.g. 00:00:30:00"]),
        (["--trainer.val_check_interval", "{minutes: -5}"], ["trainer.val_check_interval {'minutes': -5} is no time"]),
        # checked at each validation (step 2), and train/loss logged at step 4 first: EarlyStopping's RuntimeError,
        # ModelCheckpoint's MisconfigurationException, mid-run, before any checkpoint
        (["--trainer.max_steps", "6", "--trainer.log_every_n_steps", "4", "--trainer.callbacks+=EarlyStopping",
          "--trainer.callbacks.monitor", "train/loss"],
         ["EarlyStopping(monitor='train/loss') checks at each validation, every 2 steps",
          "--trainer.log_every_n_steps 1 (or a divisor of 2)"]),
        (["--trainer.max_steps", "6", "--trainer.log_every_n_steps", "4", "--trainer.callbacks+=ModelCheckpoint",
          "--trainer.callbacks.monitor", "train/loss", "--trainer.callbacks.dirpath", "mine"],
         ["ModelCheckpoint(monitor='train/loss') checks at each validation, every 2 steps"]),
        # Lightning's -1 is every validation batch, and it took -2 as no sanity check without a word
        (["--trainer.num_sanity_val_steps", "-2"], ["trainer.num_sanity_val_steps must be a whole number in [-1, inf), "
                                                    "got -2"]),
    ],
)
def test_bad_fit_inputs_are_one_line(config, capsys, override, needles):
    """Catches a user mistake ending in a deep traceback instead of a message that names the value and the fix."""
    _one_line_error(capsys, ["fit", "--config", str(config), *override], *needles)


def test_min_steps_equal_to_max_steps_trains(config, tmp_path):
    """The other side of the min_steps check above: min_steps at max_steps contradicts nothing, and the run trains
    to its end."""
    main(["fit", "--config", str(config), "--trainer.min_steps", "2"])
    assert torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2


def test_a_whole_epoch_val_check_interval_trains_under_accumulation(run_config, tmp_path):
    """Catches `--trainer.val_check_interval 1.0` (once per epoch, at its end: a whole number of optimizer steps)
    refused under gradient accumulation as "(a time)" that could fall inside an optimizer step."""
    config = run_config(chars=2_000, trainer={"max_steps": 4, "val_check_interval": 1.0, "check_val_every_n_epoch": 1,
                                              "accumulate_grad_batches": 2})
    main(["fit", "--config", str(config)])
    assert torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "best.ckpt", weights_only=True)["global_step"] > 0


def test_clipping_by_value_is_refused_before_the_run_starts(config, capsys):
    """Catches --trainer.gradient_clip_algorithm value refused only at the first optimizer step, after the model,
    the data and the run folder (config.yaml, csv/) were made."""
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.gradient_clip_algorithm", "value"],
                    "gradient_clip_algorithm='value'", "'norm'")
    assert not (config.parent / "runs").exists()


def test_fit_without_a_config_says_to_pass_one(tmp_path, capsys, monkeypatch):
    """Catches `tinylm fit --data.corpus X` (no --config) blaming a value the user never typed (max_steps -1)."""
    monkeypatch.chdir(tmp_path)
    _one_line_error(capsys, ["fit", "--data.corpus", "x.txt"], "--config configs/NAME.yaml", "--trainer.max_steps N")


def test_damaged_cached_tokenizer_says_delete_it(config, tmp_path, capsys):
    """Catches a damaged cached tokenizer being reported as a bad --data.tokenizer value (the user gave none)."""
    main(["prepare", "--config", str(config)])
    (state,) = (tmp_path / "cache" / "tokenizers").glob("char-*/tinylm_tokenizer.json")
    state.write_text("{not json")
    line = _one_line_error(capsys, ["prepare", "--config", str(config)], "is damaged", "delete that folder")
    assert str(state.parent) in line and "--data.tokenizer takes" not in line


@pytest.mark.parametrize("command", ["prepare", "fit"])
def test_sigterm_during_prepare_ends_with_a_line_and_cleans_up(config, tmp_path, command):
    """Catches SIGTERM killing `tinylm prepare` (or `fit` while it prepares its data, before its own handler takes
    over at the first step) without a word and leaving its temp folder for the next run."""
    import signal
    import time

    import forked  # `python -m tinylm` forked from a process that imported tinylm, torch and Lightning once

    big = tmp_path / "big.txt"
    big.write_text((tmp_path / "shakespeare_small.txt").read_text(encoding="utf-8") * 400)  # 8 MB
    proc = forked.popen([command, "--config", str(config), "--data.corpus", str(big)], cwd=tmp_path,
                        stderr=forked.PIPE)
    datasets = tmp_path / "cache" / "datasets"
    deadline = time.monotonic() + 120
    while not any(datasets.glob("*.tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    if proc.returncode == 0:
        pytest.skip("prepare finished before the signal came (a very fast machine)")
    assert proc.returncode == 143 and "terminated by SIGTERM" in err and "Traceback" not in err, err
    assert not list(datasets.glob("*.tmp-*"))
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no half-made run folder


@pytest.mark.parametrize("command", [["fit"], ["plan"]])
def test_sigterm_while_lightning_is_imported_ends_with_the_line(config, capsys, monkeypatch, command):
    """Catches a SIGTERM in a command's first seconds (Lightning's import) ending it without a word: the command's
    handler came after the import. The signal is sent from inside the import. (generate, which read checkpoints,
    imports no Lightning: tests/process/test_startup.py)"""
    import os
    import signal

    from tinylm.cli import console

    class Unhandled(Exception):
        pass

    def unhandled(signum, frame):  # where the command's own handler is not in place yet (Python's default: killed)
        raise Unhandled

    monkeypatch.setattr(console, "setup_lightning", lambda: os.kill(os.getpid(), signal.SIGTERM))
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        argv = command + ["--config", str(config)]
        _one_line_error(capsys, argv, f"terminated by SIGTERM before it finished; run the same `tinylm {command[0]}`")
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("command", [["generate", "--ckpt_path", "x.ckpt"], ["export", "--ckpt_path", "x.ckpt"],
                                     ["plot", "runs/tiny"]], ids=["generate", "export", "plot"])
def test_a_fit_config_given_to_a_command_that_reads_none_says_so(config, capsys, command):
    """Catches `tinylm generate --config configs/NAME.yaml` (the fit config, as for fit) ending in the parser's
    "Option 'run.name' is not accepted", which names neither the file nor what the command reads instead."""
    line = _one_line_error(capsys, [*command, "--config", str(config)], f"{config} is a `tinylm fit` config (data, "
                           "model, run, samples, seed_everything, trainer)", f"`tinylm {command[0]} --print_config`")
    assert ("from --ckpt_path" in line) == (command[0] != "plot")


@pytest.mark.parametrize("command", ["fit", "plan", "prepare"])
def test_a_config_of_another_command_given_to_fit_says_so(config, tmp_path, capsys, command):
    """Catches `tinylm fit --config g.yaml` (g.yaml: `tinylm generate --print_config`) ending in "Subcommand 'fit'
    does not accept option 'prompt'" (plan's said "Subcommand 'fit'" too), naming neither the file nor the fix."""
    given = tmp_path / "g.yaml"
    given.write_text("ckpt_path: x.ckpt\nprompt: ROMEO\nstrategy: sample\nmax_new_tokens: 10\n")
    line = _one_line_error(capsys, [command, "--config", str(given)], f"config file '{given}' is no `tinylm fit` "
                           "config: it sets max_new_tokens, prompt, strategy and none of the sections trainer,")
    assert f"`tinylm {command} --config` takes a `tinylm fit` config" in line
    if command == "plan":  # a file of plan's own options is said as that, as before
        (tmp_path / "own.yaml").write_text("gpu: H100\nmfu: 0.4\n")
        _one_line_error(capsys, [command, "--config", str(config), "--config", str(tmp_path / "own.yaml")],
                        "sets gpu, mfu, which `tinylm plan` takes as flags")


@pytest.mark.parametrize("command", [["lr-find", "--num_training", "4"], ["scaling", "--budget", "1e8"]],
                         ids=["lr-find", "scaling"])
def test_out_never_replaces_another_file_beside_it(config, capsys, command):
    """Catches `--out DIR/config.png` silently replacing DIR/config.json (an exported model's config) with the
    sweep's or the ladder's numbers (after hours of training): refused before any work, the file untouched."""
    theirs = config.parent / "config.json"
    theirs.write_text('{"model_type": "gpt2"}')
    _one_line_error(capsys, [command[0], "--config", str(config), *command[1:], "--out",
                             str(config.parent / "config.png")], f"{theirs}, which holds another file")
    assert theirs.read_text() == '{"model_type": "gpt2"}' and not (config.parent / "runs").exists()
    mine = config.parent / "mine.png"  # a picture without the command's .json beside it: not its own either
    mine.write_bytes(b"my picture")
    _one_line_error(capsys, [command[0], "--config", str(config), *command[1:], "--out", str(mine)],
                    f"--out {str(mine)!r} already exists, without the mine.json a `tinylm {command[0]}` writes")
    assert mine.read_bytes() == b"my picture"


def test_empty_corpus_is_one_line(config, tmp_path, capsys):
    """Catches an empty corpus turning into a zero-length dataset and a crash inside the sampler."""
    (tmp_path / "empty.txt").write_text("")
    _one_line_error(capsys, ["prepare", "--config", str(config), "--data.corpus", str(tmp_path / "empty.txt")], "empty")
    (tmp_path / "blank.txt").write_text(" \t\n" * 500)  # whitespace alone: it trained a vocabulary of 3
    _one_line_error(capsys, ["prepare", "--config", str(config), "--data.corpus", str(tmp_path / "blank.txt")],
                    "is empty (no text in it)")


@pytest.mark.parametrize("argv, message", [
    (["fit", "--model.lr", "-1e-3"], "model.lr must be in (0, inf), got -0.001"),
    (["plan", "--mfu", "-1E-1"], "--mfu must be in (0, 1], got -0.1"),
    (["lr-find", "--min_lr", "-1e-3"], "--min_lr must be in (0, max_lr=1.0), got -0.001"),
    (["scaling", "--budget", "-1e12"], "--budget must be in (0, 1e24], got -1000000000000.0"),
    (["generate", "--ckpt_path", "x.ckpt", "--temperature", "-1.5e+0"], "--temperature must be in [0.0001, inf)"),
    (["sample-report", "--ckpt_path", "x.ckpt", "--out", "r", "--num_samples", "-1e3"],
     "--num_samples: expected a whole number, got -1000.0"),
])
def test_a_negative_number_in_scientific_notation_is_the_options_value(config, capsys, argv, message):
    """Catches `--model.lr -1e-3` (and -1E5, -1.5e+3) ending in argparse's "expected one argument" (Python 3.11
    takes -1 and -.5 only) instead of the range check's line naming the value."""
    if argv[0] in ("fit", "plan", "lr-find", "scaling"):
        argv = [argv[0], "--config", str(config), *argv[1:]]
    _one_line_error(capsys, argv, message)


def test_a_model_option_out_of_range_is_refused_before_the_data_is_prepared(config, tmp_path, capsys):
    """Catches `--model.lr -1e-3` refused only by TinyLM's own check, after the data module had trained its tokenizer
    and tokenized the corpus (minutes on a large one)."""
    fresh = tmp_path / "fresh-cache"
    _one_line_error(capsys, ["fit", "--config", str(config), "--model.lr", "-1e-3", "--data.cache_dir", str(fresh)],
                    "model.lr must be in (0, inf), got -0.001")
    assert not fresh.exists() or not any(fresh.iterdir())


@pytest.mark.parametrize("argv, message", [
    (["fit", "--model.lr", "nan"], "--model.lr: expected a finite number, got nan"),
    (["generate", "--ckpt_path", "x.ckpt", "--temperature", "inf"], "--temperature: expected a finite number, got inf"),
    (["generate", "--ckpt_path", "x.ckpt", "--max_new_tokens", "1.5"], "--max_new_tokens: expected a whole number"),
    (["generate", "--ckpt_path", "x.ckpt", "--strategy", "topk"],
     "--strategy: expected one of greedy, sample, beam, contrastive, got topk"),
    (["fit", "--trainer.precision", "bf17"], "--trainer.precision: expected one of 64, 32, 16, transformer-engine"),
    (["fit", "--data.vocab_size", '"10"'], "--data.vocab_size: expected a whole number, got the quoted text '10'; "
                                           "write it without quotes"),
])
def test_wrongly_typed_values_are_named_in_plain_words(config, capsys, argv, message):
    """Catches jsonargparse's "Expected a <class 'float'>. Got value: nan" (a float was given, and it is one), and a
    value outside a fixed set named as jsonargparse's "Expected a typing.Literal[...]", or, for --trainer.precision
    (numbers or names), as "expected a whole number": the line lists the values it takes. A number in quotes (YAML's
    text) was "expected a whole number, got 10"."""
    if argv[0] == "fit":
        argv = [argv[0], "--config", str(config), *argv[1:]]
    _one_line_error(capsys, argv, message)


@pytest.mark.parametrize("override, key", [(["--model.n_layer", "two"], "n_layer"),
                                           (["--model.n_layers", "3"], "n_layers")])
def test_config_type_errors_and_typos_are_jsonargparse_messages(config, capsys, override, key):
    """Catches a wrongly typed or misspelled option reaching the model, or ending in a Python traceback."""
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(config), *override])
    assert e.value.code != 0
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err


@pytest.mark.parametrize("command, given, files, hint", [
    ("fit", ["--trainer.lr", "0.01"], {}, "--trainer.lr 0.01; lr is an option of model: --model.lr 0.01"),
    ("plan", ["--trainer.lr=0.01"], {}, "lr is an option of model: --model.lr 0.01"),
    ("fit", [], {"trainer": {"lr": 0.01}}, "'trainer.lr'; lr is an option of model: set it under `model:`"),
    ("lr-find", [], {"n_layer": 3}, "'n_layer'; n_layer is an option of model: set it under `model:`"),
    ("validate", [], {"model": {"seed_everything": 1}}, "seed_everything is a top-level option"),
    ("fit", ["--model.n_layers", "3"], {}, "--model.n_layers 3; the nearest option is --model.n_layer 3"),
    ("fit", ["--trainer.block_size", "8"], {}, "block_size is an option of data: --data.block_size 8"),  # not model's
    ("fit", ["--nosuch.option", "3"], {}, "tinylm fit: error: unrecognized arguments: --nosuch.option 3"),
    # a config's option no section has, nor a near name: a typo, or a config of a newer tinylm (said without a word)
    ("fit", [], {"model": {"brand_new_option": 3}}, "'model.brand_new_option'; no tinylm option has that name: drop "
     "it from the config, or, if a newer tinylm wrote the config, upgrade tinylm (git pull, or pip install -U tinylm)"),
])
def test_an_option_in_the_wrong_section_names_where_it_lives(config, tmp_path, capsys, command, given, files, hint):
    """Catches jsonargparse's bare "unrecognized arguments: --trainer.lr 0.01" (or, from a config file, "does not
    accept option 'trainer.lr'") for an option that lives in another section (model.lr) or is misspelled: the line
    names the option to give instead; one no section has keeps jsonargparse's line as it was."""
    extra = tmp_path / "extra.yaml"
    extra.write_text(json.dumps(files))
    argv = [command, "--config", str(config), *(["--config", str(extra)] if files else []), *given]
    line = _one_line_error(capsys, [*argv, *(["--ckpt_path", "x.ckpt"] if command == "validate" else [])], hint)
    assert line == hint or "nosuch" not in hint  # nothing added to the line of an option no section has


def test_resuming_with_another_tokenizer_names_the_mismatch(config, tmp_path, capsys, small_bpe):
    """Catches a resume with a different vocabulary failing on an unreadable state_dict size mismatch (and, once
    named, only after the data was prepared with the other tokenizer)."""
    main(["fit", "--config", str(config)])
    before = (tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt").read_bytes()
    tiktoken = f"tiktoken:{small_bpe.tiktoken}"  # 512 ids where the run's char tokenizer has 58
    _one_line_error(capsys, ["fit", "--config", str(config), "--data.tokenizer", tiktoken,
                             "--trainer.max_steps", "3", "--ckpt_path", "last"],
                    f"data.tokenizer {tiktoken!r} (512 ids; the run's: 'char', 58 ids)")
    assert (tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt").read_bytes() == before  # nothing damaged


def test_resuming_on_changed_text_or_split_is_refused(config, tmp_path, capsys):
    """Catches a resume silently training on a corpus whose text changed since the checkpoint (same characters,
    other order: the same char tokenizer), or on another train/val cut, as if it were the same run."""
    main(["fit", "--config", str(config)])
    corpus = tmp_path / "shakespeare_small.txt"
    text = corpus.read_text(encoding="utf-8")
    resume = ["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", "last"]
    _one_line_error(capsys, [*resume, "--data.val_fraction", "0.2"], "data.val_fraction=0.1",
                    "--data.val_fraction 0.1")
    corpus.write_text(text[len(text) // 2:] + text[: len(text) // 2], encoding="utf-8")
    _one_line_error(capsys, resume, "other text", "files were edited or replaced", "--model.init_from")
    # the same file by another name (relative, where the run named it absolute): edited, not another file
    _one_line_error(capsys, [*resume, "--data.corpus", corpus.name], "files were edited or replaced")
    (tmp_path / "other.txt").write_text(text[len(text) // 2:] + text[: len(text) // 2], encoding="utf-8")
    other = str(tmp_path / "other.txt")
    _one_line_error(capsys, [*resume, "--data.corpus", other],  # another file: named, and the run's
                    f"other text than data.corpus {other!r} holds now (the run read {str(corpus)!r})")
    corpus.write_text(text + "\n@#%~ new characters", encoding="utf-8")  # edited: another character vocabulary,
    _one_line_error(capsys, resume, "files were edited or replaced")  # said as such (was: "a different model shape")
    corpus.write_text(text, encoding="utf-8")
    main(resume)  # the text it was trained on: resumes


def test_a_resume_on_another_corpus_is_refused_before_its_data_is_prepared(config, tmp_path, capsys):
    """Catches `--data.corpus OTHER` on a resume refused only after the other corpus had a tokenizer trained on it
    and was tokenized whole (minutes on a large one), and, where its characters differ, as "a different model shape
    (vocab_size ...)" naming neither corpus; and another data.clean option refused only after that too."""
    main(["fit", "--config", str(config)])
    cache = tmp_path / "cache"

    def prepared() -> list:  # (the fingerprints remembered by the files' stamps are no preparing)
        return sorted(p.relative_to(cache) for p in cache.rglob("*") if p.name != "fingerprints.json")

    before = prepared()
    other = tmp_path / "other.txt"
    other.write_text("Zebras quietly jumped over 42 lazy foxes; {braces} & <angles>!\n" * 300, encoding="utf-8")
    resume = ["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", "last"]
    _one_line_error(capsys, [*resume, "--data.corpus", str(other)],
                    f"other text than data.corpus {str(other)!r} holds now (the run read ")
    _one_line_error(capsys, [*resume, "--data.corpus", str(tmp_path / "shakespeare_small.txt"),
                             "--data.clean.exact", "true"], "data.clean.exact off but this run has data.clean.exact")
    _one_line_error(capsys, [*resume, "--data.clean.exact", "true"], "data.clean.exact off but this run has")
    (tmp_path / "data.yaml").write_text(f"corpus: {other}\n")  # a section from a file (jsonargparse adds __path__)
    _one_line_error(capsys, [*resume, "--data", str(tmp_path / "data.yaml")], "other text than data.corpus")
    assert prepared() == before  # nothing prepared for either


@pytest.mark.parametrize("flags, says", [
    (["--model.n_embd", "33"], "n_embd (33) must be divisible by n_head (2)"),
    (["--model.positions", "rope", "--model.n_embd", "18", "--model.n_head", "2"], "head size n_embd/n_head = 9"),
    (["--run.checkpoint_every", "0"], "got 0; pass --run.checkpoint_every N (steps between saves), or "
                                      "--trainer.enable_checkpointing false to save none"),
])
def test_model_and_run_options_are_refused_before_the_data_is_prepared(config, tmp_path, capsys, flags, says):
    """Catches a model shape the GPT cannot build, or a bad run option, refused only after the data module had
    trained the tokenizer and packed the corpus (minutes on a large one, for a typo)."""
    _one_line_error(capsys, ["fit", "--config", str(config), "--data.tokenizer", "scratch-bpe",
                             "--data.vocab_size", "300", *flags], says)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("command", ["fit", "prepare"])
def test_a_glob_the_shell_expanded_is_named(tmp_path, capsys, monkeypatch, command):
    """Catches `--data.corpus parts/p_*` unquoted (the shell passes every file: the first as the corpus) ending in
    "unrecognized arguments: parts/p_ab" and nothing else; and the hint said of any word that is a file (a config
    given without --config, a folder after a corpus)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "parts").mkdir()
    for name in ("p_aa", "p_ab"):
        (tmp_path / "parts" / name).write_text("some text\n")
    _one_line_error(capsys, [command, "--data.corpus", "parts/p_aa", "parts/p_ab"],
                    "unrecognized arguments: parts/p_ab; parts/p_ab and the file before it: a glob the shell",
                    "Quote it (--data.corpus 'data/*.txt')")
    _one_line_error(capsys, [command, "--data.corpus=parts/p_aa", "parts/p_ab"], "a glob the shell expanded")
    for stray in (["parts/p_aa"], ["--data.corpus", "parts/p_aa", "parts"]):
        with pytest.raises(SystemExit):
            main([command, *stray])
        err = capsys.readouterr().err
        assert "unrecognized arguments" in err and "glob" not in err, err


def test_checkpoint_mixing_two_shapes_is_refused(config, tmp_path, capsys):
    """Catches weights of one model shape loaded under another's hyperparameters (garbage output, no error), and
    validate or a resume of such a file (or of one missing a tensor) ending in load_state_dict's traceback."""
    main(["fit", "--config", str(config)])
    path = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, weights_only=True)
    ckpt["hyper_parameters"]["n_embd"] = 64
    torch.save(ckpt, tmp_path / "mixed.ckpt")
    with pytest.raises(CheckpointError, match=r"shape \(.*32\) but its hyperparameters make \(.*64\)"):
        load_model(tmp_path / "mixed.ckpt")
    _one_line_error(capsys, ["validate", "--ckpt_path", str(tmp_path / "mixed.ckpt")], "mixed.ckpt",
                    "but its hyperparameters make (", "64)")
    ckpt = torch.load(path, weights_only=True)
    del ckpt["state_dict"]["model.transformer.ln_f.weight"]
    torch.save(ckpt, tmp_path / "dropped.ckpt")
    resume = ["fit", "--config", str(config), "--trainer.max_steps", "4", "--run.name", "branch"]
    _one_line_error(capsys, [*resume, "--ckpt_path", str(tmp_path / "dropped.ckpt")], "dropped.ckpt",
                    "missing weights ['model.transformer.ln_f.weight']")
    main([*resume, "--ckpt_path", str(path)])  # the file it came from resumes (not vacuous)


@pytest.mark.parametrize("limit", ["0", "0.0"])
def test_validate_of_no_batches_is_refused(config, tmp_path, capsys, limit):
    """Catches `tinylm validate --trainer.limit_val_batches 0` validating nothing without a word: it printed
    "step N: " with no metric, exit 0, and appended an empty row to the run's validate/metrics.csv. Refused before
    the checkpoint is read (this one does not exist)."""
    _one_line_error(capsys, ["validate", "--config", str(config), "--ckpt_path", str(tmp_path / "missing.ckpt"),
                             "--trainer.limit_val_batches", limit],
                    "trainer.limit_val_batches=0 validates nothing", "--trainer.limit_val_batches 20")


def test_validate_with_another_block_size_says_to_leave_it_out(config, tmp_path, capsys):
    """Catches `tinylm validate --data.block_size 8` of a block-16 checkpoint told to "resume with the same
    data.block_size, or start a new run": validate resumes nothing; without the option it uses the run's own."""
    main(["fit", "--config", str(config)])
    ckpt = str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")
    line = _one_line_error(capsys, ["validate", "--ckpt_path", ckpt, "--data.block_size", "8"],
                           "block_size: checkpoint 16, this run 8", "leave --data.block_size")
    assert "start a new run" not in line
    main(["validate", "--ckpt_path", ckpt])  # without it: the run's own (not vacuous)


def test_prompt_longer_than_context_warns_and_crops(config, tmp_path, capsys):
    """Catches a long prompt crashing the position embedding instead of using its last block_size tokens."""
    main(["fit", "--config", str(config)])
    capsys.readouterr()  # the run's summary
    ckpt = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    with pytest.warns(UserWarning, match="context is 16"):
        main(["generate", "--ckpt_path", str(ckpt), "--prompt", "ROMEO: " * 10, "--strategy", "greedy",
              "--max_new_tokens", "4"])
    assert capsys.readouterr().out.startswith("ROMEO: ROMEO:")


@pytest.mark.parametrize("flags, needle", [(["--max_new_tokens", "1000000000"], "max_new_tokens"),
                                           (["--strategy", "beam", "--num_beams", "100000"], "num_beams"),
                                           (["--num_samples", "1000000"], "num_samples")])
def test_generate_sizes_have_upper_bounds(config, tmp_path, capsys, flags, needle):
    """Catches a typo'd size (an extra zero or three) running for hours or exhausting memory instead of failing."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "1"])
    ckpt = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    _one_line_error(capsys, ["generate", "--ckpt_path", str(ckpt), "--prompt", "A", *flags], needle)


def test_generation_that_cannot_fit_in_memory_is_refused():
    """Catches a batch whose KV cache needs far more memory than the machine has being started anyway."""
    from tinylm.generate.strategies import check_memory
    from tinylm.model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=64, block_size=4096, n_layer=2, n_head=2, n_embd=512))  # ~32 MiB of cache a row
    check_memory(model, 1)  # one row fits
    with pytest.raises(ValueError, match="num_samples"):
        check_memory(model, 100_000)  # ~3 TiB


def test_one_sequence_that_cannot_fit_in_memory_names_the_context_not_num_samples():
    """Catches a model whose context alone does not fit (a checkpoint or config.json of a rope model saying
    block_size 10**12: the KV cache is sized by it) told to "use fewer --num_samples / --num_beams" when it
    generates one sequence with neither."""
    from tinylm.generate.strategies import check_memory
    from tinylm.model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=64, block_size=10**12, n_layer=2, n_head=2, n_embd=32, positions="rope"))
    with pytest.raises(ValueError, match=r"1 sequence at once .*block_size 1,000,000,000,000 tokens") as e:
        check_memory(model, 1)
    assert "num_samples" not in str(e.value)


@pytest.mark.parametrize("strategy", ["ddp_spawn", ("{class_path: lightning.pytorch.strategies.DDPStrategy, "
                                                    "init_args: {start_method: spawn}}"),
                                      "{class_path: lightning.pytorch.strategies.DDPStrategy, init_args: "
                                      "{start_method: forkserver}}"])
def test_spawning_strategies_are_one_line(config, capsys, strategy):
    """Catches --trainer.strategy ddp_spawn (or a DDPStrategy started by spawn or a fork server, which pickle the
    same) dying in a pickling traceback (cannot pickle '_io.TextIOWrapper')."""
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.strategy", strategy, "--trainer.devices", "2",
                             "--trainer.accelerator", "cpu"], "which pickles", "--trainer.strategy ddp")


def test_ddp_from_a_notebook_names_the_option_that_works_there(config, capsys, monkeypatch):
    """Catches `main(["fit", ..., "--trainer.strategy", "ddp"])` in a notebook's kernel ending in Lightning's advice for
    Python code: "choose ... `Trainer(strategy='ddp_notebook')` ... include the Trainer creation inside the worker
    function", where the option to pass is --trainer.strategy ddp_notebook (ddp starts its ranks by running the
    process's command line again, and a kernel has none to run)."""
    from lightning.pytorch.trainer.connectors import accelerator_connector

    monkeypatch.setattr(accelerator_connector, "_IS_INTERACTIVE", True)  # (Lightning's reading of sys.ps1 at import)
    line = _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.strategy", "ddp", "--trainer.devices",
                                    "2", "--trainer.accelerator", "cpu"],
                           "--trainer.strategy ddp starts its ranks", "--trainer.strategy ddp_notebook")
    assert "Trainer(" not in line and "worker function" not in line


def test_fsdp_from_a_notebook_names_the_option_given(config, capsys, monkeypatch):
    """Catches `main(["fit", ..., "--trainer.strategy", "fsdp"])` in a notebook's kernel refused as "--trainer.strategy
    FSDP2Strategy starts its ranks ..." (a value nobody typed: tinylm's strategy object by then), offering
    ddp_notebook as the fix without saying that it shards nothing."""
    from lightning.pytorch.trainer.connectors import accelerator_connector

    monkeypatch.setattr(accelerator_connector, "_IS_INTERACTIVE", True)  # (Lightning's reading of sys.ps1 at import)
    line = _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.strategy", "fsdp", "--trainer.devices",
                                    "2", "--trainer.accelerator", "cpu"],
                           "--trainer.strategy fsdp (FSDP2) starts its ranks", "nothing sharded")
    assert "FSDP2Strategy" not in line


def test_ddp_spawn_from_a_notebook_names_the_option_that_works_there(config, capsys, monkeypatch):
    """Catches `main(["fit", ..., "--trainer.strategy", "ddp_spawn"])` in a notebook's kernel advising "use
    --trainer.strategy ddp", which the kernel then refuses in turn (it has no command line to run again), where
    ddp_notebook is the option that trains there."""
    from lightning.pytorch.trainer.connectors import accelerator_connector

    monkeypatch.setattr(accelerator_connector, "_IS_INTERACTIVE", True)  # (Lightning's reading of sys.ps1 at import)
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.strategy", "ddp_spawn", "--trainer.devices",
                             "2", "--trainer.accelerator", "cpu"], "which pickles", "--trainer.strategy ddp_notebook")


def test_the_nccl_backend_on_the_cpu_is_one_line(config, capsys):
    """Catches a DDPStrategy with process_group_backend nccl on the CPU ending in a traceback from each rank
    ("Distributed package doesn't have NCCL built in")."""
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.strategy", "{class_path: lightning.pytorch."
                             "strategies.DDPStrategy, init_args: {process_group_backend: nccl}}", "--trainer.devices",
                             "2", "--trainer.accelerator", "cpu"], "'nccl'", "process_group_backend gloo")


@pytest.mark.parametrize("strategy", ["fsdp_cpu_offload", ("{class_path: lightning.pytorch.strategies.FSDPStrategy, "
                                                           "init_args: {state_dict_type: sharded}}"),
                                      "{class_path: lightning.pytorch.strategies.ModelParallelStrategy}"])
def test_fsdp1_is_refused_in_one_line(config, capsys, strategy):
    """Catches FSDP1 training silently without weight decay or Muon, clipping by one shard's norm (it hands the
    optimizer flattened shards), or, on a CPU, Lightning's own refusal as a traceback; and ModelParallelStrategy's
    own defaults (tensor parallel within a node, which tinylm does not apply: nothing sharded) taken as FSDP2."""
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.strategy", strategy],
                    "not supported by tinylm", "--trainer.strategy fsdp (FSDP2")


def test_lightnings_own_trainer_flag_checks_are_one_line(config, capsys):
    """Catches the Trainer's own ValueError for a bad flag (an unknown accelerator name) printed as a traceback."""
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.accelerator", "bogus"], "accelerator='bogus'")


@pytest.mark.parametrize("command", ["fit", "plan"])
def test_an_unknown_strategy_lists_only_the_strategies_tinylm_trains_with(config, capsys, command):
    """Catches Lightning's line for `--trainer.strategy bogus`, whose "Example choices" are ddp_spawn and deepspeed
    (both refused by tinylm), and plan planning that strategy without a word."""
    from tinylm.train.parallel import check_strategy

    line = _one_line_error(capsys, [command, "--config", str(config), "--trainer.strategy", "bogus"],
                           "trainer.strategy 'bogus' is not a strategy", "ddp, ddp_fork", "fsdp (FSDP2")
    listed = line.split("trains with ", 1)[1].split(", the ddp ones")[0]
    assert "spawn" not in line and "deepspeed" not in line
    for name in (n.split(" ")[0] for n in listed.split(", ")):
        check_strategy({"strategy": name})  # each one listed is one tinylm trains with


def test_several_nodes_without_a_cluster_are_refused(config, capsys, monkeypatch, tmp_path):
    """Catches --trainer.num_nodes 2 on one machine waiting forever for node 1 (and deaf to SIGTERM meanwhile)."""
    for var in ("MASTER_ADDR", "SLURM_NTASKS", "SLURM_JOB_NAME", "TORCHELASTIC_RUN_ID", "LSB_JOBID",
                "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "RANK", "WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(var, raising=False)
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.num_nodes", "2",
                             "--trainer.accelerator", "cpu"],
                    "trainer.num_nodes 2", "MASTER_ADDR", "NODE_RANK")
    assert not (tmp_path / "runs").exists()
    main(["fit", "--config", str(config)])  # validate of a checkpoint with num_nodes 2 waited the same way
    capsys.readouterr()
    _one_line_error(capsys, ["validate", "--ckpt_path", "runs/tiny/checkpoints/last.ckpt", "--trainer.num_nodes", "2",
                             "--trainer.accelerator", "cpu"], "trainer.num_nodes 2", "MASTER_ADDR",
                    "or validate on this machine alone: --trainer.num_nodes 1")
    # set by hand, but not whole: each node picked a port of its own, or waited for a node that never comes
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.setenv("NODE_RANK", "0")
    nodes = ["fit", "--config", str(config), "--trainer.num_nodes", "2", "--trainer.accelerator", "cpu", "--run.name",
             "nodes"]
    _one_line_error(capsys, nodes, "needs MASTER_PORT too", "got 'none'")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("NODE_RANK", "5")
    _one_line_error(capsys, nodes, "needs NODE_RANK, this node's number, 0 to 1", "got '5'")
    assert not (tmp_path / "runs" / "nodes").exists()


@pytest.mark.parametrize(("name", "why"), [("a/b", "has a '/'"), ("..", "not a folder of its own"), ("", "empty"),
                                          (" ", "empty"),
                                          ("a\nb", "holds a control character (a line break, a tab, ...)"),
                                          ("x" * 256, "256 bytes, over the 255 a folder name may have")])
def test_a_run_name_with_a_slash_is_refused_before_anything_is_made(config, capsys, tmp_path, name, why):
    """Catches --run.name a/b refused only after the tokenizer was trained and the data packed, leaving an empty
    runs/a/ behind; and `..` or an empty name refused for a '/' they do not have."""
    _one_line_error(capsys, ["fit", "--config", str(config), "--run.name", name], "run.name must be a plain folder "
                    f"name (runs/NAME), got {name!r} ({why})")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("flag", ["--data.corpus", "--data.tokenizer", "--trainer.default_root_dir", "--run.name",
                                  "--data.cache_dir"])
def test_a_name_whose_bytes_are_not_utf8_is_refused_before_anything_is_made(config, capsys, tmp_path, flag):
    """Catches a corpus file named in bytes that are not UTF-8 (`caf\\xe9.txt`, from a Latin-1 archive) ending the
    first fit in a UnicodeEncodeError traceback as meta.json was written (a tokenizer file's: as its copy was saved),
    a --trainer.default_root_dir (or --data.cache_dir) of such bytes training a run whose config.yaml `tinylm
    validate` and every resume then could not read ("while parsing a quoted scalar"), and such a --run.name refused
    as "a control character"."""
    name = os.fsdecode(b"caf\xe9")  # (how Python hands such an argument over: \udce9 for the byte \xe9)
    said = flag.removeprefix("--") if flag.startswith("--data") or flag == "--run.name" else flag
    text = (tmp_path / "shakespeare_small.txt").read_text(encoding="utf-8")
    if flag == "--data.corpus":
        (tmp_path / name).write_text(text, encoding="utf-8")
    elif flag == "--data.tokenizer":  # a saved char tokenizer of the corpus
        _train_char([text]).save(tmp_path / name)
    _one_line_error(capsys, ["fit", "--config", str(config), flag, name], f"{said} {name!r} is no UTF-8 text: its "
                    "bytes b'caf\\xe9' are not UTF-8 (a name in another encoding, such as Latin-1)")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()
    assert flag == "--data.tokenizer" or not (tmp_path / name).is_dir()


def test_a_checkpoint_named_in_bytes_not_utf8_is_read_and_an_export_there_is_one_line(config, capsys, tmp_path):
    """Catches a checkpoint named in bytes that are not UTF-8 (`caf\\xe9.ckpt`, copied from a Latin-1 archive) refused
    by generate, validate, eval and export as "not a readable checkpoint (truncated or not a torch file: 'utf-8'
    codec can't encode ...)": a whole file, which torch's reader could not open by that name; and `tinylm export
    --out` of such a name ending in the tokenizer writer's UnicodeEncodeError traceback; and `tinylm sample-report`
    of such a checkpoint, once loadable, ending in one after the sampling."""
    import shutil

    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    name = tmp_path / os.fsdecode(b"caf\xe9.ckpt")  # (how Python hands such an argument over: \udce9)
    shutil.copy(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", name)
    capsys.readouterr()
    greedy = ["--prompt", "RO", "--strategy", "greedy", "--max_new_tokens", "5"]
    main(["generate", "--ckpt_path", str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"), *greedy])
    want = capsys.readouterr().out
    main(["generate", "--ckpt_path", str(name), *greedy])
    assert capsys.readouterr().out == want
    out = tmp_path / os.fsdecode(b"hf\xe9")
    _one_line_error(capsys, ["export", "--ckpt_path", str(name), "--out", str(out)], f"--out {str(out)!r} is no "
                    "UTF-8 text: its bytes", "rename it in UTF-8 (convmv -f latin1 -t utf8 --notest NAME, or mv)")
    assert not out.exists() and not any(p.name.startswith(".hf") for p in tmp_path.iterdir())
    # sample-report records its checkpoint's name in metrics.json: refused before the sampling (it was a
    # UnicodeEncodeError traceback once the report was written, the sampling lost)
    _one_line_error(capsys, ["sample-report", "--ckpt_path", str(name), "--out", str(tmp_path / "report")],
                    f"--ckpt_path {str(name)!r} is no UTF-8 text, which the report records: its bytes")
    assert not (tmp_path / "report").exists()


def test_a_config_that_is_not_ascii_is_one_line_where_python_reads_files_as_ascii(config, capsys, tmp_path,
                                                                                   monkeypatch):
    """Catches a config holding any letter outside ASCII (the shipped *-modern.yaml recipes: a dash in their first
    comment), and `tinylm validate` of a run whose config.yaml holds one (its name), ending in jsonargparse's
    UnicodeDecodeError traceback under LC_ALL=C with PYTHONUTF8=0, where Python reads files as ASCII."""
    import locale

    main(["fit", "--config", str(config), "--run.name", "théâtre", "--trainer.max_steps", "1"])
    capsys.readouterr()
    config.write_text("# Théâtre\n" + config.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(locale, "getpreferredencoding", lambda do_setlocale=True: "ANSI_X3.4-1968")
    for argv, path, line in ((["fit", "--config", str(config)], str(config), 1),
                             (["validate", "--ckpt_path", "runs/théâtre/checkpoints/last.ckpt"],
                              "runs/théâtre/config.yaml", None)):
        _one_line_error(capsys, argv, f"config file {path!r} holds text that is not ASCII (line {line or ''}",
                        "Python reads files here as ANSI_X3.4-1968, not UTF-8", "run tinylm with PYTHONUTF8=1")
    assert not (tmp_path / "runs" / "tiny").exists()


def test_a_config_read_in_a_latin1_locale_is_not_said_to_be_read_in_the_c_locale(tmp_path, monkeypatch):
    """Catches the refusal of a non-ASCII config under a Latin-1 locale (de_DE.ISO-8859-1, where jsonargparse would
    read "é" as "Ã©") saying "(the C or POSIX locale without UTF-8 mode)": that is the ASCII case alone."""
    import locale

    from tinylm.cli.config_files import check_read_here

    monkeypatch.setattr(locale, "getpreferredencoding", lambda do_setlocale=True: "ISO-8859-1")
    with pytest.raises(ValueError, match="reads files here as ISO-8859-1, not UTF-8") as e:
        check_read_here(tmp_path / "c.yaml", "# Théâtre\n")
    assert "C or POSIX" not in str(e.value) and "PYTHONUTF8=1" in str(e.value)
    monkeypatch.setattr(locale, "getpreferredencoding", lambda do_setlocale=True: "ANSI_X3.4-1968")
    with pytest.raises(ValueError, match=r"not UTF-8 \(the C or POSIX locale without UTF-8 mode\)"):
        check_read_here(tmp_path / "c.yaml", "# Théâtre\n")


@pytest.mark.parametrize(("project", "said"), [
    ("team/tinylm", "run.wandb_project 'team/tinylm' is a team and a project; W&B takes the project alone: "
                    "--run.wandb_project tinylm, with the team in WANDB_ENTITY=team"),
    ("", "run.wandb_project is empty; name a W&B project"), ("a#b?", "run.wandb_project 'a#b?' holds # ?, which W&B")])
def test_a_wandb_project_w_and_b_refuses_is_refused_before_anything_is_made(config, capsys, tmp_path, project, said):
    """Catches `--run.wandb_project team/tinylm` (W&B's habit of naming runs entity/project) ending in wandb's
    UsageError traceback after the data was prepared, and an empty project logging to one named lightning_logs."""
    _one_line_error(capsys, ["fit", "--config", str(config), "--run.wandb_project", project], said)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("env", "said"), [
    ("team/tinylm", "WANDB_PROJECT=team/tinylm is a team and a project; W&B takes the project alone: "
                    "WANDB_PROJECT=tinylm, with the team in WANDB_ENTITY=team"),
    ("a#b", "WANDB_PROJECT=a#b holds #, which W&B"), (" ", "WANDB_PROJECT is set and blank")])
def test_a_wandb_project_variable_w_and_b_refuses_is_refused_before_anything_is_made(config, capsys, tmp_path,
                                                                                    monkeypatch, env, said):
    """Catches WANDB_PROJECT=team/tinylm ending in wandb's UsageError traceback after the data was prepared (wandb
    reads the variable even where --run.wandb_project overrides it), and a blank one naming the W&B project ' '."""
    monkeypatch.setenv("WANDB_PROJECT", env)
    _one_line_error(capsys, ["fit", "--config", str(config), "--run.wandb_project", "tinylm"], said)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("devices", "accelerator", "warns"), [(64, "cpu", True), ("3", "cpu", True), (2, "cpu", False),
                                                             (64, "gpu", False)])
def test_more_cpu_devices_than_cores_are_named_in_a_warning(monkeypatch, devices, accelerator, warns):
    """Catches --trainer.devices 64 on a 2-core CPU starting 64 training processes without a word (Lightning allows
    it): they take turns on the 2 cores, each with its own copy of the run in memory."""
    import warnings

    from tinylm.cli.trainer_checks import check_trainer_options

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)  # a 2-core machine
    monkeypatch.setattr("tinylm.cli.trainer_checks.check_accelerator",
                        lambda accelerator: None)  # gpu: as if one were there
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        check_trainer_options({"accelerator": accelerator, "devices": devices, "max_steps": 10}, "fit")
    lines = [str(w.message) for w in said if "--trainer.devices" in str(w.message)]
    assert len(lines) == warns, lines
    if warns:
        assert f"--trainer.devices {devices} starts {devices} training processes on a CPU with 2 cores" in lines[0]
        assert "use --trainer.devices 2 or fewer" in lines[0]


@pytest.mark.parametrize(("strategy", "why"), [("single_tpu", "TPUs"), ("xla", "TPUs"), ("deepspeed", "DeepSpeed"),
                                               ("deepspeed_stage_3_offload", "DeepSpeed"),
                                               ("lightning.pytorch.strategies.DeepSpeedStrategy", "DeepSpeed")])
def test_deepspeed_and_xla_strategies_are_refused_in_one_line(strategy, why):
    """Catches --trainer.strategy single_tpu ending in Lightning's TypeError traceback (its registry builds the
    strategy without a device), and DeepSpeed (once installed) training without tinylm's clipping or
    train/grad_norm (Lightning only warns that configure_gradient_clipping is not called)."""
    from tinylm.train.parallel import check_strategy

    with pytest.raises(ValueError, match=f"trainer.strategy '{strategy}' is not supported by tinylm: .*{why}") as e:
        check_strategy({"strategy": strategy})
    assert "--trainer.strategy ddp" in str(e.value) and "--trainer.strategy fsdp" in str(e.value)
    check_strategy({"strategy": "ddp_find_unused_parameters_true"})  # Lightning's DDP names still train
    check_strategy({"strategy": "single_device"})
    check_strategy({"strategy": "mylib.OutputLoggingDDP"})  # "tpu" inside a word of a user's class: not a TPU's


def test_single_device_on_several_devices_is_refused_in_one_line():
    """Catches --trainer.strategy single_device --trainer.devices 2 training in one process without a word."""
    from tinylm.cli.trainer_checks import check_trainer_options

    with pytest.raises(ValueError, match="'single_device' trains in one process, and trainer.devices 2 x trainer"
                                         ".num_nodes 1 asks for 2; pass --trainer.strategy ddp"):
        check_trainer_options({"strategy": "single_device", "devices": 2, "accelerator": "cpu", "max_steps": 3}, "fit")
    check_trainer_options({"strategy": "single_device", "devices": 1, "accelerator": "cpu", "max_steps": 3}, "fit")


def test_use_distributed_sampler_true_is_refused_in_one_line():
    """Catches --trainer.use_distributed_sampler true (Lightning's default, in a config copied from another project)
    failing on every DDP rank after setup with Lightning's advice to add `__init__` arguments to ResumableLoader."""
    from tinylm.cli.trainer_checks import check_trainer_options

    with pytest.raises(ValueError, match="trainer.use_distributed_sampler=true is not used by tinylm.*leave it out"):
        check_trainer_options({"use_distributed_sampler": True, "max_steps": 10}, "fit", runs=False)
    check_trainer_options({"use_distributed_sampler": False, "max_steps": 10}, "fit", runs=False)  # tinylm's own


@pytest.mark.parametrize(("env", "trainer", "said"), [
    ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, {"num_nodes": 2, "devices": 2},
     "torchrun started 2 processes (1 node(s) x --nproc_per_node 2), but trainer.num_nodes 2 x trainer.devices 2 is 4; "
     "pass --trainer.num_nodes 1 --trainer.devices 2"),
    ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, {},  # devices auto: 1 on a CPU
     "trainer.num_nodes 1 x trainer.devices 1 is 1; pass --trainer.num_nodes 2 --trainer.devices 2"),
    ({"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "job", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "2"},
     {"num_nodes": 2, "devices": 4}, "SLURM runs this job with --ntasks-per-node 2, but trainer.devices 4; pass "
     "--trainer.devices 2"),
    ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}, {"num_nodes": 2, "devices": 1}, None),
    # the same number of processes, two on one node (torchrun --nnodes 1 --nproc_per_node 2): rank 1's IndexError
    ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, {"num_nodes": 2, "devices": 1},
     "torchrun started 2 processes (1 node(s) x --nproc_per_node 2), but trainer.devices 1 asks for 1 a node; pass "
     "--trainer.num_nodes 1 --trainer.devices 2"),
    ({"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "bash", "SLURM_NTASKS_PER_NODE": "2"}, {"devices": 4}, None),
])
# devices 4 on a machine of fewer cores: tinylm's warning that they take turns, beside this test's point
@pytest.mark.filterwarnings("ignore:--trainer.devices 4 starts 4 training processes on a CPU:UserWarning")
def test_a_launcher_that_started_another_number_of_processes_is_one_line(monkeypatch, env, trainer, said):
    """Catches `torchrun --nproc_per_node 2 -m tinylm fit` with --trainer.num_nodes / --trainer.devices that do not
    multiply to torchrun's world size (devices left at auto: one process on a CPU) ending, after the data and model
    were set up, in Lightning's ValueError as a traceback from every rank, with no fix named."""
    from tinylm.cli.trainer_checks import check_trainer_options

    for var in ("MASTER_ADDR", "SLURM_NTASKS", "SLURM_JOB_NAME", "TORCHELASTIC_RUN_ID", "WORLD_SIZE",
                "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES", "LSB_JOBID", "OMPI_COMM_WORLD_SIZE",
                "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # a cluster is found: num_nodes > 1 is not refused for its lack
    options = {"accelerator": "cpu", "max_steps": 10, **trainer}
    if said is None:
        check_trainer_options(options, "fit")
        return
    with pytest.raises(ValueError) as e:
        check_trainer_options(options, "fit")
    assert said in str(e.value)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a CUDA GPU")
@pytest.mark.parametrize("command", ["fit", "lr-find"])
def test_a_gpu_accelerator_without_a_gpu_is_one_line(config, capsys, command):
    """Catches --trainer.accelerator gpu on a machine without one failing with Lightning's "No supported gpu
    backend found!", which names no fix."""
    _one_line_error(capsys, [command, "--config", str(config), "--trainer.accelerator", "gpu"],
                    "trainer.accelerator 'gpu'", "--trainer.accelerator cpu")


def test_disk_errors_name_the_path_and_a_fix_that_can_work():
    """Catches a read-only file system told to chmod (which cannot help), a disk-full line without the path, and
    EPERM (mkdir in /sys, an immutable folder) ending in a traceback as if it were a bug."""
    import errno

    from tinylm.cli.errors import is_user_error, one_line

    for code, needles, absent in [(errno.EROFS, ["read-only file system: /mnt/ro/x", "writable disk"], "chmod"),
                                  (errno.EACCES, ["permission denied: /mnt/ro/x", "chmod"], "writable disk"),
                                  (errno.EPERM, ["permission denied: /mnt/ro/x", "chmod"], "writable disk"),
                                  (errno.ENOSPC, ["no space left on the disk writing /mnt/ro/x", "--out DIR"],
                                   "chmod")]:
        e = OSError(code, "oops", "/mnt/ro/x")
        line = one_line(e)
        assert is_user_error(e) and all(n in line for n in needles) and absent not in line, line
    # a clash with a folder is no file where a folder is needed: the plain line, which names it
    assert (one_line(FileExistsError(errno.EEXIST, "File exists", "/tmp"))
            == "FileExistsError: [Errno 17] File exists: '/tmp'")


def test_a_full_disk_under_a_copy_names_the_file_written(tmp_path, monkeypatch):
    """Catches a full disk met by a copy or a move (shutil's; W&B's samples table, moved from the system's temporary
    folder into a full WANDB_DIR) named by the file it read: `no space left on the disk writing /tmp/tmpXwandb-media/
    ...table.json`, a disk with room, not the one to free."""
    import errno
    import os
    import shutil

    from tinylm.cli.errors import one_line

    src, dst = tmp_path / "tmp" / "t.table.json", tmp_path / "full" / "t.table.json"
    src.parent.mkdir()
    dst.parent.mkdir()
    src.write_text("{}")

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "sendfile", full)  # (shutil's copy on Linux; elsewhere a read and write loop)
    monkeypatch.setattr(shutil, "_USE_CP_SENDFILE", True)
    with pytest.raises(OSError) as raised:
        shutil.copyfile(src, dst)
    line = one_line(raised.value)
    assert f"no space left on the disk writing {dst};" in line and str(src) not in line, line


def test_a_full_disk_under_redirected_output_names_the_output(tmp_path, capsys, monkeypatch):
    """Catches `tinylm generate ... > samples.txt` (any command's output sent to a file) on a full disk said as
    "no space left on the disk" with the fixes of runs and datasets (--trainer.default_root_dir, --data.cache_dir,
    --out), which cannot help: that OSError names no file. The line names the standard output."""
    import errno
    import io
    import sys

    class Full(io.StringIO):  # a redirected stdout on a full disk
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics.csv").write_text("step,train/loss\n0,3.0\n1,2.5\n")
    monkeypatch.setattr(sys, "stdout", Full())
    with pytest.raises(SystemExit) as ended:
        main(["plot", "metrics.csv", "--out", "p.png"])
    err = capsys.readouterr().err.strip()
    assert ended.value.code == 1 and "\n" not in err and "Traceback" not in err
    assert "no space left on the disk writing the standard output" in err and "another disk" in err, err
    assert "--trainer.default_root_dir" not in err


@pytest.mark.parametrize("blocker, args", [
    ("ff", ["--trainer.default_root_dir", "ff"]),  # the runs folder is a file
    ("runs/tiny", []),  # the run folder is a file
    ("runs/tiny/checkpoints", []),  # found before training, not at the first save after it
    ("cache/datasets", []),  # the dataset cache
    ("dangling", ["--trainer.default_root_dir", "dangling"]),  # a link to nothing
])
def test_a_file_where_a_folder_is_needed_is_one_line(config, capsys, tmp_path, blocker, args):
    """Catches NotADirectoryError/FileExistsError tracebacks from mkdir when a file sits where tinylm makes a folder."""
    path = tmp_path / blocker
    path.parent.mkdir(parents=True, exist_ok=True)
    if blocker == "dangling":
        path.symlink_to(tmp_path / "nowhere")
    else:
        path.write_text("mine")
    line = _one_line_error(capsys, ["fit", "--config", str(config), *args], "where a folder is needed",
                           "move it away")
    assert blocker in line
    assert not (tmp_path / "runs" / "tiny" / "csv").exists()  # refused before training


@pytest.mark.parametrize("flags, verbose", [(["--verbose", "false"], False), (["--verbose=false"], False),
                                            (["--verbose=no"], False), (["--verbose=0"], False),
                                            (["--verbose", "true"], True), (["--verbose"], True)])
def test_verbose_takes_the_value_validate_help_shows(config, capsys, flags, verbose):
    """Catches `tinylm validate ... --verbose false` (the form `validate --help` lists) ending in argparse's
    "unrecognized arguments: false": tinylm's --verbose took the flag and left its value behind."""
    argv = ["validate", "--config", str(config), "--ckpt_path", "missing.ckpt", *flags]
    if verbose:  # the error itself, with its traceback
        with pytest.raises(FileNotFoundError, match="checkpoint 'missing.ckpt' not found"):
            main(argv)
    else:
        _one_line_error(capsys, argv, "checkpoint 'missing.ckpt' not found")


def test_validate_help_shows_verbose_off_and_validate_still_prints_its_table(config, capsys):
    """Catches `tinylm validate --help` saying `--verbose ... (default: True)` (Lightning's own default, for its
    table of metrics) of tinylm's traceback flag, which is off unless given; the table is printed all the same."""
    import re

    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert re.search(r"--verbose \{true,false\} Show full tracebacks on errors .*?default: False\)", shown), shown
    main(["fit", "--config", str(config)])
    capsys.readouterr()
    main(["validate", "--config", str(config), "--ckpt_path", "last"])
    assert "Validate metric" in capsys.readouterr().out


def test_verbose_with_a_value_it_does_not_know_is_refused(config, capsys):
    """Catches `--verbose=maybe` (or `=no` before) quietly turning tracebacks on."""
    with pytest.raises(SystemExit) as e:
        main(["validate", "--config", str(config), "--ckpt_path", "missing.ckpt", "--verbose=maybe"])
    assert e.value.code == "tinylm: error: --verbose takes true or false, got 'maybe'"


@pytest.mark.parametrize(
    "override, needles",
    [
        (["--seed_everything", "-1"], ["seed_everything must be a whole number in [0, 2**32), got -1"]),
        (["--seed_everything", "99999999999"], ["seed_everything must be a whole number in [0, 2**32)"]),
        (["--seed_everything", "1e20"], ["--seed_everything: expected a whole number in [0, 2**32) or true"]),
        (["--data.corpus", "loop"], ["corpus 'loop' is a loop of symbolic links", "--data.corpus PATH"]),
        (["--data.corpus", "dangling"], ["corpus 'dangling' is a link to nothing ('gone.txt' does not exist)"]),
        (["--data.corpus", "rows.csv"], ["corpus 'rows.csv' has no rows (a header or blank lines only)"]),
        (["--trainer.default_root_dir", "loop"], ["loop/tiny is a loop of symbolic links", "--run.name"]),
    ],
    ids=["seed-negative", "seed-too-large", "seed-1e20", "corpus-link-loop", "corpus-dangling-link",
         "csv-of-empty-rows", "run-folder-link-loop"],
)
def test_out_of_range_seeds_and_corpora_that_are_not_files_are_named(config, tmp_path, capsys, override, needles):
    """Catches numpy's traceback for a seed out of its range (-1, 99999999999) and "expected true or false" for
    1e20; a corpus that is a loop of symbolic links or a dangling link reported as "not found"; a CSV holding only
    a header and blank lines ending in `datasets`' traceback 'Instruction "train" corresponds to no data!'; a run
    folder under a loop of links ending in Path.resolve's "RuntimeError: Symlink loop" traceback."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to("gone.txt")
    (tmp_path / "rows.csv").write_text("text\n\n\n")
    _one_line_error(capsys, ["fit", "--config", str(config), *override], *needles)


@pytest.mark.parametrize("text", ["", "# only a comment\n"], ids=["empty", "comments"])
def test_an_empty_config_file_is_named(tmp_path, capsys, monkeypatch, text):
    """Catches an empty YAML config ending in jsonargparse's "Unexpected config:" and nothing more; and a config
    that is a loop of symbolic links reported as "not found"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.yaml").write_text(text)
    _one_line_error(capsys, ["fit", "--config", "empty.yaml"], "config file 'empty.yaml' is empty",
                    "configs/shakespeare-char-cpu.yaml")
    (tmp_path / "a.yaml").symlink_to("b.yaml")
    (tmp_path / "b.yaml").symlink_to("a.yaml")
    _one_line_error(capsys, ["fit", "--config", "a.yaml"], "config file 'a.yaml' is a loop of symbolic links")


@pytest.mark.parametrize(("text", "got"), [("trainer:\n  # max_steps: 9\n", "null"), ("model: 5\n", "5"),
                                           ("data: [1]\n", "[1]")], ids=["commented-out", "number", "list"])
def test_a_section_that_is_not_a_mapping_is_named(tmp_path, capsys, monkeypatch, text, got):
    """Catches `trainer:` with its options commented out ending in "TypeError: 'NoneType' object is not iterable",
    `data: [1]` in 'Key "data.block_size" not found in namespace' and `model: 5` going unnoticed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(text)
    section = text.split(":")[0]
    _one_line_error(capsys, ["fit", "--config", "bad.yaml"], f"config file 'bad.yaml': section {section}: must hold",
                    f"got {got}")


@pytest.mark.parametrize(("text", "key", "lines"), [
    ("model:\n  n_layer: 3\ndata:\n  block_size: 16\nmodel:\n  dropout: 0.1\n", "model", "lines 1 and 5"),
    ("model:\n  n_embd: 48\n  n_embd: 64\n", "n_embd", "lines 2 and 3")], ids=["section", "option"])
def test_a_key_given_twice_in_a_config_is_named(tmp_path, capsys, monkeypatch, text, key, lines):
    """Catches a second `model:` section appended to a recipe silently dropping every option of the first (PyYAML
    keeps the last of two equal keys): the run trained another model than the file reads."""
    from tinylm.cli.config_files import check_config_files

    monkeypatch.chdir(tmp_path)
    (tmp_path / "twice.yaml").write_text(text)
    _one_line_error(capsys, ["fit", "--config", "twice.yaml"], f"config file 'twice.yaml' sets '{key}' twice",
                    lines, "give each key once")
    # a key merged in from an anchor may be overridden: that is what `<<:` is for
    (tmp_path / "merge.yaml").write_text("base: &b\n  n_layer: 2\nmodel:\n  <<: *b\n  n_layer: 3\n")
    check_config_files(["--config", "merge.yaml"])


@pytest.mark.parametrize("option", ["--sizes", "--predict"])
def test_an_empty_list_where_one_is_needed_is_not_unset(config, tmp_path, capsys, option):
    """Catches `scaling --sizes []` (or `--predict []`) training the default ladder (or predicting the default
    model), as if the option were not given."""
    _one_line_error(capsys, ["scaling", "--config", str(config), option, "[]", "--out", str(tmp_path / "s.png")],
                    "--sizes needs at least 3 [n_layer, n_embd] pairs and --predict one pair", "got [")
    assert not (tmp_path / "s.png").exists()


@pytest.mark.parametrize(
    "text, needles",
    [("step,train/loss\n0,nan\n1,inf\n2,nan\n", ["logged no finite loss (3 train/loss values, every one NaN or inf)"]),
     ("name,age\nann,3\n", ["is not a tinylm metrics.csv (no 'step' column", "pass a run folder"])],
    ids=["all-nan", "not-a-metrics-csv"],
)
def test_plot_of_nothing_drawable_says_so(tmp_path, capsys, monkeypatch, text, needles):
    """Catches `plot` of a run whose losses are all NaN/inf, or of a CSV that is not a metrics.csv, drawing an empty
    picture under "no loss logged yet" and exiting 0."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics.csv").write_text(text)
    _one_line_error(capsys, ["plot", "metrics.csv", "--out", "p.png"], *needles)
    assert not (tmp_path / "p.png").exists()


def _denied(monkeypatch, path) -> None:
    """``path`` unreadable: chmod 000, and where that denies nothing (root, which tests may run as) every open of it
    from Python fails as it would for a user (EACCES)."""
    import builtins
    import errno
    import os
    import shutil

    if path.stat().st_nlink > 1:  # one step's files share their bytes (a user who is not root): this name alone,
        # as root's stand-in below has it (a mode is the file's, so chmod 000 denied best.ckpt, its other name, too)
        shutil.copy2(path, f"{path}.own")
        os.replace(f"{path}.own", path)
    path.chmod(0)
    if os.geteuid() == 0:
        real_open = builtins.open

        def open_denied(file, *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == os.path.realpath(path):
                raise PermissionError(errno.EACCES, "Permission denied", str(file))
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", open_denied)


def test_a_checkpoint_that_contradicts_itself_is_blamed_not_the_command(config, tmp_path, capsys, monkeypatch):
    """Catches a checkpoint's own faults blamed on the user or reported as something else: a tokenizer with more
    ids than the model's vocab_size generated silently from ids without an embedding row (and validate told the user
    to leave out a --data.tokenizer never passed); a bad hyperparameter inside it was named as a flag
    (`model.lr must be in (0, inf)`); an unreadable one was "not a readable checkpoint (truncated ...)"; a resume of
    a weights-only save ended in Lightning's KeyError traceback."""
    main(["fit", "--config", str(config)])
    path = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, weights_only=True)
    state = ckpt["tinylm"]["tokenizer"]["state"]
    state["chars"] = "".join(sorted(set(state["chars"]) | set("0123456789")))
    torch.save(ckpt, tmp_path / "longer.ckpt")
    with pytest.raises(CheckpointError, match="holds a tokenizer of 68 ids but a model of vocab_size 58"):
        load_model(tmp_path / "longer.ckpt")  # generate, export, init_from
    state["chars"] = "".join(sorted(set(state["chars"]) - set("123456789")))  # one id more than the model: the edge
    torch.save(ckpt, tmp_path / "one_more.ckpt")
    with pytest.raises(CheckpointError, match="holds a tokenizer of 59 ids but a model of vocab_size 58"):
        load_model(tmp_path / "one_more.ckpt")
    _one_line_error(capsys, ["validate", "--ckpt_path", str(tmp_path / "longer.ckpt")], "68 ids", "vocab_size 58")
    ckpt = torch.load(path, weights_only=True)
    ckpt["hyper_parameters"]["lr"] = -1.0
    torch.save(ckpt, tmp_path / "edited.ckpt")
    for argv in (["validate"], ["fit", "--config", str(config), "--trainer.max_steps", "4", "--run.name", "b"]):
        _one_line_error(capsys, [*argv, "--ckpt_path", str(tmp_path / "edited.ckpt")], "edited.ckpt",
                        "model.lr must be in (0, inf), got -1.0", "checkpoint's value, not an option")
    # a weights-only save (Lightning's save_checkpoint(weights_only=True) keeps no optimizer, scheduler or callback
    # state) resumed: Lightning's KeyError traceback
    ckpt = {k: v for k, v in torch.load(path, weights_only=True).items()
            if k not in ("optimizer_states", "lr_schedulers", "callbacks")}
    torch.save(ckpt, tmp_path / "weights.ckpt")
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.max_steps", "4", "--run.name", "c",
                             "--ckpt_path", str(tmp_path / "weights.ckpt")],
                    "weights.ckpt holds the weights but not the training state",
                    "optimizer_states, lr_schedulers, callbacks missing", "--model.init_from")
    _denied(monkeypatch, path)
    _one_line_error(capsys, ["validate", "--ckpt_path", str(path)], "permission denied", str(path))
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", "last"],
                    "permission denied", "last.ckpt")


def test_a_missing_optional_package_names_its_extra():
    """Catches `tinylm export` after `make train` (which installs only the plots extra) ending in "No module named
    'transformers'" alone: the line names the extra that installs it."""
    from tinylm.cli.errors import one_line

    line = one_line(ModuleNotFoundError("No module named 'transformers'", name="transformers"))
    assert line == ("ModuleNotFoundError: No module named 'transformers'; this command needs it: "
                    "pip install 'tinylm[export]' (or pip install transformers)")
    assert one_line(ModuleNotFoundError("No module named 'foo'", name="foo.bar")).endswith("pip install foo")


def test_a_split_too_short_to_train_on_is_refused_before_the_loggers_start(config, capsys, tmp_path, monkeypatch):
    """Catches "the val split has 10 tokens" found in `setup`, after Lightning had started the loggers: an empty
    W&B run (online: on the user's page) and csv/ were left behind by a run that never trained."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    _one_line_error(capsys, ["fit", "--config", str(config), "--data.val_fraction", "0.0005",
                             "--run.wandb_project", "tinylm-test"],
                    "the val split has 10 tokens, but one window needs block_size + 1 = 17")
    assert not (tmp_path / "runs").exists()


def test_an_early_stopping_monitor_of_no_logged_metric_is_one_line(config, capsys):
    """Catches EarlyStopping on a metric the run never logs ending in Lightning's ~75-line traceback at the first
    validation (its own message lists the metrics there are)."""
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.callbacks+=EarlyStopping",
                             "--trainer.callbacks.monitor", "accuracy"],
                    "Early stopping conditioned on metric `accuracy` which is not available", "val/loss")


def test_a_users_progress_bar_and_model_summary_take_the_place_of_tinylms(config, capsys):
    """Catches `--trainer.callbacks+=TQDMProgressBar` (or RichProgressBar) refused by Lightning as "multiple progress
    bar callbacks" (tinylm always added its own), a user's ModelSummary printed beside tinylm's, and
    `--trainer.min_steps` adding Lightning's min_epochs=1 (a whole notional epoch before an early stop)."""
    from lightning.pytorch.callbacks import ModelSummary, ProgressBar, TQDMProgressBar

    from tinylm.cli.fit import lightning_main

    cli = lightning_main(["fit", "--config", str(config), "--trainer.callbacks+=TQDMProgressBar",
                          "--trainer.callbacks.refresh_rate", "5", "--trainer.callbacks+=ModelSummary",
                          "--trainer.enable_model_summary", "true", "--trainer.enable_progress_bar", "true",
                          "--trainer.min_steps", "1"])
    bars = [cb for cb in cli.trainer.callbacks if isinstance(cb, ProgressBar)]
    assert len(bars) == 1 and type(bars[0]) is TQDMProgressBar and bars[0].refresh_rate == 5
    assert [type(cb) for cb in cli.trainer.callbacks if isinstance(cb, ModelSummary)] == [ModelSummary]
    assert cli.trainer.global_step == 2 and cli.trainer.fit_loop.min_epochs == 0


def test_a_precision_plugin_is_the_runs_precision(config):
    """Catches `--trainer.plugins lightning.pytorch.plugins.DoublePrecision` refused by Lightning as "Received both
    `precision=32-true` and `plugins=<...DoublePrecision object at 0x...>`": tinylm set a precision the user never
    gave (or a config's, which the command line's plugin overrides). Both typed is the user's own contradiction,
    which Lightning names."""
    from tinylm.cli.fit import lightning_main

    plugin = "lightning.pytorch.plugins.DoublePrecision"  # (the config's precision: 32-true, the flag's plugin wins)
    cli = lightning_main(["fit", "--config", str(config), "--trainer.plugins", plugin])
    assert cli.trainer.precision == "64-true" and cli.trainer.global_step == 2
    assert next(cli.model.parameters()).dtype == torch.float64


@pytest.mark.parametrize("args", [["--trainer.callbacks.filename", "best"], ["--trainer.callbacks.save_last", "true"],
                                  ["--trainer.callbacks.filename", "step-{step}",  # (tinylm's keep trimmed the user's)
                                   "--trainer.callbacks.auto_insert_metric_name", "false"]])
def test_a_users_checkpoint_named_as_tinylms_in_its_folder_is_refused(config, capsys, tmp_path, args):
    """Catches a user's ModelCheckpoint (monitor val/loss, mode max) writing best.ckpt into the run's checkpoints
    folder: tinylm's best.ckpt replaced it without a word (and its save_last would race tinylm's last.ckpt)."""
    folder = tmp_path / "runs" / "tiny" / "checkpoints"
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.callbacks+=ModelCheckpoint",
                             "--trainer.callbacks.dirpath", str(folder), "--trainer.callbacks.monitor", "val/loss",
                             "--trainer.callbacks.mode", "max", *args],
                    f"--trainer.callbacks.dirpath {folder} is this run's own checkpoints folder", "e.g. 'top-{step}'")
    assert not (tmp_path / "runs").exists()
    # without a dirpath and with no logger, Lightning's default folder is the same one (tinylm's best.ckpt was the
    # user's, of another step)
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.logger", "false",
                             "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor", "val/loss", *args],
                    "a ModelCheckpoint without a dirpath (with trainer.logger false: runs/tiny/checkpoints) is")
    assert not (tmp_path / "runs").exists()


def test_a_users_checkpoint_folder_inside_another_run_is_refused(config, capsys, tmp_path):
    """Catches a branch (or a resume from a checkpoint alone) that takes its run's config, with a user's
    ModelCheckpoint whose dirpath is inside that run's folder: Lightning restored its top-k there, and the branch
    deleted the old run's checkpoints as better ones came. The run's own folder, or one outside any run, is fine."""
    topk = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor", "val/loss",
            "--trainer.callbacks.save_top_k", "1", "--trainer.callbacks.dirpath"]
    main(["fit", "--config", str(config), *topk, "runs/tiny/topk"])
    kept = sorted((tmp_path / "runs" / "tiny" / "topk").iterdir())
    _one_line_error(capsys, ["fit", "--config", str(config), "--run.name", "other", *topk, "runs/tiny/topk"],
                    "--trainer.callbacks.dirpath runs/tiny/topk is inside the folder of another run",
                    "e.g. runs/other/topk")
    assert sorted((tmp_path / "runs" / "tiny" / "topk").iterdir()) == kept
    main(["fit", "--config", str(config), "--run.name", "other", *topk, str(tmp_path / "elsewhere")])


def test_a_file_name_too_long_is_one_line(tmp_path, capsys):
    """Catches `tinylm plot --out NAME.png` (or export --out) with a name over 255 bytes ending in OSError's
    traceback (ENAMETOOLONG)."""
    (tmp_path / "r" / "csv").mkdir(parents=True)
    (tmp_path / "r" / "csv" / "metrics.csv").write_text("epoch,step,train/loss\n0,0,4.0\n0,1,3.9\n")
    out = tmp_path / ("p" * 260 + ".png")
    _one_line_error(capsys, ["plot", str(tmp_path / "r"), "--out", str(out)],
                    f"OSError: file name too long: {out}; choose a shorter name")


def test_a_monitor_of_the_users_own_metric_is_not_refused():
    """Catches the near-miss check refusing metrics that are logged (`train/loss_ema` by a user's callback,
    `train/muon_lr` by tinylm itself): only tinylm's name with its slash written otherwise (`val_loss`) is refused."""
    from tinylm.cli.trainer_checks import check_callbacks

    checkpoint = lambda monitor: {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                                  "init_args": {"monitor": monitor}}
    for monitor in ("train/loss_ema", "val/loss_min", "train/muon_lr", "train/skipped_steps", "my/val/loss",
                    "val/loss/a.txt", "eval/hellaswag_acc_norm"):
        check_callbacks([checkpoint(monitor)])
    for monitor, meant in (("val_loss", "val/loss"), ("train.loss", "train/loss"), ("val-bpb", "val/bpb")):
        with pytest.raises(ValueError, match=f"monitor {monitor}: tinylm logs no such metric; did you mean {meant}"):
            check_callbacks([checkpoint(monitor)])


@pytest.mark.parametrize("section, key", [("model", "lr"), ("data", "seed"), ("data", "batch_size"),
                                          ("model", "dropout"), ("run", "checkpoint_every")])
def test_null_from_a_config_file_for_an_option_that_takes_none_is_one_line(config, tmp_path, capsys, section, key):
    """Catches `lr: null` in a --config file (jsonargparse lets null through from a file, not from a flag) ending in
    a traceback deep in AdamW or torch.manual_seed, or an "unsupported operand type(s)" line naming no option, with
    a run folder left behind. Options that take None (data.weights, model.decay_steps) still do."""
    (tmp_path / "nulls.yaml").write_text(f"{section}:\n  {key}: null\n")
    _one_line_error(capsys, ["fit", "--config", str(config), "--config", str(tmp_path / "nulls.yaml")],
                    f"{section}.{key} is null, which it cannot be")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_null_for_options_that_take_none_is_their_none(config, tmp_path, capsys):
    """The other side of the check above: null where an option takes None is that None, and the run trains."""
    (tmp_path / "nulls.yaml").write_text("data:\n  weights: null\nmodel:\n  decay_steps: null\n")
    main(["fit", "--config", str(config), "--config", str(tmp_path / "nulls.yaml")])
    assert (tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt").is_file()


def test_a_run_that_cannot_fit_in_memory_is_refused_before_its_first_step(config, tmp_path, capsys, monkeypatch):
    """Catches a batch too big for the machine going on to a 100-line allocator traceback, or on a CPU growing
    until the kernel killed it: fit compares plan's estimate of a step with the device's free memory first (here
    a machine with 1 KiB free) and names the sizes and the fix, leaving no run folder; TINYLM_NO_MEMORY_CHECK=1
    lets it train."""
    import tinylm.device

    monkeypatch.setattr(tinylm.device, "free_memory", lambda device: 2**10)
    line = _one_line_error(capsys, ["fit", "--config", str(config)], "this run needs ~")
    assert "KiB more on cpu" in line and "cpu has 1 KiB free; lower --data.batch_size" in line
    assert "--model.activation_checkpointing true" in line and "TINYLM_NO_MEMORY_CHECK=1 skips this check" in line
    assert not (tmp_path / "runs").exists()
    monkeypatch.setenv("TINYLM_NO_MEMORY_CHECK", "1")  # an estimate the user knows better than
    main(["fit", "--config", str(config)])
    assert (tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt").is_file()


def test_the_address_space_limit_counts_as_the_memory_left(config, tmp_path, capsys, monkeypatch):
    """Catches a process under `ulimit -v` (RLIMIT_AS: login nodes, batch systems) checked against the machine's
    free memory only: a step that could never fit under the limit went on to a 140-line allocator traceback
    mid-step. Under a real limit the free memory is what the limit leaves the process, and fit's refusal says so."""
    import resource

    import torch

    import tinylm.device

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status", encoding="ascii") as f:
        mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (mapped + 2**28, hard))  # 256 MiB left to map
    try:
        free = tinylm.device.free_memory(torch.device("cpu"))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert 0 < free <= 2**28
    monkeypatch.setattr(tinylm.device, "address_space_free", lambda: 2**10)
    line = _one_line_error(capsys, ["fit", "--config", str(config)], "this run needs ~")
    assert "cpu has 1 KiB free under this process's address-space limit (ulimit -v); lower" in line
    assert not (tmp_path / "runs").exists()


def test_a_cgroups_file_cache_counts_as_free(tmp_path):
    """Catches a container's memory check that charged it the file cache the kernel gives back (memory.current
    counts the pages of a corpus it read): a job under a memory limit that had read its data was told it had nothing
    free. The working set (use less inactive file pages) is what the limit is measured against, as `docker stats`
    counts it."""
    from tinylm.device import _cgroup_free

    (tmp_path / "memory.max").write_text(f"{4 * 2**30}\n")
    (tmp_path / "memory.current").write_text(f"{4 * 2**30}\n")
    (tmp_path / "memory.stat").write_text(f"anon {2**30}\nactive_file {2**29}\ninactive_file {3 * 2**30 - 2**29}\n")
    assert _cgroup_free(tmp_path) == 3 * 2**30 - 2**29
    (tmp_path / "memory.stat").unlink()  # (no stat file: the use as charged)
    assert _cgroup_free(tmp_path) == 0
    (tmp_path / "memory.max").write_text("max\n")
    assert _cgroup_free(tmp_path) is None


def test_a_limit_on_a_cgroup_above_the_processs_own_is_found(tmp_path):
    """Catches a SLURM job's memory limit missed: it sits on the job's cgroup (job_7), above the step's that the
    process runs in (/proc/self/cgroup's path), and only the root's memory.max was read (no limit: no check)."""
    from tinylm.device import _cgroup_free

    def cgroup(folder, limit, used):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "memory.max").write_text(f"{limit}\n")
        (folder / "memory.current").write_text(f"{used}\n")

    cgroup(tmp_path, "max", 50 * 2**30)
    cgroup(tmp_path / "slurm" / "job_7", 8 * 2**30, 6 * 2**30)
    cgroup(tmp_path / "slurm" / "job_7" / "step_0", "max", 5 * 2**30)
    assert _cgroup_free(tmp_path, "/slurm/job_7/step_0") == 2 * 2**30
    cgroup(tmp_path / "slurm" / "job_7" / "step_0", 3 * 2**30, 2 * 2**30)  # the least any level leaves
    assert _cgroup_free(tmp_path, "/slurm/job_7/step_0") == 2**30
    assert _cgroup_free(tmp_path, "/") is None and _cgroup_free(tmp_path, "/other/gone") is None


def test_a_cgroup_v1_memory_limit_is_found(tmp_path):
    """Catches a cgroup v1 memory limit (a host on cgroup v1 or hybrid: SLURM on RHEL 7/8, older Docker) not read:
    only v2's memory.max was, so a job limited to 8 GB on a 500 GB node was told the node's memory was free, and a
    run it could not hold went on to the kernel's OOM kill. v1's "unlimited" (2^63 less a page) is no limit."""
    from tinylm.device import _cgroup_free

    def cgroup(folder, limit, used, inactive_file=0):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "memory.limit_in_bytes").write_text(f"{limit}\n")
        (folder / "memory.usage_in_bytes").write_text(f"{used}\n")
        (folder / "memory.stat").write_text(f"inactive_file 0\ntotal_inactive_file {inactive_file}\n")

    unlimited = 9223372036854771712
    cgroup(tmp_path / "memory", unlimited, 50 * 2**30)
    cgroup(tmp_path / "memory" / "slurm" / "uid_1" / "job_7", 8 * 2**30, 7 * 2**30, inactive_file=2**30)
    cgroup(tmp_path / "memory" / "slurm" / "uid_1" / "job_7" / "step_0", unlimited, 5 * 2**30)
    assert _cgroup_free(tmp_path, "/", "/slurm/uid_1/job_7/step_0") == 2 * 2**30  # 8 GB less 7 used, 1 of it cache
    assert _cgroup_free(tmp_path, "/", "/") is None and _cgroup_free(tmp_path, "/", "/other/gone") is None
    (tmp_path / "memory.max").write_text(f"{3 * 2**30}\n")  # (hybrid: a v2 limit beside it, the least of both)
    (tmp_path / "memory.current").write_text(f"{2 * 2**30 + 2**29}\n")
    assert _cgroup_free(tmp_path, "/", "/slurm/uid_1/job_7/step_0") == 2**29


@pytest.mark.parametrize("command, target, raised, fix", [
    ("prepare", "tinylm.data.corpus._read_documents", MemoryError(), "--data.tokenizer_train_chars"),
    ("fit", "tinylm.train.module.token_loss", RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. "
     "DefaultCPUAllocator: can't allocate memory: you tried to allocate 25165824 bytes. Error code 12 (Cannot "
     "allocate memory)"), "out of memory in TinyLM._loss: ")])
def test_memory_running_out_is_one_line(config, capsys, monkeypatch, command, target, raised, fix):
    """Catches the memory running out where no check foresaw it (`ulimit -v`, other processes taking the machine's
    memory): prepare ended in a 50-line traceback of a MemoryError, fit in a 140-line one of torch's allocator; one
    line now says it ran out of memory, where (a method by its class: "in __init__" named none), and what to
    lower."""
    import importlib

    module, _, name = target.rpartition(".")

    def runs_out(*args, **kwargs):
        raise raised

    monkeypatch.setattr(importlib.import_module(module), name, runs_out)
    line = _one_line_error(capsys, [command, "--config", str(config)], "out of memory in ", fix)
    assert "the memory the machine had free; free some (other processes) or use" in line


def test_a_checkpoint_mapped_past_the_memory_left_is_not_called_damaged(tmp_path, capsys, monkeypatch):
    """Catches a checkpoint whose mapping the memory limit refused (`ulimit -v`: torch's "unable to mmap N bytes
    from file <...>: Cannot allocate memory (12)") said to be damaged ("not a readable checkpoint (truncated or not
    a torch file ...); use another one": a good file given up), its out-of-memory line telling to lower options
    of the command that do not matter there (export's --data.batch_size, which export has not; generate's
    --num_samples)."""
    import tinylm.checkpoint

    ckpt = tmp_path / "good.ckpt"
    torch.save({"state_dict": {}}, ckpt)

    def refused(path, *args, **kwargs):
        raise RuntimeError(f"unable to mmap 907778617 bytes from file <{path}>: Cannot allocate memory (12)")

    monkeypatch.setattr(tinylm.checkpoint, "_torch_load", refused)
    for command in (["export", "--out", str(tmp_path / "hf")], ["generate", "--prompt", "a"]):
        line = _one_line_error(capsys, [*command, "--ckpt_path", str(ckpt)], "out of memory in load_checkpoint: ",
                               "use a machine with more memory (the checkpoint is mapped whole)")
        assert "readable" not in line and "--data." not in line and "--num_samples" not in line


def test_cpu_ranks_are_counted_together_against_the_machines_memory(config, tmp_path, capsys, monkeypatch):
    """Catches a `--trainer.devices 2` CPU run checked as one process: its ranks share the machine's memory, so a
    machine with room for one rank's step (1.5x its need) must refuse two, naming both processes."""
    import re

    import tinylm.device
    from tinylm.cli.trainer_checks import MEMORY_MARGIN

    monkeypatch.setattr(tinylm.device, "free_memory", lambda device: 2**10)
    one = _one_line_error(capsys, ["fit", "--config", str(config)], "this run needs ~")
    need = float(re.search(r"needs ~([\d.]+) KiB", one)[1]) * 2**10
    monkeypatch.setattr(tinylm.device, "free_memory", lambda device: 1.5 * need / MEMORY_MARGIN)
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.accelerator", "cpu", "--trainer.devices", "2",
                             "--trainer.strategy", "ddp_fork"], "this run needs ~", "more on cpu (2 processes)")
    assert not (tmp_path / "runs").exists()


def test_a_missing_draft_for_the_runs_samples_is_refused_before_the_run_folder(config, tmp_path, capsys):
    """Catches `--samples.draft_ckpt_path nope.ckpt` refused only as the run started, its folder made (config.yaml,
    csv/, the lock) for a run that never trained."""
    _one_line_error(capsys, ["fit", "--config", str(config), "--samples.every_n_steps", "1",
                             "--samples.draft_ckpt_path", "nope.ckpt"], "samples.draft_ckpt_path 'nope.ckpt' not found")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command, key", [("generate", "prompt"), ("generate", "num_samples"),
                                          ("generate", "device"), ("sample-report", "device"),
                                          ("eval", "tasks")])
def test_null_from_a_config_file_of_a_command_is_one_line(tmp_path, capsys, command, key):
    """Catches `null` in a --config file of generate, sample-report or eval (jsonargparse lets it through from a file)
    ending in a TypeError traceback (`prompt: null`) or a bare TypeError naming no option (`num_samples: null`)."""
    (tmp_path / "nulls.yaml").write_text(f"{key}: null\n")
    argv = [command, "--ckpt_path", str(tmp_path / "x.ckpt"), "--config", str(tmp_path / "nulls.yaml")]
    if command == "sample-report":
        argv += ["--out", str(tmp_path / "out")]
    _one_line_error(capsys, argv, f"--{key} is null, which it cannot be")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nulls.yaml"]


@pytest.mark.parametrize("sub", ["fit", "validate"])
def test_an_empty_ckpt_path_is_named_as_empty(tmp_path, sub):
    """Catches `--ckpt_path "$CKPT"` with CKPT unset: fit ended in Lightning's traceback (`.fit() found no path for
    the best weights: ''`), validate said it needs a --ckpt_path."""
    with pytest.raises(ValueError, match=r"--ckpt_path is empty \(''"):
        resolve_ckpt_path("", tmp_path / "runs" / "x", sub)


@pytest.mark.parametrize("text", ["model: [\n", "- 1\n"])
def test_a_broken_run_record_is_named(tmp_path, text):
    """Catches a run's config.yaml edited into broken YAML (or a list) making a resume or validate, which read it as
    the run's own settings, end in jsonargparse's bare `while parsing a flow node`, naming no file."""
    run = tmp_path / "runs" / "x"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.ckpt").write_bytes(b"")
    (run / "config.yaml").write_text(text)
    with pytest.raises(ValueError, match=r"config\.yaml' (is not valid YAML|must hold a mapping).*run's own settings"):
        with_run_config(["validate", "--ckpt_path", str(run / "checkpoints" / "best.ckpt")])


_HPARAMS = {"vocab_size": 16, "block_size": 8, "n_layer": 1, "n_head": 1, "n_embd": 8, "pad_vocab_multiple": 1}


def _edited_ckpt(path, hparams, tok):
    state = {f"model.{k}": v for k, v in GPT(GPTConfig(**_HPARAMS)).state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": hparams,
                "tinylm": {"format": CHECKPOINT_FORMAT, "tokenizer": tok}}, path)
    return path


@pytest.mark.parametrize("tok", ["{not a dict", ["char"], {"version": 1, "kind": "char", "state": "x"}])
def test_checkpoint_tokenizer_state_of_another_type_is_refused_in_one_line(tmp_path, tok):
    """Catches a checkpoint's tokenizer state edited into another type ending in an AttributeError traceback."""
    ckpt = _edited_ckpt(tmp_path / "edited.ckpt", _HPARAMS, tok)
    with pytest.raises(CheckpointError, match=r"edited\.ckpt' holds a tokenizer this tinylm cannot rebuild"):
        load_model(ckpt)


@pytest.mark.parametrize("name", ["vocab_size", "block_size", "n_layer", "n_head", "n_embd"])
def test_checkpoint_hyperparameter_null_is_refused_in_one_line(tmp_path, name):
    """Catches a null size in a checkpoint's hyperparameters ending in a bare TypeError (`NoneType + int`)."""
    ckpt = _edited_ckpt(tmp_path / "edited.ckpt", {**_HPARAMS, name: None}, None)
    with pytest.raises(CheckpointError, match=rf"edited\.ckpt' has hyperparameters that build no GPT \({name}"):
        load_model(ckpt)


@pytest.mark.parametrize("key, value, said", [
    ("state_dict", [1], "holds a 'state_dict' that is a list"),
    ("hyper_parameters", [1, 2], "holds a 'hyper_parameters' that is a list"),
    ("global_step", "ten", "holds global_step 'ten', not the whole number"),
    ("global_step", -3, "holds global_step -3, not the whole number"),
    ("epoch", 2.5, "holds epoch 2.5, not the whole number"),
    ("global_step", True, "holds global_step True, not the whole number"),
])
def test_checkpoint_section_of_another_type_is_refused_in_one_line(tmp_path, key, value, said):
    """Catches a checkpoint section edited into a list ending in an AttributeError traceback, and `global_step:
    "ten"` ending every reader (eval, validate, resume) in a bare `ValueError: invalid literal for int()` line."""
    ckpt = _edited_ckpt(tmp_path / "edited.ckpt", _HPARAMS, None)
    saved = torch.load(ckpt, weights_only=True)
    saved[key] = value
    torch.save(saved, ckpt)
    with pytest.raises(CheckpointError, match=rf"edited\.ckpt' {re.escape(said)}"):
        load_model(ckpt)


def test_checkpoint_weight_that_is_no_tensor_is_refused_in_one_line(tmp_path):
    """Catches a weight edited into a string ending in an AttributeError traceback."""
    ckpt = _edited_ckpt(tmp_path / "edited.ckpt", _HPARAMS, None)
    saved = torch.load(ckpt, weights_only=True)
    saved["state_dict"]["model.transformer.wte.weight"] = "abc"
    torch.save(saved, ckpt)
    with pytest.raises(CheckpointError, match=r"edited\.ckpt': '(model\.)?transformer\.wte\.weight' is a str"):
        load_model(ckpt)


def test_a_dd_hh_mm_ss_train_time_interval_in_a_config_file_is_refused(tmp_path):
    """Catches `train_time_interval: 00:00:30:00` in a --config file read by jsonargparse as 0:00:30 without a word
    (a checkpoint every 30 s), as the same value on the command line is refused."""
    from tinylm.cli.callback_checks import check_time_intervals
    from tinylm.errors import TinyLMError

    (tmp_path / "c.yaml").write_text("trainer:\n  callbacks:\n    - class_path: ModelCheckpoint\n      init_args:\n"
                                     "        train_time_interval: 00:00:30:00\n")
    with pytest.raises(TinyLMError, match=r"interval 00:00:30:00: this option is a timedelta.*write 00:30:00"):
        check_time_intervals(["fit", "--config", str(tmp_path / "c.yaml")])


def test_a_dd_hh_mm_ss_train_time_interval_in_a_callbacks_own_file_is_refused(tmp_path, monkeypatch):
    """Catches a callback's own file (`- cb.yaml` under trainer.callbacks of a section's file, or
    --trainer.callbacks+=cb.yaml) not read by the check: its `train_time_interval: 00:00:30:00` was read by
    jsonargparse as 0:00:30 without a word (a checkpoint every 30 s, not 30 minutes)."""
    from tinylm.cli.callback_checks import check_time_intervals
    from tinylm.errors import TinyLMError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("trainer: trainer.yaml\n")
    (tmp_path / "trainer.yaml").write_text("max_steps: 2\ncallbacks:\n  - cb.yaml\n")
    (tmp_path / "cb.yaml").write_text("class_path: ModelCheckpoint\ninit_args:\n  train_time_interval: 00:30:00\n")
    check_time_intervals(["fit", "--config", "c.yaml"])  # (H:MM:SS, as the option reads it: not refused)
    (tmp_path / "cb.yaml").write_text("class_path: ModelCheckpoint\ninit_args:\n  train_time_interval: 00:00:30:00\n")
    for argv in (["--config", "c.yaml"], ["--trainer.callbacks+=cb.yaml"]):
        with pytest.raises(TinyLMError, match=r"--trainer\.callbacks(\[0\])?\.init_args\.train_time_interval "
                                              r"00:00:30:00: this option is a timedelta.*write 00:30:00"):
            check_time_intervals(["fit", *argv])


def test_a_train_monitor_checked_on_logging_steps_is_taken():
    """The other side of the refusal of a train/ metric monitored at validations between logging steps: validations
    on logging steps (4 micro-batches of 2 a step: every 2 steps, logging every 2), logging at every step, and a
    user's own train/ metric (which their callback may log at every step) pass."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from tinylm.cli.callback_checks import check_train_monitors

    check_train_monitors([EarlyStopping("train/loss"), ModelCheckpoint(monitor="train/grad_norm")], 2, 4, 2)
    check_train_monitors([EarlyStopping("train/loss")], 1, "00:00:30:00")
    check_train_monitors([EarlyStopping("train/loss_ema")], 50, 2)


def test_a_positive_validation_time_is_taken():
    """The other side of the refusal of a val_check_interval time that is none (00:00:00:00, {minutes: -5}): a
    time above zero, in each of Lightning's forms, passes."""
    from datetime import timedelta

    from tinylm.cli.trainer_checks import check_validation_interval

    for every in ("00:00:30:00", {"minutes": 5}, timedelta(seconds=1), 0.5, 500):
        check_validation_interval({"val_check_interval": every, "check_val_every_n_epoch": 1})


def test_a_base_60_val_check_interval_in_a_config_file_is_refused(tmp_path):
    """Catches `val_check_interval: 2:00:00` in a --config file (meant as two hours) read by YAML as the number 7200:
    a validation every 7,200 batches without a word. The same time with its leading zeros is a time, and passes."""
    from tinylm.cli.callback_checks import check_time_intervals
    from tinylm.errors import TinyLMError

    config = tmp_path / "c.yaml"
    config.write_text("trainer:\n  val_check_interval: 00:02:00:00\n")
    check_time_intervals(["fit", "--config", str(config)])  # (a time: the check is not refusing every time)
    config.write_text("trainer:\n  val_check_interval: 2:00:00\n")
    with pytest.raises(TinyLMError, match=r"val_check_interval 2:00:00: YAML reads this as a base-60 number \(7200.*"
                                          r"e\.g\. 00:02:00:00"):
        check_time_intervals(["fit", "--config", str(config)])
    config.write_text("trainer:\n  val_check_interval: '2:00:00'\n")  # (quoted: a string to YAML, a time)
    check_time_intervals(["fit", "--config", str(config)])


def test_a_base_60_max_time_in_a_config_file_is_named_with_the_fix(tmp_path):
    """Catches `max_time: 1:00:00:00` in a --config file (a day; YAML's base-60 number 216000) ending in "--trainer.
    max_time: expected a str, got 216000", which names no fix; quoted, or with its leading zero, it is a time."""
    from tinylm.cli.callback_checks import check_time_intervals
    from tinylm.errors import TinyLMError

    config = tmp_path / "c.yaml"
    for fine in ("01:00:00:00", "'1:00:00:00'", '"1:00:00:00"'):
        config.write_text(f"trainer:\n  max_time: {fine}\n")
        check_time_intervals(["fit", "--config", str(config)])
    check_time_intervals(["fit", "--trainer.max_time", "1:00:00:00"])  # (the command line's is text)
    config.write_text("trainer:\n  max_time: 1:00:00:00\n")
    with pytest.raises(TinyLMError, match=r"trainer\.max_time: 1:00:00:00 in a config file: YAML reads this as a "
                                          r"base-60 number.*01:00:00:00"):
        check_time_intervals(["fit", "--config", str(config)])


def test_a_base_60_max_time_in_a_config_file_is_told_a_time_that_runs(tmp_path):
    """Catches `max_time: 2:00:00` in a --config file (two hours; YAML's 7200) told to write "02:00:00, or quoted,
    '2:00:00'": both then ended in Lightning's "not a valid duration. Expected ... DD:HH:MM:SS". The time it names
    is one that Lightning's Timer takes, as the meant two hours, and the check passes."""
    from lightning.pytorch.callbacks import Timer

    from tinylm.cli.callback_checks import check_time_intervals
    from tinylm.errors import TinyLMError

    config = tmp_path / "c.yaml"
    for written, meant in (("2:00:00", 2 * 3600), ("1:00:00:00", 86400), ("10:30", 630)):
        config.write_text(f"trainer:\n  max_time: {written}\n")
        with pytest.raises(TinyLMError, match="base-60") as refused:
            check_time_intervals(["fit", "--config", str(config)])
        told = re.findall(r"[0-9:]{5,}", str(refused.value).split("base-60")[1])[-1]
        assert Timer(duration=told)._duration == meant, (written, told)
        config.write_text(f"trainer:\n  max_time: {told}\n")
        check_time_intervals(["fit", "--config", str(config)])


def test_a_base_60_time_in_a_sections_own_file_is_refused(tmp_path):
    """Catches `val_check_interval: 2:00:00` (YAML's 7200) in a section's own file, `trainer: trainer.yaml` in a
    --config or `--trainer trainer.yaml`, taken as a validation every 7,200 batches without a word (the check read the
    --config files alone), and `max_time: 1:00:00:00` there ending in "--trainer: expected a str, got 216000"."""
    from tinylm.cli.callback_checks import check_time_intervals
    from tinylm.errors import TinyLMError

    (tmp_path / "sub").mkdir()
    (config := tmp_path / "sub" / "c.yaml").write_text("trainer: trainer.yaml\n")
    section = tmp_path / "sub" / "trainer.yaml"
    for line, refused in (("val_check_interval: 2:00:00", "val_check_interval 2:00:00: YAML reads this as a base-60"),
                          ("max_time: 1:00:00:00", "max_time: 1:00:00:00 in a config file: YAML reads this")):
        section.write_text(f"max_steps: 4\n{line}\n")
        for argv in (["fit", "--config", str(config)], ["fit", "--trainer", str(section)]):
            with pytest.raises(TinyLMError, match=refused):
                check_time_intervals(argv)
    section.write_text("max_steps: 4\nval_check_interval: 00:02:00:00\nmax_time: 01:00:00:00\n")
    check_time_intervals(["fit", "--config", str(config)])  # (times: the check is not refusing every section file)


def test_a_train_monitor_checked_at_each_epochs_end_is_refused():
    """Catches EarlyStopping(monitor="train/loss", check_on_train_epoch_end=True) (or a ModelCheckpoint's
    save_on_train_epoch_end) taken where val_check_interval is on logging steps: it checks at each notional epoch's
    end, not at validations, and a corpus of 33 batches an epoch under --trainer.log_every_n_steps 50 ended at step
    33 in "Early stopping conditioned on metric `train/loss` which is not available"."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from tinylm.cli.callback_checks import check_train_monitors
    from tinylm.errors import TinyLMError

    check_train_monitors([EarlyStopping("train/loss", check_on_train_epoch_end=False)], 50, 100)  # (at validations)
    for cb in (EarlyStopping("train/loss", check_on_train_epoch_end=True),
               ModelCheckpoint(monitor="train/loss", save_on_train_epoch_end=True)):
        with pytest.raises(TinyLMError, match=r"checks at each notional epoch's end \((check|save)_on_train_epoch_end"):
            check_train_monitors([cb], 50, 100)
        check_train_monitors([cb], 1, 100)  # (logged every step: fresh at any step)


def test_a_value_thousands_of_characters_long_is_shown_by_its_ends(tmp_path, capsys):
    """Catches an error line quoting a 5,000-character value whole (a value pasted by mistake filled the terminal):
    its start and end are shown, with how much was left out."""
    name = "x/" * 2500 + "END"
    line = _one_line_error(capsys, ["fit", "--data.corpus", str(tmp_path / "c.txt"), "--run.name", name],
                           "run.name", "'x/x/x/", "/x/END'", "(4705 more characters)", "--run.name my-run")
    assert len(line) < 700, line


def test_a_long_path_in_the_resume_command_of_an_error_line_is_whole(tmp_path):
    """Catches the resume command of an interrupted run's line (`tinylm fit --data.corpus LONG/PATH ... --ckpt_path
    last`), there to be copied, cut to "...(147 more characters)..." for a corpus path over 400 characters."""
    from tinylm.cli.errors import error_line

    corpus = "/".join(["deep_folder_of_experiment_data"] * 15) + "/c.txt"
    line = error_line("fit", "interrupted by SIGTERM at step 8; saved runs/x/checkpoints/last.ckpt; resume with "
                      "`tinylm fit --config ... --ckpt_path last`", ["--data.corpus", corpus, "--run.name", "x"])
    assert f"--data.corpus {corpus} " in line and "more characters" not in line, line


def test_transformers_backend_check_is_one_line(tmp_path, monkeypatch):
    """transformers 5 beside torch < 2.6 (`pip install 'tinylm[export]'` on an older torch): its placeholder model
    raises ImportError("GPT2LMHeadModel requires PyTorch >= 2.6 ...") from transformers/utils/import_utils.py when
    built; `tinylm export` printed that as a traceback."""
    import sys
    import types

    from tinylm.cli.errors import is_user_error

    fake = tmp_path / "import_utils.py"
    fake.write_text("def requires_backends():\n    raise ImportError('GPT2LMHeadModel requires PyTorch >= 2.6')\n")
    module = types.ModuleType("transformers.utils.import_utils")
    module.__file__ = str(fake)
    exec(compile(fake.read_text(), str(fake), "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "transformers.utils.import_utils", module)
    try:
        module.requires_backends()
    except ImportError as e:
        assert is_user_error(e)


@pytest.mark.parametrize("where", ["flag", "config"])
def test_an_unexpanded_shell_variable_in_a_path_is_refused(run_config, tmp_path, capsys, monkeypatch, where):
    """Catches `--trainer.default_root_dir '$HOME/runs'` (quoted) or `default_root_dir: $SCRATCH/runs` in a config
    (YAML expands no variable) training into a folder literally named `$HOME` in the current one, without a word."""
    monkeypatch.setenv("SCRATCH", str(tmp_path / "scratch"))
    config = run_config(trainer={"default_root_dir": "$SCRATCH/runs"} if where == "config" else {})
    flag = ["--trainer.default_root_dir", "$SCRATCH/runs"] if where == "flag" else []
    _one_line_error(capsys, ["fit", "--config", str(config), *flag],
                    "'$SCRATCH/runs' holds $SCRATCH, which no shell expanded",
                    f"--trainer.default_root_dir {tmp_path / 'scratch' / 'runs'}")
    assert not (tmp_path / "$SCRATCH").exists()


def test_a_run_folder_given_for_a_checkpoint_names_its_checkpoint(config, tmp_path, capsys):
    """Catches `--ckpt_path runs/tiny` / `--model.init_from runs/tiny` (the run folder the summary names) answered with
    a generic example, or for init_from "no config.json ...: pass a directory written by `tinylm export`"."""
    main(["fit", "--config", str(config)])
    capsys.readouterr()
    ckpts = tmp_path / "runs" / "tiny" / "checkpoints"
    for argv, wanted in [(["generate", "--ckpt_path", "runs/tiny", "--prompt", "a"], "best.ckpt"),
                         (["validate", "--ckpt_path", "runs/tiny/checkpoints"], "best.ckpt"),
                         (["fit", "--config", str(config), "--ckpt_path", "runs/tiny", "--run.name", "b"], "last.ckpt"),
                         (["fit", "--config", str(config), "--model.init_from", "runs/tiny", "--run.name", "c"],
                          "best.ckpt")]:
        option = "--model.init_from" if "--model.init_from" in argv else "--ckpt_path"
        _one_line_error(capsys, argv, f"{option} {ckpts / wanted}".replace(str(tmp_path) + "/", ""))


def test_a_relative_corpus_not_found_says_where_it_was_looked_for(run_config, tmp_path, capsys):
    """Catches `tinylm fit --config exp/a.yaml` whose `corpus: data.txt` lies beside the config: "corpus 'data.txt'
    not found" did not say it was looked for in the current folder (a config's paths are not its own folder's)."""
    (tmp_path / "exp").mkdir()
    config = run_config(data={"corpus": "data.txt"})
    (tmp_path / "exp" / "data.txt").write_text("hello world\n" * 200)
    _one_line_error(capsys, ["prepare", "--config", str(config)], "corpus 'data.txt' not found",
                    f"in the current folder, {tmp_path}")


def test_a_cache_dir_from_the_environment_that_is_a_file_names_the_variable(run_config, tmp_path, capsys, monkeypatch):
    """Catches `TINYLM_CACHE_DIR=notes.txt` (a file) reported as "data.cache_dir 'notes.txt' ... (or set
    $TINYLM_CACHE_DIR)": an option the user never passed, and as the fix the variable they had set."""
    config = run_config(data={"cache_dir": None})
    (tmp_path / "notes.txt").write_text("x")
    monkeypatch.setenv("TINYLM_CACHE_DIR", "notes.txt")
    _one_line_error(capsys, ["prepare", "--config", str(config)], "$TINYLM_CACHE_DIR 'notes.txt'",
                    "set TINYLM_CACHE_DIR to a folder")


@pytest.mark.parametrize("value, got", [("1e3", "1000"), ("10.0", "10")])
def test_a_whole_number_written_as_a_float_says_how_to_write_it(config, capsys, value, got):
    """Catches `--trainer.max_steps 1e3` answered "expected a whole number, got 1000.0": 1000.0 is whole, and the line
    said neither what was wrong with it nor how to write it."""
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.max_steps", value],
                    "--trainer.max_steps: expected a whole number", f"write it as {got}")


def test_a_validation_interval_written_as_a_whole_float_says_how_to_write_it(config, capsys):
    """Catches `--trainer.val_check_interval 1e3` (batches, an int or a float option) answered "1000.0 is a fraction
    of an epoch": 1e3 is read as a float, which Lightning takes as a share of an epoch, and the line called 1000 a
    fraction without saying how to write the number of batches meant."""
    line = _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.val_check_interval", "1e3"],
                           "write it as 1000")
    assert "1000.0 is a fraction" not in line


def test_a_run_folder_of_sharded_checkpoints_names_its_checkpoint(tmp_path):
    """Catches an FSDP2 run's folder (best.ckpt and last.ckpt are folders there: sharded checkpoints) given as a
    checkpoint answered with the generic "is a folder" line, not with its checkpoint."""
    from tinylm.checkpoint import SHARDED_METADATA, checkpoint_in_folder

    last = tmp_path / "runs" / "big" / "checkpoints" / "last.ckpt"
    last.mkdir(parents=True)
    (last / SHARDED_METADATA).write_bytes(b"")
    assert checkpoint_in_folder(tmp_path / "runs" / "big") == str(last)
    assert checkpoint_in_folder(last) is None  # (a sharded checkpoint itself is one)


def test_ranks_starting_from_different_checkpoints_are_refused(monkeypatch):
    """Catches the ranks of a run on several nodes starting from different checkpoints (each node reads `--ckpt_path
    last` on its own disk: node 1 without a shared run folder found none) waiting for each other for good in their
    first collective, without a word: every rank refuses in one line once connected; the same step goes on."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from tinylm.cli.launch_checks import check_same_start
    from tinylm.errors import TinyLMError

    strategy = SimpleNamespace(root_device=torch.device("cpu"), local_rank=0)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    refused = "rank 0: step 8; ranks 1, 2: none, a new run; this node found no checkpoint in runs/x"
    for others, ours, error in ([8, 8, 8], 8, None), ([8, -1, -1], None, refused):
        monkeypatch.setattr(dist, "all_gather", lambda out, mine, o=others: [t.fill_(v) for t, v in zip(out, o)])
        if error is None:
            check_same_start(strategy, ours, "runs/x", "fit")
            continue
        with pytest.raises(TinyLMError, match=re.escape(f"start from different checkpoints ({error})")) as e:
            check_same_start(strategy, ours, "runs/x", "fit")
        assert "--trainer.default_root_dir DIR on a filesystem the nodes share" in str(e.value)


def test_a_node_whose_node_0_ended_while_connecting_says_so_in_one_line(monkeypatch):
    """Catches node 1 of a torchrun run whose node 0 ended before the ranks met (node 0 refused a run folder holding a
    run, in one line) ending in torch's DistNetworkError traceback ("Failed to recv, got 0 bytes. Connection was likely
    closed"), which named neither node 0 nor what to do."""
    import torch.distributed as dist

    from tinylm.cli.errors import is_user_error, one_line

    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    e = dist.DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server "
                              "shutdown or crash?")
    assert is_user_error(e) and one_line(e).startswith("lost the connection to the ranks' meeting point at "
                                                       "10.0.0.1:29500 (node 0's launcher): node 0 ended")
    assert not is_user_error(dist.DistNetworkError("some other network failure"))


def test_a_missing_checkpoint_under_a_folder_here_is_not_looked_up_on_the_hub(tmp_path, monkeypatch, capsys):
    """Catches `tinylm generate --ckpt_path runs/typo` (a run's name mistyped, with runs/ here) or `--ckpt_path last`
    read as a Hugging Face Hub model's name: the local path sent to huggingface.co (3 s when it cannot be reached)
    and a message about the Hub and its cache ("no Hugging Face Hub model of that name could be read") instead of
    "not found"."""
    import huggingface_hub

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "real").mkdir(parents=True)

    def asked(*args, **kwargs):
        raise AssertionError(f"the Hub was asked for {args}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", asked)
    for given in "runs/typo", "last":  # (`last`: fit's and validate's word, which generate does not take)
        line = _one_line_error(capsys, ["generate", "--ckpt_path", given, "--prompt", "a"],
                               f"checkpoint {given!r} not found")
        assert "Hugging Face Hub" not in line


def test_a_long_inline_section_is_no_file_name_to_the_time_checks(tmp_path):
    """Catches the time checks looking for a section's own file under an inline section's text (`--trainer '{...}'`,
    jsonargparse's form): one longer than 255 bytes ended `tinylm fit` in 'OSError: file name too long' before it
    began, where it trained."""
    from tinylm.cli.callback_checks import check_time_intervals

    inline = "{" + ", ".join(f'"limit_val_batches": {i}' for i in range(20)) + ', "max_steps": 3}'
    assert len(inline) > 255
    (tmp_path / "c.yaml").write_text("trainer:\n  max_steps: 2\n")
    check_time_intervals(["fit", "--config", str(tmp_path / "c.yaml"), "--trainer", inline])
