"""Run folders never lose a result, and Lightning's own flags do what Lightning's users expect (issue 9)."""

import csv
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import forked
import lightning as L
import pytest
import torch
import yaml

from tinylm.cli import main
from tinylm.cli.errors import is_user_error, one_line
from tinylm.cli.fit import lightning_main
from tinylm.cli.prompts import unescape

pytestmark = pytest.mark.process  # runs whole `tinylm` processes (tests/process)


@pytest.fixture
def config(run_config):
    """A tiny run: 4 steps, validation every 2, checkpoints every 2."""
    return run_config(run={"checkpoint_every": 2}, trainer={"max_steps": 4, "val_check_interval": 2})


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _error_line(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 1
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("tinylm ") and ": error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_validate_leaves_the_training_run_untouched(config, tmp_path, capsys):
    """Catches `tinylm validate` moving the run's metrics.csv aside, rewriting its config.yaml or starting a log at
    step 0 that a later resume appends to; the result must land in runs/NAME/validate/ at the checkpoint's step."""
    main(["fit", "--config", str(config)])
    run = tmp_path / "runs" / "tiny"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    main(["validate", "--config", str(config), "--ckpt_path", str(run / "checkpoints" / "step-2.ckpt")])
    out = capsys.readouterr().out
    assert "step 2:" in out and "val/loss" in out
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "validate" not in p.parts}
    assert after == before  # nothing of the training run changed, nothing was added beside it
    rows = _rows(run / "validate" / "metrics.csv")
    assert len(rows) == 1 and rows[0]["step"] == "2" and rows[0]["checkpoint"].endswith("step-2.ckpt")
    val_at_2 = next(float(r["val/loss"]) for r in _rows(run / "csv" / "metrics.csv") if r.get("val/loss"))
    assert float(rows[0]["val/loss"]) == pytest.approx(val_at_2, abs=1e-5)
    main(["validate", "--config", str(config), "--ckpt_path", str(run / "checkpoints" / "last.ckpt")])
    assert [r["step"] for r in _rows(run / "validate" / "metrics.csv")] == ["2", "4"]  # appended, not replaced
    main(["validate", "--config", str(config), "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
          "--trainer.fast_dev_run", "true"])  # one batch: printed, never recorded as the checkpoint's result
    assert [r["step"] for r in _rows(run / "validate" / "metrics.csv")] == ["2", "4"]


def test_validate_of_a_checkpoint_leaves_the_runs_own_loggers_and_validation_limit(config, tmp_path, capsys):
    """Catches `tinylm validate --ckpt_path` (no --config: the run's own settings) taking the run's trainer.logger
    too: a user's CSVLogger lost its training rows to validate's one row at step 0 (a WandbLogger failed without
    credentials); and its `limit_val_batches 0` (validation off while training), refused as "validates nothing"."""
    main(["fit", "--config", str(config), "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
          "--trainer.logger.save_dir", "logs", "--trainer.logger.version", "v", "--trainer.limit_val_batches", "0"])
    theirs = tmp_path / "logs" / "lightning_logs" / "v"
    before = {p: p.read_bytes() for p in theirs.iterdir()}
    capsys.readouterr()
    main(["validate", "--ckpt_path", "runs/tiny/checkpoints/last.ckpt"])
    assert "val/loss" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in theirs.iterdir()} == before
    assert len(_rows(tmp_path / "runs" / "tiny" / "validate" / "metrics.csv")) == 1


def test_validate_prints_its_result_when_it_cannot_record_it(config, tmp_path, capsys, caplog):
    """Catches validate printing its numbers and then failing (exit 1) because the record cannot be written (a
    read-only run folder, a full disk; here a file where the validate/ folder goes): a warning, not a failure."""
    main(["fit", "--config", str(config)])
    (tmp_path / "runs" / "tiny" / "validate").write_text("mine")
    capsys.readouterr()
    main(["validate", "--config", str(config), "--ckpt_path", "last"])
    out = capsys.readouterr().out
    assert "step 4:" in out and "val/loss" in out and "appended" not in out
    assert "could not append the result to" in caplog.text


def test_validate_of_a_loose_checkpoint_records_beside_it(config, tmp_path, capsys):
    """Catches `tinylm validate --ckpt_path DIR/model.ckpt` (a file outside a run folder, no run named) appending to
    runs/tinylm/validate/metrics.csv of the working folder: into the results of a run of that name, or into a new
    folder that looked like a run. It goes beside the file; a run the command names still gets it."""
    import shutil

    main(["fit", "--config", str(config)])
    loose = tmp_path / "downloads" / "model.ckpt"
    loose.parent.mkdir()
    shutil.copy(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", loose)
    capsys.readouterr()
    main(["validate", "--ckpt_path", str(loose)])
    assert f"(appended to {loose.parent / 'validate' / 'metrics.csv'})" in capsys.readouterr().out
    assert len(_rows(loose.parent / "validate" / "metrics.csv")) == 1 and not (tmp_path / "runs" / "tinylm").exists()
    main(["validate", "--ckpt_path", str(loose), "--run.name", "tiny"])
    assert len(_rows(tmp_path / "runs" / "tiny" / "validate" / "metrics.csv")) == 1


def test_validate_records_into_the_checkpoints_own_run(config, tmp_path, capsys, caplog):
    """Catches `tinylm validate --ckpt_path runs/other/...` appending its result to the config's run folder (made
    empty for it) instead of the checkpoint's, and its warning saying 'resuming' for an evaluation."""
    main(["fit", "--config", str(config), "--run.name", "other"])
    capsys.readouterr()
    main(["validate", "--config", str(config), "--model.n_layer", "3",
          "--ckpt_path", str(tmp_path / "runs" / "other" / "checkpoints" / "last.ckpt")])
    assert len(_rows(tmp_path / "runs" / "other" / "validate" / "metrics.csv")) == 1
    assert not (tmp_path / "runs" / "tiny").exists()
    assert "evaluating" in caplog.text and "resuming" not in caplog.text and "model.n_layer=3" in caplog.text


def test_validate_without_a_config_uses_the_checkpoints_data(config, tmp_path, capsys, caplog):
    """Catches `tinylm validate --ckpt_path X` without --config warning that the default model options are ignored
    (the user set none) and evaluating on the default corpus (a download) instead of the run's own data."""
    main(["fit", "--config", str(config)])
    run = tmp_path / "runs" / "tiny"
    caplog.clear()
    main(["validate", "--ckpt_path", str(run / "checkpoints" / "step-2.ckpt")])
    assert "ignoring" not in caplog.text
    val_at_2 = next(float(r["val/loss"]) for r in _rows(run / "csv" / "metrics.csv") if r.get("val/loss"))
    (row,) = _rows(run / "validate" / "metrics.csv")
    assert float(row["val/loss"]) == pytest.approx(val_at_2, abs=1e-5)


def test_validate_without_a_config_finds_a_bpe_of_another_size_and_honours_a_default_named(run_config, tmp_path,
                                                                                            capsys):
    """Catches `tinylm validate --ckpt_path X` of a run whose BPE was trained to --data.vocab_size 300 training a new
    8192 BPE (the target was not in the checkpoint) and failing on the vocabulary; and `--data.val_batches null`
    (the default, named on the command line) being replaced by the run's val_batches 1."""
    config = run_config(data={"tokenizer": "bpe", "vocab_size": 300})
    main(["fit", "--config", str(config)])
    run = tmp_path / "runs" / "tiny"
    trained = lambda: sorted(p.name for p in (tmp_path / "cache" / "tokenizers").iterdir()
                             if not p.name.startswith("checkpoint-"))  # validate's copy of the checkpoint's own
    tokenizers = trained()
    val_at_2 = next(float(r["val/loss"]) for r in _rows(run / "csv" / "metrics.csv") if r.get("val/loss"))
    main(["validate", "--ckpt_path", str(run / "checkpoints" / "last.ckpt")])
    main(["validate", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--data.val_batches", "null"])
    whole_config = tmp_path / "whole.yaml"  # the same, set in a config file, or as the section
    whole_config.write_text(f"data:\n  corpus: {tmp_path / 'shakespeare_small.txt'}\n"
                            f"  cache_dir: {tmp_path / 'cache'}\n"
                            "  val_batches: null\n")
    main(["validate", "--config", str(whole_config), "--ckpt_path", str(run / "checkpoints" / "last.ckpt")])
    main(["validate", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "-c", str(whole_config)])
    main(["validate", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--data", '{"val_batches": null}'])
    assert trained() == tokenizers  # none trained
    one_batch, *whole = (float(r["val/loss"]) for r in _rows(run / "validate" / "metrics.csv"))
    assert one_batch == pytest.approx(val_at_2, abs=1e-5) and whole[0] != pytest.approx(one_batch, abs=1e-4)
    assert whole == pytest.approx([whole[0]] * 4, abs=1e-6)


def test_validate_on_other_text_uses_the_checkpoints_tokenizer_and_names_an_overlap(run_config, tmp_path, small_data,
                                                                                    caplog):
    """Catches `validate --data.corpus OTHER` of a BPE run training a BPE on OTHER and refusing it as another
    tokenizer (with advice to "resume"), and a validation whose split holds text the model trained on (a larger
    val_fraction than the run's, or the run's corpus edited since) passing in silence."""
    config = run_config(data={"tokenizer": "bpe", "vocab_size": 300})
    main(["fit", "--config", str(config)])
    ckpt = str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")
    other = tmp_path / "german.txt"
    other.write_text((small_data / "german.txt").read_text(encoding="utf-8"), encoding="utf-8")
    with caplog.at_level("INFO", logger="tinylm"):
        main(["validate", "--ckpt_path", ckpt, "--data.corpus", str(other)])
    assert "with the checkpoint's own bpe tokenizer" in caplog.text and "larger than" not in caplog.text
    # how much of OTHER it scored: said (it scored the last 10 % saying "evaluating on data.corpus OTHER") and kept
    assert f"the validation split of data.corpus {other} (its last 10%; --data.val_fraction sets it)" in caplog.text
    (row,) = _rows(tmp_path / "runs" / "tiny" / "validate" / "metrics.csv")
    assert float(row["val/loss"]) > 0 and row["corpus"] == str(other)  # told apart from the run's own text's rows
    text = other.read_bytes()
    assert 0 < int(row["val_bytes"]) < 0.15 * len(text), row  # (of its 10 %: the run's data.val_batches)
    caplog.clear()
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["validate", "--ckpt_path", ckpt, "--data.val_fraction", "0.2"])
    assert "data.val_fraction 0.2 is larger than the 0.1 the checkpoint trained with" in caplog.text
    assert "50% of it is text the model trained on" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["validate", "--ckpt_path", ckpt, "--data.val_fraction", "0.05"])  # a part of the held-out text
        main(["validate", "--ckpt_path", ckpt, "--data.val_fraction", "0.1"])  # the run's own
    assert "larger than" not in caplog.text
    assert _rows(tmp_path / "runs" / "tiny" / "validate" / "metrics.csv")[-1]["corpus"] == str(
        tmp_path / "shakespeare_small.txt")
    corpus = tmp_path / "shakespeare_small.txt"
    corpus.write_text(corpus.read_text(encoding="utf-8")[::-1], encoding="utf-8")
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["validate", "--ckpt_path", ckpt])
    assert "holds other text than when the checkpoint trained on it" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="tinylm"):  # asked for by name: said, not done in silence
        main(["validate", "--ckpt_path", ckpt, "--data.tokenizer", "char"])
    assert "--data.tokenizer char would train a new tokenizer, not the model's: the checkpoint's own bpe" in caplog.text


def test_validate_of_a_tokenizer_file_run_needs_the_file_no_more(run_config, tmp_path, small_data, caplog):
    """Catches `validate --ckpt_path X` of a run trained with --data.tokenizer FILE failing once that file moved
    (FileNotFoundError) or changed (refused as another tokenizer, with advice to leave out an option never passed),
    though the checkpoint holds the tokenizer; and a larger val_fraction going unnamed when the corpus is named by
    another path (relative, not absolute) than the run's."""
    from tinylm.tokenize.tokenizer import build_tokenizer

    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:20_000]
    build_tokenizer("bpe", vocab_size=300, documents=lambda: [text]).save(tmp_path / "tok")
    config = run_config(data={"tokenizer": str(tmp_path / "tok" / "tokenizer.json")})
    main(["fit", "--config", str(config)])
    shutil.rmtree(tmp_path / "tok")
    ckpt = str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["validate", "--ckpt_path", ckpt, "--data.corpus", "shakespeare_small.txt", "--data.val_fraction", "0.2"])
    assert "data.val_fraction 0.2 is larger than the 0.1" in caplog.text
    (row,) = _rows(tmp_path / "runs" / "tiny" / "validate" / "metrics.csv")
    assert float(row["val/loss"]) > 0


