"""SIGTERM, SIGHUP and Ctrl+C save the run: `last.ckpt` at the step reached, a non-zero exit, an exact resume.

The runs signalled here are `python -m tinylm ...` processes forked from one that has imported tinylm and Lightning
(tests/forked.py): what is tested is the run's behaviour, not its interpreter's start (DDP's rank 1 still starts as
Lightning starts it, a fresh interpreter)."""

import contextlib
import csv
import errno
import os
import pickle
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import forked
import lightning as L
import pytest
import torch
from helpers import _assert_same_rows, _losses, _val_losses
from lightning.pytorch.loggers import CSVLogger

from tinylm.cli import main

pytestmark = pytest.mark.process  # runs whole `tinylm` processes (tests/process)


@pytest.fixture
def config(run_config):
    """Long enough to be interrupted; accumulation, dropout, workers and validation every 3 steps in between."""
    return run_config(
        chars=40_000,
        seed_everything=3,
        run={"name": "run", "checkpoint_every": 2, "keep_checkpoints": -1},
        trainer={"max_steps": 100_000, "accumulate_grad_batches": 2, "val_check_interval": 6},
        # the schedule's length is pinned, so runs that stop at different max_steps follow the same schedule
        model={"dropout": 0.1, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2, "decay_steps": 8},
        data={"block_size": 32, "batch_size": 4, "val_batches": 2, "num_workers": 2},
    )


def _wait_or_kill(proc: forked.Forked, tmp_path, timeout: float, what: str) -> None:
    """Wait for the signalled run; one that goes on is killed (with its loader workers and ranks) and fails the test:
    left running, it trained and saved a checkpoint every 2 steps until the disk was full."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the run hung after {what}:\n" + (tmp_path / "stderr.txt").read_text()[-2000:])


def _interrupt(config, tmp_path, signum: int, group: bool) -> tuple[subprocess.CompletedProcess, int]:
    """Run `tinylm fit` in a child process, send ``signum`` once step 2 is saved, to its whole process group (loader
    workers too) or to it alone; (finished process, its last.ckpt step)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread, as the in-process runs here: the same float sums
    # its own session, like a terminal job: Ctrl+C reaches the whole group (loader workers too), kill the process
    err = open(tmp_path / "stderr.txt", "w+")  # noqa: SIM115 (a file, not a pipe: a full pipe would stall the child)
    proc = forked.popen(["fit", "--config", str(config)], cwd=tmp_path, env=env, stderr=err.name,
                        start_new_session=True)
    ckpts = tmp_path / "runs" / "run" / "checkpoints"
    deadline = time.monotonic() + 300  # (bounds a hang: signalled before step 2, the test would prove nothing)
    while not (reached := (ckpts / "step-2.ckpt").is_file()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reached and proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
    if group:
        os.killpg(proc.pid, signum)
        if signum == signal.SIGTERM:  # and once more: the main process takes it as the same request
            time.sleep(0.2)
            os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    _wait_or_kill(proc, tmp_path, 120, signal.Signals(signum).name)
    err.close()
    step = torch.load(ckpts / "last.ckpt", weights_only=True, map_location="cpu")["global_step"]
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", (tmp_path / "stderr.txt").read_text()), step


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "group"), [(signal.SIGTERM, False), (signal.SIGTERM, True), (signal.SIGINT, True),
                                             (signal.SIGHUP, True)],
                         ids=["SIGTERM", "SIGTERM-twice-to-the-group", "SIGINT", "SIGHUP-to-the-group"])
def test_signal_saves_last_and_resumes_exactly(config, tmp_path, signum, group):
    """Catches SIGTERM exiting 0 and Ctrl+C exiting 1 without a checkpoint (the steps since the last periodic save
    were lost), a save mid-accumulation or before the step's validation, and loader workers killed by Ctrl+C or by
    a SIGTERM to every process of the job (SLURM's time limit, systemd; here sent twice): "DataLoader worker is
    killed", no save; and SIGHUP (a shell passes a closed terminal's on to each job's group) killing the run at once,
    with no save and no line."""
    done, step = _interrupt(config, tmp_path, signum, group)
    name = signal.Signals(signum).name
    # 143 for SIGTERM, 130 for Ctrl+C, as a shell says; a second SIGTERM that comes once the run has saved and
    # given the signal back ends the process by it: a shell says 143 too
    assert done.returncode == 128 + signum or group and done.returncode == -signal.SIGTERM == -signum, \
        done.stderr[-3000:]
    assert step >= 2
    line = (f"interrupted by {name} at step {step}; saved runs/run/checkpoints/last.ckpt; resume with `tinylm fit "
            f"--config {config} --ckpt_path last`")
    assert line in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr

    end = step + 3
    main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", str(end)])
    main(["fit", "--config", str(config), "--run.name", "straight", "--trainer.max_steps", str(end)])
    resumed, straight = tmp_path / "runs" / "run", tmp_path / "runs" / "straight"
    assert sorted(_losses(straight)) == list(range(end))
    _assert_same_rows(_losses(resumed), _losses(straight))
    _assert_same_rows(_val_losses(resumed), _val_losses(straight))
    assert _losses(straight)[end - 1] != _losses(straight)[0]  # not vacuous: the losses do change


def test_a_closed_terminal_stops_the_run_at_a_step_and_saves(config, tmp_path):
    """Catches a closed terminal (an ssh session dropped) killing `fit` at once, unsaved: the kernel's SIGHUP to the
    terminal's controlling process, and every write to the hung-up terminal failing (EIO), the progress bar's
    included. The run, on a real pseudo-terminal closed at step 2, stops at a whole step, saves, exits 129."""
    import pty

    master, slave = pty.openpty()
    terminal = os.ttyname(slave)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # as a login shell's job: its own session, the pty its controlling terminal (opened by the session's leader)
    proc = forked.popen(["fit", "--config", str(config), "--trainer.enable_progress_bar", "true"], cwd=tmp_path,
                        env=env, stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True)
    os.close(slave)
    ckpts = tmp_path / "runs" / "run" / "checkpoints"
    deadline, said = time.monotonic() + 180, b""
    while not (ckpts / "step-2.ckpt").is_file() and proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):  # the terminal's screen, read so that its buffer never fills
            said += os.read(master, 65536) if select.select([master], [], [], 0.05)[0] else b""
    assert proc.poll() is None, said[-3000:]
    os.close(master)  # the terminal closes
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.end()
        pytest.fail("the run went on after its terminal closed")
    assert proc.returncode == 129, said[-3000:]
    step = torch.load(ckpts / "last.ckpt", weights_only=True, map_location="cpu")["global_step"]
    assert step >= 2 and sorted(_losses(tmp_path / "runs" / "run")) == list(range(step))  # every step logged


class Hangup(L.Callback):
    """A terminal closing after step 2."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGHUP)


@pytest.mark.parametrize("nohup", [False, True], ids=["sighup", "under-nohup"])
def test_sighup_saves_unless_the_run_was_started_to_ignore_it(run_config, tmp_path, capsys, nohup):
    """Catches SIGHUP ending a run unsaved (it stops at a whole step and saves, 129, as SIGTERM does with 143), and a
    run started under nohup (SIGHUP ignored) stopping on one all the same: it trains to its end."""
    config = run_config(trainer={"max_steps": 5, "callbacks": [{"class_path": "test_signals.Hangup"}]})
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN if nohup else signal.SIG_DFL)
    try:
        if nohup:
            main(["fit", "--config", str(config)])
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        else:
            with pytest.raises(SystemExit) as exit_:
                main(["fit", "--config", str(config)])
            assert exit_.value.code == 129
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, before)
    ckpts = tmp_path / "runs" / "tiny" / "checkpoints"
    step = torch.load(ckpts / "last.ckpt", weights_only=True)["global_step"]
    err = capsys.readouterr().err
    if nohup:
        assert step == 5 and "interrupted" not in err, err[-2000:]
    else:
        assert step == 2, err[-2000:]
        assert "error: interrupted by SIGHUP at step 2; saved runs/tiny/checkpoints/last.ckpt" in err, err[-2000:]


def test_handlers_are_restored_after_fit(run_config):
    """Catches a finished run leaving its SIGINT handler behind, after which Ctrl+C no longer stops the process."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    main(["fit", "--config", str(run_config())])
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_second_sigterm_as_an_interrupted_run_ends_is_the_same_request(tmp_path):
    """Catches a SIGTERM sent twice to the job (SLURM, `kill -TERM -- -PGID` repeated) reaching the command's outer
    handler once the first had stopped the run: its raise, mid-teardown, left the loader's workers unjoined and the
    run ended with "DataLoader worker is killed by signal: Alarm clock" instead of its resume line (seen in CI, where
    the teardown was slow enough to be hit)."""
    from tinylm.train.interrupt import InterruptStop

    outer_calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: outer_calls.append(signum))  # as _terminate_cleanly
    try:
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path)
        stop = InterruptStop(None)
        stop.setup(trainer, None, "fit")
        os.kill(os.getpid(), signal.SIGTERM)  # the first: the run stops at its next step, raising RunInterrupted
        stop.on_exception(trainer, None, RuntimeError("stopped"))  # the run ends on it
        os.kill(os.getpid(), signal.SIGTERM)  # the second, while the run tears down
        trainer._signal_connector.teardown()  # Lightning puts back the handlers it found
        os.kill(os.getpid(), signal.SIGTERM)
        assert outer_calls == []
    finally:
        signal.signal(signal.SIGTERM, previous)


