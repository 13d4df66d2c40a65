"""`tinylm lr-find`: Lightning's range test on a fit config, weights restored, the debiased curve of each step's
loss, the rule of thumb."""

import json
import re
import shlex
from pathlib import Path

import pytest
import torch
import yaml

from tinylm.cli import main
from tinylm.studies.lr_find import DIVERGED, SMOOTHING, diverged, rule_of_thumb_lr, smoothed


def test_rule_of_thumb_by_hand():
    """6e-4 at GPT-2 small's 124M parameters, x2 at a quarter of the size (sqrt scaling, not linear)."""
    assert rule_of_thumb_lr(124_000_000) == pytest.approx(6e-4)
    assert rule_of_thumb_lr(31_000_000) == pytest.approx(1.2e-3)


def test_the_curve_is_each_steps_loss_smoothed_and_debiased():
    """A constant loss gives the constant back at every point (Lightning's own debiasing, off by one step, started
    at about half of it and rose: the curve's first tens of points sloped the wrong way and the suggestion landed
    there), and each point averages what came before it."""
    assert smoothed([3.0] * 30) == pytest.approx([3.0] * 30)
    assert smoothed([2.0, 4.0]) == pytest.approx([2.0, (SMOOTHING * 0.02 * 2 + 0.02 * 4) / (1 - SMOOTHING ** 2)])


def test_the_sweep_ends_when_its_own_curve_passes_four_times_its_lowest_point():
    """Catches the sweep ended by Lightning's rule on its own curve: its first point was about half the loss, so a
    loss that doubled (4 -> 8.5) ended the sweep; and a NaN loss, which never ended it."""
    assert not diverged([4.0]) and not diverged([4.0, 8.5]) and not diverged([4.0] * 10 + [8.5] * 5)
    rising = [4.0] * 10 + [4.0 * DIVERGED * 1.5] * 200
    first = next(k for k in range(1, len(rising) + 1) if diverged(rising[:k]))
    curve = smoothed(rising[:first])
    assert curve[-1] > DIVERGED * 4.0 >= curve[-2]  # the first point past 4x the lowest one
    assert diverged([4.0, 3.9, float("nan")]) and diverged([4.0, float("inf")])


def _red_pixels(png) -> int:
    """Pixels of matplotlib's C3 red (#d62728), the colour of the config's lr line."""
    from matplotlib.image import imread

    rgb = imread(str(png))[..., :3]
    return int((abs(rgb - torch.tensor([0xD6, 0x27, 0x28]).numpy() / 255).max(axis=-1) < 0.15).sum())


def test_lr_find_command(run_config, capsys):
    """The range test runs on the fit config, prints the suggestion beside the rule of thumb, writes the plot
    (marking the config's lr, which the user compares with both), and leaves the weights as they were (a tuner
    that trains the model in place would hand a half-trained model to the run that follows)."""
    from tinylm.cli import fit_config

    cfg = run_config()
    built = []
    original = fit_config.fit_objects

    def spy(args, **kwargs):
        cli = original(args, **kwargs)
        built.append((cli.model, {k: v.clone() for k, v in cli.model.state_dict().items()}))
        return cli

    fit_config.fit_objects = spy
    try:
        main(["lr-find", "--config", str(cfg), "--num_training", "12", "--out", "lr.png"])
    finally:
        fit_config.fit_objects = original
    out, err = capsys.readouterr()
    assert "steepest descent" in out and "rule of thumb 6e-4·(124M/N)^0.5" in out
    assert "\r" not in err  # no bar's redrawings where stderr is no terminal (Lightning's sweep bar left them in logs)
    assert (cfg.parent / "lr.png").stat().st_size > 10_000
    assert _red_pixels(cfg.parent / "lr.png") > 100  # the config's lr, marked in matplotlib's C3 (nothing else is)
    model, before = built[0]
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], msg=key)
    assert not list(cfg.parent.glob("**/.lr_find_*.ckpt"))  # Lightning's restore file is gone


