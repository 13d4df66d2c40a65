"""Options that do nothing in the mode a run chose (tinylm.cli.unused): one warning line each, from one table."""

import logging

import pytest

from tinylm.cli.fit import TinyLMCLI, lightning_main
from tinylm.cli.unused import UNUSED_UNLESS


class _Parsed(Exception):
    pass


class _ParseOnly(TinyLMCLI):
    """`tinylm fit` up to the point where it builds the model: the config parsed, the checks after parsing done."""

    def before_instantiate_classes(self) -> None:
        raise _Parsed(self)


def _warnings(run_config, caplog, *args: str) -> list[str]:
    caplog.set_level(logging.WARNING, logger="tinylm")
    with pytest.raises(_Parsed) as parsed:
        lightning_main(["fit", "--config", str(run_config()), *args], cli_class=_ParseOnly)
    cli = parsed.value.args[0]
    for key, needs in UNUSED_UNLESS.items():  # the table names real options: a renamed one would never warn
        for name in (key, needs.control):
            section, _, option = name.partition(".")
            assert option in cli.config["fit"][section], name
    return [r.getMessage() for r in caplog.records if "does nothing" in r.getMessage()]


def test_options_of_another_mode_warn_one_line_each(run_config, caplog):
    """Catches options that a run silently ignores: a Muon LR with AdamW, min_lr/decay_steps with the constant
    schedule, a guard threshold with the guard off, max_documents without streaming, a sampling option with
    sampling off (each trained exactly as without it, without a word)."""
    lines = _warnings(run_config, caplog, "--model.muon_lr", "0.05", "--model.lr_schedule", "constant",
                      "--model.min_lr", "1e-5", "--model.decay_steps", "50", "--guard.enabled", "false",
                      "--guard.loss_z", "3", "--data.max_documents", "10", "--samples.temperature", "0.5")
    assert [line.split("=")[0] for line in lines] == ["model.muon_lr", "model.min_lr", "model.decay_steps",
                                                      "data.max_documents", "guard.loss_z", "samples.temperature"]
    assert lines[0] == ("model.muon_lr=0.05 does nothing with model.optimizer='adamw': it is used only with "
                        "--model.optimizer muon; drop it, or turn that on")


def test_options_of_the_mode_chosen_do_not_warn(run_config, caplog):
    """The same options where they act: no warning (guards the test above against warning always)."""
    assert _warnings(run_config, caplog, "--model.optimizer", "muon", "--model.muon_lr", "0.05",
                     "--model.lr_schedule", "wsd", "--model.decay_fraction", "0.3", "--model.min_lr", "1e-5",
                     "--guard.loss_z", "3") == []


def test_prepare_warns_of_data_options_it_ignores(tmp_path, caplog, capsys):
    """Catches `tinylm prepare --data.vocab_size 100` with the char tokenizer (the default) building a 26-id
    vocabulary without a word: prepare reads the data options of fit's table too, and only those."""
    from tinylm.cli import main

    caplog.set_level(logging.WARNING, logger="tinylm")
    (tmp_path / "c.txt").write_text("the quick brown fox jumps over the lazy dog " * 20)
    common = ["prepare", "--data.corpus", str(tmp_path / "c.txt"), "--data.block_size", "8",
              "--data.cache_dir", str(tmp_path / "cache")]
    main([*common, "--data.vocab_size", "100"])
    hint = UNUSED_UNLESS["data.vocab_size"].hint
    assert [r.getMessage() for r in caplog.records if "does nothing" in r.getMessage()] == [
        f"data.vocab_size=100 does nothing with data.tokenizer='char': it is used only with {hint}; drop it, or turn "
        "that on"]
    caplog.clear()
    main([*common, "--data.tokenizer", "scratch-bpe", "--data.vocab_size", "260"])  # used: no word
    assert not [r for r in caplog.records if "does nothing" in r.getMessage()]
    # a dataset's options on a text file (no splits, no columns: each was ignored without a word); on a .jsonl, used
    main([*common, "--data.text_column", "body", "--data.val_split", "dev"])
    said = [r.getMessage().split("=")[0] for r in caplog.records if "does nothing" in r.getMessage()]
    assert said == ["data.val_split", "data.text_column"]
    caplog.clear()
    (tmp_path / "c.jsonl").write_text('{"body": "the quick brown fox jumps over the lazy dog"}\n' * 20)
    main([*common[:2], str(tmp_path / "c.jsonl"), *common[3:], "--data.text_column", "body"])
    assert not [r for r in caplog.records if "does nothing" in r.getMessage()]