def test_validate_ckpt_path_best_and_the_names_tinylm_does_not_use(config, tmp_path, capsys):
    """Catches `--ckpt_path best`, which --help offers, failing with "checkpoint 'best' not found", and
    `hpc`/`registry` failing the same way instead of saying what to pass."""
    line = _error_line(capsys, ["validate", "--config", str(config), "--ckpt_path", "best"])
    assert "best.ckpt not found" in line and "`last`" in line
    main(["fit", "--config", str(config)])
    capsys.readouterr()
    main(["validate", "--config", str(config), "--ckpt_path", "best"])
    rows = _rows(tmp_path / "runs" / "tiny" / "validate" / "metrics.csv")
    assert len(rows) == 1 and rows[0]["checkpoint"].endswith("best.ckpt")
    for name in ("hpc", "registry"):
        line = _error_line(capsys, ["validate", "--config", str(config), "--ckpt_path", name])
        assert f"--ckpt_path {name} is not used by tinylm" in line


def test_validate_without_a_checkpoint_is_refused(config, capsys):
    """Catches `tinylm validate` evaluating random weights with exit 0 when --ckpt_path is forgotten."""
    line = _error_line(capsys, ["validate", "--config", str(config)])
    assert "--ckpt_path" in line
    line = _error_line(capsys, ["validate", "--ckpt_path", "last"])  # no --config: the default run has none
    assert "--ckpt_path last: runs/tinylm holds no checkpoint" in line and "--config" in line


def test_ckpt_path_last_with_no_checkpoint_says_where_it_starts_a_new_run(config, tmp_path, capsys):
    """Catches `--ckpt_path last` finding no checkpoint (a run's config.yaml used from another folder: runs/ is under
    the folder the command runs in; a mistyped --run.name) starting a new run in a line easily missed, which did
    not say where: a warning names the folder, and the folder it is in."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "1", "--ckpt_path", "last"])
    assert f"--ckpt_path last: runs/tiny (in {tmp_path}) has no checkpoint yet; starting a new run from step 0" \
        in capsys.readouterr().err


def test_config_yaml_sits_in_the_run_folder_and_a_resume_keeps_it(config, tmp_path):
    """Catches config.yaml landing in csv/ when W&B is off, or a resume overwriting the config that started the run
    or that of an earlier resume from the same step."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    run = tmp_path / "runs" / "tiny"
    first = (run / "config.yaml").read_text()
    assert "max_steps: 2" in first and not (run / "csv" / "config.yaml").exists()
    killed = run / "config.resume-step2.yaml"  # an earlier resume from step 2, killed before its first save
    killed.write_text("data:\n  val_batches: 5\n")
    main(["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", "last"])
    assert (run / "config.yaml").read_text() == first
    assert killed.read_text() == "data:\n  val_batches: 5\n"  # the record of that resume is kept too
    record = run / "config.resume-step2-2.yaml"
    assert "max_steps: 4" in record.read_text()
    # the checkpoint it started from by step and file in a comment, not as ckpt_path: last.ckpt is at step 4 now,
    # and the record given as --config resumed from it (not from step 2)
    assert yaml.safe_load(record.read_text())["ckpt_path"] is None
    last = run / "checkpoints" / "last.ckpt"
    assert f"# resumed at step 2 from {last} as it was then" in record.read_text()


def test_a_branchs_config_yaml_names_its_checkpoint_as_it_was_then(config, tmp_path):
    """Catches a branch's config.yaml naming the checkpoint it started from as ckpt_path, as typed: given later as
    --config (with --run.name NEW, as a record is), it branched from whatever that file was by then (the source
    run's last.ckpt, saved over since: another step), or found nothing from another folder (a relative path). It
    says the step and the absolute file in a comment above ``ckpt_path: null``, as a resume's record does."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    main(["fit", "--config", str(config), "--run.name", "br", "--ckpt_path", "runs/tiny/checkpoints/last.ckpt"])
    record = (tmp_path / "runs" / "br" / "config.yaml").read_text()
    assert yaml.safe_load(record)["ckpt_path"] is None
    last = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    assert f"# branched at step 2 from {last} as it was then" in record, record


def test_a_config_yaml_found_in_a_new_runs_folder_is_kept(config, tmp_path, caplog):
    """Catches a new run (or a branch) into a folder holding no run but a config.yaml (the user's own, with their
    comments; an attempt that stopped before it logged) writing its config over that file. The same config
    written again (the same command rerun after such an attempt) leaves no copy."""
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    mine = "# my notes on this experiment\ntrainer:\n  max_steps: 2\n"
    (run / "config.yaml").write_text(mine)
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    assert (run / "config.previous.yaml").read_text() == mine
    assert "max_steps: 2" in (run / "config.yaml").read_text() and "config.previous.yaml" in caplog.text
    shutil.rmtree(run / "checkpoints"), shutil.rmtree(run / "csv")  # an attempt that stopped before it logged
    written = (run / "config.yaml").read_text()
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    assert sorted(p.name for p in run.glob("config*.yaml")) == ["config.previous.yaml", "config.yaml"]
    assert (run / "config.yaml").read_text() == written
    branch = tmp_path / "runs" / "br"
    branch.mkdir()
    (branch / "config.yaml").write_text(mine)
    main(["fit", "--config", str(config), "--trainer.max_steps", "4", "--run.name", "br",
          "--ckpt_path", str(run / "checkpoints" / "last.ckpt")])
    assert (branch / "config.previous.yaml").read_text() == mine
    assert "max_steps: 4" in (branch / "config.yaml").read_text()
    assert not list(branch.glob("config.resume-*"))


def test_a_config_yaml_that_is_a_folder_or_a_link_is_kept_too(config, tmp_path):
    """Catches a config.yaml in a new run's folder that is no plain file: a folder crashed the run with a traceback
    (IsADirectoryError) and the cleanup then deleted the folder; a dangling link had the config written through it,
    outside the run folder. Each is moved aside as config.previous.yaml, like a file, and the run writes its own."""
    run = tmp_path / "runs" / "tiny"
    (run / "config.yaml").mkdir(parents=True)
    main(["fit", "--config", str(config), "--trainer.max_steps", "1", "--trainer.val_check_interval", "1"])
    assert (run / "config.previous.yaml").is_dir() and "max_steps: 1" in (run / "config.yaml").read_text()
    link = tmp_path / "runs" / "link"
    link.mkdir()
    (link / "config.yaml").symlink_to(tmp_path / "elsewhere.yaml")  # dangling
    main(["fit", "--config", str(config), "--trainer.max_steps", "1", "--trainer.val_check_interval", "1",
          "--run.name", "link"])
    assert not (tmp_path / "elsewhere.yaml").exists()
    assert (link / "config.previous.yaml").is_symlink() and not (link / "config.yaml").is_symlink()


def test_a_refused_branch_leaves_no_config_yaml(config, tmp_path, capsys):
    """Catches a branch into a new folder refused on restoring (another batch size) writing that folder's
    config.yaml: the retry then counted as a resume of it, and the run's record showed a batch it never trained."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    ckpt = str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")
    branch = ["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", ckpt, "--run.name", "br"]
    assert "global batch" in _error_line(capsys, [*branch, "--data.batch_size", "3"])
    assert not (tmp_path / "runs" / "br" / "config.yaml").exists()
    main(branch)
    assert sorted(p.name for p in (tmp_path / "runs" / "br").glob("config*.yaml")) == ["config.yaml"]
    assert "batch_size: 2" in (tmp_path / "runs" / "br" / "config.yaml").read_text()