def test_lr_find_with_muon_keeps_muons_lr_at_its_ratio(run_config, capsys):
    """Catches the range test sweeping Muon at AdamW's LR (Lightning sets every parameter group to the same LR):
    at every step of the sweep Muon's LR must be muon_lr / lr times AdamW's, the output must say so, and the fit it
    suggests must set muon_lr at that ratio too."""
    import lightning as L

    from tinylm.cli.fit_config import fit_objects
    from tinylm.studies.lr_find import lr_find

    cfg = run_config(model={"optimizer": "muon", "lr": 1e-3, "muon_lr": 0.02})
    cli = fit_objects(["--config", str(cfg)])
    seen, model = [], cli.model
    step = model.optimizer_step  # the LightningModule hook that steps the optimizer, after tinylm's hooks

    def record(epoch, batch_idx, optimizer, optimizer_closure=None):
        step(epoch, batch_idx, optimizer, optimizer_closure)  # runs the closure (hooks) and the step
        seen.append((optimizer.param_groups[0]["lr"], optimizer.param_groups[-1]["lr"]))

    model.optimizer_step = record
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=8, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        default_root_dir=str(cfg.parent))
    lr_find(trainer, model, cli.datamodule, params=1, min_lr=1e-5, max_lr=1e-1, num_training=8)
    assert len(seen) == 8 and seen[-1][0] > 100 * seen[0][0]  # the sweep ran
    assert all(muon == pytest.approx(20 * adamw) for adamw, muon in seen)
    assert model.muon_lr_ratio is None  # a fit after the test is not tied
    main(["lr-find", "--config", str(cfg), "--num_training", "6", "--out", "lr.png"])
    out = capsys.readouterr().out
    assert "swept model.lr with muon_lr at 20x it" in out
    # its next: fit keeps that ratio (--model.lr alone left muon_lr at the config's 0.02: at a suggestion of 6e-2, a
    # third of lr where the sweep had it at 20x)
    command = shlex.split(out.split("next:\n", 1)[1])
    lr = float(command[command.index("--model.lr") + 1])
    assert float(command[command.index("--model.muon_lr") + 1]) == pytest.approx(20 * lr, rel=1e-2)

def test_lr_find_losses_are_per_token_under_accumulation(run_config, tmp_path):
    """Catches the curve showing Lightning's recorded loss, which is divided by the accumulation count (what backward
    sees): with accumulation 2 an untrained model's first loss read ~ln(V)/2 instead of ~ln(V) nats."""
    import json
    import math

    cfg = run_config(trainer={"accumulate_grad_batches": 2})
    main(["lr-find", "--config", str(cfg), "--num_training", "6", "--out", "lr.png"])
    losses = json.loads((tmp_path / "lr.json").read_text())["losses"]
    vocab = len(set((tmp_path / "shakespeare_small.txt").read_text()))
    assert abs(losses[0] - math.log(vocab)) < 0.5


def test_steepest_descent_is_per_decade():
    """On an exponential sweep whose loss falls fastest (per decade) at 1e-3, the suggestion is 1e-3; the slope
    against the LR itself (Lightning's suggestion) lands on the first points, where the LRs are packed together."""
    import numpy as np

    from tinylm.studies.lr_find import steepest_descent

    lrs = list(np.geomspace(1e-6, 1.0, 100))
    # a gentle fall everywhere (0.01 nats per decade, as real curves have) plus the big drop around 1e-3
    losses = [4.0 - 0.01 * np.log10(lr / 1e-6) - 1.0 / (1.0 + np.exp(-2.0 * (np.log(lr) - np.log(1e-3))))
              for lr in lrs]
    assert steepest_descent(lrs, losses) == pytest.approx(1e-3, rel=0.15)
    linear = np.gradient(np.array(losses[10:-1]), np.array(lrs[10:-1]))
    assert lrs[10 + int(np.argmin(linear))] < 1e-5  # what this function exists to avoid
    assert steepest_descent(lrs[:3], losses[:3]) is None
    rng = np.random.default_rng(0)
    assert steepest_descent(lrs, list(np.linspace(4.0, 8.0, 100))) is None  # only rises
    assert steepest_descent(lrs, list(4.17 + 0.002 * rng.standard_normal(100))) is None  # flat: noise only


@pytest.mark.parametrize("lrs, steps, why", [
    (["1e-9", "1e-7"], "20", "the loss did not fall between 1e-09 and 1e-07: raise --max_lr"),
    (["10", "1e4"], "20", "the loss diverged after .* lower --min_lr"),
    (["1e-9", "1e-7"], "6", r"too few points \(6\): raise --num_training"),
])
def test_lr_find_says_why_it_has_no_suggestion(run_config, capsys, lrs, steps, why):
    """Catches a "steepest descent" LR printed for a sweep whose loss never fell (its noise's steepest point),
    "raise --num_training" for a sweep that diverged at once (only a lower --min_lr helps), "raise --max_lr" for a
    sweep too short to tell (it was said at an LR of 1 already), and a `next:` fit at the rule of thumb's LR that did
    not say it was not the sweep's."""
    main(["lr-find", "--config", str(run_config()), "--num_training", steps, "--min_lr", lrs[0], "--max_lr", lrs[1]])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("steepest descent"))
    assert re.search(r"none \(" + why, line), line
    assert "next (no suggestion: at the rule of thumb's LR):" in out


