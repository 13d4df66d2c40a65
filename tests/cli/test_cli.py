"""`tinylm fit|validate|prepare` end to end on a tiny model and a slice of tinyshakespeare."""

import csv
import json
import math
import re
from pathlib import Path

import forked
import pytest
import torch
import yaml
from helpers import _one_line_error

from tinylm.cli import main
from tinylm.cli.fit import lightning_main
from tinylm.cli.prompts import read_prompt_file

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def config(run_config):
    """A tiny run: 6 steps, validation every 3, checkpoints every 4, text samples every 3."""
    return run_config(
        chars=30_000,
        run={"checkpoint_every": 4},
        samples={"every_n_steps": 3, "prompts": ["ROMEO:"], "max_new_tokens": 8},
        trainer={"max_steps": 6, "val_check_interval": 3},
        model={"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2},
        data={"block_size": 32, "batch_size": 4, "val_batches": 3},
    )


def _rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_fit_writes_metrics_and_checkpoints(config, tmp_path):
    """Catches a run that trains but leaves no CSV, no last.ckpt or no best checkpoint behind."""
    main(["fit", "--config", str(config)])
    run = tmp_path / "runs" / "tiny"
    ckpts = run / "checkpoints"
    assert {"last.ckpt", "best.ckpt", "step-4.ckpt", "step-6.ckpt"} <= {p.name for p in ckpts.iterdir()}
    rows = _rows(run)
    for name in ("train/loss", "train/lr", "train/grad_norm", "val/loss", "val/ppl", "val/bpb"):
        assert any(r.get(name) for r in rows), name
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    ppl = [float(r["val/ppl"]) for r in rows if r.get("val/ppl")]
    assert len(val) == 2 and ppl[-1] == pytest.approx(math.exp(val[-1]), rel=1e-4)
    ckpt = torch.load(ckpts / "last.ckpt", weights_only=True)  # loads without executing code
    assert ckpt["global_step"] == 6
    assert ckpt["tinylm"]["tokenizer"] is not None  # generate/export need nothing else
    samples = (run / "samples.txt").read_text()
    assert "--- step 3 | 'ROMEO:'" in samples and "--- step 6 |" in samples
    assert ckpt["hyper_parameters"]["vocab_size"] == len(set((tmp_path / "shakespeare_small.txt").read_text()))


def test_training_samples_take_the_decoding_options_of_generate(config, tmp_path):
    """Catches the samples a run writes ignoring (or refusing) generate's options: with no_repeat_ngram_size 1 no
    character of a greedy sample repeats one before it (prompt included), where the untrained model's greedy text
    loops; a bad value is refused before the run starts."""
    with pytest.warns(UserWarning, match=r"samples.top_p, samples.min_p, samples.typical_p do nothing with "
                                         r"samples.strategy greedy"):  # accepted, and said to do nothing
        main(["fit", "--config", str(config), "--trainer.max_steps", "3", "--samples.strategy", "greedy",
              "--samples.max_new_tokens", "30", "--samples.no_repeat_ngram_size", "1", "--samples.repetition_penalty",
              "1.2", "--samples.top_p", "0.9", "--samples.min_p", "0.05", "--samples.typical_p", "0.9"])
    sample = (tmp_path / "runs" / "tiny" / "samples.txt").read_text().split("\n", 1)[1].rstrip("\n")
    new = sample.removeprefix("ROMEO:")
    assert len(new) > 8 and len(set(new)) == len(new) and not set(new) & set("ROMEO:"), sample
    from tinylm.checkpoint import load_model
    from tinylm.generate import generate

    model, tok, _ = load_model(str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"))
    free = tok.decode(generate(model, [tok.encode("ROMEO:")], strategy="greedy", max_new_tokens=30,
                               repetition_penalty=1.2)[0])
    assert len(set(free)) < len(free)  # not vacuous: without the option, the same sample repeats itself
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--run.name", "bad", "--samples.typical_p", "0"])
    assert not (tmp_path / "runs" / "bad" / "checkpoints").exists()


def test_bad_sample_options_name_their_samples_option():
    """Catches fit refusing --samples.top_p 0 with "top_p must be in (0, 1]" (fit has no --top_p: the user had to
    guess which option), a bad samples.temperature pointing at --strategy greedy (an option of generate, not fit),
    and samples.typical_p with samples.strategy greedy (or temperature and top_k with beam) doing nothing without a
    word (generate warns)."""
    from tinylm.train.samples import SampleText

    with pytest.raises(ValueError, match=r"^samples\.top_p must be in \(0, 1\], got 0$"):
        SampleText(top_p=0)
    with pytest.raises(ValueError, match=r"^samples\.temperature must be .* \(--samples\.strategy greedy\)$"):
        SampleText(temperature=0)
    with pytest.raises(ValueError, match=r"^samples\.strategy: unknown strategy 'nope'"):
        SampleText(strategy="nope")
    with pytest.warns(UserWarning, match=r"^samples\.typical_p does nothing with samples\.strategy greedy"):
        SampleText(strategy="greedy", typical_p=0.9)
    with pytest.warns(UserWarning, match=r"^samples\.temperature, samples\.top_k do nothing with samples\.strategy "
                                         r"beam \(they shape samples\.strategy contrastive / sample\)$"):
        SampleText(strategy="beam", temperature=1.2, top_k=5)  # generate's warning, in fit's words


def test_sample_top_k_is_contrastive_searchs_candidates():
    """Catches samples.top_k given with samples.strategy contrastive being dropped (contrastive search ran with its
    default 4 candidates), while samples' default top_k (200, for sampling) is not taken for contrastive's."""
    from tinylm.train.samples import SampleText

    assert SampleText(strategy="contrastive", top_k=8).config.top_k == 8
    assert SampleText(strategy="contrastive").config.top_k is None  # contrastive's own default
    assert SampleText(strategy="sample").config.top_k == 200


def test_vocab_and_block_size_are_linked_from_data(config, tmp_path):
    """Catches the model's vocab_size/block_size being typed twice (and drifting) instead of coming from data."""
    cli = lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "1"])
    assert cli.model.hparams.vocab_size == cli.datamodule.vocab_size == cli.datamodule.tokenizer.vocab_size
    assert cli.model.hparams.block_size == 32


def test_resume_from_last_continues_from_saved_step(config, tmp_path, monkeypatch):
    """Catches --ckpt_path last restarting from step 0 (or failing on the run's existing config.yaml). And a fresh
    fit turning its config into text four times (its check that the config can be recorded, config.yaml, the
    checkpoints' copy, Lightning's hyperparameters: ~45 ms of CPU each, ~12 % of a tiny fit): tinylm's three are one;
    a config changed since (the resume's record, ckpt_path null) is written as it is now, not as it was dumped."""
    import jsonargparse

    dumps, dump = [], jsonargparse.ArgumentParser.dump
    monkeypatch.setattr(jsonargparse.ArgumentParser, "dump", lambda *a, **k: dumps.append(a[1]) or dump(*a, **k))
    main(["fit", "--config", str(config), "--trainer.max_steps", "4"])
    assert len(dumps) == 2  # tinylm's, and Lightning's own (its hyperparameters, None values dropped)
    run = tmp_path / "runs" / "tiny"
    saved = lambda: torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["tinylm"]["config"]
    assert saved() == (run / "config.yaml").read_text()
    cli = lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "6", "--ckpt_path", "last"])
    assert cli.trainer.global_step == 6
    steps = [int(r["step"]) for r in _rows(run) if r.get("train/loss")]
    assert steps[-1] == 5 and 4 in steps  # the resumed run logged steps 4 and 5 (0-based)
    for record in (saved(), (run / "config.resume-step4.yaml").read_text()):
        assert yaml.safe_load(record)["ckpt_path"] is None and "max_steps: 6" in record


CPU_CLASS = "lightning.pytorch.accelerators.CPUAccelerator"