def test_a_refused_resume_leaves_no_config_record(config, tmp_path, capsys):
    """Catches a resume refused on restoring the checkpoint (here: another batch size) writing
    config.resume-stepN.yaml: the next resume compares its trainer options with the newest record, so a refused
    attempt's record hid the warning that accumulate_grad_batches changed."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    run = tmp_path / "runs" / "tiny"
    resume = ["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", "last",
              "--trainer.accumulate_grad_batches", "2"]
    line = _error_line(capsys, [*resume, "--data.batch_size", "3"])
    assert "global batch" in line and sorted(p.name for p in run.glob("config*.yaml")) == ["config.yaml"]
    main(resume)
    assert "trainer.accumulate_grad_batches 2 (the run had 1)" in capsys.readouterr().err
    assert "accumulate_grad_batches: 2" in (run / "config.resume-step2.yaml").read_text()


def test_a_resume_with_another_accumulation_steps_on_whole_accumulations_at_the_runs_validation_steps(
        config, tmp_path, capsys):
    """Catches a resume with another accumulate_grad_batches stepping on part of an accumulation (Lightning steps when
    its micro-batch count reaches a multiple of it: 3 done, accumulation 2, the first step summed 1 micro-batch
    divided by 2; it was refused), or validating at other steps than its interval says (the count went on from the
    run's micro-batches: every 6 with accumulation 2 validated after steps 5 and 8): the count is taken again in the
    new micro-batches, as if the run had always accumulated so."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "3", "--trainer.val_check_interval", "3"])
    capsys.readouterr()
    main(["fit", "--config", str(config), "--trainer.max_steps", "9", "--ckpt_path", "last",
          "--trainer.accumulate_grad_batches", "2", "--trainer.val_check_interval", "6"])
    err = capsys.readouterr().err
    assert "trainer.accumulate_grad_batches 2 (the run had 1)" in err and "val_check_interval" not in err
    rows = _rows(tmp_path / "runs" / "tiny" / "csv" / "metrics.csv")
    assert [int(r["step"]) for r in rows if r.get("val/loss")] == [2, 5, 8]  # after steps 3, 6 and 9
    assert all(float(r["train/loss"]) < 10 for r in rows if r.get("train/loss"))


def test_a_resume_with_another_batch_size_names_the_val_batches_that_keep_the_runs_windows(config, tmp_path,
                                                                                          capsys):
    """Catches data.val_batches (batches of data.batch_size windows) silently measuring val/loss on other windows
    after a resume that trades batch size for accumulation (val/loss 0.014 off the run's from there)."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])  # batch 2, val_batches 1
    capsys.readouterr()
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--data.batch_size", "1",
          "--trainer.accumulate_grad_batches", "2", "--trainer.val_check_interval", "4"])
    assert "pass --data.val_batches 2 to keep the run's" in capsys.readouterr().err
    # that advice followed (by another run of the same start): the run's windows, nothing to say (it warned "val/loss
    # is measured on other windows")
    main(["fit", "--config", str(config), "--trainer.max_steps", "2", "--run.name", "advised"])
    capsys.readouterr()
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--data.batch_size", "1", "--data.val_batches", "2",
          "--trainer.accumulate_grad_batches", "2", "--trainer.val_check_interval", "4", "--run.name", "advised"])
    assert "other windows" not in capsys.readouterr().err


def test_a_resume_from_an_epochs_last_batch_may_change_the_accumulation():
    """Catches the refusal above hitting a checkpoint taken at a notional epoch's last batch: the next epoch counts
    its micro-batches from 0, so any accumulation divides them."""
    from tinylm.cli.resume_changes import check_accumulation
    from tinylm.errors import TinyLMError

    progress = {"current": {"ready": 3}, "is_last_batch": True}
    ckpt = {"loops": {"fit_loop": {"epoch_loop.batch_progress": progress}}}
    check_accumulation(ckpt, 2, "runs/x/checkpoints/last.ckpt")
    progress["is_last_batch"] = False
    with pytest.raises(TinyLMError, match="accumulate_grad_batches 2 does not divide the 3 micro-batches"):
        check_accumulation(ckpt, 2, "runs/x/checkpoints/last.ckpt")


def test_a_resume_from_a_save_inside_an_accumulation_is_refused():
    """Catches a resume from Lightning's OnExceptionCheckpoint of a failure before a step's second micro-batch (its
    first one's gradients not in the file) going on without a word, that step summing one micro-batch divided by 2;
    a failure before a step's first micro-batch resumes (that batch is trained again: nothing was accumulated)."""
    from tinylm.cli.resume_changes import check_accumulation
    from tinylm.errors import TinyLMError

    counts = {"ready": 16, "started": 15, "processed": 15, "completed": 15}  # micro-batch 16 drawn, not trained
    ckpt = {"loops": {"fit_loop": {"epoch_loop.batch_progress": {"current": counts, "is_last_batch": False}}}}
    with pytest.raises(TinyLMError, match=r"on_exception.ckpt was saved inside an optimizer step, after 1 of its 2 "
                                          r"micro-batches .* move it away and resume from the run's last.ckpt"):
        check_accumulation(ckpt, 2, "runs/x/checkpoints/on_exception.ckpt", had=2)
    counts.update(ready=15, started=14, processed=14, completed=14)
    check_accumulation(ckpt, 2, "runs/x/checkpoints/on_exception.ckpt", had=2)


def test_a_forked_child_does_not_keep_the_run_folder_locked(tmp_path):
    """Catches a DataLoader worker (a forked child) keeping the run folder's lock after the run released it: a
    worker outlives its parent by seconds, and the resume that followed was refused as "in use"."""
    import os
    import time

    from tinylm.cli import run_lock

    run = tmp_path / "runs" / "r"
    run_lock.lock_run_folder(run)
    forked_, go = os.pipe()
    child = os.fork()
    if child == 0:  # the worker: lives on for a while (once os.fork returns here, the fork's hooks have run)
        os.write(go, b"1")
        time.sleep(20)
        os._exit(0)
    try:
        assert os.read(forked_, 1) == b"1"
        run_lock._LOCKS.pop(str(run.resolve())).close()  # the parent's file closed as at its death: no unlock
        assert _can_lock(run / ".lock"), "the forked child still holds the run folder's lock"
    finally:
        os.kill(child, 9)
        forked.reap(child, 30)
        os.close(forked_), os.close(go)


def _can_lock(path: Path) -> bool:
    """Whether another process can take the flock on `path` now."""
    take = "import fcntl, sys; fcntl.flock(open(sys.argv[1], 'a+'), fcntl.LOCK_EX | fcntl.LOCK_NB)"
    return subprocess.run([sys.executable, "-c", take, str(path)], capture_output=True, check=False).returncode == 0


def test_a_released_run_folder_is_free_while_a_child_still_holds_a_copy_of_its_lock(tmp_path):
    """Catches the release closing its lock file only: a child forked a moment before (a DataLoader worker whose
    fork hooks have not run yet) holds a copy of the descriptor, and with it the lock, which belongs to the open
    file (the test above, which released so, lost that race with its child once under a full run)."""
    import os

    from tinylm.cli.run_lock import lock_run_folder, release_run_folder

    run = tmp_path / "runs" / "r"
    copy = os.dup(lock_run_folder(run).fileno())  # what the child holds until its hook closes it
    try:
        release_run_folder(run)
        assert _can_lock(run / ".lock")
    finally:
        os.close(copy)


def test_a_resume_with_fewer_checkpoints_to_keep_removes_the_oldest(config, tmp_path):
    """Catches a resume with a smaller --run.keep_checkpoints keeping every step-N.ckpt of the run: Lightning removes
    one file per save, and only when it holds exactly that many. And a resume with the run's config file, which does
    not name run.keep_checkpoints (the run kept all by a flag), removing all but the default 3 at its start."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "6", "--run.keep_checkpoints", "-1"])
    ckpts = tmp_path / "runs" / "tiny" / "checkpoints"
    steps = lambda: sorted(p.name for p in ckpts.glob("step-*.ckpt"))
    assert steps() == ["step-2.ckpt", "step-4.ckpt", "step-6.ckpt"]
    main(["fit", "--config", str(config), "--trainer.max_steps", "8", "--ckpt_path", "last"])
    assert steps() == ["step-2.ckpt", "step-4.ckpt", "step-6.ckpt", "step-8.ckpt"]  # the run's -1 kept
    main(["fit", "--config", str(config), "--trainer.max_steps", "10", "--ckpt_path", "last", "--run.keep_checkpoints",
          "2"])
    assert steps() == ["step-10.ckpt", "step-8.ckpt"] and (ckpts / "last.ckpt").is_file()


def test_a_resume_with_another_checkpoint_interval_still_keeps_only_the_newest(config, tmp_path):
    """Catches a resume with another --run.checkpoint_every leaving the run's earlier step-N.ckpt files forever
    beside run.keep_checkpoints newer ones (Lightning keys its state by the interval: the resumed list was empty)."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "6", "--run.keep_checkpoints", "2",
          "--run.checkpoint_every", "2"])
    ckpts = tmp_path / "runs" / "tiny" / "checkpoints"
    steps = lambda: sorted(p.name for p in ckpts.glob("step-*.ckpt"))
    assert steps() == ["step-4.ckpt", "step-6.ckpt"]
    main(["fit", "--config", str(config), "--trainer.max_steps", "12", "--ckpt_path", "last",
          "--run.keep_checkpoints", "2", "--run.checkpoint_every", "3", "--trainer.val_check_interval", "3"])
    assert steps() == ["step-12.ckpt", "step-9.ckpt"]


def test_a_run_folder_moved_and_resumed_keeps_its_best_score_and_trims_its_checkpoints(config, tmp_path):
    """Catches `mv runs/tiny runs/moved` then a resume losing the run's best score and kept files (Lightning drops a
    ModelCheckpoint's state saved under another folder): the next validation's best.ckpt replaced a better one, and
    the step-N files were never trimmed again."""
    from tinylm.train.callbacks import BestCheckpoint, PeriodicCheckpoint

    main(["fit", "--config", str(config), "--trainer.max_steps", "4", "--run.keep_checkpoints", "2"])
    shutil.move(tmp_path / "runs" / "tiny", tmp_path / "runs" / "moved")
    ckpts = tmp_path / "runs" / "moved" / "checkpoints"
    before = torch.load(ckpts / "last.ckpt", weights_only=True, map_location="cpu")["callbacks"]
    best_before = next(v["best_model_score"] for k, v in before.items() if k.startswith("BestCheckpoint"))
    cli = lightning_main(["fit", "--config", str(config), "--run.name", "moved", "--trainer.max_steps", "6",
                          "--ckpt_path", "last", "--run.keep_checkpoints", "2"])
    best = next(cb for cb in cli.trainer.callbacks if isinstance(cb, BestCheckpoint))
    periodic = next(cb for cb in cli.trainer.callbacks if isinstance(cb, PeriodicCheckpoint))
    assert best.best_model_score <= best_before  # kept, then improved on or not: never a worse one taken
    assert Path(best.best_model_path).parent == ckpts.resolve()
    assert sorted(p.name for p in ckpts.glob("step-*.ckpt")) == ["step-4.ckpt", "step-6.ckpt"]  # step-2 trimmed
    assert all(Path(p).parent == ckpts.resolve() for p in periodic.best_k_models)


def test_a_copied_run_folder_resumed_beside_its_original_logs_to_a_w_and_b_run_of_its_own(config, tmp_path):
    """Catches `cp -r runs/tiny runs/copy` then `--run.name copy --ckpt_path last` continuing the original's W&B run:
    two trainings logged steps 4, 5... of one W&B run twice (W&B ignores a step below the run's latest: once both were
    synced, one training's rows were missing there). A folder moved (`mv`: the original gone) still continues its
    W&B run."""
    main(["fit", "--config", str(config)])
    runs = tmp_path / "runs"
    last = runs / "tiny" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True, map_location="cpu")
    ckpt["tinylm"]["wandb_id"] = "abc12345"  # (as a run logging to W&B saves it; offline W&B costs seconds a run)
    torch.save(ckpt, last.with_name("edited"))
    os.replace(last.with_name("edited"), last)
    wandb_id = lambda run: torch.load(runs / run / "checkpoints" / "last.ckpt", weights_only=True,
                                      map_location="cpu")["tinylm"]["wandb_id"]
    shutil.copytree(runs / "tiny", runs / "copy")
    main(["fit", "--config", str(config), "--run.name", "copy", "--ckpt_path", "last", "--trainer.max_steps", "5"])
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "5"])
    assert (wandb_id("copy"), wandb_id("tiny")) == (None, "abc12345")
    shutil.move(runs / "tiny", runs / "moved")
    main(["fit", "--config", str(config), "--run.name", "moved", "--ckpt_path", "last", "--trainer.max_steps", "6"])
    assert wandb_id("moved") == "abc12345"


def test_a_run_folder_reached_by_another_path_is_no_copy_of_itself(config, tmp_path, monkeypatch):
    """Catches a run resumed in its own folder by another path to it (a bind mount: /scratch and /lustre/scratch, a
    container's and the host's) taken for a copy of itself beside its original (the checkpoint names the folder by
    the path it was saved through, and that path's newest checkpoint names the same W&B run): it logged to a new W&B
    run where it continues its own. (Needs a bind mount: root.)"""
    from tinylm.cli.run_folder import copied_from

    main(["fit", "--config", str(config)])
    last = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True, map_location="cpu")
    ckpt["tinylm"]["wandb_id"] = "abc12345"  # (as a run logging to W&B saves it)
    torch.save(ckpt, last)
    (other := tmp_path.parent / f"{tmp_path.name}-mount").mkdir()
    if shutil.which("mount") is None or \
            subprocess.run(["mount", "--bind", str(tmp_path), str(other)], capture_output=True).returncode:
        pytest.skip("no bind mount here (not root, or a container without CAP_SYS_ADMIN)")
    try:
        monkeypatch.chdir(other)
        assert copied_from(ckpt, "runs/tiny/checkpoints/last.ckpt") is None
        shutil.copytree(other / "runs" / "tiny", other / "runs" / "copy")  # (a copy still is one)
        assert copied_from(ckpt, "runs/copy/checkpoints/last.ckpt") == tmp_path / "runs" / "tiny"
    finally:
        monkeypatch.chdir(tmp_path)
        subprocess.run(["umount", str(other)], check=True)


def test_default_root_dir_is_where_runs_go(config, tmp_path):
    """Catches --trainer.default_root_dir being shown by --help and silently ignored."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "2", "--trainer.default_root_dir", "elsewhere"])
    assert (tmp_path / "elsewhere" / "tiny" / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "elsewhere" / "tiny" / "csv" / "metrics.csv").is_file()
    assert not (tmp_path / "runs").exists()
    cli = lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "3", "--ckpt_path", "last",
                          "--trainer.default_root_dir", "elsewhere"])
    assert cli.trainer.global_step == 3  # `last` is looked up under the same root


def test_user_logger_joins_tinylms_and_plugins_keep_atomic_writes(config, tmp_path):
    """Catches --trainer.logger and --trainer.plugins being replaced by tinylm's own (they were ignored)."""
    from tinylm.train.checkpoint_io import AtomicCheckpointIO

    cli = lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "2",
                          "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
                          "--trainer.logger.save_dir", str(tmp_path / "mine"),
                          "--trainer.plugins", "lightning.pytorch.plugins.environments.LightningEnvironment"])
    assert [type(lg).__name__ for lg in cli.trainer.loggers] == ["RunCSVLogger", "KeptCSVLogger"]  # a CSVLogger
    assert list((tmp_path / "mine").rglob("metrics.csv"))  # the user's logger wrote its own file
    assert (tmp_path / "runs" / "tiny" / "csv" / "metrics.csv").is_file()
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)  # the user's plugin joined it
    cli = lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "1", "--run.name", "own_io",
                          "--trainer.plugins", "lightning.pytorch.plugins.io.TorchCheckpointIO"])
    assert type(cli.trainer.strategy.checkpoint_io).__name__ == "TorchCheckpointIO"  # a user's CheckpointIO wins


