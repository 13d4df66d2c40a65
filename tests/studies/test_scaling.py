"""`tinylm scaling`: the ladder's arithmetic, the power-law and IsoFLOP fits, and the command's reuse of runs."""

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import yaml

from tinylm.cli import main
from tinylm.studies.scaling import fit_power_law, isoflop_optimum, ladder_time_left, rung

SHAPE = {"vocab_size": 65, "block_size": 16, "bias": True, "pad_vocab_multiple": 1}


def _finished_runs(cfg, sizes, loss_of, budget: float = 1e8, tokens_per_step: int = 32) -> None:
    """Ladder runs of the tiny config as if finished: a val/loss at their last step (head size 8); loss_of(rung, i)
    gives each one's loss."""
    from tinylm.cli.fit_config import fit_objects

    cli = fit_objects(["--config", str(cfg)])
    shape = {"vocab_size": cli.model.hparams.vocab_size, "block_size": 16, "bias": True, "pad_vocab_multiple": 1}
    for i, (n_layer, n_embd) in enumerate(sizes):
        r = rung(n_layer=n_layer, n_embd=n_embd, head_size=8, budget=budget, tokens_per_step=tokens_per_step, **shape)
        folder = cfg.parent / "runs" / f"tiny-C{budget:.1e}-{r.label}".replace("+", "") / "csv"
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(f"epoch,step,val/loss\n0,{r.max_steps - 1},{loss_of(r, i)}\n")


def test_rung_spends_the_budget():
    """max_steps x tokens per step x FLOPs per token is the budget (to rounding): a ladder that is not
    compute-matched compares models trained on different compute and its fit means nothing."""
    r = rung(n_layer=2, n_embd=32, head_size=16, budget=1e10, tokens_per_step=64, **SHAPE)
    assert r.n_head == 2 and r.max_steps == round(1e10 / (r.flops_per_token * 64))
    assert abs(r.max_steps * 64 * r.flops_per_token / 1e10 - 1) < 0.01
    with pytest.raises(ValueError, match="head size"):
        rung(n_layer=2, n_embd=40, head_size=16, budget=1e10, tokens_per_step=64, **SHAPE)


def test_rung_warms_up_for_at_most_a_tenth_of_its_steps():
    """Catches a small budget's rungs keeping the config's warmup: rungs of 17 to 76 steps under a warmup of 100
    never reach the peak LR, the larger (fewer steps) the lower, and the fit measures the schedule, not the size."""
    long = rung(n_layer=2, n_embd=32, head_size=16, budget=1e11, tokens_per_step=64, warmup_steps=100, **SHAPE)
    short = rung(n_layer=2, n_embd=32, head_size=16, budget=1e9, tokens_per_step=64, warmup_steps=100, **SHAPE)
    assert long.max_steps > 1000 and long.warmup_steps == 100
    assert 10 < short.max_steps < 1000 and short.warmup_steps == short.max_steps // 10


def test_fit_power_law_recovers_a_known_law():
    """Losses made from L = 1.5 + 30 N^-0.5 give back E, A and alpha (a fit stuck on its grid's edge or with E and
    A swapped would not), and losses that rise with size are refused with the reason."""
    ns = [1e4, 3e4, 1e5, 3e5]
    law = fit_power_law(ns, [1.5 + 30 * n**-0.5 for n in ns])
    assert (law.E, law.A, law.alpha) == pytest.approx((1.5, 30, 0.5), rel=0.02)
    assert law.rmse < 1e-3 and law(1e6) == pytest.approx(1.5 + 30 * 1e6**-0.5, abs=1e-3)
    with pytest.raises(ValueError, match="do not fall with model size"):
        fit_power_law(ns, [2.0, 2.1, 2.2, 2.3])
    ladder = [2e3, 4e3, 6e3, 8e3, 1e4]  # a narrow range, as the default ladder's: a grid alone was 0.03 nats off E
    law = fit_power_law(ladder, [1.69 + 406.4 * n**-0.34 for n in ladder])
    assert (law.E, law.A, law.alpha) == pytest.approx((1.69, 406.4, 0.34), rel=1e-6)