class SendSignals(L.Callback):
    """A scheduler inside the run: SIGUSR1 (SLURM's requeue warning) after step ``usr1_at``, SIGTERM after
    ``term_at``."""

    def __init__(self, usr1_at: int = 1, term_at: int = 3) -> None:
        self.at = {usr1_at: signal.SIGUSR1, term_at: signal.SIGTERM}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (signum := self.at.pop(trainer.global_step, None)) is not None:
            os.kill(os.getpid(), signum)


def test_verbose_keeps_the_exit_status_of_a_run_stopped_by_a_signal(run_config, capsys):
    """Catches `tinylm fit ... --verbose` stopped by SIGTERM (a scheduler's pre-emption), saved, exiting 1 as a crash
    does: --verbose adds the traceback, and the status a requeue script or scheduler reads stays 143."""
    sigterm = {"class_path": "test_signals.SendSignals", "init_args": {"usr1_at": -1, "term_at": 1}}
    config = run_config(trainer={"max_steps": 6, "callbacks": [sigterm]})
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(config), "--verbose"])
    err = capsys.readouterr().err
    assert exit_.value.code == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" in err and "RunInterrupted: interrupted by SIGTERM at step 1; saved " in err, err[-2000:]


class CtrlCTwice(L.Callback):
    """A user pressing Ctrl+C twice after step 2: the first asks for a stop at a whole step, the second for one now."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("every, said", [
    (None, "stopped at once by a second Ctrl+C at step 2: nothing was saved; no checkpoint of this run was saved "
           "yet\n"),
    (1, "stopped at once by a second Ctrl+C at step 2, unsaved (one Ctrl+C finishes the step and saves); the "
        "newest checkpoint is runs/tiny/checkpoints/last.ckpt: resume with `tinylm fit --config tiny.yaml "
        "--ckpt_path last`\n"),
])
def test_a_second_ctrl_c_stops_at_once_with_the_shells_exit_status(run_config, tmp_path, every, said):
    """Catches a second Ctrl+C exiting 1, as a failure (Lightning ends its KeyboardInterrupt handling in
    sys.exit(1)): an interrupted command exits 130, as a shell reports one, and says in a line what it cut short
    and where the run goes on from (it said Lightning's "attempting graceful shutdown", then "tinylm: interrupted")."""
    config = run_config(trainer={"max_steps": 100, "callbacks": [{"class_path": "test_signals.CtrlCTwice"}]},
                        run={"checkpoint_every": every} if every else {})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__),
                                                        os.path.dirname(os.path.dirname(__file__)),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = forked.run(["fit", "--config", config.name], cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 130, done.stderr[-3000:]
    assert done.stderr.endswith(f"tinylm fit: error: {said}"), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "graceful" not in done.stderr, done.stderr[-3000:]


def _slurm_job(monkeypatch, tmp_path, scontrol: str | None = "exit 0") -> Path:
    """The variables of a one-task SLURM job (sbatch, srun) with `scontrol` a script that records its arguments in
    the file returned and runs ``scontrol`` (None: no scontrol on PATH)."""
    for key, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "tinylm", "SLURM_JOB_ID": "123", "SLURM_PROCID": "0",
                       "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}.items():
        monkeypatch.setenv(key, value)
    (bin_ := tmp_path / "bin").mkdir()
    if scontrol is not None:
        (bin_ / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.txt"}\n{scontrol}\n')
        (bin_ / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_))
    return tmp_path / "scontrol.txt"


def test_slurm_requeue_saves_at_a_whole_step_and_requeues(run_config, tmp_path, monkeypatch, capsys):
    """Catches SLURM's auto-requeue signal (SIGUSR1, `#SBATCH --signal=USR1@90`) left to Lightning's handler, which
    saved hpc_ckpt_N.ckpt from inside the signal handler, mid-step (under DDP its save's collectives met the other
    ranks' gradient all-reduce: the run hung for good, neither saved nor requeued); and the requeued job
    (SLURM_RESTART_COUNT=1, the same command) refused as a fresh run over the run it started. The run stops at a
    whole step, saves last.ckpt, requeues the job (`scontrol requeue JOB`) and the requeued job goes on from there."""
    calls = _slurm_job(monkeypatch, tmp_path)
    config = run_config(trainer={"max_steps": 6, "callbacks": [{"class_path": "test_signals.SendSignals"}]})
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(config)])
    assert {s: signal.getsignal(s) for s in before} == before  # an interrupted run leaves no handler behind
    assert exit_.value.code == 128 + signal.SIGUSR1
    assert "interrupted by SIGUSR1 at step 1; saved runs/tiny/checkpoints/last.ckpt; SLURM job 123 requeued" in \
        capsys.readouterr().err
    assert calls.read_text() == "requeue 123\n"
    run = tmp_path / "runs" / "tiny"
    assert not list(run.glob("hpc_ckpt_*.ckpt"))
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 1
    # the requeued job runs the same script: it goes on from the run's newest checkpoint (it was refused as a fresh
    # run over an existing one, and the requeue wasted)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    main(["fit", "--config", str(run_config(trainer={"max_steps": 6}))])  # (without the scheduler inside)
    assert "SLURM requeued this job (SLURM_RESTART_COUNT=1): going on from" in capsys.readouterr().err
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    # requeued again once the run was complete (a node failed after it ended, `sbatch --requeue`): exit 0, not a
    # FAILED job whose line advises a larger max_steps
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(run_config(trainer={"max_steps": 6}))])
    assert exit_.value.code == 0 and "is already at step 6 >= --trainer.max_steps 6" in capsys.readouterr().err


class WarnInValidation(L.Callback):
    """SLURM's requeue warning (SIGUSR1) as `tinylm validate` evaluates its first batch."""

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0 and not trainer.sanity_checking:
            os.kill(os.getpid(), signal.SIGUSR1)


def test_slurm_requeue_during_validate_is_lightnings_requeue(run_config, tmp_path, monkeypatch, capsys):
    """Catches the command's stand-in for SIGUSR1 before a run (it ends the command as SIGTERM does) kept through
    `tinylm validate` under SLURM's auto-requeue: Lightning found a handler there and installed none, so validate
    ended at once with 138 and the job was not requeued; Lightning's handler requeues it and validate goes on."""
    config = run_config()
    main(["fit", "--config", str(config)])
    calls = _slurm_job(monkeypatch, tmp_path)
    main(["validate", "--config", str(config), "--ckpt_path", "runs/tiny/checkpoints/last.ckpt",
          "--trainer.callbacks+=test_signals.WarnInValidation"])
    assert "val/loss" in capsys.readouterr().out
    assert calls.read_text() == "requeue 123\n"


def test_a_failed_slurm_requeue_says_how_to_resume(run_config, tmp_path, monkeypatch, capsys):
    """Catches a run stopped by SLURM's requeue signal whose `scontrol requeue` failed (a job submitted with
    --no-requeue) ending without a word of it: the job is over, and nothing will go on from the checkpoint."""
    _slurm_job(monkeypatch, tmp_path, "echo 'Requested operation is presently disabled for job 123' >&2; exit 1")
    config = run_config(trainer={"max_steps": 6, "callbacks": [{"class_path": "test_signals.SendSignals"}]})
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config)])
    assert "saved runs/tiny/checkpoints/last.ckpt; requeueing SLURM job 123 failed (scontrol: Requested operation " \
           "is presently disabled for job 123); resume with `tinylm fit --config" in capsys.readouterr().err