def test_logger_false_turns_logging_off(config, tmp_path):
    """Catches --trainer.logger false being ignored (Lightning documents it as: no logger)."""
    cli = lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "2", "--trainer.logger", "false"])
    assert cli.trainer.loggers == []
    assert not (tmp_path / "runs" / "tiny" / "csv").exists()


TB = "{class_path: lightning.pytorch.loggers.TensorBoardLogger, init_args: {save_dir: tb}}"


@pytest.mark.parametrize("logger", [["lightning.pytorch.loggers.TensorBoardLogger", "--trainer.logger.save_dir", "tb"],
                                    [f"[{{class_path: CSVLogger, init_args: {{save_dir: csv}}}}, {TB}]"]],
                         ids=["alone", "in_a_list"])
def test_logger_without_its_package_is_one_line_naming_the_cause(config, capsys, logger):
    """Catches a logger whose package is missing failing with only "Does not validate against any of the Union
    subtypes" (the cause, e.g. tensorboard not installed, was lost), or, in a list of loggers, with "Not a valid
    subclass of Logger. Got value: [Namespace(...)...]" (the list branch's reason was left out)."""
    pytest.importorskip("lightning")
    try:
        import tensorboard  # noqa: F401

        pytest.skip("tensorboard is installed here")
    except ImportError:
        pass
    line = _error_line(capsys, ["fit", "--config", str(config), "--trainer.logger", *logger])
    assert "tensorboard" in line and "Union" not in line and "Namespace" not in line


@pytest.mark.parametrize("stop", ["max_time", "early_stopping"])
def test_a_run_stopped_early_saves_where_it_stopped(config, tmp_path, caplog, stop):
    """Catches --trainer.max_time or EarlyStopping ending a run with last.ckpt at an older periodic save: a resume
    went back there and cut the logged steps after it. max_time also stopped mid-accumulation (not resumable
    exactly): the run now finishes the optimizer step it is in."""
    early = ["--trainer.callbacks+", "EarlyStopping", "--trainer.callbacks.monitor", "val/loss",
             "--trainer.callbacks.min_delta", "10"]
    # the settings kept when the run goes on, and what stops it
    same = {"max_time": ["--trainer.accumulate_grad_batches", "2"], "early_stopping": []}
    same = [*same[stop], "--model.decay_steps", "20"]  # the schedule's length, whatever max_steps is
    flags = {"max_time": ["--trainer.max_time", "{microseconds: 1}"],
             "early_stopping": [*early, "--trainer.callbacks.patience", "1"]}[stop]
    with caplog.at_level("INFO", logger="tinylm"):
        cli = lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "20", "--run.checkpoint_every",
                              "3", *same, *flags])
    stopped = cli.trainer.global_step
    said = {"max_time": "(--trainer.max_time: 1e-06 s)",
            "early_stopping": "(EarlyStopping: Monitored metric val/loss did"}  # (what stopped it)
    assert f"the run stopped at step {stopped} of trainer.max_steps 20 {said[stop]}" in caplog.text, caplog.text
    assert stopped == {"max_time": 1, "early_stopping": 4}[stop]
    ckpt = torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True, mmap=True)
    assert ckpt["global_step"] == stopped
    batches = ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["completed"]
    assert batches == stopped * {"max_time": 2, "early_stopping": 1}[stop]

    # Going on from there logs what an unstopped run logs, under the same step labels. Caught: a resume one logging
    # step off (two rows under one step, W&B refusing a lower step), from a last.ckpt saved after the ended epoch.
    csv_of = {name: tmp_path / "runs" / name / "csv" / "metrics.csv" for name in ("tiny", "straight")}
    end = ["--trainer.max_steps", str(stopped + 2)]
    main(["fit", "--config", str(config), "--ckpt_path", "last", *end, *same])
    main(["fit", "--config", str(config), "--run.name", "straight", *end, *same])
    rows = {name: [(r["step"], r["epoch"], "train" if r["train/loss"] else "val",
                    float(r["train/loss"] or r["val/loss"]))
                   for r in _rows(path)] for name, path in csv_of.items()}
    assert [row[:3] for row in rows["tiny"]] == [row[:3] for row in rows["straight"]]
    assert [row[3] for row in rows["tiny"]] == pytest.approx([row[3] for row in rows["straight"]], abs=1e-4)


@pytest.mark.filterwarnings("ignore:`precision=bf16` is supported for historical reasons")  # (Lightning's, rightly)
def test_a_resume_names_changed_training_options(config, tmp_path, caplog):
    """Catches a resume with another gradient_clip_val (or precision, accumulation) training on silently as another
    run, and a seed_everything that the checkpoint's random state overrides being taken without a word; and a
    precision by Lightning's short name (bf16 for bf16-mixed, 32 for 32-true) warned of as another precision."""
    main(["fit", "--config", str(config)])
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "5"])
    assert "the run had" not in caplog.text  # the same settings: nothing to say
    caplog.clear()
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6",
              "--trainer.gradient_clip_val", "0.5", "--seed_everything", "42"])
    assert "trainer.gradient_clip_val 0.5 (the run had None)" in caplog.text
    assert "seed_everything 42 has no effect (the run started with 7)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tinylm"):  # the recipe's own seed again: the run's, nothing to say
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "7",
              "--trainer.gradient_clip_val", "0.5"])
    assert "the run had" not in caplog.text and "seed_everything" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tinylm"):  # unset: 32-true for this width on a CPU, the run's own
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "8",
              "--trainer.gradient_clip_val", "0.5", "--trainer.precision", "null"])
    assert "the run had" not in caplog.text
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "9",
              "--trainer.gradient_clip_val", "0.5", "--trainer.precision", "bf16-mixed"])
    assert "trainer.precision 'bf16-mixed' (the run had '32-true')" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tinylm"):  # Lightning's short name of the run's precision: the same
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "10",
              "--trainer.gradient_clip_val", "0.5", "--trainer.precision", "bf16"])
    assert "the run had" not in caplog.text, caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "11",
              "--trainer.gradient_clip_val", "0.5", "--trainer.precision", "bf16-mixed", "--data.val_batches", "2"])
    assert "with data.val_batches 2 (the run had 1): val/loss is measured on other windows" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tinylm"):  # Lightning's cut of the validation batches: the same
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "12",
              "--trainer.gradient_clip_val", "0.5", "--trainer.precision", "bf16-mixed", "--data.val_batches", "2",
              "--trainer.limit_val_batches", "1"])
    assert "with trainer.limit_val_batches 1 (the run had None): val/loss is measured on other windows" \
        in caplog.text and "data.val_batches" not in caplog.text


def test_a_resume_compares_with_the_runs_newest_record_by_its_name(config, tmp_path, caplog):
    """Catches a run folder copied with `cp -r` (each file the copy's time: config.yaml the newest) resumed with its
    newest settings warned as a change from the first ones, and config.previous.yaml (another run's) read as the
    run's: the newest record is the latest resume's by its name. And a resume of a folder whose config.yaml is gone
    (its resume records kept) writing its record as config.yaml, which that order puts first: the next resume without
    --config went on with the earlier resume's settings."""
    main(["fit", "--config", str(config)])
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "5",
          "--trainer.gradient_clip_val", "0.5"])
    run = tmp_path / "runs" / "tiny"
    (run / "config.previous.yaml").write_text(yaml.safe_dump({"trainer": {"gradient_clip_val": 3.0}}))
    later = time.time() + 60
    os.utime(run / "config.yaml", (later, later))
    os.utime(run / "config.previous.yaml", (later + 1, later + 1))
    caplog.clear()
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6",
              "--trainer.gradient_clip_val", "0.5"])
    assert "the run had" not in caplog.text
    from tinylm.cli.run_folder import run_record

    (run / "config.yaml").unlink()
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "7",
          "--trainer.gradient_clip_val", "0.25"])
    assert not (run / "config.yaml").exists()
    assert run_record(run)[0].name == "config.resume-step6.yaml"
    assert run_record(run)[1]["trainer"]["gradient_clip_val"] == 0.25


def test_a_resume_whose_max_time_is_spent_is_refused(config, tmp_path, capsys):
    """Catches `--ckpt_path last` with the same --trainer.max_time stopping at once, training nothing and saying it
    can go on (Lightning's Timer counts on from the time in the checkpoint): a loop of such jobs never trains."""
    flags = ["--trainer.max_steps", "20", "--trainer.max_time", "{microseconds: 1}"]
    main(["fit", "--config", str(config), *flags])
    capsys.readouterr()
    line = _error_line(capsys, ["fit", "--config", str(config), "--ckpt_path", "last", *flags])
    assert "max_time" in line and "already spent" in line and "larger --trainer.max_time" in line


def test_a_resume_without_the_runs_weight_averaging_is_refused(config, tmp_path, capsys):
    """Catches a run saved with EMAWeightAveraging resumed under a --config without it going on from the averaged
    weights (its checkpoint's state_dict) without a word: the trained weights (current_model_state) were dropped."""
    ema = ["--trainer.callbacks+=EMAWeightAveraging"]
    main(["fit", "--config", str(config), *ema])
    capsys.readouterr()
    line = _error_line(capsys, ["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6"])
    assert "saved by a WeightAveraging callback" in line and "--trainer.callbacks+=EMAWeightAveraging" in line
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6", *ema])  # with it: goes on


def test_ckpt_path_last_without_a_readable_last_ckpt_continues_from_the_newest(config, tmp_path, capsys, caplog):
    """Catches a run folder without last.ckpt (killed before its first periodic save: only best.ckpt) or with a
    damaged one being a dead end: the refusal said 'continue it with --ckpt_path last', which said the same."""
    main(["fit", "--config", str(config)])
    ckpts = tmp_path / "runs" / "tiny" / "checkpoints"
    torn = (ckpts / "last.ckpt").read_bytes()[:5000]
    (ckpts / "last.ckpt").unlink()  # a file of its own: last.ckpt may share its bytes with step-4.ckpt (read-only)
    (ckpts / "last.ckpt").write_bytes(torn)
    cli = lightning_main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6"])
    assert "last.ckpt is damaged; continuing from the newest readable checkpoint, step-4.ckpt (step 4)" in caplog.text
    assert cli.trainer.global_step == 6
    (ckpts / "last.ckpt").unlink()  # going back in place is refused by the newest checkpoint, whatever its name
    line = _error_line(capsys, ["fit", "--config", str(config), "--ckpt_path", str(ckpts / "step-4.ckpt"),
                                "--trainer.max_steps", "8"])
    assert "is at step 4 but" in line and "gone on to step 6" in line
    kept = ckpts.parent / "backup.ckpt"  # a copy kept in the run folder, outside checkpoints/: its own step counts
    shutil.copy(ckpts / "step-4.ckpt", kept)  # (it was taken for the newest, and the run went back to step 4)
    line = _error_line(capsys, ["fit", "--config", str(config), "--ckpt_path", str(kept), "--trainer.max_steps", "8"])
    assert "is at step 4 but" in line and "gone on to step 6" in line
    kept.unlink()
    for path in ckpts.glob("*.ckpt"):
        path.unlink()
    caplog.clear()
    line = _error_line(capsys, ["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "8"])
    assert "saved no readable checkpoint" in line and "--run.name NEW_NAME" in line
    assert "refusing to start the run again from step 0 (what --ckpt_path last does without a checkpoint)" in line
    assert "starting a new run from step 0" not in caplog.text  # what the refusal then contradicted


def test_ckpt_path_last_behind_a_newer_step_checkpoint_continues_from_the_newest(config, tmp_path, caplog):
    """Catches a run that died between its two saves at one step (step-N.ckpt written, last.ckpt not yet: a full
    disk, a kill -9) being refused by `--ckpt_path last` for going back, with advice to run the same command."""
    main(["fit", "--config", str(config)])
    ckpts = tmp_path / "runs" / "tiny" / "checkpoints"
    # last.ckpt still at step 2, step-4.ckpt at 4: a new file, as a save makes (last.ckpt and step-4.ckpt may be one
    # read-only file, tinylm.checkpoint_share)
    (ckpts / "last.ckpt").unlink()
    shutil.copy(ckpts / "step-2.ckpt", ckpts / "last.ckpt")
    cli = lightning_main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6"])
    assert "last.ckpt is at step 2, behind it (the run stopped between two saves); continuing from the newest " \
           "readable checkpoint, step-4.ckpt (step 4)" in caplog.text
    assert cli.trainer.global_step == 6
    (ckpts / "last.ckpt").unlink()
    shutil.copy(ckpts / "step-4.ckpt", ckpts / "last.ckpt")
    for path in ckpts.glob("step-*.ckpt"):
        path.unlink()  # best.ckpt (step 6) is the newest: a validation saved it after last.ckpt
    caplog.clear()
    lightning_main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "8"])
    assert "last.ckpt is at step 4, behind it (a validation saved it since); continuing from the newest readable " \
           "checkpoint, best.ckpt (step 6)" in caplog.text