@pytest.mark.parametrize("ns, losses, message", [
    ([1e6, 1e7, 1e8, 1e9], [2.0, 1.8, 1.9, 2.1], "only at the edge of the exponents"),  # falls, then rises
    ([1e6, 1e7, 1e8, 1e9], [2.0, float("nan"), 1.7, 1.65], "finite losses"),
    ([1e6, 1e7, 1e8, 1e9], [2.0, float("inf"), 1.7, 1.65], "finite losses"),
    ([0, 1e7, 1e8, 1e9], [2.0, 1.8, 1.7, 1.65], "positive sizes"),
    ([1e6, 1e7, 1e8, 1e9], [2.0, 1.8, 1.7], "4 sizes and 3 losses"),
])
def test_fit_power_law_refuses_what_no_law_describes(ns, losses, message):
    """Catches a NaN loss (a diverged rung) coming out as L = nan + nan N^-0.01, and a U-shaped ladder as a
    confident law with alpha pinned at the grid's edge, 0.25 nats off its next point."""
    with pytest.raises(ValueError, match=message):
        fit_power_law(ns, losses)


def test_fit_power_law_keeps_the_irreducible_loss_non_negative():
    """Losses that fall nearly as a pure power law (here: L = -0.4 + 12 N^-0.08, which a free fit matches exactly)
    must not give a negative irreducible loss, which would predict a cross-entropy below 0 for large N."""
    ns = [1e5, 3e5, 1e6, 3e6, 1e7]
    law = fit_power_law(ns, [-0.4 + 12 * n**-0.08 for n in ns])
    assert law.E >= 0 and law(1e15) > 0
    assert law.rmse < 0.01  # still a close fit over the points


def test_isoflop_optimum_is_the_parabola_minimum():
    """A U-shaped IsoFLOP curve with its minimum at N = 1e5 gives that N; a curve still falling at its largest
    model gives None (the optimum is beyond the ladder), not an extrapolated guess."""
    ns = [1e4, 3e4, 1e5, 3e5, 1e6]
    u = [2.0 + 0.1 * (np.log(n) - np.log(1e5)) ** 2 for n in ns]
    n_opt, l_opt = isoflop_optimum(ns, u)
    assert n_opt == pytest.approx(1e5, rel=1e-6) and l_opt == pytest.approx(2.0)
    assert isoflop_optimum(ns, [3.0, 2.5, 2.2, 2.0, 1.9]) is None
    # a power law falls all along: a parabola through it had its vertex inside the ladder (here at ~3.3e4, at a
    # loss below the law's floor 2.0), named as the optimum though the largest rung measured the lowest loss
    law = [2.0 + 3165 * n**-1.18 for n in (800, 2000, 5000, 12_000)]
    assert isoflop_optimum([800, 2000, 5000, 12_000], law) is None
    assert isoflop_optimum(ns, list(reversed([3.0, 2.5, 2.2, 2.0, 1.9]))) is None  # rising: the optimum is below


def test_scaling_command_reuses_finished_runs_and_trains_the_rest(run_config, capsys):
    """Finished ladder runs are reused (a rerun after an interruption must not retrain them), the missing model is
    trained as an ordinary run in its own folder (without the config's text samples, and with the default head
    size: the largest dividing the config's 16 and every width), and the law fitted over the ladder's logged losses
    comes out."""
    cfg = run_config(samples={"every_n_steps": 1})
    sizes = [[1, 8], [1, 16], [2, 16]]
    _finished_runs(cfg, sizes, lambda r, _: 1.5 + 30 * r.params**-0.5)  # losses from L = 1.5 + 30 N^-0.5
    config = yaml.safe_load(cfg.read_text())
    del config["trainer"]["max_steps"]  # (each run's steps follow from the budget: none needed)
    cfg.write_text(yaml.safe_dump(config))
    args = ["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes), "--predict", "[1,24]",
            "--out", "fit.png"]
    main(args)
    out = capsys.readouterr().out
    result = json.loads((cfg.parent / "fit.json").read_text())
    assert (result["law"]["E"], result["law"]["A"], result["law"]["alpha"]) == pytest.approx((1.5, 30, 0.5), rel=0.05)
    for n_layer, n_embd in sizes:  # reused, not retrained
        assert not (cfg.parent / "runs" / f"tiny-C1.0e08-L{n_layer}-d{n_embd}" / "checkpoints").exists()
    trained = cfg.parent / "runs" / "tiny-C1.0e08-L1-d24"
    assert (trained / "checkpoints" / "last.ckpt").is_file()
    saved = yaml.safe_load((trained / "config.yaml").read_text())
    assert saved["samples"]["every_n_steps"] == 0 and saved["model"]["n_head"] == 3  # 24 / 8
    assert (saved["model"]["decay_steps"] is None
            and saved["model"]["warmup_steps"] == result["runs"][-1]["warmup_steps"])
    assert result["prediction"]["measured"] > 0 and "prediction for L1-d24" in out
    assert "3 points for its 3 parameters: it passes through them, so the rmse checks nothing" in out  # (it said 0)
    assert (cfg.parent / "fit.png").stat().st_size > 10_000
    main(args)  # everything finished: nothing trains again, same answer
    assert json.loads((cfg.parent / "fit.json").read_text())["prediction"] == result["prediction"]
    capsys.readouterr()
    for other in (["--model.warmup_steps", "5"], ["--data.seed", "7"]):  # trained otherwise: not this ladder's run
        with pytest.raises(SystemExit):
            main(args + other)
        err = capsys.readouterr().err
        assert "holds a run of another ladder" in err and f"{other[0][2:]} " in err, err


