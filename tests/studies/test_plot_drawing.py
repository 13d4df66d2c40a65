"""`tinylm plot` draws what the run logged (a lone point, NaN steps, one outlier, a resume), names what it cannot draw,
replaces no picture of the user's, and imports no torch to draw a CSV."""
import json
import subprocess
import sys

import pytest

from tinylm.cli import main
from tinylm.studies.curves import read_run

HEADER = "epoch,step,train/grad_norm,train/loss,train/lr,train/tokens_per_sec,val/loss\n"


def _run(tmp_path, name: str, rows: str):
    folder = tmp_path / "runs" / name
    (folder / "csv").mkdir(parents=True)
    (folder / "csv" / "metrics.csv").write_text(HEADER + rows, encoding="utf-8")
    return folder


def _drawn(folder):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from tinylm.studies.curves import draw_runs

    fig = Figure()
    draw_runs(fig, [read_run(folder)])
    return fig.axes


def test_plot_imports_neither_torch_nor_lightning(tmp_path):
    """Catches `tinylm plot` importing torch and Lightning (via tinylm.cli.fit_config) for a picture of a CSV:
    ~6 s of CPU, 20 s on a loaded 2-core machine, against 3 s."""
    csv = _run(tmp_path, "a", "0,0,1.0,4.0,1e-3,900,\n0,1,1.0,3.9,1e-3,900,3.8\n") / "csv" / "metrics.csv"
    code = ("import json, sys; from tinylm.cli import main\ntry: main(sys.argv[1:])\nexcept SystemExit as e: "
            "print('exit', e.code)\nprint(json.dumps(['torch' in sys.modules, 'lightning' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code, "plot", str(csv), "--out", str(tmp_path / "p.png")],
                          capture_output=True, text=True, timeout=600)
    assert (tmp_path / "p.png").is_file(), done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [False, False]


@pytest.mark.filterwarnings(r"ignore:Glyph \d+ .* missing from font:UserWarning")  # (the machine's fonts decide)
def test_plot_of_a_run_named_with_an_emoji(tmp_path, monkeypatch, capsys):
    """Catches `tinylm plot runs/x🚀` ending in `--runs: expected a list, got ["runs/x\\ud83d\\ude80"]`."""
    monkeypatch.chdir(tmp_path)
    _run(tmp_path, "x🚀", "0,0,1.0,4.0,1e-3,900,\n")
    main(["plot", "runs/x🚀", "--out", "p.png"])
    assert "x🚀: train/loss 4.0000 (step 1)" in capsys.readouterr().out


def test_plot_does_not_replace_a_users_own_png(tmp_path, monkeypatch, capsys):
    """Catches `tinylm plot RUN --out mine.png` silently replacing a picture of the user's (plan, lr-find and
    scaling refuse it); plot's own earlier picture is still replaced."""
    monkeypatch.chdir(tmp_path)
    _run(tmp_path, "a", "0,0,1.0,4.0,1e-3,900,\n")
    (tmp_path / "mine.png").write_bytes(b"\x89PNG\r\n\x1a\n the user's own picture")
    with pytest.raises(SystemExit):
        main(["plot", "a", "--out", "mine.png"])
    assert "--out 'mine.png' already exists" in capsys.readouterr().err
    assert (tmp_path / "mine.png").read_bytes().endswith(b"the user's own picture")
    main(["plot", "a", "--out", "p.png"])
    main(["plot", "a", "--out", "p.png"])  # its own: replaced
    main(["plot", "a"])
    main(["plot", "a"])  # the run folder's plot.png: replaced


def test_a_lone_point_and_nan_steps_are_drawn(tmp_path):
    """Catches a run of one logged row drawing four empty panels (a line of one point is invisible), and the NaN
    steps of a guard-halted run not drawn nor said at all (the loss panel showed one invisible point)."""
    axes = _drawn(_run(tmp_path, "one", "0,0,1.2,4.17,1e-3,900,\n"))
    assert all(line.get_marker() not in ("None", "", None) for ax in axes for line in ax.lines)
    axes = _drawn(_run(tmp_path, "nan", "0,0,0.7,4.08,1e-3,900,\n0,1,nan,nan,1e-3,900,\n0,2,nan,nan,1e-3,900,\n"))
    marked = [line for line in axes[0].lines if line.get_marker() == "x"]
    assert marked and list(marked[0].get_xdata()) == [2, 3]
    assert "NaN" in marked[0].get_label()