def test_extending_a_run_names_the_lr_jump(config, caplog):
    """Catches a resume with a larger trainer.max_steps silently jumping the LR back up (the default schedule's
    length is max_steps); with model.decay_steps pinned the schedule goes on as it was, without a word."""
    main(["fit", "--config", str(config)])
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "8"])
    assert "with trainer.max_steps 8: the LR schedule's length is max_steps" in caplog.text
    assert "pin model.decay_steps" in caplog.text
    caplog.clear()
    main(["fit", "--config", str(config), "--run.name", "pinned", "--model.decay_steps", "8"])
    main(["fit", "--config", str(config), "--run.name", "pinned", "--ckpt_path", "last", "--trainer.max_steps", "6"])
    assert "LR jumps" not in caplog.text


def test_warmup_longer_than_the_run_warns(config):
    """Catches --model.warmup_steps 50 on a 4-step run training silently at a fraction of model.lr."""
    with pytest.warns(UserWarning, match=r"model\.warmup_steps=50 is not below the schedule's length 4 .*never "
                                         r"reaches model\.lr"):
        main(["fit", "--config", str(config), "--model.warmup_steps", "50"])
    import warnings

    with warnings.catch_warnings(record=True) as seen:  # a smoke test of one step is not the run: no warning
        warnings.simplefilter("always")
        main(["fit", "--config", str(config), "--run.name", "dev", "--model.warmup_steps", "50",
              "--trainer.fast_dev_run", "true"])
    assert not [w for w in seen if "warmup outlasts" in str(w.message)]
    assert not list((config.parent / "runs" / "dev").glob("**/*.ckpt"))  # a smoke test saves nothing to resume


def test_a_fast_dev_runs_start_line_names_fast_dev_run_for_its_steps(config, caplog):
    """Catches the start line of `--trainer.fast_dev_run 2` saying "2 steps (trainer.max_steps)", an option the user
    never set to 2."""
    main(["fit", "--config", str(config), "--trainer.fast_dev_run", "2"])
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("global batch:"))
    assert "; 2 steps (trainer.fast_dev_run) read 64 tokens" in line, line


def test_the_run_says_how_much_of_its_corpus_it_reads(config, caplog, recwarn):
    """Catches a run whose optimizer step is larger than its whole training split (--data.batch_size 1200 on 18k
    tokens: every step reads the same text twice over) training without a word, and the start line not saying how
    many passes over the training split trainer.max_steps make (and, resumed, what is left of the run)."""
    import re

    main(["fit", "--config", str(config)])
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("global batch:"))
    m = re.search(r"32 tokens per optimizer step; 4 steps \(trainer.max_steps\) read 128 tokens: ([\d.e-]+) passes "
                  r"over the training split \(([\d,]+) tokens\)", line)
    assert m, line
    assert float(m[1]) == pytest.approx(128 / int(m[2].replace(",", "")), rel=1e-2)
    assert not [w for w in recwarn if "training split holds" in str(w.message)]
    assert "resumed at step" not in line
    caplog.clear()  # a resume says what is left of the run too
    main(["fit", "--config", str(config), "--trainer.max_steps", "10", "--ckpt_path", "last"])
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("global batch:"))
    assert line.endswith("; resumed at step 4: 6 steps left read 192 tokens"), line
    caplog.clear()  # resumed at another accumulation: the steps before read the batch they had
    main(["fit", "--config", str(config), "--trainer.max_steps", "12", "--ckpt_path", "last",
          "--trainer.accumulate_grad_batches", "2"])
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("global batch:"))
    assert "12 steps (trainer.max_steps) read 448 tokens" in line  # 10 x 32 + 2 x 64 (not 12 x 64)
    assert line.endswith("; resumed at step 10: 2 steps left read 128 tokens"), line
    with pytest.warns(UserWarning, match=r"one optimizer step reads 19,200 tokens but the training split holds "
                                         r"[\d,]+: every step goes over it 1\.\d+ times; "
                                         r"use a smaller --data.batch_size"):
        main(["fit", "--config", str(config), "--run.name", "big", "--data.batch_size", "1200", "--trainer.max_steps",
              "1", "--trainer.val_check_interval", "1"])


def test_checkpointing_off_runs_without_checkpoints(config, tmp_path):
    """Catches --trainer.enable_checkpointing false crashing with a MisconfigurationException."""
    cli = lightning_main(["fit", "--config", str(config), "--trainer.enable_checkpointing", "false"])
    assert cli.trainer.global_step == 4
    assert not (tmp_path / "runs" / "tiny" / "checkpoints").exists()


def test_a_resume_that_saves_nothing_does_not_show_the_runs_checkpoints_as_its_own(config, tmp_path, capsys):
    """Catches the end of a resume with --trainer.enable_checkpointing false listing best.ckpt and last.ckpt (the
    run's, from before it) as if this command had saved them, its best val/loss beside them."""
    main(["fit", "--config", str(config)])
    last = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    os.utime(last, (time.time() - 60, time.time() - 60))  # (saved a minute before the resume)
    capsys.readouterr()
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6",
          "--trainer.enable_checkpointing", "false"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "checkpoints:" in ln)
    assert line.endswith("(saved before this command, which saved none: checkpointing was off)"), line
    capsys.readouterr()
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "8"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "checkpoints:" in ln)
    assert line.endswith("last.ckpt"), line


def test_optimizer_and_scheduler_flags_are_refused(config, capsys):
    """Catches --optimizer/--lr_scheduler replacing AdamW while train/lr kept logging tinylm's schedule."""
    line = _error_line(capsys, ["fit", "--config", str(config), "--optimizer", "torch.optim.SGD"])
    assert "--optimizer" in line and "--model." in line


def test_train_lr_is_what_the_optimizer_uses(config, tmp_path):
    """Catches train/lr logging the schedule's value when the optimizer runs with another (here a callback halves
    it before every step, as a user's callback or scheduler could)."""
    import lightning as L

    from tinylm.train.module import TinyLM

    class Halve(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            for group in trainer.optimizers[0].param_groups:
                group["lr"] = group["lr"] / 2

    dm = lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "1"]).datamodule
    module = TinyLM(vocab_size=dm.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=32, warmup_steps=2)
    trainer = L.Trainer(max_steps=4, logger=L.pytorch.loggers.CSVLogger(tmp_path / "halved", name=""),
                        callbacks=[Halve()], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, log_every_n_steps=1)
    trainer.fit(module, datamodule=dm)
    rows = [r for r in _rows(next((tmp_path / "halved").rglob("metrics.csv"))) if r.get("train/lr")]
    assert len(rows) == 4
    for r in rows:
        step = int(r["step"])
        assert float(r["train/lr"]) == pytest.approx(module._lr_at(step) / 2, rel=1e-6), r


def test_user_errors_are_one_line_and_bugs_keep_their_traceback(config, monkeypatch):
    """Catches a programming bug being disguised as a user error (a ZeroDivisionError or a ValueError raised deep
    inside torch printed as "error: ..." with no traceback)."""
    import torch.nn.functional as F

    from tinylm.data.datamodule import TinyLMDataModule

    try:
        F.cross_entropy(torch.zeros(2, 3), torch.zeros(5, dtype=torch.long))
    except ValueError as e:
        assert not is_user_error(e)  # raised by torch: tinylm failed to validate something
    try:
        TinyLMDataModule(batch_size=0)
    except ValueError as e:
        assert is_user_error(e) and "batch_size" in one_line(e)

    def bug(self, stage=None):
        return 1 / 0

    monkeypatch.setattr(TinyLMDataModule, "setup", bug)
    with pytest.raises(ZeroDivisionError):
        main(["fit", "--config", str(config)])


def test_a_training_process_error_is_judged_as_in_one_process():
    """ddp_fork's training processes hand their errors to the command as traceback text (what torch.multiprocessing
    does with any exception in a process it started). Catches a user's error there printed as a traceback, and a
    bug there (a ValueError raised inside torch) disguised as a one-line user error."""
    import traceback

    import torch.nn.functional as F
    from torch.multiprocessing import ProcessRaisedException

    from tinylm.cli.errors import from_training_process as _from_training_process
    from tinylm.data.datamodule import TinyLMDataModule

    def from_process(make) -> ProcessRaisedException:
        try:
            make()
        except (ValueError, TypeError):
            text = "\n\n-- Process 1 terminated with the following error:\n" + traceback.format_exc()
        return ProcessRaisedException(text, 1, 4242)

    user = _from_training_process(from_process(lambda: TinyLMDataModule(batch_size=0)))
    assert (is_user_error(user) and one_line(user).startswith("ValueError: data.batch_size")
            and user.exit_code == 1), one_line(user)
    bug = from_process(lambda: F.cross_entropy(torch.zeros(2, 3), torch.zeros(5, dtype=torch.long)))
    assert _from_training_process(bug) is bug and not is_user_error(bug)