def test_a_rung_of_another_warmup_alone_names_the_earlier_tinylm_that_kept_it(tmp_path):
    """Catches "a ladder run by an earlier tinylm kept the config's warmup" said of a rung whose warmup differs with
    its steps (another batch size): only a warmup that alone differs may be that."""
    from types import SimpleNamespace

    from tinylm.cli.scaling import check_ladder_run

    rung = SimpleNamespace(n_layer=1, n_embd=8, n_head=1, warmup_steps=2, max_steps=28)
    for max_steps, earlier in ((28, True), (55, False)):
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({
            "model": {"n_layer": 1, "n_embd": 8, "n_head": 1, "warmup_steps": 5, "decay_steps": None},
            "trainer": {"max_steps": max_steps}}))
        with pytest.raises(ValueError, match="holds a run of another ladder: model.warmup_steps 5") as e:
            check_ladder_run(tmp_path, rung, {})
        assert ("earlier tinylm" in str(e.value)) == earlier, e.value


class TermAtTheFinalValidation(L.Callback):
    """SIGTERM reaches the run as it validates after its last step (a final validation can take minutes)."""

    def on_validation_start(self, trainer, pl_module):
        if trainer.global_step == trainer.max_steps:
            os.kill(os.getpid(), signal.SIGTERM)


def test_scaling_stops_on_a_signal_during_a_runs_final_validation(run_config, capsys):
    """Catches a SIGTERM that came while a rung validated after its last step being forgotten (the run had nothing
    left to stop): the ladder went on to train the next rung, deaf to it."""
    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16]]
    _finished_runs(cfg, sizes[:2], lambda r, _: 1.5 + 30 * r.params**-0.5)
    args = ["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes), "--predict", "[1,24]",
            "--trainer.callbacks+=test_scaling.TermAtTheFinalValidation"]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 143
    err = capsys.readouterr().err
    assert "interrupted by SIGTERM as" in err and "tinylm scaling --config" in err, err
    runs = cfg.parent / "runs"
    assert (runs / "tiny-C1.0e08-L2-d16" / "checkpoints" / "last.ckpt").is_file()  # it finished
    assert not (runs / "tiny-C1.0e08-L1-d24").exists()  # the next did not start


class TermAtStep3(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 3:
            os.kill(os.getpid(), signal.SIGTERM)


def test_scaling_rerun_resumes_a_run_interrupted_after_a_checkpoint(run_config, capsys):
    """Catches the documented "rerunning the command resumes an interrupted run" breaking: the rung set aside and
    trained from scratch, or its folder refused as another run's. And a ladder under gradient accumulation failing
    (validation is due after max_steps x accumulate micro-batches, not max_steps)."""
    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16]]
    _finished_runs(cfg, sizes, lambda r, _: 1.5 + 30 * r.params**-0.5, tokens_per_step=64)
    args = ["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes), "--predict", "[1,24]",
            "--trainer.accumulate_grad_batches", "2", "--out", "fit.png"]
    with pytest.raises(SystemExit) as e:
        main([*args, "--trainer.callbacks+=test_scaling.TermAtStep3"])
    assert e.value.code == 143
    capsys.readouterr()
    main(args)
    result = json.loads((cfg.parent / "fit.json").read_text())
    run = cfg.parent / "runs" / "tiny-C1.0e08-L1-d24"
    assert not list(run.parent.glob("*.unfinished-*")) and [p.name for p in run.glob("config.resume-*")] == \
        ["config.resume-step3.yaml"]
    steps = result["runs"][-1]["steps"]
    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["val_check_interval"] == 2 * steps
    assert result["tokens_per_step"] == 64 and result["prediction"]["measured"] > 0