def test_lr_find_num_training_has_bounds(run_config, capsys):
    """Catches a typo'd --num_training 1000000000 running silently for days instead of failing at once, 3 (which
    can never give a suggestion: it reads three points past the last) accepted, and --max_lr 0 blamed on min_lr
    (whose bound it is)."""
    for n in ("1000000000", "3"):
        with pytest.raises(SystemExit):
            main(["lr-find", "--config", str(run_config()), "--num_training", n])
        assert f"num_training must be a whole number in [4, 10000], got {n}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["lr-find", "--config", str(run_config()), "--max_lr", "0"])
    assert "max_lr must be in (0, inf), got 0" in capsys.readouterr().err


def test_a_next_fit_that_fit_would_refuse_is_refused_before_the_sweep(run_config, capsys):
    """Catches `lr-find --trainer.accumulate_grad_batches 3` on a recipe that validates every 2 batches sweeping,
    then printing a `next:` fit that fit refuses (a validation inside an optimizer step): the same line, up front."""
    with pytest.raises(SystemExit):
        main(["lr-find", "--config", str(run_config()), "--trainer.accumulate_grad_batches", "3"])
    err = capsys.readouterr().err
    assert "the fit this sweep is for would be refused: trainer.val_check_interval=2 (batches) is not a multiple " \
           "of trainer.accumulate_grad_batches=3" in err
    assert "use --trainer.val_check_interval 3 (or a multiple)" in err and err.count("\n") == 1


def test_a_second_sweep_replaces_its_own_json(run_config):
    """lr-find's own earlier .json is replaced (tests/test_bad_inputs.py: another file there never is)."""
    cfg = run_config()
    for _ in range(2):  # the second run replaces the first one's numbers
        main(["lr-find", "--config", str(cfg), "--num_training", "4", "--out", str(cfg.parent / "lr.png")])
    assert "rule_of_thumb" in (cfg.parent / "lr.json").read_text()


def test_ctrl_c_mid_sweep_ends_as_interrupted(run_config, capsys, monkeypatch):
    """Catches a Ctrl+C during the sweep ending lr-find with exit status 1, as a failure, after Lightning's own
    "Detected KeyboardInterrupt" (it ends its handling in sys.exit(1)): every tinylm command ends a Ctrl+C with
    "tinylm: interrupted" and 130 (128 + SIGINT), as fit does."""

    from tinylm.train.module import TinyLM

    cfg = run_config()

    def ctrl_c(self, batch, batch_idx):
        raise KeyboardInterrupt

    monkeypatch.setattr(TinyLM, "training_step", ctrl_c)
    _interrupted(cfg, capsys, 4)
    assert not (cfg.parent / "lr.png").exists()


def _interrupted(cfg: Path, capsys, num_training: int) -> None:
    """Run `tinylm lr-find` of ``cfg``, whose training step the caller made raise KeyboardInterrupt: it ends with
    "tinylm: interrupted" and 130 (128 + SIGINT)."""
    import signal

    handler = signal.getsignal(signal.SIGINT)  # Lightning ignores further Ctrl+Cs as it shuts down: not pytest's
    try:
        with pytest.raises(SystemExit) as e:
            main(["lr-find", "--config", str(cfg), "--num_training", str(num_training), "--out", "lr.png"])
    finally:
        signal.signal(signal.SIGINT, handler)
    assert e.value.code == 130 and "tinylm: interrupted" in capsys.readouterr().err