def test_lightning_info_lines_print_once(config, tmp_path):
    """Catches every Lightning INFO line printed twice (a root-logger basicConfig beside Lightning's handler), and
    Lightning's advice that does not apply to tinylm: "The number of training batches (625) is smaller than the
    logging interval" (a notional epoch of a small corpus; logging counts steps across epochs)."""

    proc = forked.run(["fit", "--config", str(config), "--trainer.max_steps", "1", "--trainer.log_every_n_steps",
                       "1000"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("GPU available") == 1
    assert "Tip:" not in proc.stderr
    # a line about TPUs, which tinylm does not train on, and the stop at max_steps that "run NAME done" says again
    assert "TPU available" not in proc.stderr and "`Trainer.fit` stopped" not in proc.stderr
    assert "smaller than the logging interval" not in proc.stderr


def test_gpu_recipe_on_cpu_says_so(monkeypatch):
    """Catches a GPU recipe (compile, a wide model, many workers) silently running at a minute per step on a CPU."""
    import yaml

    from tinylm.cli.trainer_checks import warn_gpu_recipe_on_cpu

    class Data:
        batch_size, num_workers = 64, 2

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = yaml.safe_load((Path(__file__).parents[2] / "configs" / "shakespeare-char.yaml").read_text())
    hparams = {**recipe["model"], "block_size": recipe["data"]["block_size"]}
    with pytest.warns(UserWarning, match="sized for a GPU.*compile_model.*6-layer, 384-wide.*num_workers 2"):
        warn_gpu_recipe_on_cpu({}, hparams, Data())
    laptop = yaml.safe_load((Path(__file__).parents[2] / "configs" / "shakespeare-char-cpu.yaml").read_text())
    import warnings

    modern = yaml.safe_load((Path(__file__).parents[2] / "configs" / "shakespeare-char-cpu-modern.yaml").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the laptop recipes are not warned about, compiled too (docs/modern.md)
        for model in (laptop["model"], {**modern["model"], "compile_model": True}):
            warn_gpu_recipe_on_cpu({}, {**model, "block_size": 64}, type("D", (), {"batch_size": 12,
                                                                                   "num_workers": 0})())


def test_small_bpe_vocab_warns_at_fit_time(config, recwarn):
    """Catches a BPE that ends far below --data.vocab_size going unnoticed at fit time (only `prepare` said so)."""
    lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "1", "--data.tokenizer", "bpe",
                    "--data.vocab_size", "4096"])
    assert any("far below --data.vocab_size 4,096" in str(w.message) for w in recwarn)


def test_config_file_errors_name_the_file_and_line(tmp_path, capsys):
    """Catches a YAML with a tab reported as `<unicode string>` instead of the file, and a missing config file."""
    bad = tmp_path / "tabs.yaml"
    bad.write_text("trainer:\n\tmax_steps: 3\n")
    line = _error_line(capsys, ["fit", "--config", str(bad)])
    assert "tabs.yaml" in line and "line 2" in line and "tabs" in line.lower()
    line = _error_line(capsys, ["prepare", "--config", str(tmp_path / "nope.yaml")])
    assert "nope.yaml" in line and "not found" in line


def test_trainer_option_ranges_are_one_line(config, capsys):
    """Catches accumulate_grad_batches 0 ending in a ZeroDivisionError and a negative clip value running gradient
    ascent."""
    assert "accumulate_grad_batches" in _error_line(
        capsys, ["fit", "--config", str(config), "--trainer.accumulate_grad_batches", "0"])
    assert "gradient_clip_val" in _error_line(
        capsys, ["fit", "--config", str(config), "--trainer.gradient_clip_val", "-1"])


def test_validation_inside_an_optimizer_step_is_refused(config, tmp_path, capsys):
    """Catches a validation between two micro-batches of one step: a best.ckpt saved there loses the accumulated
    gradients, so a resume from it is not the run's (nothing is trained before the refusal)."""
    line = _error_line(capsys, ["fit", "--config", str(config), "--trainer.val_check_interval", "5",
                                "--trainer.accumulate_grad_batches", "4"])
    assert "val_check_interval=5" in line and "accumulate_grad_batches=4" in line and "4 or 8" in line
    assert line.endswith("4 or 8, or 20 to validate every 5 optimizer steps (it counts micro-batches)")
    assert not (tmp_path / "runs" / "tiny").exists()
    line = _error_line(capsys, ["fit", "--config", str(config), "--trainer.val_check_interval", "1",
                                "--trainer.accumulate_grad_batches", "4"])
    assert "val_check_interval=1 (batches)" in line  # 1 == 1.0 in Python: not a fraction
    line = _error_line(capsys, ["fit", "--config", str(config), "--trainer.val_check_interval", "00:00:00:02",
                                "--trainer.accumulate_grad_batches", "4"])  # a time: validations land anywhere
    assert "(a time) under" in line and "4 (or a multiple)" in line
    for accumulate in ("1", "4"):  # a fraction of a (notional) epoch: Lightning's own error named no fix
        line = _error_line(capsys, ["fit", "--config", str(config), "--trainer.val_check_interval", "0.5",
                                    "--trainer.accumulate_grad_batches", accumulate])
        assert "val_check_interval=0.5 is a fraction of an epoch" in line and "number of batches" in line


def test_checkpoint_with_an_unknown_hyperparameter_is_refused_in_one_line(config, tmp_path, capsys):
    """Catches a checkpoint of a newer tinylm (an option this one does not have) read without that option: generate
    and export (load_model) and TinyLM.load_from_checkpoint dropped it without a word, a resume and validate with a
    warning, each computing another model than the one trained; and its refusal failing with ~90 lines of usage."""
    from tinylm.checkpoint import load_model
    from tinylm.errors import TinyLMError
    from tinylm.train.module import TinyLM

    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    last = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    ckpt["hyper_parameters"]["option_from_the_future"] = 1
    ckpt["tinylm"]["options"].append("option_from_the_future")  # (a newer tinylm lists it as a model option)
    last.unlink()  # a new file: last.ckpt may be step-2.ckpt's, read-only (tinylm.checkpoint_share)
    torch.save(ckpt, last)
    capsys.readouterr()
    for argv in (["fit", "--config", str(config), "--trainer.max_steps", "3", "--ckpt_path", "last"],
                 ["validate", "--config", str(config), "--ckpt_path", str(last)],
                 ["generate", "--ckpt_path", str(last), "--prompt", "A", "--max_new_tokens", "2"]):
        line = _error_line(capsys, argv)
        assert "option_from_the_future=1" in line and "newer tinylm" in line and "upgrade tinylm" in line, line
    with pytest.raises(TinyLMError, match="option_from_the_future"):  # export, init_from, eval, a draft model
        load_model(last)
    with pytest.raises(TinyLMError, match="option_from_the_future"):  # the Python API's (Lightning dropped it)
        TinyLM.load_from_checkpoint(last, map_location="cpu")
    ckpt["tinylm"]["options"].remove("option_from_the_future")  # a script's subclass's own argument: not tinylm's
    ckpt["hyper_parameters"]["_instantiator"] = "lightning.pytorch.cli.instantiate_module"  # Lightning's, no option
    torch.save(ckpt, tmp_path / "subclass.ckpt")
    assert load_model(tmp_path / "subclass.ckpt")[0].config.n_layer == ckpt["hyper_parameters"]["n_layer"]
    del ckpt["hyper_parameters"]["option_from_the_future"], ckpt["tinylm"]["options"]  # an older tinylm's: every
    torch.save(ckpt, tmp_path / "older.ckpt")  # option it had is one still
    assert load_model(tmp_path / "older.ckpt")[0].config.n_layer == ckpt["hyper_parameters"]["n_layer"]


def test_stop_strings_and_prompts_accept_escapes(config, tmp_path, capsys):
    """Catches `--stop "\\n\\n"` (as the README writes it) matching a literal backslash-n instead of a blank line."""
    assert unescape(r"\n\n") == "\n\n" and unescape(r"a\tb") == "a\tb" and unescape("Grüße\\n") == "Grüße\n"
    for literal in (r"C:\xyz", "abc\\", r"a\N{foo}", r"see \d and \alpha"):  # kept as typed, not crashed on or changed
        assert unescape(literal) == literal
    assert unescape(r"a\\n") == r"a\n"
    main(["fit", "--config", str(config)])
    ckpt = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    main(["generate", "--ckpt_path", str(ckpt), "--prompt", "A", "--max_new_tokens", "200", "--seed", "0",
          "--stop", r"\n", "--strategy", "sample"])
    out = capsys.readouterr().out
    assert out.endswith("\n\n") and "\n" not in out[:-2] and "\\n" not in out  # stopped at (and kept) the newline


def test_every_command_takes_config_and_print_config(tmp_path, capsys):
    """Catches commands parsed by different mechanisms (argparse here, jsonargparse there): each takes --config FILE
    and --print_config the same way."""
    opts = tmp_path / "gen.yaml"
    opts.write_text("ckpt_path: some.ckpt\nmax_new_tokens: 7\n")
    for command in ("generate", "export", "sample-report"):
        extra = ["--out", "x"] if command != "generate" else []
        with pytest.raises(SystemExit) as e:
            main([command, "--config", str(opts), *extra, "--print_config"]) if command == "generate" else \
                main([command, "--ckpt_path", "a.ckpt", *extra, "--print_config"])
        assert e.value.code == 0
        printed = capsys.readouterr().out
        assert "ckpt_path:" in printed
        if command == "generate":
            assert "max_new_tokens: 7" in printed


class FailAtTheSecondStep(L.Callback):
    """A callback whose bug ends the run as its second step starts: after the first step's row, before a checkpoint."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 1:
            raise RuntimeError("a bug in a callback")


def test_a_run_that_fails_after_logging_a_row_keeps_its_folder(config, tmp_path):
    """Catches a failed fresh run's folder taken for one that never started (removed with what it holds) once its
    metrics.csv holds a row: the steps it logged are a result, kept for the user to read."""
    with pytest.raises(RuntimeError, match="a bug in a callback"):
        main(["fit", "--config", str(config), "--trainer.callbacks+=test_run_folders.FailAtTheSecondStep",
              "--run.checkpoint_every", "10"])
    rows = _rows(tmp_path / "runs" / "tiny" / "csv" / "metrics.csv")
    assert len(rows) == 1 and rows[0]["train/loss"], rows
    assert (tmp_path / "runs" / "tiny" / "config.yaml").is_file()


def test_two_fits_in_one_folder_cannot_run_at_once(config, tmp_path, capsys):
    """Catches two concurrent `tinylm fit` in one run folder both exiting 0 with interleaved metrics and each other's
    checkpoints (the second must be refused while the first holds the folder)."""
    from tinylm.cli.run_lock import lock_run_folder, release_run_folders

    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    hold = ("import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); f.write('pid 1'); "
            "f.flush(); print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "runs" / "tiny" / ".lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        line = _error_line(capsys, ["fit", "--config", str(config)])
        assert "in use by another tinylm process" in line
    finally:
        holder.kill()
        holder.wait()
    lock_run_folder(tmp_path / "runs" / "tiny")  # free again once the other process is gone
    release_run_folders()
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    main(["fit", "--config", str(config), "--trainer.max_steps", "3", "--ckpt_path", "last"])  # same process: fine


def test_resuming_an_earlier_checkpoint_in_place_is_refused(config, tmp_path, capsys):
    """Catches `--ckpt_path runs/X/checkpoints/step-2.ckpt` on a run that went on to step 4 silently deleting the
    CSV rows after step 2 and overwriting last.ckpt; branching into a new folder works."""
    main(["fit", "--config", str(config)])
    run = tmp_path / "runs" / "tiny"
    before = (run / "csv" / "metrics.csv").read_bytes()
    line = _error_line(capsys, ["fit", "--config", str(config), "--ckpt_path", str(run / "checkpoints" / "step-2.ckpt"),
                                "--trainer.max_steps", "3"])
    assert "step 2" in line and "step 4" in line and "--run.name" in line
    assert (run / "csv" / "metrics.csv").read_bytes() == before
    cli = lightning_main(["fit", "--config", str(config), "--ckpt_path", str(run / "checkpoints" / "step-2.ckpt"),
                          "--trainer.max_steps", "3", "--run.name", "branch"])
    assert cli.trainer.global_step == 3 and (tmp_path / "runs" / "branch" / "checkpoints" / "last.ckpt").is_file()


def test_resuming_the_checkpoint_one_step_before_the_last_in_place_is_refused(config, tmp_path, capsys):
    """The same refusal one step behind: step-3.ckpt of a run at step 4 would drop step 4 as silently."""
    main(["fit", "--config", str(config), "--run.checkpoint_every", "1"])
    step3 = tmp_path / "runs" / "tiny" / "checkpoints" / "step-3.ckpt"
    line = _error_line(capsys, ["fit", "--config", str(config), "--ckpt_path", str(step3), "--run.checkpoint_every",
                                "1", "--trainer.max_steps", "5"])
    assert "is at step 3 but" in line and "has gone on to step 4" in line


def test_resuming_a_finished_run_says_there_is_nothing_to_train(config, capsys):
    """Catches `--ckpt_path last --trainer.max_steps N` below the checkpoint's step exiting 0 having trained nothing."""
    main(["fit", "--config", str(config)])
    line = _error_line(capsys, ["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "3"])
    assert "already at step 4" in line and "--trainer.max_steps" in line


def test_a_constrained_sample_cut_short_by_max_new_tokens_is_named(config, tmp_path, capsys, caplog):
    """Catches `generate --regex ...` (or --json_schema) printing a text that max_new_tokens cut before it matched
    whole (`{"name":"x` for a JSON object) as if it were a match: exit 0, not a word on stderr."""
    pytest.importorskip("llguidance")
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    ckpt = str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")
    capsys.readouterr()
    with caplog.at_level("WARNING", logger="tinylm"):
        main(["generate", "--ckpt_path", ckpt, "--prompt", "A", "--regex", "abcdefgh", "--max_new_tokens", "3",
              "--strategy", "greedy"])
    assert capsys.readouterr().out == "Aabc\n"
    assert ("the sample ended at --max_new_tokens 3 before its text matched the --regex whole (it is cut short); "
            "raise --max_new_tokens") in caplog.text
    caplog.clear()
    main(["generate", "--ckpt_path", ckpt, "--prompt", "A", "--regex", "abc", "--max_new_tokens", "3",
          "--strategy", "greedy"])
    assert "cut short" not in caplog.text  # a whole match says nothing


def test_small_user_errors_are_one_line(config, tmp_path, capsys):
    """Catches tracebacks for: an unusable --device, a file as data.cache_dir, a seed out of range, a linked option
    given by hand, a checkpoint path that is a folder, and a block_size the corpus cannot fill in `prepare`."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    ckpt = str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")
    assert "--device" in _error_line(capsys, ["generate", "--ckpt_path", ckpt, "--device", "mps"])
    assert "seed" in _error_line(capsys, ["generate", "--ckpt_path", ckpt, "--seed", str(10**25)])
    assert "cache_dir" in _error_line(capsys, ["prepare", "--config", str(config), "--data.cache_dir", str(config)])
    assert "set from --data.eos_id" in _error_line(capsys, ["fit", "--config", str(config), "--model.eos_id", "3"])
    assert "--model.vocab_size is set from --data.vocab_size" in _error_line(
        capsys, ["fit", "--config", str(config), "--model.vocab_size", "3"])  # jsonargparse's own words before
    assert "is a folder" in _error_line(capsys, ["fit", "--config", str(config), "--ckpt_path", str(tmp_path)])
    assert "block_size" in _error_line(capsys, ["prepare", "--config", str(config), "--data.block_size", "1000000"])
    with pytest.warns(UserWarning, match="--top_k does nothing with --strategy greedy"):
        main(["generate", "--ckpt_path", ckpt, "--prompt", "A", "--strategy", "greedy", "--top_k", "5",
              "--max_new_tokens", "2"])
    with pytest.warns(UserWarning, match="--num_beams does nothing with --strategy sample .*--strategy beam"):
        main(["generate", "--ckpt_path", ckpt, "--prompt", "A", "--num_beams", "8", "--max_new_tokens", "2"])
    with pytest.warns(UserWarning, match="--seed does nothing with --strategy greedy .*--strategy sample"):
        main(["generate", "--ckpt_path", ckpt, "--prompt", "A", "--strategy", "greedy", "--seed", "3",
              "--max_new_tokens", "2"])
    capsys.readouterr()
    assert "cannot run a model" in _error_line(capsys, ["generate", "--ckpt_path", ckpt, "--device", "meta"])
    assert "is a folder" in _error_line(capsys, ["generate", "--ckpt_path", str(tmp_path)])
    assert "is not a regular file" in _error_line(capsys, ["generate", "--ckpt_path", "/dev/null"])
    (tmp_path / "zero.ckpt").write_bytes(b"")  # (it said "not a torch file: a .ckpt file?")
    assert "is empty (0 bytes" in _error_line(capsys, ["generate", "--ckpt_path", str(tmp_path / "zero.ckpt")])
    for draft in ("missing.ckpt", str(tmp_path / "zero.ckpt")):  # the option that named the file, not --ckpt_path
        line = _error_line(capsys, ["generate", "--ckpt_path", ckpt, "--prompt", "A", "--strategy", "greedy",
                                    "--draft_ckpt_path", draft])
        assert "pass --draft_ckpt_path PATH" in line and " --ckpt_path PATH" not in line, line
    # contrastive decodes min(top_k, vocab) candidates: a huge --top_k is no memory problem on a 58-char vocabulary
    main(["generate", "--ckpt_path", ckpt, "--prompt", "A", "--strategy", "contrastive", "--top_k", "10000000",
          "--max_new_tokens", "2"])


def test_outputs_that_cannot_be_written_are_refused_before_the_work(config, tmp_path, capsys):
    """Catches a bad --out ending in a traceback after the work was done (sampling every strategy, the LR sweep)
    or before it with a traceback: a folder where a file is wanted, a file where a folder is, a place where nothing
    can be created, an empty path (taken for the working folder)."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    ckpt = str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")
    (tmp_path / "text.txt").write_text("not a folder")
    (tmp_path / "shots.png").mkdir()  # a folder with a PNG's name
    cases = [
        (["sample-report", "--ckpt_path", ckpt, "--out", "text.txt"], "is a file; pass a folder path"),
        (["sample-report", "--ckpt_path", ckpt, "--out", ""], "--out is empty"),  # was: "--out '.' holds files"
        (["export", "--ckpt_path", ckpt, "--out", "text.txt/sub"], "which is a file, not a folder"),
        (["plot", "runs/tiny", "--out", "runs"], "--out must name a .png file"),
        (["plot", "runs/tiny", "--out", "shots.png"], "--out 'shots.png' is a folder; pass a file path"),
        (["lr-find", "--config", str(config), "--out", "text.txt/lr.png"], "which is a file, not a folder"),
    ]
    unwritable = tmp_path / "ro"
    unwritable.mkdir()
    unwritable.chmod(0o555)
    try:
        with open(unwritable / "probe", "w"):  # root writes anywhere: then /proc, where nobody can create a file
            pass
        unwritable = Path("/proc")
    except PermissionError:
        pass
    cases += [(["export", "--ckpt_path", ckpt, "--out", str(unwritable / "x" / "y")], "nothing can be written in"),
              (["plot", "runs/tiny", "--out", str(unwritable / "x" / "p.png")], "nothing can be written in")]
    for argv, needle in cases:
        assert needle in _error_line(capsys, argv), argv
    assert not (tmp_path / "runs" / "tiny" / "lr_find.png").exists()


def test_plan_refuses_a_gpu_it_does_not_know(config, capsys):
    """Catches `--gpu XYZ-9000` (a typo) printing 'wall time unknown' and exiting 0, unnoticed in a script."""
    line = _error_line(capsys, ["plan", "--config", str(config), "--gpu", "XYZ-9000"])
    assert "--gpu 'XYZ-9000'" in line and "h100" in line


def test_interrupt_hint_repeats_the_users_command():
    """Catches the resume hint after SIGTERM dropping --run.name (following it resumed another run)."""
    from tinylm.cli.errors import resume_command

    assert resume_command(["--config", "c.yaml", "--run.name", "sig2", "--ckpt_path", "x.ckpt"]) == \
        "tinylm fit --config c.yaml --run.name sig2 --ckpt_path last"


def test_a_diverged_checkpoint_is_refused_by_generate(config, tmp_path, capsys):
    """Catches a checkpoint whose weights are NaN printing blank text (greedy) or a torch traceback (sampling)."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    path = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, weights_only=True)
    ckpt["state_dict"] = {k: v.fill_(float("nan")) if v.is_floating_point() else v
                          for k, v in ckpt["state_dict"].items()}
    torch.save(ckpt, tmp_path / "nan.ckpt")
    assert "non-finite" in _error_line(capsys, ["generate", "--ckpt_path", str(tmp_path / "nan.ckpt"), "--prompt", "A"])


def test_a_run_refused_before_writing_anything_leaves_no_folder(config, tmp_path, capsys):
    """Catches a config error (here an odd RoPE head size, found when the model is built) leaving an empty run
    folder holding only its lock file; a run that wrote something keeps its folder."""
    line = _error_line(capsys, ["fit", "--config", str(config), "--model.positions", "rope", "--model.n_head", "4",
                                "--model.n_embd", "12"])
    assert "must be even" in line
    assert not (tmp_path / "runs").exists()  # nor the runs/ folder it made
    (tmp_path / "short.txt").write_text("too short to train on")  # refused after the loggers made csv/
    line = _error_line(capsys, ["fit", "--config", str(config), "--data.corpus", str(tmp_path / "short.txt")])
    assert not (tmp_path / "runs" / "tiny").exists(), line
    main(["fit", "--config", str(config)])
    assert (tmp_path / "runs" / "tiny" / "config.yaml").is_file() and (tmp_path / "runs" / "tiny" / ".lock").exists()


def test_a_users_csv_logger_keeps_what_earlier_runs_logged(config, tmp_path):
    """Catches a user's own `--trainer.logger CSVLogger` with a fixed version losing its metrics.csv: Lightning's
    CSVLogger deletes the file its folder holds, so a resume kept only the rows after the checkpoint, and another run
    with the same logger wiped the first. Now a resume keeps the rows before the checkpoint (a fresh run moves the
    file aside, as tinylm's own CSV: the same code)."""
    mine = ["--trainer.logger", f"{{class_path: CSVLogger, init_args: {{save_dir: {tmp_path / 'mine'}, version: v0}}}}"]
    main(["fit", "--config", str(config), "--trainer.max_steps", "2", *mine])
    metrics = tmp_path / "mine" / "lightning_logs" / "v0" / "metrics.csv"
    before = [r["step"] for r in _rows(metrics) if r.get("train/loss")]
    main(["fit", "--config", str(config), "--ckpt_path", "last", *mine])
    steps = [r["step"] for r in _rows(metrics) if r.get("train/loss")]
    assert before and steps[:len(before)] == before and int(steps[-1]) > int(before[-1])
    # another run logging into the same folder, then a resume of the first: it cut the other's rows at its own step
    # and appended under them; the other's file is moved aside whole
    main(["fit", "--config", str(config), "--run.name", "other", "--trainer.max_steps", "8", *mine])
    other = _rows(metrics)
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "8", *mine])
    asides = [_rows(p) for p in metrics.parent.glob("metrics.*.csv")]  # the first's (moved by the other's start)
    assert len(asides) == 2 and other in asides and int(_rows(metrics)[-1]["step"]) == 7  # and the other's, whole


@pytest.mark.parametrize(("node", "first"), [("1", False), ("0", True), ("", True)])
def test_a_node_started_by_hand_past_the_first_is_no_rank_zero(monkeypatch, node, first):
    """Catches node 1 of a run started by hand (MASTER_ADDR, MASTER_PORT, NODE_RANK=1; docs/distributed.md) counted
    as rank 0 before its Trainer set its rank (Lightning reads RANK, LOCAL_RANK, ... and not NODE_RANK): it took the
    run folder's lock, node 0's run was refused as "in use by another tinylm process", and node 1 waited 30 minutes
    for its peer."""
    from tinylm.cli import ranks

    for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NODE_RANK", node)
    assert ranks.rank_zero() == first


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
@pytest.mark.parametrize("folder", ["checkpoints", "csv"])
def test_a_read_only_folder_of_the_run_is_refused_before_training(config, tmp_path, capsys, folder):
    """Catches a resume into a run whose checkpoints/ cannot be written found at its first save (every step before
    it lost: 500 by default), and a read-only wandb/ ending in wandb's traceback."""
    from helpers import _one_line_error

    main(["fit", "--config", str(config)])
    where = tmp_path / "runs" / "tiny" / folder
    where.chmod(0o555)
    try:
        _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.max_steps", "6", "--ckpt_path", "last"],
                        f"permission denied: runs/tiny/{folder}")  # (the path as the run's config has it)
    finally:
        where.chmod(0o755)


