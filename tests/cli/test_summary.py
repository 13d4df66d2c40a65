"""What a command says when it is done: a run's summary with its files and the next commands, ready to paste."""

import re
import shlex
from pathlib import Path

from tinylm.cli import main
from tinylm.cli.summary import example_prompt, fit_summary, next_commands, validate_next


def _summary(out: str) -> tuple[str, list[str]]:
    """The summary's lines from 'run NAME done' on, and its `next:` commands."""
    text = out[out.index("run tiny done"):]
    commands = [line.strip() for line in text.split("next:\n", 1)[1].splitlines() if line.startswith("  tinylm ")]
    return text, commands


def test_fit_ends_with_a_summary_whose_paths_exist_and_commands_run(run_config, capsys):
    """Catches a run ending on Lightning's "`Trainer.fit` stopped" with nothing about what it made: steps, tokens,
    time, final and best val/loss and val/bpb, where best.ckpt and the metrics are, and the next commands with this
    run's paths. Each printed path exists and each printed command runs as printed."""
    config = run_config(trainer={"max_steps": 4, "val_check_interval": 2})
    main(["fit", "--config", str(config)])
    text, commands = _summary(capsys.readouterr().out)
    assert re.match(r"run tiny done: step 4: 4 steps, 128 tokens in [\d.]+s\n", text), text
    best = re.search(r"val/loss +final (\d\.\d{4}) +best (\d\.\d{4}) \(step (\d)\)", text)
    assert best and float(best[2]) <= float(best[1]) and best[3] in "24", text
    assert re.search(r"val/bpb +final \d\.\d{4} +best \d\.\d{4}", text), text
    for path in ("runs/tiny/checkpoints/best.ckpt", "runs/tiny/checkpoints/last.ckpt", "runs/tiny/csv/metrics.csv"):
        assert path in text and Path(path).is_file(), path
    assert [c.split()[1] for c in commands] == ["generate", "validate", "plot", "export"]
    for command in commands:
        args = shlex.split(command)[1:]
        main(args + (["--max_new_tokens", "4"] if args[0] == "generate" else []))
    assert Path("runs/tiny/hf/config.json").is_file() and Path("runs/tiny/validate/metrics.csv").is_file()
    out = capsys.readouterr().out
    assert "next:\n  tinylm generate --ckpt_path runs/tiny/checkpoints/best.ckpt" in out  # validate's own