def test_mixture_and_minhash_options_without_their_mode_warn(run_config, caplog):
    """Catches `--data.weights [3]` with one corpus and `--data.clean.near_threshold 0.9` without near-duplicate
    removal or decontamination (both accepted, doing nothing, without a word); and their use is not warned of."""
    lines = _warnings(run_config, caplog, "--data.weights", "[3]", "--data.clean.near_threshold", "0.9",
                      "--data.clean.num_perm", "64")
    assert [line.split("=")[0] for line in lines] == ["data.weights", "data.clean.near_threshold",
                                                      "data.clean.num_perm"], lines
    assert lines[1] == ("data.clean.near_threshold=0.9 does nothing with data.clean.near=False: it is used only with "
                        "--data.clean.near true or --data.clean.decontaminate true; drop it, or turn that on")
    caplog.clear()
    assert _warnings(run_config, caplog, "--data.clean.decontaminate", "true", "--data.clean.near_threshold",
                     "0.9") == []


def test_a_mode_turned_off_on_the_command_line_leaves_the_configs_settings_idle_without_a_word(run_config, caplog):
    """Catches `--samples.every_n_steps 0` (the documented way to turn samples off) under a recipe that sets
    samples.prompts telling the user to drop options they never typed (and `tinylm scaling`, which turns samples
    off for its rungs, saying so at every rung); an option typed beside it is still named."""
    config = run_config(samples={"every_n_steps": 5, "prompts": ["ROMEO:"], "max_new_tokens": 20})
    caplog.set_level(logging.WARNING, logger="tinylm")

    def said(*args: str) -> list[str]:
        caplog.clear()
        with pytest.raises(_Parsed):
            lightning_main(["fit", "--config", str(config), *args], cli_class=_ParseOnly)
        return [r.getMessage().split("=")[0] for r in caplog.records if "does nothing" in r.getMessage()]

    assert said("--samples.every_n_steps", "0") == []
    assert said("--samples", "{every_n_steps: 0}") == []  # (a section typed whole: its keys are typed too)
    assert said("--samples.every_n_steps", "0", "--samples.top_k", "5") == ["samples.top_k"]


def test_validate_names_the_training_flags_it_ignores(run_config, caplog, capsys):
    """Catches `tinylm validate --trainer.max_steps 5 --trainer.gradient_clip_val 1` (training options) accepted
    without a word; the same options from the config file (fit's and validate's alike) are not named."""
    from tinylm.cli import main

    config = run_config(trainer={"max_steps": 2, "gradient_clip_val": 1.0})
    main(["fit", "--config", str(config)])
    caplog.set_level(logging.WARNING, logger="tinylm")
    caplog.clear()
    main(["validate", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "5",
          "--trainer.accumulate_grad_batches", "2"])
    said = [r.getMessage() for r in caplog.records if "does nothing in tinylm validate" in r.getMessage()]
    assert said == ["--trainer.accumulate_grad_batches does nothing in tinylm validate (it sets training); drop it",
                    "--trainer.max_steps does nothing in tinylm validate (it sets training); drop it"]


def test_a_resume_names_only_the_options_typed_on_its_command_line(run_config, caplog):
    """Catches a run started with `--samples.every_n_steps 0` under a recipe that sets samples.prompts (no warning)
    warning at every resume that the prompts do nothing: the resume reads the run's config.yaml, which holds both,
    and the user cannot drop them there."""
    from tinylm.cli import main

    config = run_config(samples={"every_n_steps": 5, "prompts": ["ROMEO:"], "max_new_tokens": 20})
    caplog.set_level(logging.WARNING, logger="tinylm")
    main(["fit", "--config", str(config), "--samples.every_n_steps", "0"])
    main(["fit", "--ckpt_path", "last", "--run.name", "tiny", "--trainer.max_steps", "3"])
    main(["fit", "--ckpt_path", "last", "--run.name", "tiny", "--trainer.max_steps", "4", "--samples.top_k", "5"])
    said = [r.getMessage().split("=")[0] for r in caplog.records if "does nothing" in r.getMessage()]
    assert said == ["samples.top_k"], said