@pytest.mark.parametrize("accelerator", ["cpu", {"class_path": CPU_CLASS}])
def test_a_cpu_run_on_a_gpu_machine_takes_the_cpus_precision(accelerator, run_config, monkeypatch, recwarn):
    """Catches `--trainer.accelerator cpu` on a machine with a GPU taking the GPU's default precision: 16-mixed (a
    T4's, a V100's: no bf16), which Lightning said the user had passed and ran as bf16-mixed; bf16-mixed (newer
    GPUs) on a 32-wide model, where the CPU's rule is 32-true (1.35x faster at 128 wide). The accelerator as a
    config's object (class_path: ...CPUAccelerator) took the GPU's, and so did a resume's reading of it."""
    from jsonargparse import Namespace

    import tinylm.device
    from tinylm.device import resolve_precision

    def on_a_gpu_machine(*args, bf16: bool = False, **kwargs):  # the machine has a GPU while the precision is chosen
        with monkeypatch.context() as m:  # (only then: the run itself trains on this CPU; a CUDA build of torch
            m.setattr(torch.cuda, "is_available", lambda: True)  # without a driver fails on a faked GPU)
            m.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)  # a T4: no bf16
            return resolve_precision(*args, **kwargs)

    assert on_a_gpu_machine(None, 32) == "16-mixed"  # (not vacuous: the GPU's, where the run trains on it)
    monkeypatch.setattr(tinylm.device, "resolve_precision", on_a_gpu_machine)
    cli = lightning_main(["fit", "--config", str(run_config(trainer={"precision": None, "accelerator": accelerator}))])
    assert cli.trainer.precision == "32-true"
    from tinylm.device import names_cpu  # (resume_changes reads the run's record and the config: no object there)

    assert names_cpu(Namespace(class_path=CPU_CLASS)) and not names_cpu({"class_path": "x.CUDAAccelerator"})
    assert not [w for w in recwarn if "AMP with fp16 is not supported on CPU" in str(w.message)]
    assert on_a_gpu_machine(None, 32, "cpu", bf16=True) == on_a_gpu_machine(None, 32, "CPU", bf16=True) == "32-true"
    assert on_a_gpu_machine(None, 32, "auto", bf16=True) == "bf16-mixed"  # (an A100's)


def test_validate_reproduces_the_runs_last_val_loss(config, tmp_path):
    """Catches validate evaluating different data or different weights than training did."""
    main(["fit", "--config", str(config)])
    last_val = [float(r["val/loss"]) for r in _rows(tmp_path / "runs" / "tiny") if r.get("val/loss")][-1]
    ckpt = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    cli = lightning_main(["validate", "--config", str(config), "--ckpt_path", str(ckpt)])
    assert cli.trainer.callback_metrics["val/loss"].item() == pytest.approx(last_val, abs=1e-5)


def test_fresh_run_refuses_a_folder_that_holds_a_run(config, tmp_path, capsys):
    """Catches a second fresh run writing its last.ckpt over another run's (issue: a BPE run overwrote a char run's
    checkpoint, after which the README's resume command failed)."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "1"])
    last = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(config), "--trainer.max_steps", "1", "--data.tokenizer", "bpe"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--ckpt_path last" in err and "--run.name" in err
    assert last.read_bytes() == before
    main(["fit", "--config", str(config), "--trainer.max_steps", "1", "--run.name", "other"])
    assert (tmp_path / "runs" / "other" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_every_shipped_config_parses(name, capsys):
    """Catches a shipped YAML that no longer matches the code's signatures (renamed or retyped options)."""
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(REPO / "configs" / name), "--print_config"])
    assert e.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["max_steps"] > 0 and printed["model"]["n_layer"] > 0


def test_print_config_of_a_resume_prints_what_it_runs(config, tmp_path, capsys):
    """Catches `--print_config` with --ckpt_path printing the model options the resume ignores (the checkpoint's
    are the model: a printed `n_embd: 64` for a 32-wide run), and printing the resolved file for `last`; the printed
    config resumes the run. `--ckpt_path last` without a checkpoint yet prints too (it trained instead)."""
    main(["fit", "--config", str(config)])
    capsys.readouterr()
    resume = ["fit", "--config", str(config), "--trainer.max_steps", "8", "--ckpt_path", "last"]
    with pytest.raises(SystemExit) as e:
        main([*resume, "--model.n_embd", "64", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert e.value.code == 0 and printed["model"]["n_embd"] == 32 and printed["ckpt_path"] == "last"
    assert printed["trainer"]["max_steps"] == 8
    (tmp_path / "printed.yaml").write_text(yaml.safe_dump(printed))
    main(["fit", "--config", str(tmp_path / "printed.yaml")])
    capsys.readouterr()
    assert torch.load(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8
    with pytest.raises(SystemExit) as e:  # a resume that would be refused (nothing to train) prints all the same
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--print_config"])
    assert e.value.code == 0 and yaml.safe_load(capsys.readouterr().out)["trainer"]["max_steps"] == 6
    with pytest.raises(SystemExit) as e:
        main([*resume, "--run.name", "new", "--print_config"])
    out, err = capsys.readouterr()
    assert e.value.code == 0 and yaml.safe_load(out)["run"]["name"] == "new", err
    assert not (tmp_path / "runs" / "new").exists()


def test_a_section_from_a_file_is_read(config, tmp_path):
    """Catches `--run run.yaml` (a section's options from a file, as `--help` offers) ending in "RunOptions got an
    unexpected keyword argument '__path__'": the path jsonargparse keeps beside a section read from a file."""
    (tmp_path / "run.yaml").write_text("name: from-file\ncheckpoint_every: 3\n")
    main(["fit", "--config", str(config), "--run", str(tmp_path / "run.yaml")])
    assert (tmp_path / "runs" / "from-file" / "checkpoints" / "step-3.ckpt").is_file()


def test_a_section_from_a_file_named_in_a_config_is_read(config, tmp_path):
    """Catches `run: run.yaml` in a --config file (a section's options from a file beside it, which jsonargparse reads
    as it reads `--run run.yaml`) refused as a section that "must hold run options indented below it"."""
    (tmp_path / "run.yaml").write_text("name: from-file\ncheckpoint_every: 3\nwandb_project: null\n")
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "run": "run.yaml"}))
    main(["fit", "--config", str(config), "--trainer.max_steps", "3"])
    assert (tmp_path / "runs" / "from-file" / "checkpoints" / "step-3.ckpt").is_file()


def test_prepare_reads_a_data_section_from_a_file(config, tmp_path, capsys):
    """Catches `tinylm prepare --data data.yaml` (and `data: data.yaml` in a --config file), a section's options from
    a file as fit takes them, ending in "PreparedData.__init__() got an unexpected keyword argument '__path__'"."""
    (tmp_path / "data.yaml").write_text(yaml.safe_dump(yaml.safe_load(config.read_text())["data"]))
    main(["prepare", "--config", str(config), "--data", str(tmp_path / "data.yaml")])
    assert "vocab" in capsys.readouterr().out


def test_prepares_printed_config_reads_back(config, tmp_path, capsys):
    """Catches `tinylm prepare --print_config` writing the fit sections it ignores as `trainer: null`, which neither
    prepare nor fit reads back ("section trainer: must hold trainer options ..."); a recipe's sections stay whole."""
    for args in ([], ["--config", str(config)]):
        with pytest.raises(SystemExit) as e:
            main(["prepare", *args, "--print_config"])
        assert e.value.code == 0
        printed = tmp_path / "printed.yaml"
        printed.write_text(capsys.readouterr().out)
        assert all(v is not None for v in yaml.safe_load(printed.read_text()).values() if not isinstance(v, str))
        main(["prepare", "--config", str(printed), "--data.corpus", str(tmp_path / "shakespeare_small.txt")])
        assert "vocab_size" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # the recipe's sections: fit reads them as it would the recipe
        main(["fit", "--config", str(printed), "--print_config"])
    steps = yaml.safe_load(config.read_text())["trainer"]["max_steps"]
    assert e.value.code == 0 and yaml.safe_load(capsys.readouterr().out)["trainer"]["max_steps"] == steps