def test_a_fresh_run_is_not_started_from_a_checkpoint_an_on_exception_callback_left(config, tmp_path, capsys):
    """Catches Lightning's rule for a run with an OnExceptionCheckpoint and no ckpt_path: it resumes from the newest
    of that callback's file and a ModelCheckpoint's last*.ckpt. A fresh run became, silently, a resume of another
    run's failed one (and deleted its file when done), or of a last.ckpt in a user's ModelCheckpoint folder."""
    keep = ["--trainer.callbacks+", "OnExceptionCheckpoint", "--trainer.callbacks.dirpath", "saved"]
    main(["fit", "--config", str(config), *keep])  # a fresh run with the callback: no Lightning warning about "last"
    said = capsys.readouterr()
    assert "ckpt_path" not in said.err and not (tmp_path / "saved" / "on_exception.ckpt").exists(), said.err[-2000:]
    failed = tmp_path / "saved" / "on_exception.ckpt"  # what a failed run left
    failed.parent.mkdir(exist_ok=True)
    shutil.copy(tmp_path / "runs" / "tiny" / "checkpoints" / "step-2.ckpt", failed)
    line = _error_line(capsys, ["fit", "--config", str(config), "--run.name", "other", *keep])
    assert "saved/on_exception.ckpt" in line and "--ckpt_path saved/on_exception.ckpt" in line, line
    assert failed.is_file() and not (tmp_path / "runs" / "other" / "checkpoints").exists()
    # an FSDP2 run's is a folder of shards: the same
    failed.rename(tmp_path / "file.ckpt")
    failed.mkdir()
    (failed / "meta.pt").touch()
    _error_line(capsys, ["fit", "--config", str(config), "--run.name", "other", *keep])
    shutil.rmtree(failed)
    shutil.copy(tmp_path / "file.ckpt", failed)
    # the failed run itself goes on from its last.ckpt (refused: a loop of two refusals), told its file goes
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6", *keep])
    assert "on_exception.ckpt, the checkpoint a run saved as it failed (OnExceptionCheckpoint), is deleted by " \
           "Lightning when this run ends" in capsys.readouterr().err

    topk = ["--trainer.callbacks+", "ModelCheckpoint", "--trainer.callbacks.dirpath", "topk"]
    (tmp_path / "topk").mkdir()
    assert not failed.exists()  # (deleted by Lightning as the resume ended, as said)
    shutil.copy(tmp_path / "file.ckpt", tmp_path / "topk" / "last.ckpt")
    line = _error_line(capsys, ["fit", "--config", str(config), "--run.name", "third", *keep[:2], "--trainer"
                                ".callbacks.dirpath", "saved2", *topk])
    assert f"--trainer.callbacks.dirpath {tmp_path / 'topk'} holds last.ckpt" in line, line