def test_fsdp_reshard_is_not_called_idle_under_fsdp2_by_its_other_name():
    """Catches `--trainer.strategy fsdp2 --model.fsdp_reshard_after_forward false` warned of as doing nothing ('used
    only with --trainer.strategy fsdp') while FSDP2 ran with it: tinylm.train.parallel takes fsdp and fsdp2, any
    case."""
    from tinylm.cli.unused import unused_options

    defaults = {"model": {"fsdp_reshard_after_forward": True}, "trainer": {"strategy": "auto"}}

    def said(strategy: str) -> list[str]:
        return unused_options({"model": {"fsdp_reshard_after_forward": False}, "trainer": {"strategy": strategy}},
                              defaults)

    assert said("fsdp") == said("fsdp2") == said("FSDP2") == []
    assert len(said("ddp")) == 1


def test_validate_names_the_training_sections_it_ignores(caplog):
    """Catches `tinylm validate --eval.tasks piqa` (help: 'scores zero-shot tasks at validation time'), `--guard.*`,
    `--samples.*`, `--run.checkpoint_every` or `--data.seed` accepted without a word while validate ran none of them."""
    from tinylm.cli.unused import warn_training_flags

    caplog.set_level(logging.WARNING, logger="tinylm")
    warn_training_flags({"eval.tasks", "eval.limit", "guard.loss_z", "samples.every_n_steps", "run.checkpoint_every",
                         "data.seed", "data.val_batches", "model.lr"})
    said = [r.getMessage() for r in caplog.records]
    assert said[:2] == ["--data.seed does nothing in tinylm validate (it sets training); drop it",
                        "--run.checkpoint_every does nothing in tinylm validate (it sets training); drop it"]
    assert [line.split(" do")[0] for line in said[2:]] == ["--guard.loss_z", "--samples.every_n_steps",
                                                          "--eval.limit, --eval.tasks"]


def test_prepare_names_the_loader_options_it_ignores(tmp_path, caplog, capsys):
    """Catches `tinylm prepare --data.batch_size 999 --data.seed 5` accepted without a word: the dataset written is
    the same whatever the loader's options say (a config file's are fit's too: not named)."""
    from tinylm.cli import main

    caplog.set_level(logging.WARNING, logger="tinylm")
    (tmp_path / "c.txt").write_text("the quick brown fox jumps over the lazy dog " * 20)
    main(["prepare", "--data.corpus", str(tmp_path / "c.txt"), "--data.block_size", "8", "--data.cache_dir",
          str(tmp_path / "cache"), "--data.batch_size", "999", "--data.seed", "5"])
    assert [r.getMessage() for r in caplog.records if "does nothing" in r.getMessage()] == [
        f"--data.{k} does nothing in tinylm prepare (it sets the batches training draws); drop it"
        for k in ("batch_size", "seed")]


def test_weights_only_false_is_refused_not_ignored(run_config):
    """Catches `--weights_only false` (Lightning's: load a checkpoint's pickled objects too) accepted and ignored:
    tinylm loads every checkpoint weights-only. true and null (the default) are what it does anyway."""
    with pytest.raises(ValueError, match="--weights_only false is not taken by tinylm"):
        lightning_main(["fit", "--config", str(run_config()), "--weights_only", "false"], cli_class=_ParseOnly)
    with pytest.raises(_Parsed):
        lightning_main(["fit", "--config", str(run_config()), "--weights_only", "true"], cli_class=_ParseOnly)


def test_clean_examples_without_a_clean_rule_is_named():
    """Catches `--data.clean.examples 7` with no cleaning rule on accepted without a word: nothing is cleaned and no
    clean.json (whose examples it counts) is written. Any rule gives it its effect, a threshold of 0 too."""
    from tinylm.cli.unused import unused_options
    from tinylm.data.clean import CleanOptions

    defaults = {"data": {"clean": vars(CleanOptions())}}

    def said(**clean) -> list[str]:
        return unused_options({"data": {"clean": vars(CleanOptions(examples=7, **clean))}}, defaults)

    assert [line.split("=")[0] for line in said()] == ["data.clean.examples"]
    assert said(exact=True) == said(min_words=0) == said(decontaminate=True) == said(max_symbol_ratio=0.5) == []