def test_prepare_prints_summary(config, tmp_path, capsys):
    """Catches `tinylm prepare` not accepting a fit config (also a run's own config.yaml, which LightningCLI writes
    with its `weights_only` option) or not saying what it made."""
    main(["prepare", "--config", str(config)])
    out = capsys.readouterr().out
    assert "65" in out or "vocab" in out
    assert "train" in out and "val" in out
    main(["fit", "--config", str(config), "--trainer.max_steps", "1"])
    capsys.readouterr()
    main(["prepare", "--config", str(tmp_path / "runs" / "tiny" / "config.yaml")])
    assert capsys.readouterr().out == out


def test_generate_from_a_fit_checkpoint(config, tmp_path, capsys):
    """Catches `tinylm generate` needing anything beyond the checkpoint (config, data, tokenizer files)."""
    main(["fit", "--config", str(config)])
    ckpt = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    (tmp_path / "cache").rename(tmp_path / "gone")  # the data and its tokenizer are no longer around
    capsys.readouterr()
    main(["generate", "--ckpt_path", str(ckpt), "--prompt", "ROMEO:", "--strategy", "greedy", "--max_new_tokens", "20"])
    first = capsys.readouterr().out
    assert first.startswith("ROMEO:") and len(first.rstrip("\n")) == len("ROMEO:") + 20  # char model: 1 token = 1 char
    main(["generate", "--ckpt_path", str(ckpt), "--prompt", "ROMEO:", "--strategy", "greedy", "--max_new_tokens", "20"])
    assert capsys.readouterr().out == first  # greedy is deterministic
    # a bare boolean flag means true, as plan's --json (it was "argument --no_cache: expected one argument")
    with pytest.warns(UserWarning, match=r"--early_stopping does nothing with --strategy greedy"):
        main(["generate", "--ckpt_path", str(ckpt), "--no_cache", "--prompt", "ROMEO:", "--strategy", "greedy",
              "--max_new_tokens", "20", "--early_stopping"])
    assert capsys.readouterr().out == first  # the same tokens without the KV cache
    main(["generate", "--ckpt_path", str(ckpt), "--prompt", "ROMEO:", "--num_samples", "3", "--seed", "1",
          "--max_new_tokens", "5"])
    out = capsys.readouterr().out
    assert out.count("ROMEO:") == 3
    assert [line for line in out.splitlines() if line.startswith("-----")] == \
        [f"----- sample {i} -----" for i in (1, 2, 3)]  # the first one was unlabelled
    # no prompt: a char tokenizer has no end-of-text token, so it starts from a newline (it was an error)
    main(["generate", "--ckpt_path", str(ckpt), "--strategy", "greedy", "--max_new_tokens", "7"])
    assert len(capsys.readouterr().out) == len("\n") + 7 + len("\n")


def test_generate_decodes_the_continuation_after_the_prompt(run_config, tmp_path, small_data, capsys):
    """Catches a SentencePiece-style (Metaspace) model printing "Once upon aLel" for "Once upon a Lel": new tokens
    decoded on their own lose the space their "▁" stands for, in the streamed text, the returned texts and the
    stop strings, and the samples written during training. What generate prints must be the tokenizer's decoding of
    prompt + new tokens."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from tinylm.checkpoint import load_model
    from tinylm.generate import SamplingConfig, generate_with
    from tinylm.generate.rows import _Rows, decode_after
    from tinylm.train.samples import SampleText

    hf = HF(models.Unigram())
    hf.pre_tokenizer, hf.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:30_000]
    hf.train_from_iterator([text], trainers.UnigramTrainer(vocab_size=300, special_tokens=["<unk>"], unk_token="<unk>"))
    hf.save(str(tmp_path / "tokenizer.json"))
    main(["fit", "--config", str(run_config(data={"tokenizer": str(tmp_path / "tokenizer.json")}))])
    ckpt = str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")
    model, tok, _ = load_model(ckpt)
    prompt = tok.encode("Once upon a")
    assert tok.decode(tok.encode(" time")) == "time"  # what decoding alone loses
    assert decode_after(tok.decode, prompt, tok.encode(" time")) == " time"
    for strategy in ("greedy", "beam"):  # streamed, and printed at the end
        beams = 2 if strategy == "beam" else 1
        new = generate_with(model, [prompt], SamplingConfig(strategy=strategy, max_new_tokens=12, num_beams=beams))[0]
        capsys.readouterr()
        main(["generate", "--ckpt_path", ckpt, "--prompt", "Once upon a", "--strategy", strategy,
              "--max_new_tokens", "12"] + (["--num_beams", "2"] if strategy == "beam" else []))
        assert capsys.readouterr().out == tok.decode(prompt + new) + "\n"
        # the samples a run writes as it trains: with its beams (not one, which is greedy), decoded the same way
        sampler = SampleText(strategy=strategy, max_new_tokens=12, **({"num_beams": beams} if beams > 1 else {}))
        assert "Once upon a" + sampler._sample(model, tok, "Once upon a") == tok.decode(prompt + new)
    # a stop string at the start of the continuation: " t" is there only after the prompt's words
    rows = _Rows(SamplingConfig(stop_strings=[" t"]), tok.decode, None, [prompt])
    for token in tok.encode(" time"):
        rows.accept([token])  # one row: its next token
    assert rows.active == [False]


def test_generate_into_a_closed_pipe_stops_quietly(config, tmp_path):
    """Catches `tinylm generate ... | head -c 10` ending in a two-part BrokenPipeError traceback: the error
    handler wrote to the same closed stdout."""
    import os
    import select


    main(["fit", "--config", str(config)])
    ckpt = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    pipe = tmp_path / "stdout"  # a named pipe: its reader here, as `| head -c 10`
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)  # no EOF before the run has opened it
    proc = forked.popen(["generate", "--ckpt_path", str(ckpt), "--prompt", "a", "--max_new_tokens", "20000"],
                        cwd=tmp_path, stdout=pipe, stderr=tmp_path / "stderr")
    out = b""
    while len(out) < 10 and select.select([reader], [], [], 120)[0]:
        out += os.read(reader, 10 - len(out))
    assert len(out) == 10
    os.close(reader)  # the reader goes away, as head does (20,000 tokens take far longer than this)
    os.close(keep)
    proc.wait(timeout=120)
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 141 and "Traceback" not in err and "Error" not in err, err


def test_validate_into_a_closed_pipe_ends_with_141(config, tmp_path):
    """Catches `tinylm validate ... | head -1` ending with exit 1 and not a word: Lightning's table of metrics is
    printed by rich, whose answer to a reader gone is SystemExit(1); every other command ends quietly with 141, as a
    shell reports a reader gone. And the result it computed lost (`| less` quit before it, `| true`): the table met
    the reader gone before validate recorded its row in validate/metrics.csv."""
    import os
    import subprocess
    import sys

    main(["fit", "--config", str(config)])
    ckpt = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "tinylm", "validate", "--ckpt_path", str(ckpt)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    proc.stdout.close()  # the reader goes away before the table is printed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err[-2000:]
    assert "Traceback" not in err and "error" not in err, err[-2000:]
    with open(tmp_path / "runs" / "tiny" / "validate" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["step"] for row in rows] == ["6"] and float(rows[0]["val/loss"]) > 0, rows


@pytest.mark.parametrize("flags, match", [
    (["--top_p", "1.5"], "top_p"), (["--temperature", "0"], "temperature"), (["--top_k", "0"], "top_k"),
    (["--num_beams", "0", "--strategy", "beam"], "num_beams"),
    # accepted once, then NaN probabilities (logits / 1e-40, a penalty of 1e-40) or length ** 400 crashed
    (["--temperature", "1e-40"], r"temperature must be in \[0.0001, inf\)"),
    (["--repetition_penalty", "1e-40"], r"repetition_penalty must be in \[0.001, inf\)"),
    (["--strategy", "beam", "--length_penalty", "400"], r"length_penalty must be in \[-10, 10\]"),
    (["--strategy", "contrastive", "--num_samples", "3"], "3 identical texts"),  # N x the work, nothing new
    (["--ckpt_path", ""], "--ckpt_path is empty"),  # was "checkpoint '.' is a folder"
    (["--prompt", "ab\udcff"],
     r"not valid UTF-8 \(byte b'\\xff' at character 2\)"),  # a byte the shell could not decode
    (["--prompt", "é"], "remove it from the text"),  # a character the char model never saw
])
def test_generate_bad_sampling_arguments_are_one_line_errors(config, tmp_path, capsys, flags, match):
    """Catches out-of-range sampling arguments producing tracebacks or silently wrong text."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "1"])
    ckpt = tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"
    with pytest.raises(SystemExit) as e:
        main(["generate", "--ckpt_path", str(ckpt), "--prompt", "A", *flags])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert re.search(match, err.splitlines()[-1]) and "Traceback" not in err, err