def test_ctrl_c_mid_sweep_ends_the_sweeps_bar_and_says_one_line(run_config, capsys, monkeypatch):
    """Catches a Ctrl+C (or SIGTERM) mid-sweep leaving Lightning's sweep bar open: on a terminal "tinylm:
    interrupted" was glued to the bar's drawing and the bar drawn again below it as the process exited, after
    Lightning's own "Detected KeyboardInterrupt, attempting graceful shutdown ..." line: three lines for one."""
    import logging

    from tinylm.studies import lr_find as sweep
    from tinylm.train.module import TinyLM

    cfg, steps, closed, made_bar, step = run_config(), [], [], sweep.bar, TinyLM.training_step

    def ctrl_c(self, batch, batch_idx):
        steps.append(batch_idx)
        if len(steps) == 3:  # mid-sweep, its bar drawn
            raise KeyboardInterrupt
        return step(self, batch, batch_idx)

    def recorded(*args, **kwargs):
        made = made_bar(*args, **kwargs)
        close = made.close
        made.close = lambda: closed.append(True) or close()
        return made

    monkeypatch.setattr(TinyLM, "training_step", ctrl_c)
    monkeypatch.setattr(sweep, "bar", recorded)
    _interrupted(cfg, capsys, 8)
    assert closed == [True]
    said = logging.LogRecord("lightning", logging.INFO, "", 0, "\nDetected KeyboardInterrupt, attempting graceful "
                             "shutdown ...", None, None)
    assert not sweep._SweepLines().filter(said)


def test_the_curve_under_accumulation_is_each_steps_mean_loss(run_config):
    """Catches the curve reading Lightning's loss of each step's last micro-batch alone (its range test's): with
    accumulation 4 a curve twice as noisy as the loss the step trains on, which the suggestion is read from."""
    import lightning as L

    from tinylm.cli.fit_config import fit_objects
    from tinylm.studies.lr_find import lr_find

    cli = fit_objects(["--config", str(run_config())])
    model, micro = cli.model, []
    training_step = model.training_step

    def record(batch, batch_idx):
        loss = training_step(batch, batch_idx)
        micro.append(float(loss.detach()))
        return loss

    model.training_step = record
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=6, accumulate_grad_batches=4, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, default_root_dir=str(cli.run_dir))
    result = lr_find(trainer, model, cli.datamodule, params=1, min_lr=1e-4, max_lr=1e-2, num_training=6)
    steps = [sum(micro[i:i + 4]) / 4 for i in range(0, len(micro), 4)]
    assert len(micro) == 24 and len(set(micro[:4])) == 4  # (micro-batches that differ: their mean is no last one)
    assert result.losses == pytest.approx(smoothed(steps), rel=1e-6)


def test_sweep_steps_are_the_runs_global_batch(run_config, capsys, monkeypatch):
    """Catches a run on 2 devices swept at one device's batch, half the run's, its LR suggested for that: on one
    device the sweep accumulates the micro-batches of every device (and the run's own accumulation)."""
    import tinylm.studies.lr_find
    from tinylm.studies.lr_find import LRFind

    cfg = run_config()
    seen = []

    def sweep(trainer, *args, **kwargs):
        seen.append((trainer.num_devices, trainer.accumulate_grad_batches))
        return LRFind([1e-4, 1e-3], [3.0, 2.0], 1e-3, 1e-3)

    monkeypatch.setattr(tinylm.studies.lr_find, "lr_find", sweep)
    main(["lr-find", "--config", str(cfg), "--trainer.accelerator", "cpu", "--trainer.devices", "2",
          "--trainer.accumulate_grad_batches", "3", "--trainer.val_check_interval", "6", "--out", "lr.png"])
    assert seen == [(1, 6)]
    assert "accumulates 6 micro-batches a step (accumulate_grad_batches 3 x 2)" in capsys.readouterr().out


def test_default_out_that_cannot_be_written_is_refused_before_the_sweep(run_config, capsys, monkeypatch):
    """Catches lr-find running its whole sweep (minutes) and only then failing to write runs/NAME/lr_find.png (a
    read-only run folder, or a file in its place): the default path is checked before any work, as --out is."""
    import tinylm.studies.lr_find

    cfg = run_config()
    (cfg.parent / "runs").mkdir()
    (cfg.parent / "runs" / "tiny").write_text("not a folder")

    def sweep(*args, **kwargs):
        raise AssertionError("the sweep ran")

    monkeypatch.setattr(tinylm.studies.lr_find, "lr_find", sweep)
    with pytest.raises(SystemExit):
        main(["lr-find", "--config", str(cfg), "--num_training", "4"])
    assert "runs/tiny/lr_find.png' lies under runs/tiny, which is a file" in capsys.readouterr().err


