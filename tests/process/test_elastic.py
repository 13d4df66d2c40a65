"""Elastic resume: a run may continue on another number of devices, or with accumulation standing in for devices or
batch size, when the global batch (the windows an optimizer step draws) stays the same.

Batch k of rank r holds the global samples (k * world_size + r) * B ... + B - 1 (tinylm.data.loader.TrainBatches),
so 1 device with batch 2B draws exactly the windows of 2 devices with batch B, and DDP's gradient average over the
two halves equals the single device's mean over all of them. These tests run real DDP on 2 CPU processes: the
command forked from a process that has imported tinylm and Lightning (tests/forked.py), DDP's rank 1 started by
Lightning (a fresh interpreter), ddp_fork's forked from the command.
"""

import csv
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import forked
import lightning as L
import pytest
import torch

from tinylm.cli import main

pytestmark = [pytest.mark.process, pytest.mark.slow]
B, STEPS, HALF = 4, 6, 3


@pytest.fixture
def config(run_config):
    return run_config(chars=40_000, seed_everything=5, run={"name": "straight", "checkpoint_every": HALF},
                      trainer={"max_steps": STEPS, "val_check_interval": HALF},
                      model={"lr": 3e-3, "warmup_steps": 1, "decay_steps": STEPS},
                      data={"block_size": 32, "batch_size": 2 * B, "val_batches": None})  # all of val:
    # val_batches counts batches of data.batch_size windows, so a limit would evaluate other windows after the batch
    # size changes


class SlowRankOne(L.Callback):
    """Rank 1 reaches its setup a moment after rank 0 (a busy node, a slower import)."""

    def setup(self, trainer, pl_module, stage):
        if trainer.global_rank == 1:
            time.sleep(2.0)


class InfLossOnRankOne(L.Callback):
    """Rank 1's own loss of step 1 turns infinite (its gradients stay finite): the other rank's loss is finite."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == 1 and trainer.global_step == 2:  # step 1 was just taken
            pl_module.step_loss.fill_(float("inf"))  # in place: the health monitor holds this tensor until it reads


class SigtermToRankOne(L.Callback):
    """Rank 1 alone gets SIGTERM after step 30 (as when a signal reaches one process of a run)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == 1 and trainer.global_step == 30:
            os.kill(os.getpid(), signal.SIGTERM)


class SigtermInTheSanityCheck(L.Callback):
    """SIGTERM to every process of the run while it runs its sanity check, before training starts."""

    def on_sanity_check_start(self, trainer, pl_module):
        if trainer.global_rank == 0:
            os.killpg(os.getpgid(0), signal.SIGTERM)


class CountValBatches(L.Callback):
    """Each rank writes how many validation batches it evaluated (after training) to val-batches-<rank>.txt."""

    def __init__(self) -> None:
        self.n = 0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.n += not trainer.sanity_checking

    def on_fit_end(self, trainer, pl_module):
        Path(f"val-batches-{trainer.global_rank}.txt").write_text(str(self.n))


