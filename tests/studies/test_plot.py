"""`tinylm plot`: the four charts from metrics.csv, health alerts marked, several runs, runs without validation."""

import os

import pytest
from helpers import _one_line_error

from tinylm.checkpoint import load_checkpoint
from tinylm.cli import main
from tinylm.studies.curves import read_run

HEADER = "epoch,health/spike,step,train/grad_norm,train/loss,train/lr,train/tokens_per_sec,val/loss\n"


def _run(tmp_path, name: str, rows: str):
    folder = tmp_path / "runs" / name
    (folder / "csv").mkdir(parents=True)
    (folder / "csv" / "metrics.csv").write_text(HEADER + rows)
    return folder


def _png(path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_read_run_series_alerts_and_cut_rows(tmp_path):
    """Every logged metric is read with its step (counted as tinylm counts them: Lightning's row 0 is step 1),
    health columns become alerts, and a last row cut short by an interrupted (or ongoing) write is left out: its
    "3." may be the start of "3.5" (a reader that chokes on it hides the whole run; one that reads it plots a
    made-up point)."""
    folder = _run(tmp_path, "a", "0,,0,1.5,4.2,1e-4,900,\n0,1,1,9.0,4.0,2e-4,950,\n0,,1,,,,,3.9\n0,,2,1.1,3.")
    curves = read_run(folder)
    assert curves.series["train/loss"] == [(1, 4.2), (2, 4.0)]
    assert curves.series["train/grad_norm"] == [(1, 1.5), (2, 9.0)]
    assert curves.series["val/loss"] == [(2, 3.9)]
    assert curves.alerts == [(2, "spike")]
    assert "health/spike" not in curves.series
    damaged = folder / "csv" / "metrics.csv"  # a byte that is no UTF-8 (a disk error): that cell only is lost
    damaged.write_bytes(damaged.read_bytes().replace(b"4.0", b"4.\xff"))
    assert read_run(folder).series["train/loss"] == [(1, 4.2)]


def test_plot_overlays_runs_and_handles_no_validation(tmp_path, monkeypatch, capsys):
    """Two runs (one with no validation row yet) in one PNG, named by run name under runs/; the summary names the
    alert. A run not yet validated must still plot: that is when people look."""
    monkeypatch.chdir(tmp_path)
    _run(tmp_path, "a", "0,,0,1.5,4.2,1e-4,900,\n0,1,1,9.0,4.0,2e-4,950,\n0,,1,,,,,3.9\n")
    _run(tmp_path, "b", "0,,0,1.4,4.3,1e-4,800,\n0,,1,1.3,4.1,2e-4,820,\n")
    main(["plot", "a", "runs/b", "--out", "both.png"])
    out = capsys.readouterr().out
    assert _png(tmp_path / "both.png")
    assert "a: train/loss 4.0000 (step 2), val/loss 3.9000 (step 2); health alerts: spike at 2" in out
    assert "b: train/loss 4.1000 (step 2)" in out


def test_a_csv_of_tinylm_validate_or_eval_is_read_at_its_own_steps(tmp_path):
    """Catches `tinylm plot runs/NAME/validate/metrics.csv` drawing the validate of step-20.ckpt at step 21: its
    rows (and eval's) count steps done, as the checkpoint; only Lightning's CSV counts from 0."""
    for folder in ("validate", "eval"):
        path = tmp_path / folder / "metrics.csv"
        path.parent.mkdir()
        path.write_text("time,checkpoint,step,val/loss\nt,c,20,3.5\n")
        assert read_run(path).series["val/loss"] == [(20, 3.5)]


def test_a_run_folder_named_in_bytes_not_utf8_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    """Catches `tinylm plot RUN` of a run folder named in bytes that are not UTF-8 (Latin-1 `b\\xe9`, or UTF-8
    under LC_ALL=C with PYTHONUTF8=0) refused as "--runs: 'utf-8' codec can't encode character '\\udce9' in position
    6: surrogates not allowed", which named neither the folder nor the fix."""
    monkeypatch.chdir(tmp_path)
    name = "runs/" + os.fsdecode(b"b\xe9")  # (how Python hands such an argument over: \udce9 for the byte \xe9)
    _run(tmp_path, os.fsdecode(b"b\xe9"), "0,,0,1.5,4.2,1e-4,900,\n")
    for argv in (["plot", name], ["plot", f"--runs={name}"]):
        _one_line_error(capsys, argv, f"--runs {name!r} is no UTF-8 text: its bytes b'runs/b\\xe9' are not UTF-8",
                        "rename it in UTF-8 (convmv -f latin1 -t utf8 --notest NAME, or mv)")


def test_runs_of_one_name_in_two_folders_are_told_apart(tmp_path, monkeypatch, capsys):
    """Catches two runs named "x" (sweeps/a/runs/x, sweeps/b/runs/x) drawn and summed up under one label each."""
    monkeypatch.chdir(tmp_path)
    _run(tmp_path / "a", "x", "0,,0,1.5,4.2,1e-4,900,\n")
    _run(tmp_path / "b", "x", "0,,0,1.4,4.3,1e-4,800,\n")
    main(["plot", "a/runs/x", "b/runs/x/", "--out", "both.png"])
    out = capsys.readouterr().out
    assert "a/runs/x: train/loss 4.2000 (step 1)" in out and "b/runs/x: train/loss 4.3000 (step 1)" in out


def test_alerts_of_several_runs_say_whose_they_are(tmp_path):
    """Catches alerts of overlaid runs drawn as identical red lines labelled by kind alone: which run diverged?"""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from tinylm.studies.curves import draw_runs

    a = read_run(_run(tmp_path, "a", "0,,0,1.5,4.2,1e-4,900,\n0,1,1,9.0,4.0,2e-4,950,\n"))
    b = read_run(_run(tmp_path, "b", "0,,0,1.4,4.3,1e-4,800,\n0,,1,1.3,4.1,2e-4,820,\n"))
    fig = Figure()
    draw_runs(fig, [a, b])
    assert [t.get_text() for t in fig.axes[0].texts] == ["a: spike"]
    fig = Figure()
    draw_runs(fig, [a])
    assert [t.get_text() for t in fig.axes[0].texts] == ["spike"]


def test_the_headline_of_many_runs_wraps_between_runs(tmp_path):
    """Catches the figure's title of 5 runs (`tinylm plot` of a scaling ladder, as scaling's next: says) drawn on one
    line that ran off both sides of the picture; a run's own headline is never broken."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from tinylm.studies.curves import _headline, draw_runs

    runs = [read_run(_run(tmp_path, f"sd-C2.0e10-L1-d{d}", "0,,0,1.5,4.2,1e-4,900,\n")) for d in (8, 12, 16, 20, 24)]
    fig = Figure(figsize=(11, 7))
    draw_runs(fig, runs)
    lines = fig._suptitle.get_text().split("\n")
    assert len(lines) > 1 and all(len(line) <= 11 * 12 for line in lines)
    assert ", ".join(lines).replace(",, ", ", ") == ", ".join(_headline(run) for run in runs)


def test_plot_a_real_run(run_config, capsys):
    """A run written by `tinylm fit` plots with default output in its folder (the CSV written by Lightning is the
    format the reader must follow, not a hand-made one), its steps named as the run named them: the plot said
    "val/loss (step 2)" of the validation the run did "at step 3", whose checkpoint is step-3.ckpt."""
    cfg = run_config(trainer={"max_steps": 6, "val_check_interval": 3}, run={"checkpoint_every": 3})
    main(["fit", "--config", str(cfg)])
    capsys.readouterr()
    main(["plot", "runs/tiny"])
    out = capsys.readouterr().out
    curves = read_run(cfg.parent / "runs" / "tiny")
    assert [s for s, _ in curves.series["val/loss"]] == [3, 6] and f"val/loss {curves.series['val/loss'][-1][1]:.4f} "\
        "(step 6)" in out
    assert [s for s, _ in curves.series["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert load_checkpoint(cfg.parent / "runs" / "tiny" / "checkpoints" / "step-3.ckpt")["global_step"] == 3
    assert _png(cfg.parent / "runs" / "tiny" / "plot.png")


def test_plot_help_shows_the_positional_form(capsys):
    """Catches `tinylm plot --help` showing `--runs [ITEM,...]`, a form that takes only a JSON list (`--runs
    runs/NAME` fails), instead of the positional `tinylm plot RUN [RUN ...]` that works."""
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    assert capsys.readouterr().out.startswith("usage: tinylm plot RUN [RUN ...] [options]")


def test_plot_takes_runs_as_a_flag_too(tmp_path, monkeypatch, capsys):
    """Catches `--runs NAME` (the flag --help lists) failing with "expected a list": it takes one or more names,
    and `--runs=NAME`, as well as the positional form."""
    monkeypatch.chdir(tmp_path)
    for name in "abc":
        _run(tmp_path, name, "0,,0,1.5,4.2,1e-4,900,\n")
    for args in (["--runs", "a", "b"], ["a", "--runs=b"], ["--runs", "a", "--runs", "b", "--out", "x.png"]):
        main(["plot", *args])
        printed = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()[:-1]]
        assert printed == ["a", "b"]


def test_plot_takes_runs_after_its_options_too(tmp_path, monkeypatch, capsys):
    """Catches `tinylm plot --out x.png a` (options first, as argparse takes any command's) refused with
    "unrecognized arguments: a", naming the run it was given as if it were a stray word: only the runs before the
    first option were read as runs."""
    monkeypatch.chdir(tmp_path)
    for name in "ab":
        _run(tmp_path, name, "0,,0,1.5,4.2,1e-4,900,\n")
    for args in (["--out", "x.png", "a", "b"], ["a", "--out", "x.png", "b"], ["--metric", "loss", "a", "--runs", "b"]):
        main(["plot", *args])
        printed = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()[:-1]]
        assert printed == ["a", "b"]


def test_plot_errors(tmp_path, monkeypatch, capsys):
    """A run folder without metrics is a one-line error naming the file and what to pass."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["plot", "nope"])
    assert "csv/metrics.csv not found" in capsys.readouterr().err
    _run(tmp_path, "a", "0,,0,1.5,4.2,1e-4,900,\n")
    with pytest.raises(SystemExit):
        main(["plot", "a", "--reference", "-1"])  # a loss below 0: a typo, not a published result
    assert "reference must be in [0, inf), got -1" in capsys.readouterr().err
    ckpt = tmp_path / "runs" / "a" / "checkpoints" / "last.ckpt"  # a file of the run: its folder is named
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"PK")
    with pytest.raises(SystemExit):
        main(["plot", str(ckpt)])
    err = capsys.readouterr().err
    assert "is a file, not a run or a metrics.csv: pass its run folder" in err and str(ckpt.parents[1]) in err
    assert err.count("\n") == 1
    (tmp_path / "lr.png").write_bytes(b"lr-find's picture")  # with its numbers beside it: not plot's to replace
    (tmp_path / "lr.json").write_text('{"suggested_lr": 0.001}')
    with pytest.raises(SystemExit):
        main(["plot", "a", "--out", "lr.png"])
    assert "--out 'lr.png' is the picture of the numbers in lr.json" in capsys.readouterr().err
    assert (tmp_path / "lr.png").read_bytes() == b"lr-find's picture"
    (tmp_path / "rep").mkdir()  # a sample report's picture, which its report.md shows: not plot's to replace
    (tmp_path / "rep" / "diversity_vs_likelihood.png").write_bytes(b"the report's picture")
    (tmp_path / "rep" / "report.md").write_text("![](diversity_vs_likelihood.png)\n")
    with pytest.raises(SystemExit):
        main(["plot", "a", "--out", "rep/diversity_vs_likelihood.png"])
    assert "is a picture of the sample report rep/report.md" in capsys.readouterr().err
    assert (tmp_path / "rep" / "diversity_vs_likelihood.png").read_bytes() == b"the report's picture"
    main(["plot", "a", "--out", "lr2.png"])
    main(["plot", "a", "--out", "lr2.png"])  # plot's own picture: replaced
    assert _png(tmp_path / "lr2.png")


def test_plot_without_matplotlib(tmp_path, monkeypatch, capsys):
    """matplotlib is an optional extra: without it the error is one line naming what to install."""
    monkeypatch.chdir(tmp_path)
    _run(tmp_path, "a", "0,,0,1.5,4.2,1e-4,900,\n")
    monkeypatch.setitem(__import__("sys").modules, "matplotlib.figure", None)
    with pytest.raises(SystemExit):
        main(["plot", "a"])
    assert 'pip install "tinylm[plots]"' in capsys.readouterr().err


def _last(folder, key: str) -> tuple[int, float]:
    return read_run(folder).series[key][-1]


def test_runs_of_different_tokenizers_plot_bits_per_byte(run_config, capsys):
    """Catches `plot` comparing a char run and a BPE run in nats per token (a BPE run's loss per token is several
    times a char run's however good it is): when the runs' tokenizers differ, the first panel is val/bpb, a line
    says so, and --metric loss still draws nats per token. Two real tiny runs' metrics.csv."""
    from tinylm.studies.curves import run_tokenizer

    for name, tokenizer in (("char", "char"), ("bpe", "bpe")):
        cfg = run_config(run={"name": name}, data={"tokenizer": tokenizer, "vocab_size": 300}, name=f"{name}.yaml",
                         trainer={"max_steps": 2, "val_check_interval": 2})
        main(["fit", "--config", str(cfg)])
    runs = cfg.parent / "runs"
    capsys.readouterr()
    assert run_tokenizer(runs / "char") == "char (vocab 58)" and run_tokenizer(runs / "bpe") == "bpe (vocab 300)"
    main(["plot", "runs/char", "runs/bpe", "--out", "both.png"])
    out = capsys.readouterr().out
    assert out.startswith("the runs' tokenizers differ (bpe (vocab 300); char (vocab 58)): plotting val/bpb")
    for name in ("char", "bpe"):
        step, bpb = _last(runs / name, "val/bpb")
        assert f"{name}: val/bpb {bpb:.4f} (step {step})" in out
        assert "val/loss" not in out
    assert _png(cfg.parent / "both.png")
    main(["plot", "runs/char", "runs/bpe", "--metric", "loss", "--out", "loss.png"])
    out = capsys.readouterr().out
    assert "tokenizers differ" not in out and f"val/loss {_last(runs / 'bpe', 'val/loss')[1]:.4f}" in out
    main(["plot", "runs/char", "--metric", "bpb"])  # asked for with one run: no line, bpb drawn
    out = capsys.readouterr().out
    assert "differ" not in out and out.startswith("char: val/bpb")


def _drawn(tmp_path, name: str, rows: str, metric: str = "loss"):
    """The figure `tinylm plot` draws of one run whose metrics.csv is ``rows`` (its header first)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from tinylm.studies.curves import draw_runs

    folder = tmp_path / "runs" / name
    (folder / "csv").mkdir(parents=True)
    (folder / "csv" / "metrics.csv").write_text(rows)
    fig = Figure()
    draw_runs(fig, [read_run(folder)], metric=metric)
    return fig


def test_bpb_panel_draws_val_bpb_and_train_bpb_when_logged(tmp_path):
    """Catches --metric bpb leaving the first panel on nats/token (or dropping train/bpb where a run logs it)."""
    fig = _drawn(tmp_path, "a", "step,train/loss,train/bpb,val/loss,val/bpb\n0,4.0,5.5,,\n1,3.0,4.5,,\n1,,,3.1,4.6\n",
                 metric="bpb")
    assert fig.axes[0].get_title().startswith("bits per byte")
    assert [line.get_label() for line in fig.axes[0].lines] == ["a train/bpb", "a val/bpb"]
    assert list(fig.axes[0].lines[1].get_ydata()) == [4.6]


def test_a_muon_runs_two_learning_rates_are_drawn_and_named(tmp_path):
    """Catches the learning-rate panel of a Muon run drawing train/lr alone (AdamW's, for embeddings, head and
    norms), unnamed: read as the model's LR, 20x below the blocks' train/muon_lr, which was never drawn."""
    lr = _drawn(tmp_path, "m", "step,train/loss,train/lr,train/muon_lr\n0,4.0,5e-4,0.01\n1,3.0,1e-3,0.02\n").axes[1]
    assert [line.get_label() for line in lr.lines] == ["m train/lr", "m train/muon_lr"]
    assert lr.get_legend() is not None and lr.get_yscale() == "log"
    lr = _drawn(tmp_path, "a", HEADER + "0,,0,1.0,4.0,1e-3,100,\n").axes[1]  # an AdamW run's panel, as it was
    assert lr.get_yscale() == "linear" and lr.get_legend() is None


def test_plot_expands_a_quoted_home(tmp_path, monkeypatch, capsys):
    """Catches `tinylm plot '~/runs/a'` (quoted, or from a script: no shell expands it) said "not found", though
    --out and every option expand `~`."""
    monkeypatch.setenv("HOME", str(tmp_path))
    _run(tmp_path, "a", "0,,0,1.5,4.2,1e-4,900,\n0,,1,1.4,4.0,1e-4,900,3.9\n")
    main(["plot", "~/runs/a", "--out", str(tmp_path / "p.png")])
    assert _png(tmp_path / "p.png")


def test_plot_runs_writes_png_only_under_a_png_name(tmp_path):
    """Catches the Python API's plot_runs(runs, "x.jpg") writing PNG bytes under a .jpg name (the CLI refused it;
    the library did not)."""
    pytest.importorskip("matplotlib")
    from tinylm.studies.curves import RunCurves, plot_runs

    run = RunCurves("a", series={"train/loss": [(1, 4.0), (2, 3.5)], "val/loss": [(2, 3.6)]})
    with pytest.raises(ValueError, match=r"out must name a .png file, got '.*x.jpg'"):
        plot_runs([run], tmp_path / "x.jpg")
    assert not (tmp_path / "x.jpg").exists()
    assert plot_runs([run], tmp_path / "sub" / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