def test_scaling_counts_the_tokens_of_every_device(run_config, monkeypatch):
    """Catches a ladder on 2 devices training every rung for twice its budget: a step takes every device's batch."""
    import tinylm.cli.fit

    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16], [1, 24]]
    _finished_runs(cfg, sizes, lambda r, _: 1.5 + 30 * r.params**-0.5, tokens_per_step=64)  # 2 devices x 32

    def trains(argv, **kwargs):  # every rung is finished at the 2-device length: nothing may train
        raise AssertionError(f"trained {argv}")

    monkeypatch.setattr(tinylm.cli.fit, "lightning_main", trains)
    main(["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes[:3]), "--predict", "[1,24]",
          "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--out", "fit.png"])
    assert json.loads((cfg.parent / "fit.json").read_text())["tokens_per_step"] == 64


def test_scaling_holds_no_weights_of_the_configs_model(run_config, monkeypatch):
    """Catches the ladder building the config's own model for real (to read its hyperparameters) and holding it
    through every rung: gpt2-124m.yaml's 0.5 GB, gpt2-1.5b.yaml's 6 GB of weights that no rung trains. Its shapes
    are read on the meta device, as plan's are, and the ladder's numbers are those of the config's n_layer."""
    import tinylm.cli.fit
    import tinylm.cli.fit_config

    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16], [1, 24]]
    _finished_runs(cfg, sizes, lambda r, _: 1.5 + 30 * r.params**-0.5)
    built = []

    def kept(fit_args, **kwargs):
        built.append(cli := objects(fit_args, **kwargs))
        return cli

    def trains(argv, **kwargs):  # every rung is finished: nothing may train
        raise AssertionError(f"trained {argv}")

    objects = tinylm.cli.fit_config.fit_objects
    monkeypatch.setattr(tinylm.cli.fit_config, "fit_objects", kept)
    monkeypatch.setattr(tinylm.cli.fit, "lightning_main", trains)
    main(["scaling", "--config", str(cfg), "--model.n_layer", "3", "--budget", "1e8", "--sizes",
          json.dumps(sizes[:3]), "--predict", "[1,24]", "--out", "fit.png"])
    (cli,) = built
    assert all(p.is_meta for p in cli.model.parameters()) and cli.model.hparams.n_layer == 3
    assert json.loads((cfg.parent / "fit.json").read_text())["prediction"]["measured"] > 0