def _fit(config: Path, *args: str, devices: int, strategy: str = "ddp") -> str:
    """`tinylm fit` on `devices` CPU processes (`strategy` when 2, in a process of its own: DDP's launcher re-runs
    the command); what it printed on stderr (2 devices)."""
    if devices == 1:
        main(["fit", "--config", str(config), *args])
        return ""
    cmd = ["fit", "--config", str(config), "--trainer.accelerator", "cpu", "--trainer.devices", str(devices),
           "--trainer.strategy", strategy, *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = forked.run(cmd, cwd=config.parent, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def _metric(run: Path, key: str) -> dict[int, float]:
    with open(run / "csv" / "metrics.csv") as f:
        return {int(r["step"]): float(r[key]) for r in csv.DictReader(f) if r.get(key)}


@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)], ids=["2-to-1", "1-to-2"])
def test_resume_on_another_device_count_continues_the_same_run(config, tmp_path, before, after):
    """Catches an elastic resume that draws other windows than the uninterrupted run (ranks replaying each other's
    samples, a position counted per rank instead of globally, a batch of the wrong size): the resumed run's
    losses must match a straight single-device run with the same global batch."""
    _fit(config, devices=1)
    straight = tmp_path / "runs" / "straight"
    per_device = lambda n: str(2 * B // n)
    _fit(config, "--run.name", "elastic", "--trainer.max_steps", str(HALF), "--data.batch_size", per_device(before),
         devices=before)
    err = _fit(config, "--run.name", "elastic", "--ckpt_path", "last", "--data.batch_size", per_device(after),
               "--model.lr", "0.5", devices=after)  # ignored (the checkpoint's is kept), with a warning
    if after == 2:  # said by rank 0 alone (the other rank runs the same command)
        assert err.count("ignoring model.lr=0.5") == 1, err[-3000:]
    elastic = tmp_path / "runs" / "elastic"
    want, got = _metric(straight, "val/loss"), _metric(elastic, "val/loss")
    assert sorted(got) == sorted(want) == [HALF - 1, STEPS - 1]  # validated before and after the device change
    assert got == pytest.approx(want, abs=1e-4)
    # train/loss is the mean over the whole global batch (both ranks'), so every step matches, on 2 devices too
    want, got = _metric(straight, "train/loss"), _metric(elastic, "train/loss")
    assert sorted(got) == sorted(want) == list(range(STEPS))
    assert [got[s] for s in range(STEPS)] == pytest.approx([want[s] for s in range(STEPS)], abs=1e-4)


@pytest.mark.parametrize("before, after", [((1, 2 * B, 1), (1, B, 2)), ((2, B, 1), (1, B, 2)), ((1, B, 2), (2, B, 1))],
                         ids=["batch-for-accumulation", "2-devices-for-accumulation", "accumulation-for-2-devices"])
def test_a_resume_may_trade_devices_or_batch_for_accumulation(config, tmp_path, capsys, before, after):
    """Catches a resume that keeps the global batch (data.batch_size x devices x accumulation) in micro-batches of
    another size continuing from the wrong window or at the wrong place in a step: the loader's position and
    Lightning's batch counters count micro-batches, so both are counted again in the new ones (a position left as it
    was drew the windows of half the steps again; counters left so stepped after one micro-batch of two). The
    resumed run's losses must match a straight single-device run's, step by step."""
    _fit(config, devices=1)  # 1 device x batch 2B x accumulation 1
    split = lambda devices, batch, accumulate: ["--data.batch_size", str(batch), "--trainer.accumulate_grad_batches",
                                                str(accumulate), "--trainer.val_check_interval", str(HALF * accumulate)]
    _fit(config, "--run.name", "elastic", "--trainer.max_steps", str(HALF), *split(*before), devices=before[0])
    capsys.readouterr()
    _fit(config, "--run.name", "elastic", "--ckpt_path", "last", *split(*after), devices=after[0])
    if after[0] == 1:  # (2 devices: said on the command's own stderr, which `_fit` checks returned 0)
        err = capsys.readouterr().err
        assert f"as {after[1]} x 1 x {after[2]}: the same {2 * B} windows a step" in err, err[-3000:]
        assert "the run had" not in err, err[-3000:]  # no "with trainer.accumulate_grad_batches 2 (the run had 1)"
    straight, elastic = tmp_path / "runs" / "straight", tmp_path / "runs" / "elastic"
    for key, steps in (("val/loss", [HALF - 1, STEPS - 1]), ("train/loss", list(range(STEPS)))):
        want, got = _metric(straight, key), _metric(elastic, key)
        assert sorted(got) == sorted(want) == steps, key
        assert [got[s] for s in steps] == pytest.approx([want[s] for s in steps], abs=1e-4), key


def test_an_elastic_resume_past_the_new_epochs_end_steps_on_whole_accumulations(run_config, tmp_path):
    """Catches an elastic resume whose notional epoch is shorter than the run's (a rank's epoch counts its own
    micro-batches: 14 on 2 ranks x batch 2, 6 on 1 device x batch 4) going on from Lightning's count of the run's
    epoch (8, in a checkpoint saved after a validation) past the new epoch's end: Lightning ended the epoch after one
    micro-batch, the first resumed step summed one of two (its gradient halved), and the steps after it took other
    windows. The losses must follow a straight single-device run's, step by step."""
    config = run_config(chars=500, seed_everything=5, run={"name": "straight", "checkpoint_every": 4},
                        trainer={"max_steps": 10, "accumulate_grad_batches": 2, "val_check_interval": 8},
                        model={"lr": 3e-3, "warmup_steps": 1, "decay_steps": 10},
                        data={"batch_size": 4, "val_batches": None})
    _fit(config, devices=1)
    _fit(config, "--run.name", "elastic", "--trainer.max_steps", "4", "--data.batch_size", "2", devices=2)
    _fit(config, "--run.name", "elastic", "--ckpt_path", "last", devices=1)
    want, got = _metric(tmp_path / "runs" / "straight", "train/loss"), _metric(tmp_path / "runs" / "elastic",
                                                                                "train/loss")
    assert sorted(got) == sorted(want) == list(range(10))
    assert [got[s] for s in range(10)] == pytest.approx([want[s] for s in range(10)], abs=1e-4)


def test_changed_global_batch_is_refused_in_one_line(config, tmp_path, capsys):
    """Catches a resume with another global batch silently drawing other data (or a refusal that does not say
    which --data.batch_size, or accumulation, restores the run's global batch)."""
    _fit(config, "--trainer.max_steps", str(HALF), devices=1)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--data.batch_size", str(B)])
    err = capsys.readouterr().err.strip().splitlines()
    line = next(ln for ln in err if "global batch of" in ln)
    assert f"global batch of {2 * B} windows a step" in line
    assert f"resume with --data.batch_size {2 * B} or --trainer.accumulate_grad_batches 2, or" in line
    # a batch size typed wrong beside a new accumulation: this line, not the accumulation's check (which named an
    # accumulation that the global batch then refused)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--ckpt_path", "last", "--data.batch_size", "2",
              "--trainer.accumulate_grad_batches", "2", "--trainer.val_check_interval", "6"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.endswith(f"resume with --data.batch_size {2 * B} --trainer.accumulate_grad_batches 1 or "
                         f"--trainer.accumulate_grad_batches {B} or --data.batch_size {B}, or start a new run"), line


def test_ddp_fork_trains_and_resumes(config, tmp_path):
    """Catches `--trainer.strategy ddp_fork` (what Lightning picks in notebooks as ddp_notebook) failing after a run
    that trained fine: its main process loads the weights back from a bare state_dict that tinylm refused as
    "not a Lightning checkpoint". A resume on fork must also continue the same run."""
    fork = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp_fork",
            "--data.batch_size", str(B), "--run.name", "fork"]
    for args in (["--trainer.max_steps", str(HALF)], ["--ckpt_path", "last"]):
        done = forked.run(["fit", "--config", str(config), *fork, *args], cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "stopped at step" not in done.stderr, done.stderr[-3000:]  # the forking process trained nothing itself
    _fit(config, devices=1)
    want, got = _metric(tmp_path / "runs" / "straight", "train/loss"), _metric(tmp_path / "runs" / "fork", "train/loss")
    assert sorted(got) == list(range(STEPS))
    assert [got[s] for s in range(STEPS)] == pytest.approx([want[s] for s in range(STEPS)], abs=1e-4)


def test_an_early_stop_under_ddp_fork_is_said(config, tmp_path):
    """Catches a ddp_fork run stopped by EarlyStopping ending without the "stopped at step N" line a single process
    prints: the line came from the command's own trainer, which under ddp_fork stays at step 0 (its training
    processes train)."""
    early = ["--trainer.callbacks+", "EarlyStopping", "--trainer.callbacks.monitor", "val/loss",
             "--trainer.callbacks.min_delta", "10", "--trainer.callbacks.patience", "1",
             "--trainer.val_check_interval", "1"]
    err = _fit(config, *early, "--data.batch_size", str(B), devices=2, strategy="ddp_fork")
    said = [line for line in err.splitlines() if "the run stopped at step" in line]
    assert len(said) == 1 and said[0].startswith(f"the run stopped at step 2 of trainer.max_steps {STEPS}"), err[-3000:]
    assert torch.load(tmp_path / "runs" / "straight" / "checkpoints" / "last.ckpt", weights_only=True,
                      map_location="cpu")["global_step"] == 2


def test_a_branch_into_a_new_folder_on_two_ranks_does_not_hang(config, tmp_path):
    """A run from another run's checkpoint into a new folder (a branch) on two ranks, rank 1 late: it trains and
    writes the new folder's config.yaml, not a resume record. (Ranks once decided apart whether this was a resume:
    rank 1, looking after rank 0 had written config.yaml, skipped a broadcast the others made; a hang when the
    unmatched collectives did not happen to pair up, which this timing did not reproduce reliably.)"""
    _fit(config, "--trainer.max_steps", str(HALF), devices=1)
    ckpt = tmp_path / "runs" / "straight" / "checkpoints" / "last.ckpt"
    _fit(config, "--run.name", "branch", "--ckpt_path", str(ckpt), "--data.batch_size", str(B),
         "--trainer.callbacks+=test_elastic.SlowRankOne", devices=2)
    assert (tmp_path / "runs" / "branch" / "config.yaml").is_file()
    assert not list((tmp_path / "runs" / "branch").glob("config.resume-*.yaml"))  # a new folder: its first config


def test_two_ranks_say_their_global_batch_and_halt_together_on_one_ranks_nonfinite_loss(config, tmp_path):
    """Catches the health monitor judging each rank's own loss: rank 1 halted alone on its infinite loss and rank 0
    died in the next collective with a gloo traceback (on GPUs: a hang until NCCL's timeout), no alert logged. And
    a run on 2 devices never saying that its optimizer step takes twice the windows of data.batch_size."""
    cmd = ["fit", "--config", str(config), "--trainer.accelerator", "cpu",
           "--trainer.devices", "2", "--trainer.strategy", "ddp", "--data.batch_size", str(B),
           "--trainer.log_every_n_steps", "2", "--trainer.callbacks+=test_elastic.InfLossOnRankOne"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = forked.run(cmd, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("tinylm fit: error:")]
    assert len(errors) == 1 and "non-finite loss" in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert _metric(tmp_path / "runs" / "straight", "health/nonfinite") == {1: 1.0}
    said = [line for line in done.stderr.splitlines() if "global batch:" in line]
    assert len(said) == 1 and f"global batch: {2 * B} windows of 32 tokens" in said[0] and "x 2 device(s)" in said[0]
    steps = int(re.search(r"; ([\d,]+) steps \(trainer.max_steps\)", said[0])[1].replace(",", ""))
    assert f": {2 * B * 32:,} tokens per optimizer step; {steps:,} steps (trainer.max_steps) read " \
           f"{steps * 2 * B * 32:,} tokens" in said[0], said[0]


@pytest.mark.parametrize("strategy", ["ddp", "ddp_fork"])
def test_a_signal_to_one_rank_stops_both_one_step_later_without_waiting_on_every_step(config, tmp_path, strategy):
    """Catches a SIGTERM that reached one rank stopping the run with exit 1 and "a signal to another rank" (the
    signal lost on the way), and the ranks agreeing on a stop with a blocking collective at every step (a host sync
    per step, 4-9 % of a small model's step on CPU: benchmarks/bench_stop_agreement.py): their vote of step 30 is
    read at the end of step 31, which is where they stop. Under ddp_fork, catches the stop reaching the command as
    its training processes' tracebacks and exit 1."""
    cmd = ["fit", "--config", str(config), "--trainer.accelerator", "cpu",
           "--trainer.devices", "2", "--trainer.strategy", strategy, "--data.batch_size", str(B),
           "--trainer.max_steps", "100000", "--trainer.val_check_interval", "1000", "--run.checkpoint_every", "1000",
           "--trainer.callbacks+=test_elastic.SigtermToRankOne"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = forked.run(cmd, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "interrupted by" in line]
    # ddp_fork's command reports the training process that stopped first: either one
    told = "interrupted by SIGTERM (to another rank) at step 31;" if strategy == "ddp" else " at step 31;"
    assert len(said) == 1 and told in said[0] and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert said[0].startswith("tinylm fit: error: interrupted by SIGTERM"), said
    ckpt = tmp_path / "runs" / "straight" / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=True, map_location="cpu")["global_step"] == 31


def test_a_sigterm_before_training_starts_stops_every_rank(config, tmp_path):
    """Catches a SIGTERM during the sanity check (or data setup) of a DDP run hanging it for good: Lightning's
    notifier broadcast from inside the signal handler, and the other rank never joined. The ranks vote at step 1's
    end and read the vote at step 2's, where they stop."""
    cmd = ["fit", "--config", str(config), "--trainer.accelerator", "cpu",
           "--trainer.devices", "2", "--trainer.strategy", "ddp", "--data.batch_size", str(B),
           "--trainer.num_sanity_val_steps", "2", "--trainer.callbacks+=test_elastic.SigtermInTheSanityCheck"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = forked.popen(cmd, cwd=tmp_path, stderr=forked.PIPE, env=env,
                        start_new_session=True)  # its own process group: the callback signals all of it
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.end()
        pytest.fail("the run hung after a SIGTERM in its sanity check")
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    said = [line for line in err.splitlines() if "interrupted by" in line]
    assert len(said) == 1 and "interrupted by SIGTERM at step 2;" in said[0], err[-3000:]


def test_ranks_share_the_validation_and_report_what_one_device_does(run_config, tmp_path):
    """Catches every rank evaluating the whole validation split (N devices did N times the work for one number), and
    the per-corpus val/loss/NAME of a mixture averaged over the ranks' shares instead of summed: the numbers must be
    one device's, from half the batches on each of two ranks."""
    import numpy as np

    rng = np.random.default_rng(0)
    corpora = []
    for name, letters in (("a.txt", "abcde"), ("b.txt", "vwxyz")):
        (tmp_path / name).write_text("".join(rng.choice(list(letters), size=12_000)), encoding="utf-8")
        corpora.append(str(tmp_path / name))
    config = run_config(seed_everything=5, trainer={"max_steps": 2, "val_check_interval": 2},
                        model={"lr": 3e-3, "warmup_steps": 1},
                        data={"corpus": corpora, "weights": [0.5, 0.5], "batch_size": 2 * B, "val_batches": None})
    count = "--trainer.callbacks+=test_elastic.CountValBatches"
    _fit(config, count, devices=1)
    one = int((tmp_path / "val-batches-0.txt").read_text())
    _fit(config, count, "--run.name", "two", "--data.batch_size", str(B), devices=2)
    shares = [int((tmp_path / f"val-batches-{r}.txt").read_text()) for r in (0, 1)]
    # each corpus's 75 val windows: 10 batches of 8 on one device; 19 batches of 4 on two, 10 on rank 0, 9 on rank 1
    # and one that counts nothing (every rank runs as many: under FSDP a rank with fewer left the others waiting)
    assert one == 2 * 10 and shares == [2 * 10, 2 * 10]
    for key in ("val/loss", "val/loss/a.txt", "val/loss/b.txt", "val/bpb"):
        want, got = _metric(tmp_path / "runs" / "tiny", key), _metric(tmp_path / "runs" / "two", key)
        assert list(got) == list(want) == [1] and got[1] == pytest.approx(want[1], abs=1e-5), key


def test_a_scaling_ladder_on_two_ranks_reports_once_and_sets_a_killed_run_aside_once(run_config, tmp_path):
    """Catches every rank of a 2-device ladder printing the table and writing the plot, and both ranks moving aside
    the folder of a rung killed before its first checkpoint (the second found it gone, or locked by the first)."""
    config = run_config()
    killed = tmp_path / "runs" / "tiny-C1.0e07-L1-d24" / "csv"  # the last rung: rank 1 runs by the time it comes
    killed.mkdir(parents=True)
    (killed / "metrics.csv").write_text("epoch,step,train/loss\n0,0,4.1\n")
    # a budget of 16, 5, 3 and 3 steps (1 to 3 steps would do for what is checked: fewer, fewer seconds)
    cmd = ["scaling", "--config", str(config), "--budget", "1e7", "--sizes",
           "[[1,8],[1,16],[2,16]]", "--predict", "[1,24]", "--trainer.accelerator", "cpu", "--trainer.devices", "2",
           "--trainer.strategy", "ddp"]
    done = forked.run(cmd, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("compute-matched ladder") == 1, done.stdout
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len([r for r in runs if r.endswith(".json")]) == 1, runs
    assert len([r for r in runs if ".unfinished-" in r]) == 1, runs


def test_ranks_that_ddp_fork_starts_say_each_warning_once(config, tmp_path):
    """Catches every training process of ddp_fork printing its own copy of each warning (they learn their rank after
    this process set up its console), and a failure's line followed by torch's "Terminating process" noise."""
    _fit(config, devices=1)
    cmd = ["validate", "--config", str(config), "--ckpt_path", "last",
           "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp_fork"]
    done = forked.run([*cmd, "--data.val_fraction", "0.3"], cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("is larger than") == 1, done.stderr[-3000:]
    done = forked.run([*cmd, "--data.block_size", "4000"], cwd=tmp_path, timeout=300)
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and said[-1].startswith("tinylm validate: error: ValueError: "), done.stderr[-3000:]
    assert "Terminating process" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]


class EveryRankRaises(L.Callback):
    """A user's error raised on every rank as the run sets up (a split too short is now found before the ranks
    part: in prepare_data, on rank 0 alone)."""

    def setup(self, trainer, pl_module, stage):
        from tinylm.errors import TinyLMError

        raise TinyLMError("the data of this rank is wrong")


def test_an_error_every_rank_raises_is_a_whole_line_from_each_saying_its_rank(config, tmp_path):
    """Catches two ranks' copies of one error printed as two identical lines, once glued into one (print wrote the
    text and its newline apart, and the ranks' writes interleaved)."""
    cmd = ["fit", "--config", str(config), "--trainer.accelerator", "cpu",
           "--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.callbacks+=test_elastic.EveryRankRaises"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = forked.run(cmd, cwd=tmp_path, env=env, timeout=300)
    said = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 1 and len(said) == 2, done.stderr[-3000:]
    assert sorted(line.startswith("tinylm fit: error: (rank 1) ") for line in said) == [False, True], said
    assert all(line.count("error:") == 1 and line.endswith("the data of this rank is wrong") for line in said), said


def test_a_master_port_in_use_is_one_line(config, tmp_path):
    """Catches `MASTER_PORT=N` of a port another process listens on ending in ~60 lines of torch's C++ frames
    (DistNetworkError: EADDRINUSE) instead of the port and the fix."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cmd = ["fit", "--config", str(config), "--trainer.accelerator", "cpu", "--trainer.devices", "2",
               "--trainer.strategy", "ddp"]
        done = forked.run(cmd, cwd=tmp_path, env={**os.environ, "MASTER_PORT": str(port)}, timeout=300)
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and said[-1] == (
        f"tinylm fit: error: MASTER_PORT {port} is in use by another process (address already in use): the ranks "
        "cannot meet there; pass another MASTER_PORT, or leave it unset on one machine (Lightning then picks a free "
        "one)"), done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_ranks_that_do_not_all_meet_in_time_are_one_line(monkeypatch):
    """Catches a rank stopped (Ctrl+Z, kill -STOP, a scheduler's suspend), slow to start or never started past the
    process group's timeout ending the run in torch's traceback (~25 lines, DistStoreError "Timed out after 21
    seconds waiting for clients. 1/2 clients joined.": a real 2-rank run with DDPStrategy's timeout 20 s) instead of
    one line that says what happened and what to do."""
    import datetime

    from tinylm.cli.errors import is_user_error, one_line

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29512")
    with pytest.raises(torch.distributed.DistStoreError) as raised:  # rank 0's store, rank 1 never connecting
        torch.distributed.TCPStore("127.0.0.1", 0, world_size=2, is_master=True, wait_for_workers=True,
                                   timeout=datetime.timedelta(seconds=1))
    line = one_line(raised.value)
    assert is_user_error(raised.value), line
    assert line.startswith("the ranks did not all meet at 127.0.0.1:29512 in time (Timed out after ") and \
        "1/2 clients joined): a rank was stopped (Ctrl+Z, kill -STOP, a scheduler's suspend), slow to start, or " \
        "never started; run the same command again, on every node" in line, line


def test_a_collective_timed_out_on_a_stopped_rank_is_one_line():
    """Catches a rank stopped alone (kill -STOP, Ctrl+Z of one task, a scheduler suspending one) past the process
    group's timeout ending rank 0 in ~60 lines of traceback ending "RuntimeError: [.../gloo/transport/tcp/
    unbound_buffer.cc:78] Timed out waiting 60000ms for recv operation to complete" (a real 2-rank run, rank 1
    stopped 100 s under DDPStrategy's timeout 60 s), instead of one line with the cause and the resume."""
    from tinylm.cli.errors import error_line, is_user_error, one_line

    e = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                     "waiting 60000ms for recv operation to complete")
    assert is_user_error(e)
    line = error_line("fit", one_line(e), ["--config", "c.yaml"])
    assert line == ("tinylm fit: error: another rank did not take part in a collective for 60 s (the process group's "
                    "timeout): it was stopped (Ctrl+Z, kill -STOP, a scheduler's suspend of one task) or stuck that "
                    "long, so the run stopped; go on with `tinylm fit --config c.yaml --ckpt_path last`\n"), line
    assert not is_user_error(RuntimeError("Timed out waiting for the GPU"))  # (another timeout: a bug's traceback)


def _rng_rank(rank: int, port: int, path: Path) -> str:
    """One of two ranks (gloo) drawing dropout-like numbers through RNGState: its first draws, and whether a resume
    from the checkpoint (the dict rank 0 writes) draws what it drew after the save (see the test)."""
    import datetime
    from types import SimpleNamespace

    import torch.distributed as dist

    from tinylm.train.callbacks import RNGState

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    trainer = SimpleNamespace(global_rank=rank, world_size=2)

    def first_batch(rng: RNGState) -> None:
        torch.manual_seed(5)  # as seed_everything seeds every rank, alike (their initial weights are the same)
        rng.on_train_start(trainer, None)
        rng.on_train_batch_start(trainer, None, None, 0)

    first_batch(rng := RNGState())
    first = torch.rand(4)
    state = rng.state_dict()  # every rank takes part (a checkpoint's save); rank 0's dict is the file
    after = torch.rand(4)
    if rank == 0:
        torch.save(state, path)
    dist.barrier()
    resumed = RNGState()
    resumed.load_state_dict(torch.load(path, weights_only=True))
    first_batch(resumed)
    return json.dumps({"first": first.tolist(), "after": after.tolist(), "exact": torch.equal(torch.rand(4), after)})


def test_each_rank_draws_its_own_dropout_masks_and_resumes_them(tmp_path):
    """Catches every rank of a run drawing the same dropout masks (seed_everything seeds all ranks alike, and a
    checkpoint held rank 0's random state alone): rows k and B + k of the global batch dropped the same units, where
    one device (and nanoGPT's ranks, seeded 1337 + rank) draws each row's own. Each rank's stream also resumes
    exactly on 2 ranks, and rank 0's on 1. The ranks are processes forked from this one (gloo)."""
    from types import SimpleNamespace

    from tinylm.train.callbacks import RNGState

    said = forked.two_ranks(lambda rank, port: _rng_rank(rank, port, tmp_path / "rng.pt"), tmp_path)
    rank0, rank1 = (json.loads(line) for line in said)
    assert rank0["first"] != rank1["first"], said  # each rank its own masks
    assert rank0["exact"] and rank1["exact"], said  # each resumed on 2 ranks as it went on
    one, trainer = RNGState(), SimpleNamespace(global_rank=0, world_size=1)  # resumed on 1 device: rank 0's goes on
    one.load_state_dict(torch.load(tmp_path / "rng.pt", weights_only=True))
    one.on_train_start(trainer, None)
    one.on_train_batch_start(trainer, None, None, 0)
    assert torch.rand(4).tolist() == rank0["after"], said


def _failed_rank(rank: int, port: int) -> str:
    """One of two ranks (gloo): rank 0 goes on without a save (the failure never reached it: it left), rank 1 fails
    and saves a failure's checkpoint (OnExceptionCheckpoint: RNGState's on_exception, then its state_dict)."""
    import datetime
    from types import SimpleNamespace

    import torch.distributed as dist

    from tinylm.train.callbacks import RNGState

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    dist.barrier()
    if rank == 0:
        return "{}"
    rng, trainer = RNGState(), SimpleNamespace(global_rank=rank, world_size=2)
    rng.on_train_start(trainer, None)
    rng.on_exception(trainer, None, RuntimeError("a failure of rank 1 alone"))
    return json.dumps({"ranks": rng.state_dict()["ranks"]})


def test_a_failure_of_one_rank_saves_its_checkpoint_without_the_others(tmp_path):
    """Catches the save of a failure's checkpoint (Lightning's OnExceptionCheckpoint) gathering every rank's random
    state: a failure of one rank (its data, a callback) saved there alone, and the gather waited for ranks that never
    joined it; `tinylm fit` on 2 devices hung for good (SIGTERM waits for a step's end that never comes) where it
    ended with the failure's traceback. The checkpoint holds rank 0's state alone (``ranks`` None)."""
    said = forked.two_ranks(_failed_rank, tmp_path)
    assert json.loads(said[1]) == {"ranks": None}, said