def test_lr_find_ends_with_the_fit_command_at_its_lr(run_config, capsys):
    """Catches an lr-find that leaves the user to work out how to use its answer: its last line is the fit command
    with the suggested lr, which parses as printed (its --print_config shows that lr)."""
    cfg = run_config()
    main(["lr-find", "--config", str(cfg), "--num_training", "12", "--out", "lr.png"])
    out = capsys.readouterr().out
    command = out.split("next:\n", 1)[1].strip()
    lr = json.loads((cfg.parent / "lr.json").read_text())
    lr = lr["suggestion"] or lr["rule_of_thumb"]
    assert command.startswith(f"tinylm fit --config {cfg}") and f" --model.lr {lr:.2e} " in command
    with pytest.raises(SystemExit) as e:
        main([*shlex.split(command)[1:], "--print_config"])
    assert e.value.code in (0, None) and f"lr: {float(f'{lr:.2e}')}" in capsys.readouterr().out


def test_the_next_fit_keeps_the_schedules_floor_at_the_configs_ratio(run_config, capsys, monkeypatch):
    """Catches a suggestion below the config's model.min_lr printed as a `next:` fit that fit refuses ("model.min_lr
    must be in [0, lr]"): the fit sets min_lr at the config's ratio to lr, as the cosine it was written for."""
    import tinylm.studies.lr_find
    from tinylm.studies.lr_find import LRFind

    cfg = run_config(model={"lr": 1e-3, "min_lr": 1e-4})
    monkeypatch.setattr(tinylm.studies.lr_find, "lr_find", lambda *a, **k: LRFind([1e-6, 1e-5], [3.0, 2.0], 5e-5, 1e-3))
    main(["lr-find", "--config", str(cfg), "--out", "lr.png"])
    command = capsys.readouterr().out.split("next:\n", 1)[1].strip()
    assert command.endswith("--model.lr 5.00e-05 --model.min_lr 5.00e-06"), command
    main(shlex.split(command)[1:])  # (the model's check of min_lr is made as it is built: the fit trains)
    assert (cfg.parent / "runs" / "tiny" / "checkpoints" / "last.ckpt").is_file()


def test_lr_find_reads_the_data_of_the_run_the_config_names(run_config, tmp_path, capsys, caplog):
    """Catches `tinylm lr-find --config X` after `tinylm fit --config X --data.corpus my.txt` needing --data.corpus
    again (X names a corpus not to be had here, as a hub dataset offline): the run folder X names holds the run's
    config.yaml, whose corpus is read (its prepared dataset reused), said in a line; a flag still overrides. And its
    next: command leaving that corpus out, so the fit it suggests would train on X's own (here: not found)."""
    corpus, gone = str(tmp_path / "shakespeare_small.txt"), str(tmp_path / "gone.txt")
    cfg = run_config(data={"corpus": gone})
    main(["fit", "--config", str(cfg), "--data.corpus", corpus])
    with caplog.at_level("INFO", logger="tinylm"):
        main(["lr-find", "--config", str(cfg), "--num_training", "4"])
    assert f"holds a run: the data it read, from its config.yaml: data.corpus={corpus!r} (not {gone!r})" in caplog.text
    out = capsys.readouterr().out
    assert "steepest descent" in out
    # its next command names a new run beside the one there (a fresh fit into runs/tiny would be refused), with the
    # data the sweep read, which that new folder has no record of
    assert re.search(r"next[^\n]*:\n  tinylm fit --config \S+ --data.corpus \S+ --run.name tiny-lr\de-\d\d --model.lr ",
                     out), out
    command = shlex.split(re.split(r"next[^\n]*:\n", out)[-1])  # (the fit printed a next: of its own before)
    assert command[command.index("--data.corpus") + 1] == corpus
    with pytest.raises(SystemExit) as e:
        main([*command[1:], "--print_config"])
    assert e.value.code in (0, None) and f"corpus: {corpus}" in capsys.readouterr().out
    assert len(list((tmp_path / "cache" / "datasets").iterdir())) == 1  # the run's, made once
    with pytest.raises(SystemExit):  # a flag is the user's word: the gone file is read, and refused
        main(["lr-find", "--config", str(cfg), "--num_training", "4", "--data.corpus", gone])
    assert "gone.txt' not found" in capsys.readouterr().err


def test_lr_find_next_fit_names_one_run(run_config, capsys):
    """Catches the next: fit of a sweep given `--run.name NAME` of a run that exists saying both names
    (`--run.name NAME --run.name NAME-lr2e-01`): the new name replaces the sweep's."""
    cfg = run_config()
    main(["fit", "--config", str(cfg), "--run.name", "mine"])
    main(["lr-find", "--config", str(cfg), "--num_training", "4", "--run.name", "mine"])
    command = shlex.split(re.split(r"next[^\n]*:\n", capsys.readouterr().out)[-1])
    assert command.count("--run.name") == 1 and command[command.index("--run.name") + 1].startswith("mine-lr"), command