def test_scaling_restarts_a_run_stopped_before_its_first_checkpoint(run_config, capsys):
    """Catches a rung killed (kill -9, out of memory) before its first checkpoint blocking every rerun of the
    ladder: fit refused its folder of logs as another run's. Its logs are kept aside, and it trains again; a run
    another process is training is left where it is."""
    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16]]
    _finished_runs(cfg, sizes, lambda r, _: 1.5 + 30 * r.params**-0.5)
    killed = cfg.parent / "runs" / "tiny-C1.0e08-L1-d24"
    (killed / "csv").mkdir(parents=True)
    (killed / "csv" / "metrics.csv").write_text("epoch,step,train/loss\n0,0,4.1\n")  # one logged step, no checkpoint
    args = ["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes), "--predict", "[1,24]"]
    # unless it is not stopped at all: another process trains it (and holds its lock)
    hold = ("import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(killed / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(SystemExit):
            main(args)
        assert "is in use by another tinylm process" in capsys.readouterr().err
        assert not list(killed.parent.glob("*.unfinished-*"))
    finally:
        holder.kill()
        holder.wait()
    main(args)
    assert (killed / "checkpoints" / "last.ckpt").is_file()
    assert (killed / ".lock").read_text() == f"pid {os.getpid()}"  # its lock is the new run's, in the new folder
    aside = list(killed.parent.glob("tiny-C1.0e08-L1-d24.unfinished-*"))
    assert len(aside) == 1 and (aside[0] / "csv" / "metrics.csv").read_text().endswith("0,0,4.1\n")


def test_scaling_retrains_a_run_that_ended_without_its_final_val_loss(run_config, monkeypatch, caplog):
    """Catches a rung trained to its last step whose final val/loss was not logged (validation off, or killed as it
    validated) blocking every rerun: its resume was refused ("already at step N >= --trainer.max_steps: nothing to
    train; pass a larger --trainer.max_steps", an option scaling ignores). Its logs are kept aside; it trains again."""
    import torch

    import tinylm.cli.fit

    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16]]
    _finished_runs(cfg, sizes, lambda r, _: 1.5 + 30 * r.params**-0.5)
    run = cfg.parent / "runs" / "tiny-C1.0e08-L1-d24"
    (run / "checkpoints").mkdir(parents=True)
    (run / "csv").mkdir()
    (run / "csv" / "metrics.csv").write_text("epoch,step,train/loss,val/loss\n0,9,3.0,\n")  # no val/loss logged
    from tinylm.checkpoint import CHECKPOINT_FORMAT

    torch.save({"global_step": 10**6, "state_dict": {}, "tinylm": {"format": CHECKPOINT_FORMAT}},  # past its last step
               run / "checkpoints" / "last.ckpt")
    trained = []

    def trains(argv, **kwargs):  # the rung's new run: its final val/loss logged
        trained.append(argv)
        (run / "csv").mkdir(parents=True)
        (run / "csv" / "metrics.csv").write_text(f"epoch,step,val/loss\n0,{10**6},2.0\n")

    monkeypatch.setattr(tinylm.cli.fit, "lightning_main", trains)
    with caplog.at_level("INFO", logger="tinylm"):
        main(["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes), "--predict",
              "[1,24]", "--out", "fit.png"])
    assert "ended without a final val/loss in its csv/metrics.csv; its logs are now in" in caplog.text
    assert len(trained) == 1 and "--ckpt_path" not in trained[0]  # from scratch, not a resume
    assert json.loads((cfg.parent / "fit.json").read_text())["prediction"]["measured"] == 2.0
    aside = list(run.parent.glob("tiny-C1.0e08-L1-d24.unfinished-*"))
    assert len(aside) == 1 and (aside[0] / "checkpoints" / "last.ckpt").is_file()


def test_final_val_loss_leaves_out_a_row_cut_short(tmp_path):
    """Catches a rung whose final row was cut as it was written (a kill, the machine's end: "0,9,2.0" of
    "0,9,2.0512") read as finished at the cut number: a rerun reused it and fitted the law to 2.0, where a row
    without its newline is no row (as plot and a resume read it) and the rung trains again."""
    from tinylm.cli.scaling import final_val_loss

    (tmp_path / "csv").mkdir()
    path = tmp_path / "csv" / "metrics.csv"
    path.write_text("epoch,step,val/loss\r\n0,4,2.5\r\n0,9,2.0512\r\n")  # (csv's own line ends)
    assert final_val_loss(tmp_path, 10) == 2.0512
    path.write_text("epoch,step,val/loss\r\n0,4,2.5\r\n0,9,2.0")
    assert final_val_loss(tmp_path, 10) is None


def test_scaling_without_a_law_still_reports(run_config, capsys):
    """Losses that rise with size (a budget past the ladder's optimal size, as happens on small data) give no
    power law, but the command still prints the table and the measured larger model instead of failing after
    hours of training; every run here is finished, so nothing trains."""
    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16], [1, 24]]  # the last is --predict
    _finished_runs(cfg, sizes, lambda _, i: [1.9, 1.93, 2.0, 2.1][i])  # rising: the optimum is below the ladder
    main(["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes[:3]), "--predict",
          json.dumps(sizes[3]), "--head_size", "8", "--out", "u.png"])
    out = capsys.readouterr().out
    result = json.loads((cfg.parent / "u.json").read_text())
    assert "do not fall with model size" in result["law"]["none"] and "no law over the first 3" in out
    assert result["prediction"]["measured"] == 2.1 and "compute-optimal size for this budget" in out
    assert (cfg.parent / "u.png").stat().st_size > 10_000
    main(["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes[:3]), "--predict",
          json.dumps(sizes[3]), "--head_size", "8"])  # the default name tells ladders apart: none overwrites another
    assert (cfg.parent / "runs" / "tiny-scaling-C1.0e08-L1-d8_L1-d16_L2-d16_L1-d24.json").is_file()