def test_a_requeued_job_that_saved_only_lightnings_hpc_checkpoint_goes_on_from_it(run_config, tmp_path, monkeypatch,
                                                                                   capsys):
    """Catches a requeued SLURM job whose run saved no checkpoint of its own (checkpointing off; or killed before its
    step ended), only Lightning's hpc_ckpt_1.ckpt on SIGUSR1, said to start again from step 0 with its logged rows
    set aside, then resumed by Lightning from that file unsaid (it takes one when --ckpt_path is unset): its
    metrics.csv began mid-run, the rows before in metrics.before-requeue-1.csv."""
    _slurm_job(monkeypatch, tmp_path, None)  # (requeueing fails, logged: the hpc save is what counts)
    trainer = {"max_steps": 6, "enable_checkpointing": False}
    config = run_config(trainer={**trainer, "callbacks": [{"class_path": "test_signals.SendSignals"}]})
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config)])
    run = tmp_path / "runs" / "tiny"
    assert torch.load(run / "hpc_ckpt_1.ckpt", weights_only=True)["global_step"] == 1
    capsys.readouterr()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    main(["fit", "--config", str(run_config(trainer=trainer))])  # (the same run, without the scheduler inside)
    err = capsys.readouterr().err
    assert "starts again from step 0" not in err, err
    assert f"going on from {Path('runs/tiny/hpc_ckpt_1.ckpt')} (step 1)" in err, err
    assert not (run / "csv" / "metrics.before-requeue-1.csv").exists()
    steps = [int(row["step"]) for row in csv.DictReader(open(run / "csv" / "metrics.csv")) if row["train/loss"]]
    assert steps == [0, 1, 2, 3, 4, 5]


class SendWarning(L.Callback):
    """A scheduler other than SLURM warning of its pre-emption (LSF's `bsub -wa USR2`, `timeout -s USR1`): ``signum``
    after step 1."""

    def __init__(self, signum: str = "SIGUSR1") -> None:
        self.signum = signal.Signals[signum]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == 1:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2], ids=["SIGUSR1", "SIGUSR2"])
def test_a_pre_emption_warning_outside_slurm_saves_at_a_whole_step(run_config, tmp_path, signum):
    """Catches SIGUSR1 or SIGUSR2 outside SLURM's auto-requeue (a user's `kill -USR1`, `timeout -s USR1`, another
    scheduler's warning before it pre-empts the job) killing `tinylm fit` at once by Python's default, with no save
    and no word (the shell's "User defined signal 1"), the steps since the last periodic save lost: it stops the run
    as SIGTERM does, at a whole step, saves last.ckpt and says so (exit 128 + the signal)."""
    callback = {"class_path": "test_signals.SendWarning", "init_args": {"signum": signum.name}}
    config = run_config(trainer={"max_steps": 6, "callbacks": [callback]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), os.path.dirname(os.path.dirname(__file__)),
                                         os.environ.get("PYTHONPATH", "")])
    done = forked.run(["fit", "--config", config.name], cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 128 + signum, done.stderr[-3000:]
    assert f"interrupted by {signum.name} at step 1; saved runs/tiny/checkpoints/last.ckpt; resume with `tinylm fit " \
           "--config" in done.stderr, done.stderr[-3000:]
    run = tmp_path / "runs" / "tiny"
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 1


class WarnAsBuilt(L.Callback):
    """A scheduler's pre-emption warning (SIGUSR1) while `tinylm fit` builds the run, before its training loop's
    handlers: where a tokenizer trains and the corpus is packed (minutes, for a large one)."""

    def __init__(self) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)