def test_a_run_without_metrics_is_not_offered_a_plot(tmp_path):
    """Catches `tinylm fit --trainer.logger false` ending with `next: tinylm plot runs/NAME`, which fails when pasted
    (no csv/metrics.csv to plot)."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").touch()
    text = fit_summary(tmp_path, steps=2, first_step=0, tokens_per_step=None, seconds=1.0)
    assert "tinylm export" in text and "tinylm plot" not in text, text
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("epoch,step,train/loss\n0,1,3.0\n")
    assert "tinylm plot" in fit_summary(tmp_path, steps=2, first_step=0, tokens_per_step=None, seconds=1.0)


def test_a_last_validation_before_the_runs_end_is_not_called_final(tmp_path):
    """Catches a run whose validation schedule missed its end (check_val_every_n_epoch: the last validation at step
    20 of 30) summed up as "val/loss final ...", a value 10 steps stale."""
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("epoch,step,train/loss,val/loss,val/bpb\n0,9,,3.5,5.0\n"
                                                  "1,19,,3.25,4.75\n2,29,3.0,,\n")
    text = fit_summary(tmp_path, steps=30, first_step=0, tokens_per_step=None, seconds=1.0)
    assert "val/loss last (step 20) 3.2500   best 3.2500 (step 20)" in text, text
    assert "final" not in fit_summary(tmp_path, steps=30, first_step=0, tokens_per_step=None, seconds=1.0)
    assert "val/loss final 3.2500" in fit_summary(tmp_path, steps=20, first_step=0, tokens_per_step=None, seconds=1)


def test_checkpoints_are_called_older_by_the_setting_not_by_the_clock(tmp_path):
    """Catches the end of a run that saved its checkpoints saying "(saved before this command, which saved none:
    checkpointing was off)" when last.ckpt's mtime lay before the wall clock's start of the command (a file server's
    clock 10 minutes behind this machine's, or the clock stepped forward since the save), and a resume with
    checkpointing off not saying it of a last.ckpt saved within a second of its start."""
    import os
    import time

    (tmp_path / "checkpoints").mkdir()
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.touch()
    os.utime(last, (time.time() - 600, time.time() - 600))  # (as a file server 10 minutes behind stamps it)
    text = fit_summary(tmp_path, steps=4, first_step=0, tokens_per_step=None, seconds=1.0)
    assert "saved before this command" not in text, text
    last.touch()  # (just saved, by the run before)
    text = fit_summary(tmp_path, steps=8, first_step=4, tokens_per_step=None, seconds=1.0, checkpointing=False)
    assert "(saved before this command, which saved none: checkpointing was off)" in text, text


def test_a_run_without_a_logger_still_says_its_validation(run_config, capsys):
    """Catches `--trainer.logger false` ending without the val/loss and val/bpb lines (read from metrics.csv, which
    such a run does not write): the trainer's final numbers, and best.ckpt's val/loss."""
    config = run_config(trainer={"max_steps": 4, "val_check_interval": 2})
    main(["fit", "--config", str(config), "--trainer.logger", "false"])
    text, _ = _summary(capsys.readouterr().out)
    lines = r"\n  val/loss final \d\.\d{4}   best \d\.\d{4} \(best\.ckpt\)\n  val/bpb  final \d\.\d{4}\n"
    assert re.search(lines, text), text


def test_a_sharded_checkpoint_folder_is_named_with_its_next_commands(tmp_path):
    """Catches an FSDP2 run (its best.ckpt and last.ckpt: folders of shards) ending with no `checkpoints:` line and
    no `next:` commands, though generate, validate and export read those folders."""
    for name in ("best.ckpt", "last.ckpt"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / "meta.pt").touch()
    text = fit_summary(tmp_path, steps=2, first_step=0, tokens_per_step=None, seconds=1.0)
    assert "checkpoints: " in text and "best.ckpt" in text.split("checkpoints: ")[1].splitlines()[0], text
    assert "next:" in text and "tinylm generate --ckpt_path" in text and "best.ckpt" in text.split("next:")[1], text


def test_a_model_transformers_cannot_hold_is_not_offered_an_export(run_config, capsys):
    """Catches the modern recipe (qk_norm, logit_softcap, relu2) ending with `next: tinylm export ...`, which fails
    when pasted: the export is offered where transformers has the model's options."""
    from types import SimpleNamespace

    from tinylm.cli.summary import exportable
    from tinylm.model import GPTConfig

    config = run_config(trainer={"max_steps": 2}, model={"positions": "rope", "norm": "rmsnorm", "qk_norm": True})
    main(["fit", "--config", str(config)])
    text, commands = _summary(capsys.readouterr().out)
    assert [c.split()[1] for c in commands] == ["generate", "validate", "plot"], text
    assert exportable(SimpleNamespace(model=SimpleNamespace(config=GPTConfig(vocab_size=8, block_size=8, n_layer=1,
                                                                             n_head=1, n_embd=8))))


def test_the_next_generate_prompt_is_one_the_runs_tokenizer_encodes():
    """Catches `next: tinylm generate ... --prompt 'ROMEO:'` failing when pasted after a char-level run on a corpus
    without those letters ("character 'R' is not in the char tokenizer's vocabulary")."""
    from tinylm.tokenize.tokenizer import build_tokenizer

    assert example_prompt(build_tokenizer("char", documents=lambda: ["ROMEO: hi"])) == "ROMEO:"
    assert example_prompt(build_tokenizer("char", documents=lambda: ["the cat\nsat"])) == ""  # a newline starts it
    assert example_prompt(build_tokenizer("char", documents=lambda: ["the\tcat"])) == "\\t"  # its first character
    assert next_commands(Path("best.ckpt"), Path("."), "\\t")[0].endswith("--prompt '\\t'")