def test_scaling_warns_when_whole_steps_miss_the_budget(run_config, capsys, caplog):
    """Catches a ladder whose larger rungs get 1-2 steps (a rung needing 1.49 steps trained 1: a third of the
    budget) reported as compute-matched without a word."""
    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16], [1, 24]]
    _finished_runs(cfg, sizes, lambda _, i: [2.4, 2.3, 2.2, 2.1][i], budget=3e6)
    main(["scaling", "--config", str(cfg), "--budget", "3e6", "--sizes", json.dumps(sizes[:3]), "--predict",
          json.dumps(sizes[3]), "--head_size", "8", "--out", "w.png"])
    assert "L1-d24 trains 2 steps" in caplog.text and "not compute-matched; raise --budget" in caplog.text
    assert "L1-d8 trains" not in caplog.text  # ~12 steps: within 5 %


def test_scaling_refuses_a_diverged_rung(run_config, capsys):
    """Catches a rung whose final val/loss is nan flowing into the fit and a report with exit status 0."""
    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16], [1, 24]]
    _finished_runs(cfg, sizes, lambda _, i: [2.4, float("nan"), 2.1, 2.0][i])
    with pytest.raises(SystemExit) as e:
        main(["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes[:3]), "--predict",
              json.dumps(sizes[3]), "--head_size", "8"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 1 and "tiny-C1.0e08-L1-d16 ended with val/loss nan" in last and "--model.lr" in last


def test_scaling_refuses_a_folder_of_another_ladder(run_config):
    """Catches a rung's folder from another --head_size (or budget with the same rounded tag, or model options)
    being reused as this rung: its loss reported as this model's, or its checkpoint resumed as it."""
    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16]]
    folder = cfg.parent / "runs" / "tiny-C1.0e08-L1-d8"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"model": {"n_layer": 1, "n_embd": 8, "n_head": 8},
                                                        "trainer": {"max_steps": 3}}))
    with pytest.raises(SystemExit):
        main(["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes), "--predict",
              "[1,24]", "--head_size", "8"])
    assert not (cfg.parent / "runs" / "tiny-C1.0e08-L1-d16").exists()  # refused before anything trained


@pytest.mark.parametrize("args, message", [
    (["--head_size", "0"], "head_size"),
    (["--predict", "[1,16]"], "repeat a size"),
    (["--budget", "1e-3"], "less than one step.*raise --budget"),
    (["--head_size", "3"], r"\[1, 8\] with head size 3.*--head_size"),
    (["--out", "fit.json"], "--out must name a .png file"),
    (["--budget", "1e30"], r"budget must be in \(0, 1e24\]"),
    (["--sizes", "[[1,7],[1,12],[1,16]]"], "share no head size above 1.*--head_size"),  # heads of one channel
    (["--ckpt_path", "x.ckpt"], "--ckpt_path x.ckpt is an option of `tinylm fit`"),  # was passed to every run
    (["--sizes", "[[1,-8],[1,16],[2,16]]"], r"n_layer and n_embd >= 1, got \[\[1, -8\]"),  # was about n_head -2
    (["--sizes", "[[1,8],[1,16]]"], r"at least 3 .* got \[\[1, 8\], \[1, 16\]\]"),  # not Python's tuples
    # every rung was the pretrained model, trained at each rung's length and labelled with the rung's size
    (["--model.init_from", "x.ckpt"], "model.init_from 'x.ckpt': tinylm scaling trains each size .*from scratch"),
    # the first rung trained, then "ended without a final val/loss"; and a rerun was refused ("nothing to train")
    (["--trainer.limit_val_batches", "0"], "trainer.limit_val_batches 0: .* reads each run's final val/loss"),
    (["--trainer.logger", "false"], "trainer.logger false: .* reads each run's final val/loss"),
])
def test_scaling_bad_options_fail_in_one_line_before_training(run_config, capsys, args, message):
    cfg = run_config()
    base = ["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", "[[1,8],[1,16],[2,16]]",
            "--predict", "[1,24]"]
    with pytest.raises(SystemExit) as e:
        main(base + args)
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]  # (earlier lines: logging from the config's data preparation)
    assert e.value.code != 0 and last.startswith("tinylm scaling: error:") and re.search(message, last), err
    assert not (cfg.parent / "runs").exists()