def test_a_resume_stopped_by_max_time_does_not_blame_the_early_stop_of_the_command_before(config, caplog):
    """Catches the stop line of a resume stopped by --trainer.max_time naming EarlyStopping with the reason it gave
    in the command before (Lightning restores the callback's stopping_reason_message from the checkpoint)."""
    early = ["--trainer.callbacks+", "EarlyStopping", "--trainer.callbacks.monitor", "val/loss",
             "--trainer.callbacks.min_delta", "10", "--trainer.callbacks.patience", "1", "--model.decay_steps", "20"]
    main(["fit", "--config", str(config), "--trainer.max_steps", "20", *early])
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--config", str(config), "--trainer.max_steps", "20", *early[:5], "0", *early[6:], "--ckpt_path",
              "last", "--trainer.max_time", "{microseconds: 1}"])  # (min_delta 0: it stops no more)
    *_, line = (r.getMessage() for r in caplog.records if "the run stopped at step" in r.getMessage())
    assert "(--trainer.max_time: 1e-06 s)" in line, line


def test_a_resume_with_a_larger_early_stopping_patience_goes_on(config, caplog):
    """Catches the patience a resume gives EarlyStopping replaced by its checkpoint's (Lightning restores it): a run
    it stopped, resumed with a larger patience to go on, stopped again at its next validation without improvement,
    its config.resume-step<N>.yaml saying the new patience. Its count without improvement goes on (1, then 2, 3)."""
    early = ["--trainer.callbacks+", "EarlyStopping", "--trainer.callbacks.monitor", "val/loss",
             "--trainer.callbacks.min_delta", "10", "--trainer.callbacks.patience", "1", "--model.decay_steps", "20"]
    main(["fit", "--config", str(config), "--trainer.max_steps", "20", *early])  # stopped at step 4 (validations: 2,
    with caplog.at_level("INFO", logger="tinylm"):  # 4, 6, 8: none improves by 10)
        main(["fit", "--config", str(config), "--trainer.max_steps", "20", *early[:7], "3", *early[8:], "--ckpt_path",
              "last"])
    assert "EarlyStopping(monitor=val/loss): patience 3 as given (the checkpoint's: 1), counting on from its 1 " \
           "validation(s) without improvement" in caplog.text, caplog.text
    *_, line = (r.getMessage() for r in caplog.records if "the run stopped at step" in r.getMessage())
    assert line.startswith("the run stopped at step 8 of trainer.max_steps 20 (EarlyStopping"), line


def test_the_branch_a_refusal_advises_runs(config, tmp_path, capsys):
    """Catches the refusal of `--ckpt_path best` behind the run's newest step advising "--run.name NEW_NAME (same
    --ckpt_path)": `best` then named the new folder's best.ckpt, which does not exist. It names the file."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "6", "--run.checkpoint_every", "2"])
    ckpts = tmp_path / "runs" / "tiny" / "checkpoints"
    (ckpts / "best.ckpt").unlink()
    shutil.copy(ckpts / "step-4.ckpt", ckpts / "best.ckpt")  # an overfitting run: its best is behind its last
    line = _error_line(capsys, ["fit", "--config", str(config), "--ckpt_path", "best", "--trainer.max_steps", "8"])
    advice = re.search(r"--run\.name NEW_NAME (--ckpt_path \S+),", line)
    assert advice and advice[1] == "--ckpt_path runs/tiny/checkpoints/best.ckpt", line
    main(["fit", "--config", str(config), "--trainer.max_steps", "8", "--run.name", "branch", *advice[1].split()])
    assert (tmp_path / "runs" / "branch" / "checkpoints" / "last.ckpt").is_file()


def test_a_new_run_refused_after_its_data_leaves_no_folder(config, tmp_path, capsys):
    """Catches a fresh run refused only once its tokenizer exists (a prompt it cannot encode) leaving runs/NAME with
    its config.yaml, CSV and W&B start behind, as if it had run; a resume refused the same way keeps its folder."""
    _error_line(capsys, ["fit", "--config", str(config), "--run.name", "new", "--samples.every_n_steps", "2",
                         "--samples.prompts+", "€uro"])
    assert not (tmp_path / "runs" / "new").exists()
    main(["fit", "--config", str(config)])
    kept = sorted(p.relative_to(tmp_path) for p in (tmp_path / "runs" / "tiny").rglob("*"))
    _error_line(capsys, ["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "6",
                         "--samples.every_n_steps", "2", "--samples.prompts+", "€uro"])
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "runs" / "tiny").rglob("*")) == kept
    # a folder that was there before (a user's, holding the config they wrote) is never removed with its files
    own = tmp_path / "runs" / "mine"
    own.mkdir()
    (own / "config.yaml").write_text(config.read_text())
    _error_line(capsys, ["fit", "--config", str(own / "config.yaml"), "--run.name", "mine", "--samples.every_n_steps",
                         "2", "--samples.prompts+", "€uro"])
    assert (own / "config.yaml").is_file() or (own / "config.previous.yaml").is_file()


def test_fp16_weights_are_warned_of(run_config):
    """Catches `--trainer.precision 16-true` training silently into a divergence (fp16 AdamW states underflow; the
    health monitor then names the LR, clipping or data): fit says so in one warning; 16-mixed is not warned of."""
    import warnings

    cfg = run_config(trainer={"max_steps": 1, "precision": "16-true"})
    with pytest.warns(UserWarning, match="16-true keeps the weights and the AdamW/Muon states in fp16.*use 16-mixed"):
        main(["fit", "--config", str(cfg)])
    from tinylm.cli.trainer_checks import warn_fp16_weights

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_fp16_weights({"precision": "16-mixed"})
        warn_fp16_weights({"precision": "bf16-mixed"})


def test_bf16_weights_are_warned_of(run_config, tmp_path):
    """Catches `--trainer.precision bf16-true` training with updates rounded away, silently (bf16 weights: 8
    significant bits): at lr 1e-3 every norm gain ended exactly 1.0; fit says so in one warning naming bf16-mixed."""
    import torch

    cfg = run_config(trainer={"max_steps": 4, "precision": "bf16-true"}, model={"lr": 1e-3, "warmup_steps": 1})
    with pytest.warns(UserWarning, match="bf16-true keeps the weights in bf16, where an update .* use bf16-mixed"):
        main(["fit", "--config", str(cfg)])
    state = torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    gains = [t for k, t in state.items() if ".ln_" in k and k.endswith("weight")]  # what the warning is about
    assert gains and all(t.dtype == torch.bfloat16 and bool((t == 1).all()) for t in gains)


def test_windows_is_refused_in_one_line(monkeypatch, capsys):
    """Native Windows has no SIGHUP, SIGALRM or fcntl, which every command uses: one line pointing to WSL, not an
    AttributeError's traceback from tinylm.cli.signals."""
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setitem(sys.modules, "fcntl", None)  # (no such module there)
    assert "run it under WSL" in _error_line(capsys, ["generate", "--ckpt_path", "x.ckpt"])
    assert "run it under WSL" in _error_line(capsys, ["fit", "--config", "configs/shakespeare-char-cpu.yaml"])


def test_gpu_recipe_on_a_mac_gpu_is_not_said_to_run_on_the_cpu(monkeypatch):
    """accelerator auto on an Apple-silicon Mac trains on MPS (Lightning's pick): no "very slow on this CPU"."""
    import warnings

    import yaml

    from tinylm.cli.trainer_checks import warn_gpu_recipe_on_cpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    recipe = yaml.safe_load((Path(__file__).parents[2] / "configs" / "shakespeare-char.yaml").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_gpu_recipe_on_cpu({}, {**recipe["model"], "block_size": recipe["data"]["block_size"]},
                               type("D", (), {"batch_size": 64, "num_workers": 0})())


@pytest.mark.slow
def test_nodes_that_find_different_checkpoints_are_refused_not_left_waiting(config, tmp_path):
    """Catches a run on two nodes started by hand, each with a run folder of its own (runs/ on a local disk; docs/
    distributed.md asks for one they share), resumed with --ckpt_path last: node 0 found its checkpoint and resumed,
    node 1 found none and started a new run, their first collectives differed, and both waited for each other for
    good (torch's 30 minutes), without a word and deaf to SIGTERM. Each node now ends in one line naming the steps."""
    import contextlib
    import socket

    from tinylm.cli.run_lock import release_run_folders

    main(["fit", "--config", str(config)])  # node 0's folder holds the run, at step 4; node 1's holds nothing
    release_run_folders()  # (this process's lock on it: node 0 is another process)
    (node1 := tmp_path / "node1").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["fit", "--config", str(config), "--trainer.max_steps", "6", "--ckpt_path", "last", "--data.batch_size",
            "1", "--trainer.accelerator", "cpu", "--trainer.strategy", "ddp", "--trainer.num_nodes", "2",
            "--trainer.devices", "1"]  # (batch 1 x 2 ranks: the run's global batch)
    env = [{**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(n),
            "OMP_NUM_THREADS": "1"} for n in (0, 1)]
    # node 0 forked from the test worker's warm server (tests/forked.py: one interpreter's imports fewer), node 1 a
    # fresh `python -m tinylm` (the server serves one child at a time)
    nodes = [forked.popen(args, cwd=tmp_path, env=env[0], stderr=forked.PIPE, start_new_session=True),
             subprocess.Popen([sys.executable, "-m", "tinylm", *args], cwd=node1, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, env=env[1])]
    try:
        errs = [p.communicate(timeout=180)[1] for p in nodes]
    except subprocess.TimeoutExpired:
        for p in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
        nodes[0].end()
        pytest.fail("the nodes waited for each other: " + nodes[1].communicate()[1][-1500:])
    for n, (p, err) in enumerate(zip(nodes, errs)):
        said = [line for line in err.splitlines() if ": error:" in line]
        found = "step 4 in runs/tiny" if n == 0 else "no checkpoint in runs/tiny"
        want = (f"tinylm fit: error: {'(rank 1) ' if n else ''}the nodes start from different checkpoints (rank 0: "
                f"step 4; rank 1: none, a new run; this node found {found}): each node reads the run folder")
        assert p.returncode == 1 and len(said) == 1 and said[0].startswith(want), err[-3000:]
        assert "copy runs/tiny to every node" in said[0] and "Traceback" not in err, err[-3000:]
    assert not (node1 / "runs").exists()  # node 1 wrote no run of its own


def test_a_run_folder_with_logged_rows_holds_a_run_and_its_metrics_file_is_closed(tmp_path):
    """Catches holds_run reading the whole metrics.csv through a file it never closed (a ResourceWarning each fit)."""
    import gc
    import warnings

    from tinylm.cli.run_folder import holds_run

    (tmp_path / "csv").mkdir()
    metrics = tmp_path / "csv" / "metrics.csv"
    held = {}
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for text in ("", "epoch,step,train/loss\n", "epoch,step,train/loss\n0,1,4.0", "epoch,step\n0,1\n0,2\n"):
            metrics.write_text(text)
            held[text] = holds_run(tmp_path)
        gc.collect()
    assert list(held.values()) == [False, False, True, True]
    # (the collection may close other tests' leaked files too: this file's are the ones asked about)
    assert not [w for w in caught if issubclass(w.category, ResourceWarning) and str(metrics) in str(w.message)]