def test_a_pre_emption_warning_before_training_ends_the_command_in_its_line(run_config, tmp_path):
    """Catches SIGUSR1 (SLURM's `--signal=USR1@90`, `timeout -s USR1`) during the data preparation or tokenizer
    training inside `tinylm fit`, before tinylm.train.interrupt's handler, killing the command by Python's default:
    status -10, not a word (the shell's "User defined signal 1"). It ends as a SIGTERM there does, in one line, with
    the status the run's own handler gives (138); once training starts that handler still saves at a whole step."""
    config = run_config(trainer={"callbacks": [{"class_path": "test_signals.WarnAsBuilt"}]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), os.path.dirname(os.path.dirname(__file__)),
                                         os.environ.get("PYTHONPATH", "")])
    done = forked.run(["fit", "--config", config.name], cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 128 + signal.SIGUSR1, done.stderr[-3000:]
    assert done.stderr.endswith("tinylm fit: error: terminated by SIGUSR1 before it finished; run the same `tinylm "
                                "fit` again\n"), done.stderr[-3000:]


def test_sigterm_with_checkpointing_off_exits_non_zero(config, tmp_path):
    """Catches SIGTERM ending a run with checkpointing off with exit 0 halfway (a scheduler would record success)."""
    proc = forked.popen(["fit", "--config", str(config), "--trainer.enable_checkpointing", "false",
                         "--data.num_workers", "0"], cwd=tmp_path, stderr=forked.PIPE,
                        env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics = tmp_path / "runs" / "run" / "csv" / "metrics.csv"
    deadline = time.monotonic() + 120
    while (not metrics.is_file() or metrics.stat().st_size < 200) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    try:
        err = proc.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:
        proc.end()
        pytest.fail("the run went on after SIGTERM")
    assert proc.returncode == 143, err[-3000:]
    assert "interrupted by SIGTERM at step" in err and "nothing was saved" in err and "Traceback" not in err


def _two_ranks(config, strategy: str = "ddp", command: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """The arguments of `tinylm fit --config CONFIG` (or of ``command``) on 2 CPU ranks and its environment, in
    which the callbacks of this file can be named."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.path.dirname(os.path.dirname(__file__)),
                                          os.environ.get("PYTHONPATH", "")])}
    return [*(command or ("fit", "--config", str(config))), "--trainer.accelerator",
            "cpu", "--trainer.devices", "2", "--trainer.strategy", strategy], env


class TermRank1AtSetup(L.Callback):
    """A SIGTERM that reaches one training process of ddp_fork's before training (a scheduler's to one rank)."""

    def setup(self, trainer, pl_module, stage):
        if trainer.global_rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)


def test_a_sigterm_to_one_ddp_fork_training_process_before_training_exits_143(run_config, tmp_path):
    """Catches a training process's stop on SIGTERM (raised as an Exception there, for torch's wrapper to pass on)
    read back by the launching process with exit 1: a scheduler then records a failure, not a termination."""
    cmd, env = _two_ranks(run_config(), "ddp_fork")
    done = forked.run([*cmd, "--trainer.callbacks+=test_signals.TermRank1AtSetup"], cwd=tmp_path, env=env,
                      timeout=120)
    assert done.returncode == 143, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(said) == 1 and "terminated by SIGTERM before it finished" in said[0], done.stderr[-3000:]


def _signal_two_ranks(tmp_path, config, strategy: str, signum: int, *, when: str, to: str,
                      args: tuple[str, ...] = (), command: tuple[str, ...] = ()) -> tuple[int, str]:
    """`tinylm fit` (or ``command``) on 2 CPU ranks in its own session, with ``args``; ``signum`` sent ``when``
    ("connecting": as the ranks connect; "step 2": once step-2.ckpt is saved) ``to`` "launcher" (the command alone,
    as a scheduler or `timeout` does), "group" (every process, as a terminal's Ctrl+C) or "rank 1" (ddp's second
    process alone). Its exit status and stderr; a hang fails the test."""
    err = open(tmp_path / "stderr.txt", "w+")  # noqa: SIM115 (the child's stderr, read after it exits)
    cmd, env = _two_ranks(config, strategy, command)
    proc = forked.popen([*cmd, *args], cwd=tmp_path, env=env, stderr=err.name, start_new_session=True)
    ready = {"connecting": lambda: "Initializing distributed: GLOBAL_RANK: 0" in (tmp_path / "stderr.txt").read_text(),
             "step 2": (tmp_path / "runs" / "run" / "checkpoints" / "step-2.ckpt").is_file}[when]
    deadline = time.monotonic() + 300  # (bounds a hang: these whole tests took ~55 s on a loaded 2-core machine)
    while not (reached := ready()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reached and proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
    if to == "group":
        os.killpg(proc.pid, signum)
    elif to == "rank 1":
        os.kill(_rank1(proc.pid), signum)
    else:
        proc.send_signal(signum)
    _wait_or_kill(proc, tmp_path, 90, "the signal")
    err.close()
    return proc.returncode, (tmp_path / "stderr.txt").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["one process", "ddp_fork"])
def test_a_run_started_to_ignore_ctrl_c_trains_on(run_config, tmp_path, strategy):
    """Catches ddp_fork hanging for good on two Ctrl+Cs to a run started with SIGINT ignored (a script's `&` job):
    its training processes installed their own handler anyway, took the second for "stop now" and ended without a
    result, which the launcher waited for forever; one process stopped at the first. A Ctrl+C the command was
    started to ignore is ignored: the run trains to its end."""
    config = run_config(chars=40_000, run={"name": "run", "checkpoint_every": 2}, trainer={"max_steps": 12})
    cmd, env = _two_ranks(config, "ddp_fork") if strategy == "ddp_fork" else \
        (["fit", "--config", str(config)], dict(os.environ))
    err = open(tmp_path / "stderr.txt", "w+")  # noqa: SIM115 (the child's stderr, read after it exits)
    # started as a script's `&` job is (`sh -c 'trap "" INT; exec ...'`): with Ctrl+C ignored
    proc = forked.popen(cmd, cwd=tmp_path, env=env, stderr=err.name, start_new_session=True, ignore_sigint=True)
    ckpts = tmp_path / "runs" / "run" / "checkpoints"
    deadline = time.monotonic() + 300  # (bounds a hang: signalled before step 2, the test would prove nothing)
    while not (reached := (ckpts / "step-2.ckpt").is_file()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reached and proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
    for _ in range(2):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
    _wait_or_kill(proc, tmp_path, 90, "two Ctrl+Cs")
    err.close()
    said = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 0 and "interrupted" not in said, said[-3000:]
    assert torch.load(ckpts / "last.ckpt", weights_only=True, map_location="cpu")["global_step"] == 12


@pytest.fixture
def ddp_config(run_config):
    """Long enough to be signalled at any point; a periodic save at step 2 says when training is under way."""
    return run_config(chars=40_000, run={"name": "run", "checkpoint_every": 2},
                      trainer={"max_steps": 100_000, "val_check_interval": 1000})


@pytest.mark.slow
def test_slurm_requeue_under_ddp_saves_and_requeues(ddp_config, tmp_path):
    """Catches a DDP run of two SLURM tasks (as srun starts them) hanging for good on the auto-requeue signal: each
    rank's Lightning handler saved hpc_ckpt_N.ckpt from inside the handler, and the rank that got it first waited in
    the save's collectives while the other ran its step's gradient all-reduce (SIGTERM was never handled either):
    neither saved nor requeued, SLURM's time limit killed it. Both ranks stop at one whole step, save last.ckpt,
    and rank 0 requeues the job once."""
    (bin_ := tmp_path / "bin").mkdir()
    (bin_ / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.txt"}\n')
    (bin_ / "scontrol").chmod(0o755)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}",
               "MASTER_PORT": str(port), "SLURM_JOB_ID": "4321", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "2",
               "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": str(rank),
               "SLURM_LOCALID": str(rank), "SLURM_NODELIST": "127.0.0.1"}
        args = ["fit", "--config", str(ddp_config), "--trainer.accelerator", "cpu", "--trainer.devices", "2"]
        (tmp_path / f"rank{rank}.txt").write_text("")
        if rank == 0:  # forked from the test worker's warm server (tests/forked.py: one interpreter's imports fewer)
            procs.append(forked.popen(args, cwd=tmp_path, env=env, stderr=tmp_path / "rank0.txt"))
        else:  # a fresh interpreter (the server serves one child at a time)
            with open(tmp_path / f"rank{rank}.txt", "w") as err:
                procs.append(subprocess.Popen([sys.executable, "-m", "tinylm", *args], cwd=tmp_path, env=env,
                                              stdout=subprocess.DEVNULL, stderr=err))
    try:
        # a fresh interpreter imports Lightning, the ranks connect and train 2 steps: 84 s on a loaded 2-core machine
        # (both fresh). A deadline only bounds a hang: sent before the ranks' handlers, SIGUSR1 killed them ([-10, -10],
        # no word)
        step2, deadline = tmp_path / "runs" / "run" / "checkpoints" / "step-2.ckpt", time.monotonic() + 300
        while not (reached := step2.is_file()) and time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.02)
        assert reached and all(p.poll() is None for p in procs), \
            "the run did not reach step 2:\n" + (tmp_path / "rank0.txt").read_text()[-2000:]
        procs[0].send_signal(signal.SIGUSR1)
        time.sleep(0.3)  # (the signal's delivery to srun's tasks, and its handling in each, are that far apart)
        procs[1].send_signal(signal.SIGUSR1)
        codes = [p.wait(timeout=90) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung on the requeue signal:\n" + (tmp_path / "rank0.txt").read_text()[-2000:])
    finally:
        for p in procs:
            p.kill()
    said = (tmp_path / "rank0.txt").read_text()
    assert codes == [138, 138], said[-3000:]
    assert "saved runs/run/checkpoints/last.ckpt; SLURM job 4321 requeued" in said, said[-3000:]
    assert (tmp_path / "scontrol.txt").read_text() == "requeue 4321\n"


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "signum"), [("ddp", signal.SIGTERM), ("ddp_fork", signal.SIGTERM),
                                                  ("ddp_fork", signal.SIGINT)],
                         ids=["ddp-SIGTERM", "ddp_fork-SIGTERM", "ddp_fork-SIGINT"])
def test_sigterm_under_ddp_saves_and_says_so_once(ddp_config, tmp_path, strategy, signum):
    """Catches the run hanging for good (ddp, 3 times in 4: Lightning's SIGTERM handler broadcast from inside
    whatever collective rank 0 was in), every rank printing its own "interrupted" line, and ddp_fork's parent exiting
    on SIGTERM while its training processes trained on: the run stops at a step, saves last.ckpt, says so once. A
    Ctrl+C to ddp_fork's parent alone (a notebook's Interrupt) left its training processes training to the end."""
    code, text = _signal_two_ranks(tmp_path, ddp_config, strategy, signum, when="step 2", to="launcher")
    ckpts = tmp_path / "runs" / "run" / "checkpoints"
    assert code == 128 + signum, text[-3000:]
    said = [line for line in text.splitlines() if "tinylm fit: error:" in line]
    want = "interrupted by SIGTERM at step" if strategy == "ddp" else "passed on to the training processes"
    assert len(said) == 1 and want in said[0] and "--ckpt_path last" in said[0], text[-3000:]
    saved = torch.load(ckpts / "last.ckpt", weights_only=True, map_location="cpu")["global_step"]
    assert saved >= 2
    time.sleep(1)
    assert not (ckpts / f"step-{saved + 2 - saved % 2}.ckpt").exists()  # nothing trained on after the stop


@pytest.mark.slow
@pytest.mark.parametrize("to", ["launcher", "group"])
def test_sigterm_while_the_ranks_connect_is_one_line(ddp_config, tmp_path, to):
    """Catches a SIGTERM while the ranks of a ddp run still connect ending in rank 1's gloo traceback (the launcher
    left, rank 1 lost its rendezvous) or in exit 137 without a word (rank 1, killed by it while it started, and
    Lightning's watch SIGKILLed the launcher, which waited for rank 1 to connect): one line and 143, as one process."""
    code, text = _signal_two_ranks(tmp_path, ddp_config, "ddp", signal.SIGTERM, when="connecting", to=to)
    said = [line for line in text.splitlines() if "error:" in line]
    # (the launcher waiting in torch's C++ for rank 1 to connect says where it waited)
    line = r"tinylm fit: error: terminated by SIGTERM (before it finished|while connecting to the other ranks at " \
        r"127\.0\.0\.1:\d+); run the same `tinylm fit` again"
    assert code == 143 and len(said) == 1 and re.fullmatch(line, said[0]), text[-3000:]
    assert "Traceback" not in text and "Exception raised from" not in text, text[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(("node", "signum"), [(1, signal.SIGTERM), (0, signal.SIGINT)], ids=["node1-SIGTERM",
                                                                                            "node0-Ctrl+C"])
def test_a_node_waiting_for_the_others_ends_on_a_signal(ddp_config, tmp_path, node, signum):
    """Catches a node started by hand (docs/distributed.md: MASTER_ADDR, MASTER_PORT, NODE_RANK) whose peer never
    came ignoring SIGTERM and Ctrl+C for 30 minutes (torch's rendezvous retries in C++, where no Python handler
    runs; only kill -9 ended it), saying nothing meanwhile: it ends on the signal in one line, 128 + the signal."""
    with socket.socket() as free:  # a port nobody listens on (node 1 waits for it), free to take (node 0)
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(node)}
    err = open(tmp_path / "stderr.txt", "w+")  # noqa: SIM115 (the child's stderr, read after it exits)
    cmd = ["fit", "--config", str(ddp_config), "--trainer.accelerator", "cpu", "--trainer.strategy", "ddp",
           "--trainer.num_nodes", "2", "--trainer.devices", "1"]
    proc = forked.popen(cmd, cwd=tmp_path, env=env, stderr=err.name, start_new_session=True)
    deadline = time.monotonic() + 120
    while "Initializing distributed" not in (tmp_path / "stderr.txt").read_text() and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1)  # inside torch's wait
    assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
    sent = time.monotonic()
    proc.send_signal(signum)
    _wait_or_kill(proc, tmp_path, 30, "the signal")
    took = time.monotonic() - sent
    err.close()
    text = (tmp_path / "stderr.txt").read_text()
    said = [line for line in text.splitlines() if "error:" in line or line == "tinylm: interrupted"]
    how = "terminated by SIGTERM" if signum == signal.SIGTERM else "interrupted by Ctrl+C"
    want = f"tinylm fit: error: {'(rank 1) ' if node else ''}{how} while connecting to the other ranks at " \
           f"127.0.0.1:{port}; run the same `tinylm fit` again"
    # (on a loaded machine the signal may come before torch's wait, and its handler says it: as before)
    before = "tinylm fit: error: (rank 1) terminated by SIGTERM before it finished; run the same `tinylm fit` again" \
        if node else "tinylm: interrupted"
    assert proc.returncode == 128 + signum and said in ([want], [before]) and took < 15, (took, text[-3000:])
    assert "Traceback" not in text and "Exception raised from" not in text, text[-3000:]  # (torch's C++ stack)