def test_one_outlier_does_not_flatten_the_loss_panel(tmp_path):
    """Catches one spike (a guard-skipped bad batch at 60 nats among 2-4) setting the loss panel's y-range to 0-60,
    which drew the whole descent as a flat line at the bottom."""
    rows = "".join(f"0,{s},1.0,{60.0 if s == 50 else 4 - s / 50},1e-3,900,\n" for s in range(100))
    ax = _drawn(_run(tmp_path, "spike", rows))[0]
    assert ax.get_ylim()[1] < 10
    assert any("above, up to 60" in line.get_label() for line in ax.lines)


def test_a_run_folder_without_its_csv_is_named_as_one(tmp_path, monkeypatch, capsys):
    """Catches `tinylm plot runs/x` of a run folder (config.yaml, checkpoints, wandb/) whose csv/metrics.csv is
    gone saying "pass a run folder written by `tinylm fit`": it is one; the line names what is missing and where
    its W&B run is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x" / "wandb").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "config.yaml").write_text("run: {name: x}\n")
    with pytest.raises(SystemExit):
        main(["plot", "runs/x"])
    err = capsys.readouterr().err
    assert "has no runs/x/csv/metrics.csv" in err and "runs/x/wandb" in err and "pass a run folder" not in err


def test_a_resume_is_drawn_as_a_seam(tmp_path):
    """Catches a resumed run (here with its accumulation doubled, so each later step holds twice the tokens)
    drawn as one seamless curve: the resume's record config.resume-step20.yaml marks step 20 in every panel."""
    folder = _run(tmp_path, "a", "".join(f"0,{s},1.0,{4 - s / 50},1e-3,900,\n" for s in range(40)))
    (folder / "config.resume-step20.yaml").write_text("trainer: {accumulate_grad_batches: 2}\n")
    assert read_run(folder).resumes == [20]
    for ax in _drawn(folder):
        assert any(list(line.get_xdata()) == [20, 20] for line in ax.lines)


def test_a_runs_opening_descent_is_not_clipped_as_an_outlier(tmp_path):
    """Catches the outlier clipping taking a run's first logged loss (10 nats, falling to ~1 within a few steps of
    300) for a spike: the panel ended at 7 and the run's start was a red triangle "1 point(s) above"."""
    import math

    rows = "".join(f"0,{s},1.0,{1 + 9 * math.exp(-s / 2) + (s % 7) / 70},1e-3,900,\n" for s in range(300))
    ax = _drawn(_run(tmp_path, "descent", rows))[0]
    assert ax.get_ylim()[1] >= 10
    assert not any("above, up to" in line.get_label() for line in ax.lines)


def test_a_mixtures_per_corpus_val_losses_are_drawn(tmp_path):
    """Catches a run on a mixture of corpora plotted with val/loss over all only: the val/loss/NAME each corpus
    logged (docs/data.md) were read and never drawn; they are drawn in the loss panel, named in its legend."""
    folder = tmp_path / "runs" / "mix"
    (folder / "csv").mkdir(parents=True)
    (folder / "csv" / "metrics.csv").write_text(
        "epoch,step,train/loss,train/lr,val/loss,val/loss/a.txt,val/loss/b.txt\n"
        "0,9,4.1,1e-3,,,\n0,9,,,4.0,3.9,4.1\n0,19,3.8,1e-3,,,\n0,19,,,3.7,3.6,3.8\n", encoding="utf-8")
    labels = [line.get_label() for line in _drawn(folder)[0].lines]
    assert "mix val/loss/a.txt" in labels and "mix val/loss/b.txt" in labels, labels


def test_a_long_runs_csv_keeps_only_the_columns_drawn(tmp_path):
    """Catches `tinylm plot` reading metrics.csv whole into memory and keeping a series of every column, a tuple a
    point: a 200,000-step run's train/skipped_steps and a callback's own per-step metric (train/mfu) cost time and
    memory for curves never drawn (356 MB, 9.5 s of CPU; now 197 MB, 5.1 s). A series is two arrays (16 bytes a
    point, not ~110); the drawn columns, alerts and NaN steps read as before."""
    folder = tmp_path / "runs" / "long"
    (folder / "csv").mkdir(parents=True)
    (folder / "csv" / "metrics.csv").write_text(
        "epoch,health/spike,step,train/loss,train/mfu,train/skipped_steps,val/loss,val/loss/web.txt,val/ppl\n"
        "0,,0,4.2,0.3,0.0,,,\n0,1.0,1,nan,0.3,1.0,,,\n0,,1,,,,3.9,3.8,49.4\n0,,2,4.0,0.3,0.0,,,\n0,,3,3.",
        encoding="utf-8")
    curves = read_run(folder)
    assert sorted(curves.series) == ["train/loss", "val/loss", "val/loss/web.txt"], sorted(curves.series)
    assert curves.series["train/loss"] == [(1, 4.2), (3, 4.0)] and curves.series["val/loss/web.txt"] == [(2, 3.8)]
    assert curves.alerts == [(2, "spike")] and curves.nonfinite == {"train/loss": [2]}
    assert [points.values.itemsize for points in curves.series.values()] == [8, 8, 8]  # (array("d"), not tuples)