def test_scaling_names_the_options_it_sets_per_run(run_config, caplog):
    """Catches --trainer.max_steps (or the validation interval, the decay length, the width) ignored without a
    word: each run's length follows from --budget, its shape from --sizes."""
    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16], [1, 24]]
    _finished_runs(cfg, sizes, lambda r, _: 1.5 + 30 * r.params**-0.5)
    main(["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes[:3]), "--predict",
          "[1,24]", "--trainer.max_steps", "5", "--model.decay_steps=9", "--model.n_embd", "64", "--model.n_head", "4"])
    # not --model.n_head: the config's head size (n_embd / n_head) sets the rungs' heads
    assert "ignoring --trainer.max_steps --model.decay_steps --model.n_embd\n" in caplog.text
    caplog.clear()
    main(["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(sizes[:3]), "--predict",
          "[1,24]", "--trainer.val_check_interval=5"])
    assert "ignoring --trainer.val_check_interval" in caplog.text


def test_scaling_counts_the_configs_architecture():
    """Catches the ladder sizing a plain nanoGPT when the config has RoPE (no position table) and an untied head."""
    plain = rung(n_layer=1, n_embd=16, head_size=8, budget=1e10, tokens_per_step=64, **SHAPE)
    modern = rung(n_layer=1, n_embd=16, head_size=8, budget=1e10, tokens_per_step=64, **SHAPE,
                  positions="rope", tie_embeddings=False)
    assert modern.params == plain.params - 16 * 16 + 65 * 16  # no position table (block 16), an LM head of its own


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("losses, side", [([1.9, 2.3, 2.4, 2.5], "below"), ([2.4, 2.2, 2.1, 2.05], "above")])
def test_scaling_says_on_which_side_the_optimum_lies(run_config, capsys, losses, side, reverse):
    """Catches "beyond the ladder (the loss still falls)" printed for losses that rise from the smallest model, and
    the side named from the order of --sizes (largest first: the other side) instead of the models' sizes."""
    cfg = run_config()
    sizes = [[1, 8], [1, 16], [2, 16], [1, 24]]  # the last is --predict
    ladder, given = (sizes[2::-1], losses[2::-1] + losses[3:]) if reverse else (sizes[:3], losses)
    _finished_runs(cfg, ladder + sizes[3:], lambda _, i: given[i])
    main(["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", json.dumps(ladder), "--predict",
          json.dumps(sizes[3]), "--head_size", "8", "--out", "s.png"])
    assert f"{side} the ladder's range" in capsys.readouterr().out



def test_scaling_says_rung_k_of_n_and_the_ladders_time_left(run_config, capfd, caplog):
    """Catches a ladder that trains for hours saying nothing of where it is: each rung says "rung k of n" (a reused
    one says so), and from the second trained rung on, the ladder's time left; the end names the plot command. And
    each rung printing Lightning's 9-line model summary (5 rungs: 45 lines of it), which says again what its
    "scaling: rung" line says (a config that sets enable_model_summary still decides)."""
    import shlex

    cfg = run_config()
    settings = yaml.safe_load(cfg.read_text())
    del settings["trainer"]["enable_model_summary"]  # Lightning's default: a summary at every fit
    cfg.write_text(yaml.safe_dump(settings))
    sizes = [[1, 8], [1, 12], [1, 16]]
    _finished_runs(cfg, sizes[:1], lambda r, _: 1.5 + 30 * r.params**-0.5, budget=1e6)  # (rungs of 1-3 steps)
    with caplog.at_level("INFO", logger="tinylm"):
        main(["scaling", "--config", str(cfg), "--budget", "1e6", "--sizes", json.dumps(sizes), "--predict", "[1,20]",
              "--out", "k.png"])
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scaling: rung")]
    assert [s.split(":")[1].strip() for s in said] == [f"rung {k} of 4" for k in (1, 2, 3, 4)], said
    assert "(finished before: reused)" in said[0] and "left" not in said[1]
    assert re.search(r"about \S+ left for the ladder \(2 runs to train\)", said[2]), said[2]
    assert re.search(r"about \S+ left for the ladder \(1 run to train\)", said[3]), said[3]
    said = capfd.readouterr()
    assert "| Name" not in said.out + said.err  # (rungs 2-4 trained: none printed a model summary)
    plot = said.out.split("next:\n", 1)[1].strip()
    assert plot.startswith("tinylm plot ") and all(Path(p).is_dir() for p in shlex.split(plot)[2:])


