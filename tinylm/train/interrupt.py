"""Stopping a run on SIGTERM (schedulers, `kill`), SIGHUP (the terminal closed), Ctrl+C (SIGINT) or a scheduler's
pre-emption warning (SIGUSR1, SIGUSR2, where nothing else handles them) without losing it.

Lightning alone exits 0 on SIGTERM without a checkpoint (its loops raise ``SIGTERMException``, a ``SystemExit``,
even mid-accumulation or mid-validation), 1 on Ctrl+C (``KeyboardInterrupt``, wherever it lands), and dies on SIGHUP
at once, unsaved. Here each signal only sets a flag; the run stops at the next point where its state is whole: after
an optimizer step, and after that step's validation when one is due (under several ranks, one step later: see
`InterruptStop._stop_signal`). It saves ``last.ckpt`` there (as exact to resume from as a periodic checkpoint) and
raises :class:`RunInterrupted` (exit 128 + the signal: 143, 129, 130). A second Ctrl+C stops at once, without
saving. A SIGHUP or Ctrl+C the run was started to ignore (nohup, a script's `&` job) stays ignored.

Under SLURM's auto-requeue (`#SBATCH --signal=USR1@90`), the requeue signal is this one's too, where the run saves
checkpoints: it stops the run as SIGTERM does, saves ``last.ckpt`` and requeues the job (`scontrol requeue`, as
Lightning does), exit 138. Lightning's own handler saved ``hpc_ckpt_N.ckpt`` from inside the signal handler,
mid-step, and under DDP its save's collectives met the other ranks' gradient all-reduce: the run hung for good,
neither saved nor requeued (see setup). Lightning's SIGTERM handler (composed with the one found installed, this
one) runs until training starts; from then on this one alone handles SIGTERM (see on_train_start: under DDP,
Lightning's hung the run).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Checkpoint

from tinylm.errors import TinyLMError
from tinylm.train import stop_state
from tinylm.train.callbacks import validation_follows

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# a scheduler's warning before it pre-empts the job (LSF's `bsub -wa USR2`, `timeout -s USR1`, a user's `kill -USR1`):
# a stop request as SIGTERM is, where nothing else handles it (by default it killed the run at once, unsaved, unsaid)
_WARNINGS = (signal.SIGUSR1, signal.SIGUSR2)
_REQUESTS = (signal.SIGTERM, signal.SIGHUP, *_WARNINGS)  # a stop asked once; the same signal again is the same one
_late: int | None = None  # see late_signal


def late_signal() -> int | None:
    """The signal that reached the last run too late to stop it (after its last step began: during that step, its
    final validation or checkpoint), which therefore ended normally; None if none did. Read once: a command that
    goes on to other work (the next run of a scaling ladder) stops on it instead."""
    global _late
    signum, _late = _late, None
    return signum


class RunInterrupted(TinyLMError):
    """A run stopped by a signal after saving ``last.ckpt``; ``exit_code`` is the shell's 128 + signal number. Every
    rank stops together (they agree on a stop at a step)."""

    every_rank = True

    def __init__(self, message: str, *, signum: int | None, step: int, ckpt_path: str) -> None:
        super().__init__(message)
        self.signum, self.step, self.ckpt_path = signum, step, ckpt_path
        self.exit_code = 128 + signum if signum else 1


class InterruptStop(L.Callback):
    """On SIGTERM, SIGHUP or SIGINT: finish the optimizer step (and its validation), save ``<dirpath>/last.ckpt``
    (unless ``dirpath`` is None: checkpointing is off), stop with :class:`RunInterrupted`.

    Args:
        dirpath: The run's checkpoint folder, or None to stop without saving.
    """

    def __init__(self, dirpath: str | Path | None) -> None:
        self.dirpath = None if dirpath is None else Path(dirpath)
        self._previous: dict[int, object] = {}  # handlers found installed, restored when the run ends
        self._armed = False
        self._received: int | None = None
        self._step_seen = -1
        self._stepped = False  # the last training batch ended an optimizer step
        self._votes: dist.ProcessGroup | None = None  # the ranks' CPU group for their stop votes (None: one rank)
        self._pending: tuple[torch.Tensor, dist.Work] | None = None  # the vote under way, read at the next step
        self._trainer: L.Trainer | None = None
        self._requeue_signal: int | None = None  # SLURM's auto-requeue signal, when this callback handles it
        self._requeue = False  # the requeue signal came: the run requeues its job as it stops (rank 0)
        self._requeued = False  # the job was requeued as the run stopped: SLURM's SIGTERM that ends it is expected
        self._stopped_on = 0  # the signal the run stopped on (the ranks' agreed one)

    # Installed at setup, before Lightning registers its own handlers (which then compose with these) and before
    # the DataLoader workers fork: forked workers inherit this handler, so a terminal's Ctrl+C, which reaches the
    # whole process group, does not kill them under the step being finished.
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return
        # Lightning's SIGTERM notifier, installed after this hook until on_train_start replaces it, broadcasts from
        # inside the signal handler: under DDP a SIGTERM during the sanity check or data setup hung the run for good
        # (the other ranks never joined). This handler's flag is enough: the ranks agree at the first step's end.
        trainer._signal_connector._sigterm_notifier_fn = lambda signum, frame: None
        global _late
        self._trainer, self._received, self._armed, _late = trainer, None, True, None
        for s in _WARNINGS:  # the command's handler until the run's (tinylm.cli.signals) stands for the default
            if getattr(signal.getsignal(s), "until_a_run", False):
                signal.signal(s, signal.SIG_DFL)
        stop_state.over, stop_state.line = False, None
        # None: a handler not installed from Python, which Python cannot reinstall; such a signal is left alone. So
        # is a SIGHUP the command was started to ignore (nohup), and a Ctrl+C (a script's `&` job): ddp_fork's
        # training processes took two for "stop now", ended without a result, and the launcher waited for one
        # forever. (An ignored SIGTERM is not left to Lightning's handler, which it installs anyway: that one stops
        # mid-step, unsaved.)
        self._previous = {s: h for s in _SIGNALS if (h := _outer_handler(s)) is not None
                          and not (s in (signal.SIGINT, signal.SIGHUP) and h == signal.SIG_IGN)}
        # SLURM's auto-requeue signal, where Lightning would install its handler (none found; it installs none over
        # one) and this run saves checkpoints: Lightning's saved hpc_ckpt_N.ckpt inside the handler, mid-step, and
        # under DDP its save's collectives met the other ranks' gradient all-reduce: hung, neither saved nor requeued
        env = trainer._accelerator_connector.cluster_environment
        requeue = env.requeue_signal if isinstance(env, SLURMEnvironment) and env.auto_requeue else None
        self._requeue_signal, self._requeue, self._requeued, self._stopped_on = None, False, False, 0
        if requeue and self.dirpath is not None and _outer_handler(requeue) == signal.SIG_DFL:
            self._requeue_signal, self._previous[requeue] = requeue, signal.SIG_DFL
        # SIGUSR1 / SIGUSR2 outside SLURM's auto-requeue, left at their default (a handler of a script's own, or
        # an ignored one, is left alone): a stop at a whole step that saves last.ckpt, as SIGTERM
        self._previous.update({s: signal.SIG_DFL for s in _WARNINGS if s != requeue and _outer_handler(s) ==
                               signal.SIG_DFL})
        for s in self._previous:
            signal.signal(s, self._on_signal)
        stop_state.reader_gone = lambda signum: self._on_signal(signum, None)

    def _on_signal(self, signum: int, frame) -> None:
        if not self._armed:  # the run is over (Lightning's teardown can reinstall this handler): act as before it
            if signum in _REQUESTS and self._received == signum:
                return  # the request it is ending on, again
            self._restore()
            previous = self._previous.get(signum)
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signum)
            return
        if signum == signal.SIGINT and self._received == signal.SIGINT:  # a second Ctrl+C: stop now, unsaved
            stop_state.line = self._unsaved_line()
            self._disarm()
            raise KeyboardInterrupt
        if signum == signal.SIGHUP:
            stop_state.leave_terminal()
        if signum == self._requeue_signal:
            self._requeue = True  # (after a SIGTERM too, as Lightning's handler requeued on it whenever it came)
            if self._received in _REQUESTS:
                return  # the stop asked already, named in its line
        self._received = signum
        # Lightning's loops raise SIGTERMException mid-accumulation or mid-validation once its `received_sigterm` is
        # set (by its notifier, a no-op here: see setup); the run stops at a whole step instead.
        if self._trainer is not None:
            self._trainer._signal_connector.received_sigterm = False

    def _unsaved_line(self) -> str:
        """What a second Ctrl+C left: the steps done, not saved since the newest checkpoint, and where the run goes
        on from. (Lightning's "Detected KeyboardInterrupt, attempting graceful shutdown" and "tinylm: interrupted"
        named neither.) Runs in the signal handler: a checkpoint removed meanwhile is no error of its own."""
        step = "" if self._trainer is None else f" at step {self._trainer.global_step}"
        try:
            newest = self._newest_checkpoint()
        except OSError:
            newest = None
        if newest is None:
            after = "; no checkpoint of this run was saved yet" if self.dirpath is not None else \
                " (--trainer.enable_checkpointing false)"
            return f"stopped at once by a second Ctrl+C{step}: nothing was saved{after}"
        # `last` is the run's newest checkpoint by step (best.ckpt too); the CLI spells out the user's own command
        return (f"stopped at once by a second Ctrl+C{step}, unsaved (one Ctrl+C finishes the step and saves); the "
                f"newest checkpoint is {newest}: resume with `tinylm fit --config ... --ckpt_path last`")

    def _newest_checkpoint(self) -> Path | None:
        """The checkpoint folder's newest by step, as `--ckpt_path last` chooses (last.ckpt first at one step). By
        mtime, a folder copied with `cp -r` and resumed, or a clock stepped back mid-run, named an older one (best.ckpt,
        an early step-N.ckpt) the newest. FSDP2's sharded folders (not read here: gathering one takes minutes), and
        files none of which can be read, by mtime (last.ckpt first of files saved together: a non-root user's
        step-N.ckpt and last.ckpt are one inode)."""
        from tinylm.checkpoint import is_checkpoint
        from tinylm.checkpoint_steps import checkpoints_by_step

        saved = [] if self.dirpath is None else [p for p in self.dirpath.glob("*.ckpt") if is_checkpoint(p)]
        found = []
        if saved and all(p.is_file() for p in saved):
            try:
                found = checkpoints_by_step(self.dirpath)[0]
            except (RuntimeError, MemoryError):  # (a mapping refused, `ulimit -v`: the line is said all the same)
                pass
        return max(found)[2] if found else max(saved, key=lambda p: (p.stat().st_mtime_ns, p.name == "last.ckpt"),
                                               default=None)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._step_seen, self._stepped = trainer.global_step, False
        self._pending = None
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():  # every rank, in this order
            self._votes = dist.new_group(backend="gloo")  # apart from the gradients' group (NCCL on GPUs)
        # Lightning (2.6) has since put its own SIGTERM handler in front of this one, and under DDP that handler
        # runs a broadcast: inside whatever collective rank 0 was in (a gradient all-reduce, a metric's sync) while
        # the other ranks wait in theirs, so the run hung for good on SIGTERM about 3 times in 4. This handler
        # alone is enough: the ranks agree to stop at a step's end, every rank in the same call (_stop_signal).
        if self._armed and signal.SIGTERM in self._previous and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        self._stepped, self._step_seen = trainer.global_step != self._step_seen, trainer.global_step
        if not self._stepped or validation_follows(trainer) or not (signum := self._stop_signal(trainer)):
            return
        # the step's metrics reach the loggers just after this hook; log them now or the CSV loses the step's row
        trainer._logger_connector.update_train_step_metrics()
        self._stop(trainer, signum)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self._stepped and (signum := self._stop_signal(trainer)):
            self._stop(trainer, signum)

    def _stop_signal(self, trainer: L.Trainer) -> int:
        """The signal to stop on now, 0 for none; every rank gets the same answer at the same step."""
        if 0 < trainer.max_steps <= trainer.global_step:
            return 0  # training is complete: the run ends normally, with its final checkpoint
        if trainer.world_size == 1:
            return self._received or 0
        # Every rank stops at the same step (one of them may have missed the signal). At each step's end the ranks
        # vote (the signal each received, 0 for none; the max wins) without waiting for the result: the all-reduce
        # runs on CPU tensors over gloo while the next step trains, and is read at that step's end, long done. So
        # the run stops one step after the signal, with no host sync (a blocking vote at every step made a small
        # model's step 4-9 % slower on CPU: benchmarks/bench_stop_agreement.py).
        if self._votes is None:  # no torch.distributed group to vote over: the strategy's blocking reduce
            vote = torch.tensor([self._received or 0], device=trainer.strategy.root_device)
            return int(trainer.strategy.reduce(vote, reduce_op="max").item())
        agreed = self._collect()
        vote = torch.tensor([self._received or 0])
        self._pending = (vote, dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self._votes, async_op=True))
        return agreed

    def _collect(self) -> int:
        """The outcome of the vote under way (0: none under way, or no signal)."""
        if self._pending is None:
            return 0
        (vote, work), self._pending = self._pending, None
        work.wait()
        return int(vote.item())

    def _stop(self, trainer: L.Trainer, signum: int) -> None:
        self._collect()  # the vote just cast, by every rank: not left under way
        self._stopped_on = signum
        name = signal.Signals(signum).name
        if self._received != signum:
            name += " (to another rank)"
        if self.dirpath is None:
            path = None
            stop_state.line = (f"interrupted by {name} at step {trainer.global_step}; nothing was saved "
                          "(--trainer.enable_checkpointing false)")
        else:
            path = self.dirpath / "last.ckpt"
            trainer.save_checkpoint(path, weights_only=False)  # the full state: optimizer, loops, callbacks
            after = "resume with `tinylm fit --config ... --ckpt_path last`"
            if (self._requeue or signum == self._requeue_signal) and trainer.is_global_zero:
                said = self._requeue_job()
                after = said if self._requeued else f"{said}; {after}"
            stop_state.line = f"interrupted by {name} at step {trainer.global_step}; saved {path}; {after}"
        raise RunInterrupted(stop_state.line, signum=signum, step=trainer.global_step, ckpt_path=str(path or ""))

    def _requeue_job(self) -> str:
        """Requeue this SLURM job as Lightning's auto-requeue does (`scontrol requeue`; a job array's task by its
        array's id and its own); what became of it, for the stop's line."""
        array = os.environ.get("SLURM_ARRAY_JOB_ID", "").strip()
        job = f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID', '').strip()}" if array else \
            os.environ.get("SLURM_JOB_ID", "").strip()
        try:
            done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        except OSError as e:  # no scontrol on PATH
            return f"requeueing SLURM job {job} failed (scontrol: {e.strerror})"
        if done.returncode:
            said = (done.stderr or done.stdout).strip().splitlines()
            return f"requeueing SLURM job {job} failed (scontrol: {said[-1] if said else f'exit {done.returncode}'})"
        self._requeued = True  # SLURM ends the job now, with a SIGTERM: not a stop of its own
        return f"SLURM job {job} requeued: it runs the same command again, which goes on from there"

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        global _late
        # the run completed first; what it leaves behind is whole (and a complete run is not requeued)
        signum = (self._received or 0) if self._received != self._requeue_signal else 0
        if trainer.world_size > 1:  # the ranks agree (one may have missed it), or one stops a ladder the others go on
            self._collect()
            vote = torch.tensor([signum], device=trainer.strategy.root_device)
            signum = int(trainer.strategy.reduce(vote, reduce_op="max").item())
        if self._votes is not None:
            dist.destroy_process_group(self._votes)
            self._votes = None
        _late = signum or None
        self._disarm()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._disarm()

    def _disarm(self) -> None:
        self._armed, stop_state.over, stop_state.reader_gone = False, True, None
        self._restore()
        handlers = dict(self._previous)
        if self._received in _REQUESTS and self._received in handlers:
            # the run stops (or ended) on it: a second SIGTERM is the same request (a scheduler's to the group,
            # repeated), not one to act on mid-teardown, where the outer handler's raise left the loader's workers
            # unjoined ("DataLoader worker is killed by signal: Alarm clock" a minute later); a second SIGHUP too
            handlers[self._received] = signal.SIG_IGN
            if threading.current_thread() is threading.main_thread():
                signal.signal(self._received, signal.SIG_IGN)
        # SLURM's SIGTERM ending the job it requeued; and the requeue signal reaching a rank that stopped on another
        # rank's (it was killed by it, exit -10): the run is saved (the command restores them as it ends)
        ignored = [signal.SIGTERM] if self._requeued else []
        ignored += [self._requeue_signal] if self._requeue_signal and self._stopped_on == self._requeue_signal else []
        for s in (s for s in ignored if s in handlers):
            handlers[s] = signal.SIG_IGN
            if threading.current_thread() is threading.main_thread():
                signal.signal(s, signal.SIG_IGN)
        if self._trainer is not None:  # Lightning's teardown reinstalls the handlers it found (this one): not these
            self._trainer._signal_connector._original_handlers.update(handlers)
            self._trainer = None

    def _restore(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for s, handler in self._previous.items():
                signal.signal(s, handler)


def _outer_handler(signum: int):
    """The handler installed for ``signum``, looking through one left behind by an earlier run's callback."""
    handler = signal.getsignal(signum)
    owner = getattr(handler, "__self__", None)
    return owner._previous.get(signum, signal.SIG_DFL) if isinstance(owner, InterruptStop) else handler


class InterruptCheckpoint(InterruptStop, Checkpoint):
    """`InterruptStop` that saves ``<dirpath>/last.ckpt``. A ``Checkpoint`` so that Lightning runs it after the
    other checkpoint callbacks: a validation's ``best.ckpt`` candidate is saved before the run stops.

    Args:
        dirpath: The run's checkpoint folder.
    """