def test_a_runs_record_with_weights_only_false_still_resumes(run_config, caplog):
    """Catches a run started with `--weights_only false` (accepted and ignored until it was refused) whose
    config.yaml, its record, keeps `weights_only: false`: `tinylm fit --ckpt_path last` and `tinylm validate` of it
    read that record and were refused with "leave it out", an option the user had not typed."""
    import yaml

    path = run_config()
    cfg = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**cfg, "weights_only": False}))
    caplog.set_level(logging.WARNING, logger="tinylm")
    with pytest.raises(_Parsed):
        lightning_main(["fit", "--config", str(path)], cli_class=_ParseOnly)
    assert any("weights_only: false in the config does nothing" in r.getMessage() for r in caplog.records)


def test_an_unused_option_out_of_its_range_is_refused_alone(run_config, tmp_path, caplog, capsys):
    """Catches `--data.clean.near_threshold 1.5` without near (fit and prepare) and `--model.muon_lr -1` with AdamW
    printing "does nothing ... drop it, or turn that on" and then the refusal of the same value: the range is
    checked first, and its one line is all the user reads."""
    from tinylm.cli import main

    caplog.set_level(logging.WARNING, logger="tinylm")
    for args, said in ((["--data.clean.near_threshold", "1.5"], r"data\.clean\.near_threshold must be in \(0, 1\]"),
                       (["--model.muon_lr", "-1"], r"model\.muon_lr must be in \(0, inf\)")):
        with pytest.raises(ValueError, match=said):
            _warnings(run_config, caplog, *args)
        assert not [r for r in caplog.records if "does nothing" in r.getMessage()], args
    (tmp_path / "c.txt").write_text("the quick brown fox jumps over the lazy dog " * 20)
    with pytest.raises(SystemExit):
        main(["prepare", "--data.corpus", str(tmp_path / "c.txt"), "--data.cache_dir", str(tmp_path / "cache"),
              "--data.clean.near_threshold", "1.5"])
    assert "near_threshold must be in (0, 1], got 1.5" in capsys.readouterr().err
    assert not [r for r in caplog.records if "does nothing" in r.getMessage()]


def test_eval_tasks_with_validation_off_is_named(run_config, caplog):
    """Catches `--eval.tasks piqa --trainer.limit_val_batches 0` training to its end without one score and without
    a word: in-loop evals are scored at validation time, and that run never validates."""
    lines = _warnings(run_config, caplog, "--eval.tasks", "piqa", "--trainer.limit_val_batches", "0")
    assert lines == ["eval.tasks='piqa' does nothing with trainer.limit_val_batches=0: it is used only with "
                     "validation on (trainer.limit_val_batches unset or above 0: the tasks are scored at validation "
                     "time); drop it, or turn that on"]
    caplog.clear()
    assert _warnings(run_config, caplog, "--eval.tasks", "piqa", "--trainer.limit_val_batches", "0.5") == []


def test_a_sampling_option_out_of_its_range_is_refused_alone(tmp_path, capsys, recwarn):
    """Catches `tinylm generate --length_penalty 400` (errors.md's row, the default strategy sample) and `--strategy
    greedy --top_p 1.5` printing "does nothing with --strategy ..." and then the refusal of the same value: the range
    is checked first (before the checkpoint is read), and its one line is all the user reads, as for fit's options."""
    from tinylm.cli import main

    for args, said in ((["--length_penalty", "400"], "--length_penalty must be in [-10, 10], got 400.0"),
                       (["--strategy", "greedy", "--top_p", "1.5"], "--top_p must be in (0, 1], got 1.5")):
        with pytest.raises(SystemExit):
            main(["generate", "--ckpt_path", str(tmp_path / "none.ckpt"), *args])
        assert said in capsys.readouterr().err
        assert not [w for w in recwarn if "does nothing" in str(w.message)], args


def test_a_count_out_of_its_range_is_named_as_the_model_names_it(run_config, caplog):
    """Catches fit's early check (before the data is built) saying `model.prefix_len must be in [0, block_size=16)`
    where TinyLM's own check, and docs/errors.md, say `must be a whole number in`: the same value, one message."""
    with pytest.raises(ValueError, match=r"^model\.prefix_len must be a whole number in \[0, block_size=16\), got 16$"):
        _warnings(run_config, caplog, "--model.attn_mask", "prefix", "--model.prefix_len", "16")
    with pytest.raises(ValueError, match=r"^model\.warmup_steps must be a whole number in \[0, inf\), got -1$"):
        _warnings(run_config, caplog, "--model.warmup_steps", "-1")