def test_scaling_and_its_rungs_read_the_data_of_the_run_the_config_names(run_config, tmp_path, monkeypatch):
    """Catches a ladder on a config whose run (runs/tiny, trained with --data.corpus my.txt) is there reading the
    config's corpus instead (one not to be had here), or its rungs doing so: each rung's fit is given the run's."""
    from tinylm.cli import scaling

    corpus = str(tmp_path / "shakespeare_small.txt")
    cfg = run_config(data={"corpus": str(tmp_path / "gone.txt")})
    record = yaml.safe_load(cfg.read_text())
    record["data"]["corpus"] = corpus  # what `tinylm fit --config tiny.yaml --data.corpus my.txt` writes
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    (tmp_path / "runs" / "tiny" / "config.yaml").write_text(yaml.safe_dump(record))
    given = []

    def rung_trained(run_dir, r, fit_args, accumulate):  # what the rung's `fit` is told, instead of training it
        given.append(fit_args)
        return 1.5 + 30 * r.params**-0.5

    monkeypatch.setattr(scaling, "_train_rung", rung_trained)
    main(["scaling", "--config", str(cfg), "--budget", "1e8", "--sizes", "[[1,8],[1,16],[2,16]]", "--predict",
          "[1,24]", "--out", "fit.png"])
    assert len(given) == 4 and all(f"--data.corpus={corpus}" in args for args in given)


def test_ladder_time_left_counts_a_resumed_rung_by_the_steps_it_trained(tmp_path, monkeypatch, caplog):
    """Catches the ladder's time left taken as the mean time of the rungs trained, a rung resumed at its last
    quarter counted whole: 10 s for a quarter of a rung is 40 s a rung, not 10."""
    from tinylm.cli import scaling
    from tinylm.cli.summary import duration

    assert ladder_time_left(10.0, 0.25, 2) == 80.0 and ladder_time_left(30.0, 1.5, 1) == 20.0
    assert ladder_time_left(0.0, 0.0, 3) is None and ladder_time_left(5.0, 1.0, 0) is None
    rungs = [rung(n_layer=1, n_embd=n, head_size=8, budget=1e8, tokens_per_step=64, **SHAPE) for n in (8, 16, 24)]
    clock = iter([0.0, 10.0, 100.0, 140.0, 200.0, 240.0])
    monkeypatch.setattr(scaling.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(scaling, "_resume_step", lambda run_dir, max_steps: 3 * max_steps // 4 * (run_dir.name == "a"))
    monkeypatch.setattr(scaling, "_train_rung", lambda *args: 2.0)
    with caplog.at_level("INFO", logger="tinylm"):
        scaling._train_ladder(rungs, [tmp_path / n for n in "abc"], [], 1)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scaling: rung")]
    trained = (rungs[0].max_steps - 3 * rungs[0].max_steps // 4) / rungs[0].max_steps  # about a quarter
    assert f"about {duration(10 / trained * 2)} left for the ladder (2 runs" in said[1], said


def test_the_fits_rmse_is_its_residuals_root_mean_square():
    """Catches the printed rmse off by sqrt(points) (the square root of the sum of squares): only rmse < tol on
    exact data was checked. With noise, it equals the residuals' root mean square to the fitted law."""
    from tinylm.studies.scaling import fit_power_law

    ns = [1e4, 3e4, 1e5, 3e5, 1e6]
    noise = [0.02, -0.015, 0.01, -0.02, 0.012]
    losses = [1.5 + 30 * n**-0.5 + e for n, e in zip(ns, noise)]
    law = fit_power_law(ns, losses)
    residuals = [law(n) - y for n, y in zip(ns, losses)]
    assert law.rmse == pytest.approx(math.sqrt(sum(r * r for r in residuals) / len(ns)), rel=1e-6)
    assert 0.005 < law.rmse < 0.02  # (not vacuous: the noise shows)


def test_scaling_rerun_with_seed_everything_true_reuses_its_own_runs(run_config, monkeypatch, capsys):
    """Catches a rerun of `tinylm scaling --seed_everything true` refusing the ladder's own finished runs ("holds a
    run of another ladder: seed_everything A (this ladder: B)": each command drew a new seed), where the docs promise
    that rerunning the command reuses finished runs and resumes interrupted ones."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    cfg = run_config()
    args = ["scaling", "--config", str(cfg), "--budget", "1e6", "--sizes", "[[1,8],[1,16],[2,16]]", "--predict",
            "[1,24]", "--seed_everything", "true", "--out", "fit.png"]
    main(args)
    first = json.loads((cfg.parent / "fit.json").read_text())
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # another process: seeding had set it
    main(args)
    assert json.loads((cfg.parent / "fit.json").read_text())["runs"] == first["runs"]