def test_twenty_runs_are_told_apart(tmp_path):
    """Catches 20 runs overlaid (a sweep) drawn in 10 colours, the 11th in the 1st's, under a legend of 40 entries
    that squashed every panel to a sliver (7 runs' ran over the panel below): each run has its own colour, and a
    legend of many entries stands beside the panels, a run per entry, and its kinds of curve once each."""
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_hex
    from matplotlib.figure import Figure

    from tinylm.studies.curves import draw_runs

    runs = [read_run(_run(tmp_path, f"sweep-{r:02d}", f"0,0,1.0,{4 + r / 10},1e-3,900,\n0,9,,,,,{3.9 + r / 10}\n"))
            for r in range(20)]
    fig = Figure(figsize=(11, 7))
    draw_runs(fig, runs)
    loss = fig.axes[0]
    assert len({to_hex(line.get_color()) for line in loss.lines if line.get_label().endswith(" val/loss")}) == 20
    assert loss.get_legend() is None and len(fig.legends) == 1
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == [run.name for run in runs] + ["train/loss", "val/loss"], labels
    assert all(ax.get_position().height > 0.2 for ax in fig.axes), [ax.get_position().height for ax in fig.axes]
    fig = Figure(figsize=(11, 7))  # two runs' four entries: in the panel, as before
    draw_runs(fig, runs[:2])
    assert fig.axes[0].get_legend() is not None and not fig.legends


def test_the_headline_breaks_no_run_name_at_a_hyphen(tmp_path):
    """Catches the figure's title of many runs wrapped inside a run's name at its hyphen: "lr-" ended one line and
    "sweep-03: val/loss 1.730 ..." began the next."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from tinylm.studies.curves import _headline, draw_runs

    runs = [read_run(_run(tmp_path, f"lr-sweep-{r:02d}", "0,0,1.0,4.2,1e-3,900,\n0,9,,,,,3.9\n")) for r in range(10)]
    fig = Figure(figsize=(11, 7))
    draw_runs(fig, runs)
    lines = fig._suptitle.get_text().split("\n")
    assert len(lines) > 1 and all(any(_headline(run) in line for line in lines) for run in runs), lines


def test_a_slow_legend_placement_prints_no_warning(tmp_path, monkeypatch):
    """Catches `tinylm plot` of a 2,000,000-step run printing matplotlib's "UserWarning: Creating legend with
    loc="best" can be slow with large amounts of data." twice: nothing its user can act on (the legend is drawn)."""
    pytest.importorskip("matplotlib")
    import itertools
    import warnings

    import matplotlib.legend

    from tinylm.studies.curves import plot_runs

    clock = itertools.count(0, 2.0)  # every placement "takes" 2 s, as one among 2M points does
    monkeypatch.setattr(matplotlib.legend.time, "perf_counter", lambda: next(clock))
    folder = _run(tmp_path, "long", "0,0,1.0,4.2,1e-3,900,\n0,9,,,,,3.9\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_runs([read_run(folder)], tmp_path / "p.png")
    assert not [str(w.message) for w in caught if "legend" in str(w.message)], [str(w.message) for w in caught]
    assert (tmp_path / "p.png").is_file()


def test_the_steps_of_a_long_run_are_readable(tmp_path):
    """Catches the x axis of a 200,000-step run labelled 0, 25000, ... 200000, the labels running together into
    "100000125000150000175000200000" (0 px apart): from 100,000 steps they read 25k, 50k, ... (a short run's as
    before), a space at least between two."""
    pytest.importorskip("matplotlib")
    from tinylm.studies.curves import draw_runs
    from tinylm.studies.plots import figure_canvas

    for last, expected in ((199_999, "200k"), (299, "300")):
        fig, canvas = figure_canvas(figsize=(11, 7))
        draw_runs(fig, [read_run(_run(tmp_path / str(last), "long", f"0,0,1.0,4.2,1e-3,900,\n0,{last},1.0,2.1,1e-3,"
                                                                     "900,\n"))])
        canvas.draw()
        for ax in fig.axes:
            labels = [t for t in ax.get_xticklabels() if t.get_text() and 0 <= t.get_position()[0] <= last + 1]
            boxes = [t.get_window_extent() for t in labels]
            assert labels[-1].get_text() == expected and all(b.x0 - a.x1 >= 5 for a, b in zip(boxes, boxes[1:])), \
                [t.get_text() for t in labels]