def test_generate_reads_its_prompt_from_a_file_or_a_pipe(config, tmp_path, capsys, monkeypatch):
    """Catches `--prompt_file` (a file, or - for a pipe) giving another prompt than --prompt with the same text: its
    bytes are the prompt as written (only one trailing line end goes, CRLF too; escapes are not read), and
    `--prompt -` with text piped in continuing "-" without a word (the piped text was ignored)."""
    import io

    main(["fit", "--config", str(config), "--trainer.max_steps", "1"])
    gen = ["generate", "--ckpt_path", str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"),
           "--strategy", "greedy", "--max_new_tokens", "5"]
    capsys.readouterr()
    main([*gen, "--prompt", "ROMEO:\\nA"])  # typed: the escape is a newline
    typed = capsys.readouterr().out
    (tmp_path / "p.txt").write_bytes("ROMEO:\nA\n".encode())
    main([*gen, "--prompt_file", "p.txt"])
    assert capsys.readouterr().out == typed
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"ROMEO:\nA\r\n")))
    main([*gen, "--prompt_file", "-"])
    assert capsys.readouterr().out == typed
    (tmp_path / "p.txt").write_bytes(b"a\\n\n\n")
    assert read_prompt_file("p.txt") == "a\\n\n"  # as written: an escape stays, one line end of two goes
    (tmp_path / "p.txt").write_bytes(b"\xef\xbb\xbfROMEO:\r\n")  # Notepad's: a byte-order mark, CRLF
    assert read_prompt_file("p.txt") == "ROMEO:"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"ROMEO:")))
    with pytest.warns(UserWarning, match="--prompt - continues the text '-'.*use --prompt_file -"):
        main([*gen, "--prompt", "-"])


