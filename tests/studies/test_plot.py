"""`tinylm plot`: the four charts from metrics.csv, health alerts marked, several runs, runs without validation."""

import pytest

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
    """Every logged metric is read with its step, health columns become alerts, and a last row cut short by an
    interrupted (or ongoing) write is left out: its "3." may be the start of "3.5" (a reader that chokes on it
    hides the whole run; one that reads it plots a made-up point)."""
    folder = _run(tmp_path, "a", "0,,0,1.5,4.2,1e-4,900,\n0,1,1,9.0,4.0,2e-4,950,\n0,,1,,,,,3.9\n0,,2,1.1,3.")
    curves = read_run(folder)
    assert curves.series["train/loss"] == [(0, 4.2), (1, 4.0)]
    assert curves.series["train/grad_norm"] == [(0, 1.5), (1, 9.0)]
    assert curves.series["val/loss"] == [(1, 3.9)]
    assert curves.alerts == [(1, "spike")]
    assert "health/spike" not in curves.series
    damaged = folder / "csv" / "metrics.csv"  # a byte that is no UTF-8 (a disk error): that cell only is lost
    damaged.write_bytes(damaged.read_bytes().replace(b"4.0", b"4.\xff"))
    assert read_run(folder).series["train/loss"] == [(0, 4.2)]


def test_plot_overlays_runs_and_handles_no_validation(tmp_path, monkeypatch, capsys):
    """Two runs (one with no validation row yet) in one PNG, named by run name under runs/; the summary names the
    alert. A run not yet validated must still plot: that is when people look."""
    monkeypatch.chdir(tmp_path)
    _run(tmp_path, "a", "0,,0,1.5,4.2,1e-4,900,\n0,1,1,9.0,4.0,2e-4,950,\n0,,1,,,,,3.9\n")
    _run(tmp_path, "b", "0,,0,1.4,4.3,1e-4,800,\n0,,1,1.3,4.1,2e-4,820,\n")
    main(["plot", "a", "runs/b", "--out", "both.png"])
    out = capsys.readouterr().out
    assert _png(tmp_path / "both.png")
    assert "a: train/loss 4.0000 (step 1), val/loss 3.9000 (step 1); health alerts: spike at 1" in out
    assert "b: train/loss 4.1000 (step 1)" in out


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


def test_plot_a_real_run(run_config, capsys):
    """A run written by `tinylm fit` plots with default output in its folder (the CSV written by Lightning is the
    format the reader must follow, not a hand-made one)."""
    cfg = run_config(trainer={"max_steps": 3, "val_check_interval": 3})
    main(["fit", "--config", str(cfg)])
    main(["plot", "runs/tiny"])
    assert "val/loss" in capsys.readouterr().out
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


def test_plot_without_matplotlib(tmp_path, monkeypatch, capsys):
    """matplotlib is an optional extra: without it the error is one line naming what to install."""
    monkeypatch.chdir(tmp_path)
    _run(tmp_path, "a", "0,,0,1.5,4.2,1e-4,900,\n")
    monkeypatch.setitem(__import__("sys").modules, "matplotlib.figure", None)
    with pytest.raises(SystemExit):
        main(["plot", "a"])
    assert 'pip install "tinylm[plots]"' in capsys.readouterr().err