def test_a_long_wait_for_the_other_ranks_is_said_once(monkeypatch, capsys):
    """Catches a node waiting for its peers saying nothing for torch's 30 minutes; and the watch of the wait left
    holding Python's signal wakeup fd after it (it is another's to take)."""
    from tinylm.cli import ranks, rendezvous

    monkeypatch.setattr(rendezvous, "NOTE_S", 0.2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv(ranks.RANK0_PID, raising=False)
    with rendezvous.waiting("connecting to the other ranks at 10.0.0.1:29500"):
        time.sleep(2.5)
    assert signal.set_wakeup_fd(-1) == -1
    time.sleep(1.5)  # (the watch would say it again by now)
    said = capsys.readouterr().err
    assert said.count("tinylm: still connecting to the other ranks at 10.0.0.1:29500 (") == 1, said


def test_a_long_wait_is_said_by_one_task_of_a_node_under_srun(monkeypatch, capsys):
    """Catches every task of an srun step saying the long wait (and a signal's line) into the job's one output:
    srun sets no LOCAL_RANK, only SLURM_LOCALID, and each task took itself for its node's first. Task 1 is quiet."""
    from tinylm.cli import ranks, rendezvous

    monkeypatch.setattr(rendezvous, "NOTE_S", 0.2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv(ranks.RANK0_PID, raising=False)
    for key, value in {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
                       "SLURM_NODEID": "0", "SLURM_JOB_NAME": "train"}.items():
        monkeypatch.setenv(key, value)
    with rendezvous.waiting("connecting to the other ranks at 10.0.0.1:29500"):
        time.sleep(1.5)
    assert "tinylm: still connecting" not in capsys.readouterr().err
    monkeypatch.setenv("SLURM_LOCALID", "0")  # (not vacuous: the node's first task says it)
    with rendezvous.waiting("connecting to the other ranks at 10.0.0.1:29500"):
        time.sleep(1.5)
    assert "tinylm: still connecting" in capsys.readouterr().err


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_is_named_in_one_line(ddp_config, tmp_path):
    """Catches `kill -9` of one rank of a ddp run ending in the other's gloo traceback ("Connection reset by peer")
    and exit 1, with no word of what happened: the line names the rank, its pid and the signal, and how to go on."""
    code, text = _signal_two_ranks(tmp_path, ddp_config, "ddp", signal.SIGKILL, when="step 2", to="rank 1")
    said = [line for line in text.splitlines() if "error:" in line]
    assert code == 1 and len(said) == 1 and "Traceback" not in text, text[-3000:]
    assert re.match(r"tinylm fit: error: rank 1 \(pid \d+\) was killed by SIGKILL .*; resume with `tinylm fit "
                    r"--config .* --ckpt_path last`$", said[0]), said


class SlowToEnd(L.Callback):
    """Rank 0's ending on an error outlasts tinylm's watch over the ranks (a large save, W&B's upload): it goes on
    3 s after rank 1 ended, the watch being shortened here to 1 s (it polls every 1 s)."""

    def __init__(self) -> None:
        from tinylm.cli import ranks

        ranks.STUCK_S = 1.0  # its 20 s would make the test slow

    def on_exception(self, trainer, pl_module, exception) -> None:
        from tinylm.cli import ranks

        if trainer.global_rank == 0:
            while any(p.poll() is None for p in ranks.RANKS):
                time.sleep(0.05)
            time.sleep(3)
            Path("ended.txt").write_text("whole")


@pytest.mark.slow
def test_a_slow_end_after_a_stop_is_not_cut_short(ddp_config, tmp_path):
    """Catches tinylm's watch over the ranks ending rank 0 (os._exit) 20 s after rank 1 had stopped with it on a
    SIGTERM, while rank 0 was still ending (a large save, W&B's upload): its teardown cut and the line "terminated
    by SIGTERM before it finished; run the same `tinylm fit` again" in place of "interrupted ... saved ...". Only a
    rank 0 still training (waiting for the lost rank in a collective that never returns) is ended."""
    code, text = _signal_two_ranks(tmp_path, ddp_config, "ddp", signal.SIGTERM, when="step 2", to="group",
                                   args=("--trainer.callbacks+=test_signals.SlowToEnd",))
    said = [line for line in text.splitlines() if "error:" in line]
    assert code == 143 and len(said) == 1 and "interrupted by SIGTERM at step" in said[0], text[-3000:]
    assert (tmp_path / "ended.txt").read_text() == "whole"


class DiskFullOnOneRank(L.Callback):
    """Rank ``rank`` alone finds the disk full after step 2 (its own log file, say)."""

    def __init__(self, rank: int = 1) -> None:
        self.rank = rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == 2:
            raise OSError(errno.ENOSPC, "No space left on device", "rank.log")


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_an_error_on_one_rank_is_its_line_alone(ddp_config, tmp_path, rank):
    """Catches a user's error on one rank of a ddp run (a full disk) followed by the other rank's gloo traceback
    ("Connection closed by peer"): rank 0's, below rank 1's line; or rank 1's, left running when rank 0 ended on
    its line, failing after the command had ended. stderr is read to its end: every process that held it ended."""
    cmd, env = _two_ranks(ddp_config)
    done = forked.run([*cmd, "--trainer.callbacks+=test_signals.DiskFullOnOneRank", "--trainer.callbacks.rank",
                       str(rank)], cwd=tmp_path, env=env, timeout=300)
    said = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    line = f"tinylm fit: error: {'(rank 1) ' if rank else ''}OSError: no space left on the disk writing rank.log; "
    assert len(said) == 1 and said[0].startswith(line), done.stderr[-3000:]


def test_a_lost_rank_on_another_machine_is_named_by_its_global_rank(monkeypatch):
    """Catches a rank killed on the second machine of a `--trainer.num_nodes 2` run (2 ranks each) named by its
    place among that machine's ranks ("rank 1", which is the first machine's) instead of its rank in the run, 3."""
    from tinylm.cli import ranks

    class Killed:
        pid = 4242

        def poll(self):
            return -signal.SIGKILL

    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setattr(ranks, "RANKS", [Killed()])
    assert str(ranks.lost_rank()).startswith("rank 3 (pid 4242) was killed by SIGKILL")


@pytest.mark.parametrize("how", ["its handler", "no handler yet"])
def test_a_rank_ended_by_sighup_before_training_is_said(how):
    """Catches a rank that a SIGHUP ended before training (its terminal closed, or `kill -HUP`, as the ranks start or
    connect) ending the run without a word: the rank stops on it quietly, exit 129 (rank 0 says what every rank stops
    on), and rank 0 took that for an error the rank had said itself, where SIGTERM's 143 and Ctrl+C's 130 were said;
    killed before its handler, it was "killed by SIGHUP ... the other ranks cannot go on", exit 1."""
    from tinylm.cli import ranks

    code = "import sys; sys.exit(129)" if how == "its handler" else "import os, signal; os.kill(os.getpid(), 1)"
    rank = subprocess.Popen([sys.executable, "-c", code])
    rank.wait(timeout=60)
    held = ranks.RANKS[:]
    ranks.RANKS[:] = [rank]
    try:
        lost = ranks.lost_rank(wait=0)
    finally:
        ranks.RANKS[:] = held
    assert str(lost) == "terminated by SIGHUP before it finished; run the same `tinylm fit` again"
    assert (lost.exit_code, lost.said) == (129, False)


def test_a_rank_that_the_ending_command_kills_is_not_reported_lost(tmp_path):
    """Catches a second line under a loaded machine's SIGTERM while the ranks connected ("terminated by SIGTERM ..."
    then "rank 1 (pid N) was killed by SIGKILL ...", exit 1 for 143): the command, ending on its error, SIGKILLs a
    rank slow to end (end_ranks), and the watch of the ranks took that for a rank lost, said so and exited 1. Run in
    a forked child: the watch's os._exit would end the test's process."""
    import weakref

    from tinylm.cli import ranks

    pid = os.fork()
    if pid == 0:  # the command's process: a rank, its watch, then main ending on an error
        code = 3
        try:
            err = os.open(tmp_path / "stderr.txt", os.O_WRONLY | os.O_CREAT)
            os.dup2(err, 2)
            rank = subprocess.Popen(["sleep", "30"])
            ranks.RANKS[:] = []
            ranks.watch_ranks([rank], weakref.ref(ranks))  # any object: nothing is distributed here
            ranks.REPORTING.acquire()  # as main's _end_on_error
            ranks.end_ranks(wait=0.1)  # SIGKILLs it
            time.sleep(2.5)  # the watch polls every 1 s, lost_rank waits up to 2 s
            code = 0
        finally:
            os._exit(code)
    status = forked.reap(pid, 60)
    said = (tmp_path / "stderr.txt").read_text()
    assert os.waitstatus_to_exitcode(status) == 0 and "was killed" not in said, said


def test_a_training_process_writing_down_its_error_ends_with_it_on_the_launchers_sigterm(tmp_path):
    """Catches ddp_fork's launcher, ending the other training processes with a SIGTERM as one failed, reaching a rank
    that had failed in a collective with it ("Connection closed by peer") while torch wrote its error down: the
    signal, raised as an error there, printed that rank's two chained tracebacks after the failure's one line. The
    SIGTERM is sent as the traceback is formatted (the moment it came in CI); the rank ends with its own error."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, signal, sys, traceback\n"
        "from torch.multiprocessing.spawn import _wrap\n"
        "from tinylm.cli.signals import terminate_cleanly\n"
        "format_exc = traceback.format_exc\n"
        "def launchers_sigterm(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return format_exc(*args, **kwargs)\n"
        "traceback.format_exc = launchers_sigterm\n"
        "def _wrapping_function(i):\n"
        "    raise RuntimeError('Connection closed by peer [127.0.0.1]:24989')\n"
        "with terminate_cleanly('validate'):\n"
        "    _wrap(_wrapping_function, 0, (), sys.argv[1])\n")
    done = _rank_writing_down_its_error(script)
    assert done.returncode == 1 and done.stderr == "", done.stderr


def _rank_writing_down_its_error(script: Path) -> subprocess.CompletedProcess:
    """``script`` run with the path of the error file torch's wrapper writes (its one argument); its output, once
    that file is checked to hold the rank's own error."""
    error_file = script.with_name("error")
    done = subprocess.run([sys.executable, str(script), str(error_file)], capture_output=True, text=True,
                          timeout=120)
    assert "RuntimeError: Connection closed by peer" in pickle.loads(error_file.read_bytes()), done.stderr
    return done


def test_a_training_process_exiting_on_its_error_ends_with_it_on_the_launchers_sigterm(tmp_path):
    """Catches the launcher's SIGTERM (ddp_fork's, ending the other training processes as one failed) reaching a
    rank a moment later than the one above: its error written down, torch's wrapper had ended it (sys.exit(1)) and
    multiprocessing ran its exit function; the signal, raised as an error there, printed its traceback ("During
    handling of the above exception ... SystemExit: 1") after the failure's one line (seen on a loaded machine). The
    SIGTERM is sent from a finalizer that exit function runs; the rank ends with its own error, 1, quietly."""
    script = tmp_path / "ranks.py"
    script.write_text(
        "import multiprocessing, os, signal, sys\n"
        "from multiprocessing import util\n"
        "from torch.multiprocessing.spawn import _wrap\n"
        "from tinylm.cli.signals import terminate_cleanly\n"
        "def _wrapping_function(i):\n"
        "    util.Finalize(None, os.kill, args=(os.getpid(), signal.SIGTERM), exitpriority=100)\n"
        "    raise RuntimeError('Connection closed by peer [127.0.0.1]:24989')\n"
        "with terminate_cleanly('validate'):\n"
        "    rank = multiprocessing.get_context('fork').Process(target=_wrap,\n"
        "                                                       args=(_wrapping_function, 1, (), sys.argv[1]))\n"
        "    rank.start()\n"
        "    rank.join(60)\n"
        "print(rank.exitcode)\n")
    done = _rank_writing_down_its_error(script)
    assert done.stdout == "1\n" and done.stderr == "", done.stdout + done.stderr


def test_a_lost_rank_whose_line_cannot_be_written_still_ends_the_command():
    """Catches the watch of the ranks, its line's write failing (a closed terminal's EIO), leaving the lock it holds
    taken: the command, ending on its own error meanwhile (the lost rank's failed collective), waited for it for
    good. Run in a forked child: the watch's os._exit would end the test's process."""
    import weakref

    from tinylm.cli import ranks

    class ClosedTerminal:
        def write(self, text):
            raise OSError(errno.EIO, "Input/output error")

        def flush(self):
            pass

    pid = os.fork()
    if pid == 0:  # the command's process: a rank lost, its watch, then main ending on an error
        code = 3
        try:
            sys.stderr = ClosedTerminal()
            rank = subprocess.Popen(["sleep", "30"])
            ranks.RANKS[:] = []
            ranks.watch_ranks([rank], weakref.ref(ranks))  # any object: nothing is distributed here
            rank.kill()  # lost
            while not ranks.REPORTING.locked():  # the watch says why the command ends
                time.sleep(0.01)
            ranks.REPORTING.acquire()  # as main's _end_on_error: waits for the watch, which ends the process
            code = 4
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(forked.reap(pid, 60)) == 1


def test_a_rank_slow_to_end_after_its_error_is_waited_for(monkeypatch):
    """Catches rank 0's gloo traceback ("Connection closed by peer") below rank 1's own error line on a loaded
    machine: rank 1 closed its connections as it ended, but took more than 2 s to exit, so rank 0 took it for alive
    and printed its failed collective. A peer's closed connection now waits for that rank's end (up to 30 s); any
    other error still waits 2 s."""
    from tinylm.cli import ranks

    # (it ends 2.5 s after its stdin closes, not 4 s after its start: a test process held up 2 s meanwhile found it
    # ended in the first wait)
    rank = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(2.5); sys.exit(1)"],
                            stdin=subprocess.PIPE)
    try:
        monkeypatch.setattr(ranks, "RANKS", [rank])
        assert ranks.lost_rank(raised=RuntimeError("[pair.cc:553] Read error: Connection reset by gremlins")) is None
        rank.stdin.close()  # it ends, once past a plain error's 2 s
        closed = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                              "[127.0.0.1]:18856")
        lost = ranks.lost_rank(raised=closed)
        assert lost is not None and lost.said and lost.exit_code == 1, lost
        assert str(lost).startswith(f"rank 1 (pid {rank.pid}) stopped on an error")
    finally:
        rank.kill()
        rank.wait()