def test_a_second_sweeps_next_fit_names_a_run_not_yet_trained(run_config, capsys, monkeypatch):
    """Catches a second lr-find of a config (after its first next: fit was run) printing that fit's --run.name again
    (`tiny-lr5e-05`, which now holds a run: fit refused it, "already holds a run"): the name is numbered past it."""
    import tinylm.studies.lr_find
    from tinylm.studies.lr_find import LRFind

    cfg = run_config()
    monkeypatch.setattr(tinylm.studies.lr_find, "lr_find", lambda *a, **k: LRFind([1e-6, 1e-5], [3.0, 2.0], 5e-5, 1e-3))
    main(["fit", "--config", str(cfg)])
    names = []
    for _ in range(2):
        main(["lr-find", "--config", str(cfg)])
        command = shlex.split(re.split(r"next[^\n]*:\n", capsys.readouterr().out)[-1])
        names.append(command[command.index("--run.name") + 1])
        main(command[1:])  # the fit as printed trains (a name that held a run was refused)
    assert names == ["tiny-lr5e-05", "tiny-lr5e-05-2"], names
    assert all((cfg.parent / "runs" / n / "checkpoints" / "last.ckpt").is_file() for n in names)


def test_lr_find_and_scaling_need_no_max_steps(run_config, capsys):
    """Catches lr-find (and scaling) refusing a config without trainer.max_steps ("pass --trainer.max_steps N"),
    a count they then ignore: the sweep trains --num_training steps, the ladder its own per model."""
    cfg = run_config()
    config = yaml.safe_load(cfg.read_text())
    del config["trainer"]["max_steps"]
    cfg.write_text(yaml.safe_dump(config))
    main(["lr-find", "--config", str(cfg), "--num_training", "6", "--out", "lr.png"])
    assert (cfg.parent / "lr.json").is_file()
    with pytest.raises(SystemExit):  # fit itself still needs it
        main(["fit", "--config", str(cfg)])
    assert "trainer.max_steps is not set" in capsys.readouterr().err


def test_lr_find_with_a_drawn_seed_records_it_and_its_next_fit_keeps_it(run_config, capsys, monkeypatch):
    """Catches `--seed_everything true` sweeps whose drawn seed is kept nowhere (lr-find writes no config.yaml, and
    its .json had no seed) and whose `next:` fit said `--seed_everything true` again: a fit from other weights than
    the ones swept, and a sweep no one can repeat; and a next: fit saying both, `--seed_everything true ...
    --seed_everything 1234` (the later one wins, but the command reads as two seeds)."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    cfg = run_config()
    main(["lr-find", "--config", str(cfg), "--num_training", "4", "--out", "lr.png", "--seed_everything", "true"])
    seed = json.loads((cfg.parent / "lr.json").read_text()).get("seed_everything")
    assert isinstance(seed, int) and not isinstance(seed, bool)
    command = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])  # the next: fit
    assert command[command.index("--seed_everything"):][:2] == ["--seed_everything", str(seed)]
    assert command.count("--seed_everything") == 1


def test_lr_find_says_nothing_of_its_temporary_checkpoint(run_config):
    """Catches Lightning's "Restoring states from the checkpoint path at /tmp/.../.lr_find_<uuid>.ckpt", "Restored
    all states ..." and "`Trainer.fit` stopped: `max_steps=12` reached." on stderr: a file the user never made, a fit
    the user never ran (12 is --num_training)."""
    import logging

    said = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage())
    lightning = logging.getLogger("lightning.pytorch")
    lightning.addHandler(handler)
    try:
        main(["lr-find", "--config", str(run_config()), "--num_training", "12", "--out", "lr.png"])
    finally:
        lightning.removeHandler(handler)
    assert said and not [line for line in said if ".lr_find_" in line or "`Trainer.fit` stopped" in line], said


def test_lr_find_started_by_a_launcher_on_several_ranks_is_refused(run_config, monkeypatch, capsys):
    """Catches `torchrun --nproc_per_node 2 -m tinylm lr-find ...` running the whole sweep once per rank (it runs on
    one device), each writing the same lr_find.png: refused in one line before anything runs."""
    cfg = run_config()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as e:
        main(["lr-find", "--config", str(cfg), "--num_training", "4", "--out", "lr.png"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and "tinylm lr-find runs in one process, but a launcher started 2" in err[-1]
    assert not (cfg.parent / "lr.png").exists() and not (cfg.parent / "lr.json").exists()