def test_resume_keeps_checkpoint_hyperparameters_and_says_so(config, tmp_path, caplog):
    """Catches `--ckpt_path last --model.lr X` silently mixing a new LR into a resumed run (Lightning #20801)."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    with caplog.at_level("WARNING", logger="tinylm"):
        cli = lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "3", "--ckpt_path", "last",
                              "--model.lr", "0.5"])
    assert cli.model.hparams.lr == 3e-3
    assert any("ignoring model.lr=0.5 (checkpoint: 0.003)" in r.getMessage() for r in caplog.records)
    # a value equal to the default, named on the command line, is ignored too: and says so
    main(["fit", "--config", str(config), "--trainer.max_steps", "2", "--run.name", "drop", "--model.dropout", "0.1"])
    caplog.clear()
    with caplog.at_level("WARNING", logger="tinylm"):
        cli = lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "3", "--run.name", "drop",
                              "--ckpt_path", "last", "--model.dropout", "0.0"])
    assert cli.model.hparams.dropout == 0.1
    assert "ignoring model.dropout=0.0 (checkpoint: 0.1)" in caplog.text


def test_resume_takes_runtime_options_from_this_run(config, caplog):
    """Catches a resume ignoring --model.activation_checkpointing true (the way out of an OOM) or
    --model.fsdp_reshard_after_forward (FSDP2's memory for speed) as if it were a hyperparameter: they change
    memory, not the numbers."""
    main(["fit", "--config", str(config), "--trainer.max_steps", "2"])
    with caplog.at_level("WARNING", logger="tinylm"):
        cli = lightning_main(["fit", "--config", str(config), "--trainer.max_steps", "3", "--ckpt_path", "last",
                              "--model.activation_checkpointing", "true", "--model.fsdp_reshard_after_forward",
                              "false"])
    assert cli.model.hparams.activation_checkpointing and cli.model.hparams.fsdp_reshard_after_forward is False
    assert all(type(b).__name__ == "RecomputedBlock" for b in cli.model.model.transformer.h)
    assert "ignoring" not in caplog.text


def test_streamed_text_holds_back_a_character_until_its_last_byte(capsys):
    """Catches `tinylm generate` streaming "��" for a character whose bytes arrive as separate byte-level tokens
    (each byte alone decodes as U+FFFD)."""
    from tinylm.cli.commands import _StreamPrinter

    decode = lambda ids: bytes(ids).decode("utf-8", "replace")
    printer = _StreamPrinter(decode, list(b"caf"), "caf")
    assert capsys.readouterr().out == ""  # the prompt comes with the first token (a refusal before it: nothing)
    new = list("é東".encode())
    for token in new:
        printer(0, token)
    printer.finish(new)
    assert capsys.readouterr().out == "café東"


def test_a_node_started_by_hand_beyond_the_first_logs_errors_only():
    """Catches every node of a multi-node run started by hand (NODE_RANK=1, ...) printing the run's warnings and
    notes again: rank 0 of node 0 says them."""
    import logging
    import os

    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from tinylm.cli.console import setup as _setup_console

    # each node a child forked from this process (Lightning imported, with no NODE_RANK), set up as a fresh process
    # is: no handler on the "tinylm" logger yet, Lightning's rank that of a process it did not start (0)
    levels = {}
    for node in ("0", "1"):
        ready, said = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover (a child: leaves at once, never back into pytest)
            try:
                os.close(ready)
                tinylm_log = logging.getLogger("tinylm")
                tinylm_log.handlers.clear()
                tinylm_log.setLevel(logging.NOTSET)
                rank_zero_only.rank = 0
                # as each node started by hand has them (with no MASTER_ADDR, a NODE_RANK is a stray: ignored)
                os.environ.update(NODE_RANK=node, MASTER_ADDR="10.0.0.1", MASTER_PORT="29500")
                _setup_console()
                os.write(said, str(tinylm_log.getEffectiveLevel()).encode())
            finally:
                os._exit(0)
        os.close(said)
        forked.reap(child, 60)  # ended: what it said waits in the pipe
        levels[node] = int(os.read(ready, 16) or -1)
        os.close(ready)
    assert levels == {"0": 20, "1": 40}  # INFO, ERROR


def test_tinylm_help_answers_without_importing_lightning():
    """Catches `tinylm --help` (and `tinylm` alone) importing Lightning, torch and all before printing the command
    list: 10 s on a busy 2-core machine for a line of usage."""
    import subprocess
    import sys

    code = "import sys; from tinylm.cli import main; main(['--help']); print('lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("usage: tinylm COMMAND") and "sample-report" in out
    assert out.splitlines()[-1] == "False"


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_into_a_closed_pipe_ends_quietly(flag):
    """Catches `tinylm --help | head -3` (or `tinylm --version | true`) ending in a BrokenPipeError traceback: the
    usage (the version) was printed outside the handling every command's output has (exit 141, as a shell reports a
    reader gone, and nothing on stderr)."""
    import os
    import subprocess
    import sys

    reader, writer = os.pipe()
    os.close(reader)  # the reader gone before anything is written (closed 0.5 s into the child's start instead, it was
    # not yet gone when this process was held up that long on a loaded machine: exit 0)
    proc = subprocess.Popen([sys.executable, "-c", "import sys\nsys.stdin.close()\n"
                             f"from tinylm.cli import main\nsys.argv = ['tinylm', '{flag}']\nmain()"],
                            stdout=writer, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    os.close(writer)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err, err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full (a disk that is always full)")
@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_onto_a_full_disk_is_one_line(flag):
    """Catches `tinylm --version > /dev/full` (a full disk) ending in an OSError traceback, where every command's
    output says it in one line."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "tinylm", flag], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=60)
    assert done.returncode == 1 and done.stderr.startswith("tinylm: error: OSError: no space left on the disk "
                                                           "writing the standard output"), done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_into_an_unwritable_stdout_gives_no_disk_advice(tmp_path, flag):
    """Catches `tinylm --version 1</dev/null` (stdout open for reading: EBADF) told to "free some space": only a full
    disk gets that fix; another error says what it is, as every command's output does."""
    import subprocess
    import sys

    (tmp_path / "in").write_text("")
    with open(tmp_path / "in") as read_only:
        done = subprocess.run([sys.executable, "-m", "tinylm", flag], stdout=read_only, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    assert done.returncode == 1 and "Bad file descriptor" in done.stderr, done.stderr
    assert "space" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def _samples(run_dir: Path) -> list[tuple[str, str]]:
    """(prompt, text) of each sample in a run's samples.txt."""
    found = re.findall(r"^--- step \d+ \| ('[^\n]*')\n(.*?)(?=\n--- |\Z)", (run_dir / "samples.txt").read_text(),
                       flags=re.M | re.S)
    return [(eval(p), t.rstrip("\n")) for p, t in found]  # noqa: S307 (the repr of a prompt this test wrote)


def test_training_samples_draft_with_a_checkpoint_loaded_once(config, run_config, tmp_path, capsys):
    """Catches --samples.draft_ckpt_path missing, or a draft whose tokenizer is not the run's used instead of refused
    in one line before the first step: the samples drafted by a smaller model are the model's own greedy text
    (speculative decoding is exact), and samples.txt says how many tokens each forward pass of the model wrote."""
    pytest.importorskip("llguidance")
    main(["fit", "--config", str(config), "--run.name", "draft", "--model.n_layer", "1", "--model.n_embd", "16",
          "--samples.every_n_steps", "0", "--trainer.max_steps", "2"])
    draft = tmp_path / "runs" / "draft" / "checkpoints" / "last.ckpt"
    prompts = ["ROMEO:", "JULIET:"]
    main(["fit", "--config", str(config), "--trainer.max_steps", "3", "--samples.strategy", "greedy",
          "--samples.max_new_tokens", "30", "--samples.draft_ckpt_path", str(draft), "--samples.num_draft_tokens", "3",
          "--samples.prompts", json.dumps(prompts)])
    from tinylm.checkpoint import load_model
    from tinylm.generate import generate

    model, tok, _ = load_model(str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"))
    want = [(p, p + tok.decode(generate(model, [tok.encode(p)], strategy="greedy", max_new_tokens=30)[0]))
            for p in prompts]
    assert _samples(tmp_path / "runs" / "tiny") == want
    assert re.search(r"--- speculative: [\d.]+ tokens per forward pass", (tmp_path / "runs" / "tiny" / "samples.txt")
                     .read_text())
    (tmp_path / "other.txt").write_text("abc " * 2000)
    other = run_config(data={"corpus": str(tmp_path / "other.txt")}, run={"name": "other"}, name="other.yaml")
    main(["fit", "--config", str(other), "--samples.every_n_steps", "0"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--run.name", "mixed", "--samples.draft_ckpt_path",
              str(tmp_path / "runs" / "other" / "checkpoints" / "last.ckpt")])
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if "samples.draft_ckpt_path" in ln]
    assert len(err) == 1 and "not the model's (char, " in err[0], err
    assert not (tmp_path / "runs" / "mixed" / "checkpoints").exists()


def test_training_samples_take_a_grammar_and_a_seed_per_prompt(config, tmp_path, capsys):
    """Catches --samples.regex ignored, the samples of two prompts drawn with the same random numbers (the same
    prompt twice gave the same text twice), and a regex the run's char tokenizer cannot write found only at the
    first sample step (after the run had trained up to it): it is refused in one line before the first step."""
    pytest.importorskip("llguidance")
    pattern = r"[a-z]{2,6}( [a-z]{2,6}){1,3}\."
    main(["fit", "--config", str(config), "--trainer.max_steps", "3", "--samples.strategy", "sample",
          "--samples.temperature", "1.5", "--samples.max_new_tokens", "40", "--samples.regex", pattern,
          "--samples.prompts", '["ROMEO:", "ROMEO:"]'])
    (_, a), (_, b) = _samples(tmp_path / "runs" / "tiny")
    assert re.fullmatch(pattern, a.removeprefix("ROMEO:")) and re.fullmatch(pattern, b.removeprefix("ROMEO:"))
    assert a != b
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--run.name", "nope", "--samples.regex", "(x|y)ü"])
    err = capsys.readouterr().err.strip().splitlines()
    assert sum("the samples.regex '(x|y)ü' needs text this char tokenizer" in ln for ln in err) == 1, err
    assert not (tmp_path / "runs" / "nope" / "checkpoints").exists()


def test_a_path_option_starting_with_a_tilde_is_the_home_folder(run_config, tmp_path, monkeypatch):
    """Catches `--trainer.default_root_dir=~/runs` (no shell expands `~` after `=`, in quotes or in YAML) splitting the
    run between ./~/runs (its config, checkpoints) and $HOME/runs (Lightning's CSV logger expands `~`) and ending in a
    FileNotFoundError traceback; and `data.cache_dir: ~/cache` in a config making a folder named `~`."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = run_config(data={"cache_dir": "~/cache"})
    main(["fit", "--config", str(config), "--trainer.default_root_dir=~/runs"])
    home = tmp_path / "home"
    assert (home / "runs" / "tiny" / "checkpoints" / "last.ckpt").is_file()
    assert (home / "runs" / "tiny" / "csv" / "metrics.csv").is_file()
    assert (home / "cache" / "datasets").is_dir()
    assert not (tmp_path / "~").exists()


def test_seed_everything_true_draws_a_seed_and_records_it(run_config, monkeypatch):
    """Catches `--seed_everything true` (Lightning's help: "a random seed") seeding every run with 0 (Lightning's
    seed_everything(None) without PL_GLOBAL_SEED): each run draws its own, and its config.yaml records it."""
    config = run_config()
    seeds = []
    for name in ("a", "b"):
        monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # (set by the seeding of the run before, in-process)
        main(["fit", "--config", str(config), "--seed_everything", "true", "--run.name", name])
        seeds.append(yaml.safe_load(open(f"runs/{name}/config.yaml"))["seed_everything"])
    assert all(isinstance(s, int) and not isinstance(s, bool) for s in seeds) and seeds[0] != seeds[1], seeds



def test_a_ddp_fork_run_in_process_leaves_no_master_port(run_config, monkeypatch):
    """Catches MASTER_PORT left in a notebook's process by `main(["fit", ..., "--trainer.strategy", "ddp_fork"])`
    (Lightning's launcher sets the port it chose): every later DDP run of the process took that port as given
    instead of finding a free one, and failed where another program held it by then."""
    import os

    monkeypatch.delenv("MASTER_PORT", raising=False)
    main(["fit", "--config", str(run_config()), "--trainer.strategy", "ddp_fork", "--trainer.devices", "2",
          "--trainer.max_steps", "2", "--run.name", "a"])
    assert (Path("runs") / "a" / "checkpoints" / "last.ckpt").is_file()
    assert "MASTER_PORT" not in os.environ


def test_a_callers_ddp_fork_run_stopped_by_ctrl_c_returns_once_saved(run_config, monkeypatch):
    """Catches a notebook's Interrupt (SIGINT to the kernel alone) of `main(["fit", ..., "--trainer.strategy",
    "ddp_fork"])` ending the call (SystemExit 130, "they finish their step and save last.ckpt") while the training
    processes still trained: last.ckpt was not there yet, and the next cell's `--ckpt_path last` started the run over
    from step 0 beside them. A process that is the command waits for them at its exit; a caller's call now does."""
    import multiprocessing
    import os
    import signal
    import time

    from tinylm.train.interrupt import InterruptCheckpoint
    from tinylm.train.module import TinyLM

    batch_end, stop = TinyLM.on_train_batch_end, InterruptCheckpoint._stop

    def on_train_batch_end(self, *args):  # (in the training processes: forked with the patch)
        if self.trainer.global_step == 2 and self.trainer.global_rank == 0:
            os.kill(os.getppid(), signal.SIGINT)  # the kernel's Interrupt: to the launching process alone
        return batch_end(self, *args)

    def slow_stop(self, trainer, signum):  # a checkpoint that takes a moment to write (a large model's)
        time.sleep(1)
        return stop(self, trainer, signum)

    monkeypatch.setattr(TinyLM, "on_train_batch_end", on_train_batch_end)
    monkeypatch.setattr(InterruptCheckpoint, "_stop", slow_stop)
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(run_config()), "--trainer.strategy", "ddp_fork", "--trainer.devices", "2",
              "--trainer.max_steps", "1000", "--run.name", "a"])
    assert e.value.code == 130
    assert not [child for child in multiprocessing.active_children() if not child.daemon]
    assert (Path("runs") / "a" / "checkpoints" / "last.ckpt").is_file()


def test_a_callers_later_random_seed_is_not_the_last_runs_seed(run_config, monkeypatch):
    """Catches PL_GLOBAL_SEED left in a notebook's or script's process by `main(["fit", ...])` (Lightning's
    seed_everything sets it, and seed_everything(None) reads it back): every later `--seed_everything true` of the
    process took the run before's seed (1337 each time, the same losses), where a fresh process draws one."""
    import os

    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    config = run_config()
    main(["fit", "--config", str(config), "--seed_everything", "1337", "--run.name", "a"])
    assert "PL_GLOBAL_SEED" not in os.environ and "PL_SEED_WORKERS" not in os.environ
    seeds = []
    for name in ("b", "c"):
        main(["fit", "--config", str(config), "--seed_everything", "true", "--run.name", name])
        seeds.append(yaml.safe_load(open(f"runs/{name}/config.yaml"))["seed_everything"])
    assert 1337 not in seeds and seeds[0] != seeds[1], seeds


def test_a_callers_later_run_is_not_deterministic_after_one_that_was(run_config, monkeypatch):
    """Catches `--trainer.deterministic true` left on in a notebook's or script's process after `main(["fit", ...])`
    (Lightning's torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG): every later run of the
    process, and the caller's own torch code, ran deterministic algorithms (slower on a GPU, or refused an op that has
    none) where a fresh process does not."""
    import os

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert not torch.are_deterministic_algorithms_enabled()
    try:
        main(["fit", "--config", str(run_config()), "--trainer.deterministic", "true"])
        assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    finally:
        torch.use_deterministic_algorithms(False)


def test_a_callers_process_holds_nothing_of_a_finished_run(run_config, monkeypatch):
    """Catches `main(["fit", ...])` leaving its run alive in a notebook's or sweep's process: jsonargparse's parser of
    the command, kept in a ContextVar it never resets, held the run's Trainer, its model with the optimizer state and
    its data memmaps (GPU memory, open files) until the process's next command, past gc.collect() and
    torch.cuda.empty_cache()."""
    import gc
    import weakref

    from tinylm.train.module import TinyLM

    made, configure = weakref.WeakSet(), TinyLM.configure_optimizers

    def configure_optimizers(self):
        made.add(self)
        return configure(self)

    monkeypatch.setattr(TinyLM, "configure_optimizers", configure_optimizers)
    main(["fit", "--config", str(run_config())])
    assert Path("runs/tiny/checkpoints/last.ckpt").exists()  # (the run trained its model)
    gc.collect()
    assert len(made) == 0, "the run's model is still referenced after main() returned"


def test_a_callers_torch_threads_are_its_own_after_a_run(run_config):
    """Catches torch's CPU thread count left as a run chose it (--run.threads, or the CPUs free as it started) in a
    notebook's or script's process after `main(["fit", ...])`: the caller's own torch code ran on that count from
    then on (1 thread, after a run started at a busy moment)."""
    caller = torch.get_num_threads()
    torch.set_num_threads(caller + 1)
    try:
        main(["fit", "--config", str(run_config()), "--run.threads", str(caller)])
        assert torch.get_num_threads() == caller + 1
    finally:
        torch.set_num_threads(caller)


def test_a_callers_logging_config_prints_each_line_once(run_config, capsys):
    """Catches every tinylm line printed twice in a script or notebook that configured logging (logging.basicConfig:
    a handler on the root logger, writing to the console): once by tinylm's own handler, once by the root's, which the
    "tinylm" logger propagates to. The caller's handler says it, once, in the caller's format."""
    import logging
    import sys

    root = logging.StreamHandler(sys.stderr)  # (basicConfig's: stderr as it is now, capsys's)
    root.setFormatter(logging.Formatter("ROOT %(name)s: %(message)s"))
    logging.getLogger().addHandler(root)
    try:
        main(["fit", "--config", str(run_config()), "--run.threads", "1"])
    finally:
        logging.getLogger().removeHandler(root)
    err = capsys.readouterr().err
    assert err.count("CPU threads: 1 (--run.threads)") == 1, err
    assert "ROOT tinylm: CPU threads: 1 (--run.threads)" in err


def test_main_takes_paths_and_numbers_as_the_words_they_stand_for(run_config, capsys):
    """Catches a notebook's `main(["fit", "--config", folder / "x.yaml", "--trainer.max_steps", 20])` (a pathlib path,
    a number, as subprocess.run takes them) ending in "AttributeError: 'PosixPath' object has no attribute
    'partition'", and `main("fit --config x.yaml")` (one text) in "unknown command 'f'"."""
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", run_config(), "--trainer.max_steps", 3, "--model.lr", 1e-05, "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert e.value.code == 0 and printed["trainer"]["max_steps"] == 3 and printed["model"]["lr"] == 1e-05
    with pytest.raises(TypeError, match=r"a list of words, got the text 'fit --config x.yaml'; pass main\(shlex"):
        main("fit --config x.yaml")
    with pytest.raises(TypeError, match=r"word 2 is None \(NoneType\)"):
        main(["fit", "--config", None])


def test_main_takes_numpys_numbers_as_the_words_they_stand_for(run_config, capsys):
    """Catches a sweep's `main(["fit", ..., "--trainer.max_steps", steps])` with ``steps`` from np.arange (or a
    DataFrame's row: np.int64, np.float32) refused as "word 4 is np.int64(3) (int64)", where the message and
    docs/python.md say numbers are taken as their text (np.float64, a float's subclass, was)."""
    import numpy as np

    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", run_config(), "--trainer.max_steps", np.arange(3, 4)[0], "--model.lr",
              np.float32(1e-05), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert e.value.code == 0 and printed["trainer"]["max_steps"] == 3 and printed["model"]["lr"] == 1e-05


def test_a_generate_stopped_mid_line_leaves_no_open_line_to_the_next_command(tmp_path, capsys, monkeypatch):
    """Catches a notebook's `main(["generate", ...])` stopped mid-line (the kernel's Interrupt while it streamed a
    sample) leaving its open line to every later command of the process: each one's error or stop then wrote an empty
    line on stdout first (the line was ended already, when the generate stopped)."""
    from tinylm.cli import commands, console

    def streamed_then_interrupted(command: str, rest: list[str]) -> None:
        console.write("ROMEO: half a li")
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patched:
        patched.setattr(commands, "run", streamed_then_interrupted)
        with pytest.raises(SystemExit) as e:
            main(["generate", "--ckpt_path", "a.ckpt"])
    assert e.value.code == 130 and capsys.readouterr().out == "ROMEO: half a li\n"
    with pytest.raises(SystemExit) as e:  # the next command of the process: its own error, nothing before it
        main(["generate", "--ckpt_path", str(tmp_path / "none.ckpt")])
    out, err = capsys.readouterr()
    assert e.value.code == 1 and out == "" and "none.ckpt" in err, (out, err)


def test_a_command_from_another_thread_while_one_runs_is_one_line(run_config, capsys, monkeypatch):
    """Catches two commands at once in one process (a sweep's trials in threads: Optuna's n_jobs, a thread pool)
    reading each other's working folder, random seed and torch threads: jsonargparse parses a config from the
    config's folder, and the other trial's relative corpus was "not found" there. The second is refused in one line;
    the first trains on, and the next command after it runs."""
    import threading

    from tinylm.train.module import TinyLM

    config, started, proceed, ended = run_config(), threading.Event(), threading.Event(), []
    configure = TinyLM.configure_optimizers

    def configure_optimizers(self):  # the run in the other thread waits here, mid-fit, for the second command
        if threading.current_thread() is not threading.main_thread():
            started.set()
            proceed.wait(60)
        return configure(self)

    def first():
        main(["fit", "--config", str(config), "--run.name", "first"])
        ended.append(True)

    monkeypatch.setattr(TinyLM, "configure_optimizers", configure_optimizers)
    thread = threading.Thread(target=first, name="trial-1")
    thread.start()
    try:
        assert started.wait(60)
        capsys.readouterr()
        line = _one_line_error(capsys, ["fit", "--config", str(config), "--run.name", "second"],
                               "another tinylm command (fit, in thread 'trial-1') is running in this process")
        assert "its own process" in line
    finally:
        proceed.set()
        thread.join(120)
    assert ended and Path("runs/first/checkpoints/last.ckpt").exists() and not Path("runs/second").exists()
    main(["fit", "--config", str(config), "--run.name", "third"])  # one at a time: as ever
    assert Path("runs/third/checkpoints/last.ckpt").exists()


def test_a_forked_child_is_not_refused_for_a_command_of_another_thread(run_config, monkeypatch):
    """Catches a process forked while a command ran in a thread (a sweep's multiprocessing or ProcessPoolExecutor
    workers, fork on Linux: the process-based executor the one-command refusal advises) refusing every command: the
    child kept the parent's record of the running command, though only the forking thread runs in a child."""
    import contextlib
    import io
    import multiprocessing
    import threading

    from tinylm.train.module import TinyLM

    config, started, proceed = run_config(), threading.Event(), threading.Event()
    configure = TinyLM.configure_optimizers

    def configure_optimizers(self):  # the run in the other thread waits here, mid-fit, while the child is forked
        started.set()
        proceed.wait(60)
        return configure(self)

    def child(conn):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
            main(["generate", "--ckpt_path", "missing.ckpt", "--prompt", "a"])
        conn.send(err.getvalue())

    monkeypatch.setattr(TinyLM, "configure_optimizers", configure_optimizers)
    thread = threading.Thread(target=main, args=(["fit", "--config", str(config)],), name="trial-1")
    thread.start()
    try:
        assert started.wait(60)
        ours, theirs = multiprocessing.get_context("fork").Pipe()
        proc = multiprocessing.get_context("fork").Process(target=child, args=(theirs,))
        proc.start()
        said = ours.recv() if ours.poll(60) else "(nothing)"
        proc.join(60)
    finally:
        proceed.set()
        thread.join(120)
    assert "another tinylm command" not in said and "missing.ckpt" in said, said


def test_seed_everything_true_on_a_resume_keeps_the_run_seed(run_config, monkeypatch, caplog):
    """Catches `--seed_everything true` on a resume (a script's command with `--ckpt_path last` added) drawing a new
    seed: warned about as having "no effect" on every resume, and recorded in the resume's config as if it had. The
    run's own seed is kept, and said."""
    config = run_config()
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    main(["fit", "--config", str(config), "--seed_everything", "true"])
    seed = yaml.safe_load(open("runs/tiny/config.yaml"))["seed_everything"]
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--config", str(config), "--seed_everything", "true", "--ckpt_path", "last",
              "--trainer.max_steps", "3"])
    assert f"the run's seed {seed} is kept" in caplog.text and "has no effect" not in caplog.text, caplog.text
    assert yaml.safe_load(open("runs/tiny/config.resume-step2.yaml"))["seed_everything"] == seed
    caplog.clear()
    with caplog.at_level("INFO", logger="tinylm"):  # validate writes no config record: none is said to keep it
        main(["validate", "--ckpt_path", "runs/tiny/checkpoints/last.ckpt", "--seed_everything", "true"])
    assert "drew seed" in caplog.text and "records it" not in caplog.text, caplog.text

def test_seed_everything_true_from_a_checkpoint_outside_its_folder_keeps_the_run_seed(run_config, monkeypatch,
                                                                                       caplog, tmp_path):
    """Catches `--seed_everything true` with a checkpoint copied out of its run folder (a branch from a shared
    checkpoint) drawing a new seed, warned about as having "no effect" and recorded as if it had."""
    import shutil

    config = run_config()
    main(["fit", "--config", str(config)])
    (tmp_path / "shared").mkdir()
    shutil.copy("runs/tiny/checkpoints/last.ckpt", tmp_path / "shared" / "x.ckpt")
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--config", str(config), "--seed_everything", "true", "--ckpt_path", "shared/x.ckpt",
              "--run.name", "mine", "--trainer.max_steps", "3"])
    assert "the run's seed 7 is kept" in caplog.text and "has no effect" not in caplog.text, caplog.text
    assert yaml.safe_load(open("runs/mine/config.yaml"))["seed_everything"] == 7


def test_generate_shows_progress_until_text_printed_at_the_end(run_config, tmp_path, capsys, monkeypatch):
    """Catches `tinylm generate --strategy beam` (and --num_samples N) sitting silent until all its tokens are
    decoded: a progress line of the tokens decoded goes to stderr (in a log, every LINE_INTERVAL seconds: 0 here),
    the text alone to stdout; a streamed sample shows its text instead."""
    import tinylm.progress

    main(["fit", "--config", str(run_config())])
    ckpt = str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt")
    monkeypatch.setattr(tinylm.progress, "LINE_INTERVAL", 0.0)
    for extra in (["--strategy", "beam", "--num_beams", "2"], ["--num_samples", "2"], []):
        capsys.readouterr()
        main(["generate", "--ckpt_path", ckpt, "--prompt", "ROMEO:", "--max_new_tokens", "9"] + extra)
        out, err = capsys.readouterr()
        assert out.startswith(("ROMEO:", "----- sample 1 -----")) and "generating" not in out
        assert ("generating: 100% 9/9" in err) == bool(extra), err


def test_validate_records_the_step_of_the_weights_it_validated(config, tmp_path, monkeypatch):
    """Catches `tinylm validate --ckpt_path last` on a running fit recording "step 4" beside step 6's val/loss: the
    command read the step when it parsed (last.ckpt at step 4) and Lightning loaded the file again seconds later,
    after the fit had saved step 6 over it. The step now comes from the file whose weights were validated."""
    import shutil

    from tinylm.train.checkpoint_io import AtomicCheckpointIO

    main(["fit", "--config", str(config)])
    folder = tmp_path / "runs" / "tiny" / "checkpoints"
    last_val = [float(r["val/loss"]) for r in _rows(tmp_path / "runs" / "tiny") if r.get("val/loss")][-1]
    shutil.copyfile(folder / "last.ckpt", tmp_path / "step-6.ckpt")
    shutil.copyfile(folder / "step-4.ckpt", folder / "last.ckpt")  # what the command reads first
    real = AtomicCheckpointIO.load_checkpoint

    def the_fit_saved_meanwhile(self, path, *args, **kwargs):
        shutil.copyfile(tmp_path / "step-6.ckpt", folder / "last.ckpt.tmp")
        Path(folder / "last.ckpt.tmp").replace(folder / "last.ckpt")
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(AtomicCheckpointIO, "load_checkpoint", the_fit_saved_meanwhile)
    main(["validate", "--ckpt_path", str(folder / "last.ckpt")])
    row = list(csv.DictReader(open(tmp_path / "runs" / "tiny" / "validate" / "metrics.csv")))[-1]
    assert (int(row["step"]), float(row["val/loss"])) == (6, pytest.approx(last_val, abs=1e-5))


def test_a_run_named_like_a_number_resumes_from_what_it_wrote(run_config, tmp_path, capsys):
    """Catches a run named `--run.name 3e-4` (a sweep named by its LR) that trained and could then never resume,
    validate or plan: its config.yaml (and the config kept in its checkpoint) said `name: 3e-4`, plain, which
    jsonargparse reads back as 0.0003 ("expected a str"). Every config tinylm writes quotes such a string."""
    config = run_config()
    main(["fit", "--config", str(config), "--run.name", "3e-4", "--samples.prompts", '["1e5"]'])
    run = tmp_path / "runs" / "3e-4"
    assert yaml.safe_load((run / "config.yaml").read_text())["run"]["name"] == "3e-4"
    main(["fit", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--trainer.max_steps", "3"])
    main(["fit", "--config", str(run / "config.yaml"), "--ckpt_path", "last", "--trainer.max_steps", "4"])
    main(["validate", "--ckpt_path", str(run / "checkpoints" / "last.ckpt")])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(run / "config.yaml"), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["run"]["name"] == "3e-4" and printed["samples"]["prompts"] == ["1e5"]


def test_a_prompt_file_that_never_ends_is_refused(monkeypatch):
    """Catches `--prompt_file /dev/zero` (or /dev/urandom, or an endless pipe as -) reading until the machine killed
    the process (a MemoryError traceback under a memory limit)."""
    import io

    from tinylm.cli import prompts

    with pytest.raises(ValueError, match=r"--prompt_file '/dev/zero' is a device, not a text file"):
        read_prompt_file("/dev/zero")
    monkeypatch.setattr(prompts, "MAX_TEXT_BYTES", 2**20)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a" * (2**20 + 1))))
    with pytest.raises(ValueError, match=r"--prompt_file standard input holds more than 1 MiB"):
        read_prompt_file("-")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a" * 2**20)))
    assert len(read_prompt_file("-")) == 2**20


def test_version(capsys):
    """Catches `tinylm --version` answered with "unknown command" (the first thing one asks of a tool)."""
    import tinylm

    for flag in ("--version", "-V"):
        main([flag])
        assert capsys.readouterr().out == f"tinylm {tinylm.__version__}\n"


def test_a_commands_typo_and_missing_options_are_named(capsys):
    """Catches `tinylm generate --temprature` without the nearest option (fit gave it), and a missing required
    option said as argparse's "the following arguments are required: ckpt_path" (no flag, plot's RUN as --runs)."""
    for argv, said in ((["generate", "--ckpt_path", "x.ckpt", "--temprature", "0.5"],
                        "unrecognized arguments: --temprature 0.5; the nearest option is --temperature 0.5"),
                       (["generate"], "--ckpt_path is required (tinylm generate --help says what it takes)"),
                       (["plot"], "RUN is required (tinylm plot --help says what it takes)")):
        with pytest.raises(SystemExit):
            main(argv)
        assert capsys.readouterr().err.strip().endswith(said), argv


def test_a_commands_config_file_with_a_typo_names_the_file_and_the_nearest_option(tmp_path, capsys):
    """Catches `top_kk: 5` in a generate --config file said as "Option 'top_kk' is not accepted" (no file, no
    nearest option), and a file holding a list told to hold fit's sections."""
    (tmp_path / "g.yaml").write_text("top_kk: 5\n")
    (tmp_path / "l.yaml").write_text("- a\n")
    for name, said in (("g.yaml", "g.yaml: Option 'top_kk' is not accepted; the nearest option is top_k"),
                       ("l.yaml", "must hold a mapping of KEY: VALUE lines")):
        with pytest.raises(SystemExit):
            main(["generate", "--ckpt_path", "x.ckpt", "--config", str(tmp_path / name)])
        assert said in capsys.readouterr().err, name


def test_no_advice_against_the_loaders_chosen_num_workers(run_config, monkeypatch):
    """Catches Lightning's PossibleUserWarning "The 'train_dataloader' does not have many workers which may be a
    bottleneck. Consider increasing ... `num_workers=15`" (and the val_dataloader's) on every fit and validate of a
    machine of 3 or more CPUs: tinylm reads in the main process on purpose (docs/data.md)."""
    import warnings

    import lightning.fabric.utilities.data as data

    monkeypatch.setattr(data, "_num_cpus_available", lambda: 16)  # as on the 16-CPU host of a GPU
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        main(["fit", "--config", str(run_config())])
    assert not [w for w in seen if "does not have many workers" in str(w.message)]


def test_ema_weight_averaging_on_one_device_says_nothing_of_sharding(run_config):
    """Catches Lightning's "You're using the WeightAveraging callback with a model that overrides the
    configure_model callback. WeightAveraging doesn't support sharding model layers, so you may run out of memory"
    at every run with the EMAWeightAveraging that docs/cli.md recommends: TinyLM shards only under FSDP2."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        main(["fit", "--config", str(run_config()), "--trainer.callbacks+=EMAWeightAveraging"])
    assert not [w for w in seen if "doesn't support sharding model layers" in str(w.message)]
def test_the_top_level_help_names_every_flag_of_its_own():
    """Catches `tinylm --help` listing --verbose but not --version (docs/cli.md's table has it): a reader of the
    help alone never learned it."""
    from tinylm.cli.table import usage

    assert "--verbose" in usage() and "--version" in usage()




def test_a_config_record_cut_by_a_kill_is_never_left_half_written(run_config, monkeypatch):
    """Catches config.yaml and config.resume-step<N>.yaml written in place: a kill mid-write left a cut record in
    the run folder (the next resume took its own config.yaml for another run's and moved it aside). A record is
    written to a temp file renamed into place: a write cut short leaves the earlier record whole, or none."""
    from pathlib import Path

    config = run_config()
    main(["fit", "--config", str(config)])
    record = Path("runs/tiny/config.yaml").read_text()
    real_write_text = Path.write_text

    class Killed(BaseException):  # as SIGKILL: nothing of tinylm's own runs after it
        pass

    def cut(self, text, *args, **kwargs):  # half the record written, then the process is gone
        if not self.name.startswith("config."):
            return real_write_text(self, text, *args, **kwargs)
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise Killed

    monkeypatch.setattr(Path, "write_text", cut)
    with pytest.raises(Killed):
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "3"])
    monkeypatch.setattr(Path, "write_text", real_write_text)
    assert Path("runs/tiny/config.yaml").read_text() == record
    assert sorted(p.name for p in Path("runs/tiny").glob("config*")) == ["config.yaml"]


def test_a_next_command_naming_a_file_in_bytes_not_utf8_pastes_back_to_that_file(tmp_path, monkeypatch):
    """Catches the next commands after `tinylm validate` of a checkpoint named in bytes that are not UTF-8
    (`caf\\xe9.ckpt`, Latin-1) printing it as 'caf\ufffd.ckpt' (the byte replaced): pasted, the command found no such
    file. It is written as bash's $'...' of its bytes, which a shell gives back as the file's own name."""
    import os
    import subprocess

    from tinylm.cli.summary import shown

    monkeypatch.chdir(tmp_path)
    for raw in (b"runs/caf\xe9.ckpt", b"it's \xe9\\.ckpt"):
        said = shown(os.fsdecode(raw))
        assert said.startswith("$'") and "\ufffd" not in said
        assert subprocess.run(["bash", "-c", f"printf %s {said}"], capture_output=True).stdout == raw
    assert shown("runs/café.ckpt") == "'runs/café.ckpt'"  # (UTF-8 text: as before)