def _rank1(pid: int) -> int | None:
    """The pid of rank 1 among the children of rank 0 (``pid``), once it runs: the one Lightning started with
    LOCAL_RANK=1 in its environment (rank 0 forks others too, loader and tokenizer workers, that are no rank), or
    the one tests/forked.py forked for it, named so once the launcher started it."""
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        with contextlib.suppress(OSError):
            if b"\0LOCAL_RANK=1\0" in b"\0" + Path(f"/proc/{child}/environ").read_bytes() or \
                    Path(f"/proc/{child}/comm").read_text() == "tinylm-rank1\n":
                return int(child)
    return None


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.mark.slow
@pytest.mark.parametrize("when", ["connecting", "step 2"])
def test_rank_0_killed_by_sigkill_ends_the_other_ranks_in_one_line(ddp_config, tmp_path, when):
    """Catches `kill -9` of rank 0 (the command itself, or the out-of-memory killer) leaving rank 1 to fail with a
    gloo traceback ("Connection reset by peer") after the shell's prompt, or, while the ranks connected, running for
    good (torch's rendezvous timeout, 30 min): rank 1 ends with one line naming rank 0 and how to resume."""
    err = open(tmp_path / "stderr.txt", "w+")  # noqa: SIM115 (the ranks' stderr, read after they end)
    cmd, env = _two_ranks(ddp_config)
    proc = forked.popen(cmd, cwd=tmp_path, env=env, stderr=err.name, start_new_session=True)
    ready = {"connecting": lambda: _rank1(proc.pid) is not None,  # rank 1 started, the ranks not yet connected
             "step 2": (tmp_path / "runs" / "run" / "checkpoints" / "step-2.ckpt").is_file}[when]
    deadline = time.monotonic() + 300  # (bounds a hang)
    while not (reached := ready()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reached and proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
    rank1 = _rank1(proc.pid)
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 60
    while not _gone(rank1) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not _gone(rank1):
        os.killpg(proc.pid, signal.SIGKILL)  # not left behind
        pytest.fail("rank 1 ran on after rank 0 was killed:\n" + (tmp_path / "stderr.txt").read_text()[-2000:])
    err.close()
    text = (tmp_path / "stderr.txt").read_text()
    said = [line for line in text.splitlines() if "error:" in line]
    assert len(said) == 1 and "Traceback" not in text, text[-3000:]
    assert re.match(rf"tinylm fit: error: \(rank 1\) rank 0 \(pid {proc.pid}\), the command that started this rank, "
                    r"ended without a word .*; resume with `tinylm fit --config .* --ckpt_path last`$", said[0]), said


@pytest.mark.slow
def test_a_lost_rank_names_the_command_it_ended(ddp_config, tmp_path):
    """Catches the line about a rank lost under `tinylm validate` naming `tinylm fit` ("resume with `tinylm fit ...
    --ckpt_path last`"), and its command built from the process's arguments, wrong when an option came before the
    command (`tinylm --verbose validate ...` gave `tinylm fit validate ...`)."""
    main(["fit", "--config", str(ddp_config), "--trainer.max_steps", "2"])
    ckpt = str(tmp_path / "runs" / "run" / "checkpoints" / "last.ckpt")
    code, text = _signal_two_ranks(tmp_path, ddp_config, "ddp", signal.SIGKILL, when="connecting", to="rank 1",
                                   command=("--verbose", "validate", "--ckpt_path", ckpt))
    said = [line for line in text.splitlines() if "error:" in line]
    assert code == 1 and len(said) == 1, text[-3000:]
    assert re.match(r"tinylm validate: error: rank 1 \(pid \d+\) was killed by SIGKILL .*; run the same `tinylm "
                    rf"validate --ckpt_path {ckpt} --trainer.accelerator cpu .*` again$", said[0]), said


class CtrlCTwiceToTheGroup(L.Callback):
    """A terminal's Ctrl+C twice after step 2: to every process of the run; rank 0's ending then takes 3 s (W&B's
    upload, say), as rank 1 ends."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_rank == 0 and trainer.global_step == 2:
            os.killpg(os.getpgid(0), signal.SIGINT)
            os.killpg(os.getpgid(0), signal.SIGINT)

    def on_exception(self, trainer, pl_module, exception) -> None:
        if trainer.global_rank == 0:
            time.sleep(3)


@pytest.mark.slow
def test_a_second_ctrl_c_under_ddp_is_said_once(ddp_config, tmp_path):
    """Catches a double Ctrl+C under ddp saying its line once per rank (rank 1 said "tinylm: interrupted" too, when
    it ended before rank 0 ended it)."""
    cmd, env = _two_ranks(ddp_config)
    done = forked.run([*cmd, "--trainer.callbacks+=test_signals.CtrlCTwiceToTheGroup"], cwd=tmp_path, env=env,
                      timeout=300, start_new_session=True)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.count("stopped at once by a second Ctrl+C") == 1, done.stderr[-3000:]


class CtrlCAtExit(L.Callback):
    """A Ctrl+C as the command exits (its exit hooks run: the loader's workers joined, W&B's upload)."""

    def __init__(self) -> None:
        import atexit

        atexit.register(self._press)  # (last registered, first run: before multiprocessing's and torch's)

    @staticmethod
    def _press() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the exit goes on, unless the Ctrl+C ends it


def test_a_ctrl_c_while_exiting_ends_at_once_quietly(run_config, tmp_path):
    """Catches a Ctrl+C that lands as the command exits printing "Exception ignored in atexit callback ...
    KeyboardInterrupt" and a traceback (and the exit going on): it ends the process at once with 130, quietly."""
    config = run_config(trainer={"max_steps": 2, "callbacks": [{"class_path": "test_signals.CtrlCAtExit"}]},
                        data={"num_workers": 2})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__),
                                                        os.path.dirname(os.path.dirname(__file__)),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = forked.run(["fit", "--config", str(config)], cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-3000:]
    assert (tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt").is_file()  # the run itself had ended


class StopAtStep2(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)


class SlowUpload(CSVLogger):
    """A logger whose end takes a while (W&B's upload), and a Ctrl+C then: in the teardown of a stopped run."""

    def finalize(self, status: str) -> None:
        super().finalize(status)
        if status == "failed":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the teardown goes on, unless the Ctrl+C ends it


def test_a_ctrl_c_in_the_teardown_after_a_stop_still_says_where_it_stopped(run_config, tmp_path):
    """Catches a Ctrl+C during the teardown of a run stopped by SIGTERM ending the command at once without a word:
    the line saying where it stopped, what was saved and how to resume was lost (the checkpoint was saved)."""
    config = run_config(trainer={"max_steps": 100, "callbacks": [{"class_path": "test_signals.StopAtStep2"}],
                                 "logger": [{"class_path": "test_signals.SlowUpload",
                                             "init_args": {"save_dir": "mine"}}]})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__),
                                                        os.path.dirname(os.path.dirname(__file__)),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = forked.run(["fit", "--config", str(config)], cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr[-3000:]
    line = (f"tinylm fit: error: interrupted by SIGTERM at step 2; saved runs/tiny/checkpoints/last.ckpt; resume with "
            f"`tinylm fit --config {config} --ckpt_path last`")
    assert [s for s in done.stderr.splitlines() if "error:" in s] == [line], done.stderr[-3000:]


def test_a_hung_up_terminals_streams_go_to_dev_null(monkeypatch):
    """Catches the streams of a hung-up terminal pointed at a debugging file (/tmp/hupdbg/after.txt, left in by
    mistake): where that folder is missing, os.open failed, the OSError was passed over, and the streams stayed on the
    dead terminal, whose next write ended the run mid-step."""
    from tinylm.train import stop_state

    opened, dup = [], []
    monkeypatch.setattr(stop_state, "terminal_fds", {1, 2})
    monkeypatch.setattr(stop_state.os, "open", lambda path, flags: opened.append(path) or 99)
    monkeypatch.setattr(stop_state.os, "dup2", lambda src, fd: dup.append((src, fd)))
    monkeypatch.setattr(stop_state.os, "close", lambda fd: None)
    monkeypatch.setattr(stop_state.os, "isatty", lambda fd: False)
    stop_state.leave_terminal()
    assert opened == [os.devnull] and dup == [(99, 1), (99, 2)]


@pytest.mark.parametrize("said", [False, True])
def test_a_ctrl_c_while_the_command_ends_says_the_stop_line_it_had_not_said(tmp_path, said):
    """Catches a second Ctrl+C on a DDP run that landed while rank 0 waited for the rank it started to end, before
    its line: the command ended with 130 and not a word, though last.ckpt was saved (0.3-1 s between the two). The
    stop's line is said first, unless the command said its line already."""
    script = f"""
import os, signal, time
from tinylm.cli import ranks, signals
from tinylm.train import stop_state
ranks.COMMAND[:] = ["fit", "--config", "c.yaml"]
stop_state.line = ("interrupted by SIGINT at step 3; saved runs/x/checkpoints/last.ckpt; resume with "
                   "`tinylm fit --config ... --ckpt_path last`")
signals.SAID[0] = {said}
signals.end_at_once_on_ctrl_c()
os.kill(os.getpid(), signal.SIGINT)
time.sleep(30)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 130, done.stderr[-2000:]
    line = ("tinylm fit: error: interrupted by SIGINT at step 3; saved runs/x/checkpoints/last.ckpt; resume with "
            "`tinylm fit --config c.yaml --ckpt_path last`\n")
    assert done.stderr == ("" if said else line), done.stderr[-2000:]


_BLOCKED_STDERR = """
import io, os, signal, sys, time
from tinylm.cli import ranks, signals
from tinylm.train import stop_state

class Blocked(io.RawIOBase):
    sent = False
    def writable(self): return True
    def fileno(self): return 2
    def write(self, data):
        if not Blocked.sent:
            Blocked.sent = True
            os.kill(os.getpid(), signal.{signal})  # the handler runs here, the stream's lock held
            time.sleep(30)
        return os.write(2, bytes(data))

{setup}
sys.stderr = io.TextIOWrapper(io.BufferedWriter(Blocked()), line_buffering=True)
sys.stderr.write("a line of the command's own\\n")
"""


@pytest.mark.parametrize("when", ["ending", "imports"])
def test_a_signal_inside_a_blocked_write_to_stderr_still_says_its_line(tmp_path, when):
    """Catches the line lost when a signal whose handler says it landed inside the command's own write to stderr
    that blocked (a full pipe, a terminal paused by Ctrl+S or slow over ssh): the handler's write through the stream
    hit that write's lock ("RuntimeError: reentrant call inside <_io.BufferedWriter name='<stderr>'>", swallowed)
    and the command ended at once without a word: a second Ctrl+C as the command ends (the stop's line, its
    checkpoint saved) or a second signal during the imports. Here stderr's file sends the signal from inside its
    write, as the signal interrupts a blocked one."""
    if when == "ending":
        setup = ("ranks.COMMAND[:] = ['fit', '--config', 'c.yaml']\n"
                 "stop_state.line = 'interrupted by SIGINT at step 3; saved runs/x/checkpoints/last.ckpt'\n"
                 "signals.SAID[0] = False\nsignals.end_at_once_on_ctrl_c()")
        script, status = _BLOCKED_STDERR.format(signal="SIGINT", setup=setup), 130
        line = "tinylm fit: error: interrupted by SIGINT at step 3; saved runs/x/checkpoints/last.ckpt\n"
    else:
        setup = ("ended = signals.terminate_cleanly('prepare', True); ended.__enter__()\n"
                 "held = signals.held('prepare', True); held.__enter__()\n"
                 "os.kill(os.getpid(), signal.SIGTERM)  # the first: held until the imports are done")
        script, status = _BLOCKED_STDERR.format(signal="SIGTERM", setup=setup), 143
        line = "tinylm prepare: error: SIGTERM during the imports, after an earlier signal: ended at once\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (status, line), done.stderr[-2000:]


def test_a_sigterm_inside_a_best_effort_step_still_ends_the_command(monkeypatch):
    """Catches a SIGTERM that lands inside an ``except Exception`` of tinylm's (here the load of an eval task from
    the hub, which says "no data here" on any failure) being taken for that failure: `tinylm eval` ended in "no data
    here; the hub said: terminated by SIGTERM ..." with exit 1, not in its stop's line with 143."""
    import datasets

    from tinylm.cli import signals
    from tinylm.cli.errors import Terminated
    from tinylm.evals import tasks

    def killed_while_loading(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # (the handler raises here)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (no probe of the hub first: the test runs offline)
    monkeypatch.setattr(tasks, "package_root", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", killed_while_loading)
    with pytest.raises(Terminated, match="terminated by SIGTERM before it finished"):
        with signals.terminate_cleanly("eval"):
            tasks.load_items(tasks.TASKS["piqa"])


def test_a_signal_during_the_imports_waits_for_them_then_ends_the_command_in_its_line(tmp_path):
    """Catches a SIGTERM (or Ctrl+C) landing inside Lightning's import: raised mid-import it left a module half made,
    and numpy's lazy submodules recursed without end (a RecursionError's 50-line traceback, exit 1, in place of
    the command's one line, 143). Now held until the imports are done; a second one meanwhile ends the command at
    once, unless the command runs in a caller's process (main([...]) from a notebook: its kernel lives on)."""
    from tinylm.cli import signals
    from tinylm.cli.errors import Terminated

    done = []
    with pytest.raises(Terminated, match="terminated by SIGTERM before it finished"):
        with signals.terminate_cleanly("fit"), signals.held("fit", program=False):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # (a handler runs between two bytecodes: here, inside the imports)
            os.kill(os.getpid(), signal.SIGTERM)  # a second: a caller's process (a notebook's kernel) is not ended
            time.sleep(0.01)
            done.append("imported")
    assert done == ["imported"]
    with pytest.raises(KeyboardInterrupt), signals.terminate_cleanly("generate"), signals.held("generate", False):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        done.append("imported again")
    assert done == ["imported", "imported again"]
    script = tmp_path / "twice.py"
    script.write_text("import os, signal, time\n"
                      "from tinylm.cli import signals\n"
                      "with signals.terminate_cleanly('fit'), signals.held('fit', program=True):\n"
                      "    os.kill(os.getpid(), signal.SIGTERM)\n"
                      "    time.sleep(0.01)\n"
                      "    os.kill(os.getpid(), signal.SIGTERM)\n"
                      "    time.sleep(0.01)\n"
                      "    print('not ended')\n")
    ended = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert ended.returncode == 128 + signal.SIGTERM and ended.stdout == "", (ended.returncode, ended.stdout)
    assert ended.stderr == "tinylm fit: error: SIGTERM during the imports, after an earlier signal: ended at once\n", \
        ended.stderr


def test_a_second_ctrl_c_names_the_newest_checkpoint_by_step_not_by_mtime(tmp_path):
    """Catches the second Ctrl+C's line naming best.ckpt of step 10 "the newest checkpoint" beside last.ckpt of step
    20 when best.ckpt's mtime was the later one: a run folder copied with `cp -r` (its files stamped in the order
    copied) and resumed, or the clock stepped back an hour mid-run. `--ckpt_path last` goes on from last.ckpt."""
    import torch

    from tinylm.train.interrupt import InterruptStop

    for name, at in (("step-10.ckpt", 10), ("step-20.ckpt", 20), ("last.ckpt", 20), ("best.ckpt", 10)):
        # (copied in this order: best.ckpt stamped last)
        torch.save({"state_dict": {}, "global_step": at, "tinylm": {"format": 1}}, tmp_path / name)
    os.utime(tmp_path / "step-10.ckpt", ns=(2**62, 2**62))  # (and one touched: stamped in the future)
    assert "the newest checkpoint is " + str(tmp_path / "last.ckpt") in InterruptStop(tmp_path)._unsaved_line()
    (tmp_path / "last.ckpt").unlink()  # (the save after step-20.ckpt's cut short)
    assert "the newest checkpoint is " + str(tmp_path / "step-20.ckpt") in InterruptStop(tmp_path)._unsaved_line()


def test_a_second_ctrl_c_names_last_ckpt_among_checkpoints_saved_as_one_file(tmp_path):
    """Catches the second Ctrl+C's line naming step-1.ckpt, not last.ckpt, for a user who is not root: a step's
    checkpoints are then hard links of one file (one inode, one mtime), and the tie went to the first name."""
    from tinylm.train.interrupt import InterruptStop

    (tmp_path / "step-1.ckpt").write_bytes(b"x")
    os.link(tmp_path / "step-1.ckpt", tmp_path / "last.ckpt")
    assert "the newest checkpoint is " + str(tmp_path / "last.ckpt") in InterruptStop(tmp_path)._unsaved_line()