def test_the_next_generate_prompt_of_a_corpus_in_another_script_is_read_back_by_generate():
    """Catches the prompt of a char-level run on a corpus of CJK text in one line (no 'ROMEO:', no newline) written
    as Python's escape (--prompt '\\u3053'), which generate reads as six characters: the pasted command failed on
    the backslash. Generate's reading of the prompt gives back the vocabulary's first character, a backslash too."""
    from tinylm.cli.prompts import unescape
    from tinylm.tokenize.tokenizer import build_tokenizer

    for text in ("日本語のテキストです", "\\alpha\\beta"):
        tokenizer = build_tokenizer("char", documents=lambda text=text: [text])
        prompt = example_prompt(tokenizer)
        assert unescape(prompt) == tokenizer.decode([0]) and tokenizer.encode(unescape(prompt)), prompt


def test_validates_next_commands_are_kept_for_a_path_naming_validate():
    """Catches `tinylm validate --ckpt_path 'runs/to validate later/checkpoints/best.ckpt'` ending on an empty
    "next:": the validate command was left out by " validate " anywhere in a line, and the path has it in each."""
    text = validate_next(Path("runs/to validate later/checkpoints/best.ckpt"))
    assert [c.split()[1] for c in text.splitlines()[1:]] == ["generate", "export"], text


def test_a_resumed_run_counts_its_own_steps(run_config, capsys):
    """Catches the summary of a resume counting the steps (and tokens) of the run before it."""
    config = run_config(trainer={"max_steps": 2, "val_check_interval": 2})
    main(["fit", "--config", str(config)])
    capsys.readouterr()
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "3"])
    text, _ = _summary(capsys.readouterr().out)
    assert text.startswith("run tiny done: step 3: 1 step (from step 2), 32 tokens in "), text


def test_the_model_summary_gives_tinylms_flops_per_token(run_config, caplog):
    """Catches the model summary's "Total FLOPs: 0" (Lightning counts a forward over an example_input_array tinylm
    does not have): it gives the training FLOPs per token that MFU and `plan` use."""
    from lightning.pytorch.utilities.model_summary import get_human_readable_count

    from tinylm.cli.fit import lightning_main

    config = run_config(trainer={"enable_model_summary": True})
    with caplog.at_level("INFO"):
        cli = lightning_main(["fit", "--config", str(config)])
    text = "\n".join(r.getMessage() for r in caplog.records)
    per_token = get_human_readable_count(int(cli.model.model.flops_per_token()))
    assert f"{per_token} training FLOPs per token" in text and "FLOPs:" not in text and "| FLOPs" not in text


def test_a_ddp_fork_run_says_the_steps_its_training_processes_took(tmp_path, run_config):
    """Catches the summary of a ddp_fork run saying "run tiny done: step 0: 0 steps, 0 tokens" and "val/loss last
    (step 4)": the launching process's trainer trains nothing, and its training processes hand back their metrics,
    not their loops."""
    import forked  # `python -m tinylm` forked from a process that imported tinylm, torch and Lightning once

    config = run_config(trainer={"max_steps": 4})
    done = forked.run(["fit", "--config", str(config), "--trainer.accelerator", "cpu", "--trainer.devices", "2",
                       "--trainer.strategy", "ddp_fork"], cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "run tiny done: step 4: 4 steps, 256 tokens in " in done.stdout, done.stdout[-2000:]
    assert re.search(r"val/loss +final \d\.\d{4}", done.stdout), done.stdout[-2000:]


def test_a_wandb_run_that_could_not_end_is_not_offered_to_wandb_sync(tmp_path, monkeypatch):
    """Catches the summary of a run whose W&B run could not be ended (its run folder on a full disk: the .wandb file
    cut short) offering `wandb sync` of it as of any offline run."""
    import sys
    from types import SimpleNamespace

    from tinylm.train import loggers

    (tmp_path / "wandb" / "offline-run-20261130_101010-abc123").mkdir(parents=True)

    def full(exit_code):
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(run=SimpleNamespace(offline=False), finish=full))
    loggers.finish_wandb(exit_code=0)
    said = fit_summary(tmp_path, steps=2, first_step=0, tokens_per_step=8, seconds=1.0, wandb=(tmp_path, "abc123"))
    assert "offline, not ended (OSError: [Errno 28] No space left on device)" in said and "wandb sync" not in said
    loggers.WANDB_UNFINISHED.clear()
    said = fit_summary(tmp_path, steps=2, first_step=0, tokens_per_step=8, seconds=1.0, wandb=(tmp_path, "abc123"))
    assert "offline; upload with `wandb sync" in said
