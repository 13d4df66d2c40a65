"""Stopping a run on SIGTERM (schedulers, `kill`) or Ctrl+C (SIGINT) without losing it.

Lightning alone exits 0 on SIGTERM without a checkpoint (its loops raise ``SIGTERMException``, a ``SystemExit``,
even mid-accumulation or mid-validation) and 1 on Ctrl+C (``KeyboardInterrupt``, wherever it lands). Here either
signal only sets a flag; the run stops at the next point where its state is whole: after an optimizer step, and
after that step's validation when one is due (under several ranks, at the first such point where they agree, about
once a second). It saves ``last.ckpt`` there (as exact to resume from as a periodic
checkpoint) and raises :class:`RunInterrupted`. A second Ctrl+C stops at once, without saving.

Under SLURM, Lightning's SIGUSR1 requeue handler is untouched. Its SIGTERM handler (composed with the one found
installed, this one) runs until training starts; from then on this one alone handles SIGTERM (see on_train_start:
under DDP, Lightning's hung the run).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint

from tinylm.errors import TinyLMError
from tinylm.train.callbacks import validation_follows

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Under several ranks, how often (seconds of training) they agree on a stop. Each agreement is a collective and, on
# GPUs, a host sync: one per step cost ~4 % of a tiny model's step (benchmarks/bench_stop_agreement.py).
AGREE_EVERY_S = 1.0
_late: int | None = None  # see late_signal


def late_signal() -> int | None:
    """The signal that reached the last run after its last step (during its final validation or checkpoint), which
    therefore ended normally; None if none did. Read once: a command that goes on to other work (the next run of a
    scaling ladder) stops on it instead."""
    global _late
    signum, _late = _late, None
    return signum


class RunInterrupted(TinyLMError):
    """A run stopped by a signal after saving ``last.ckpt``; ``exit_code`` is the shell's 128 + signal number."""

    def __init__(self, message: str, *, signum: int | None, step: int, ckpt_path: str) -> None:
        super().__init__(message)
        self.signum, self.step, self.ckpt_path = signum, step, ckpt_path
        self.exit_code = 128 + signum if signum else 1


class InterruptStop(L.Callback):
    """On SIGTERM or SIGINT: finish the optimizer step (and its validation), save ``<dirpath>/last.ckpt`` (unless
    ``dirpath`` is None: checkpointing is off), stop with :class:`RunInterrupted`.

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
        self._agreed_at = (0.0, 0)  # (time, step) of the ranks' last agreement
        self._next_agreement = 0  # the step at which the ranks agree next
        self._trainer: L.Trainer | None = None

    # Installed at setup, before Lightning registers its own handlers (which then compose with these) and before
    # the DataLoader workers fork: forked workers inherit this handler, so a terminal's Ctrl+C, which reaches the
    # whole process group, does not kill them under the step being finished.
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return
        global _late
        self._trainer, self._received, self._armed, _late = trainer, None, True, None
        # None: a handler not installed from Python, which Python cannot reinstall; such a signal is left alone
        self._previous = {s: h for s in _SIGNALS if (h := _outer_handler(s)) is not None}
        for s in self._previous:
            signal.signal(s, self._on_signal)

    def _on_signal(self, signum: int, frame) -> None:
        if not self._armed:  # the run is over (Lightning's teardown can reinstall this handler): act as before it
            if signum == signal.SIGTERM and self._received == signal.SIGTERM:
                return  # the request it is ending on, again
            self._restore()
            previous = self._previous.get(signum)
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signum)
            return
        if signum == signal.SIGINT and self._received == signal.SIGINT:
            self._disarm()
            raise KeyboardInterrupt  # a second Ctrl+C: stop now, unsaved
        self._received = signum
        # Before training starts, Lightning's SIGTERM handler ran just before this one and set its
        # `received_sigterm`, on which its loops raise SIGTERMException mid-accumulation or mid-validation; the run
        # stops at a whole step instead.
        if self._trainer is not None:
            self._trainer._signal_connector.received_sigterm = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._step_seen, self._stepped = trainer.global_step, False
        self._agreed_at, self._next_agreement = (time.monotonic(), trainer.global_step), trainer.global_step + 1
        # Lightning (2.6) has since put its own SIGTERM handler in front of this one, and under DDP that handler
        # runs a broadcast: inside whatever collective rank 0 was in (a gradient all-reduce, a metric's sync) while
        # the other ranks wait in theirs, so the run hung for good on SIGTERM about 3 times in 4. This handler
        # alone is enough: the ranks agree to stop at a step's end, every rank in the same call (_stop_signal).
        if self._armed and signal.SIGTERM in self._previous and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
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
        # Every rank stops at the same step (one of them may have missed the signal): they agree about once every
        # AGREE_EVERY_S, at steps they also agree on. Each proposes how many steps that is, from its own pace; the
        # fewest wins. One collective carries both: the max of (signal received, -steps until the next agreement).
        step = trainer.global_step
        if step < self._next_agreement:
            return 0
        (then, then_step), now = self._agreed_at, time.monotonic()
        steps = max(1, min(10_000, int(AGREE_EVERY_S * (step - then_step) / max(now - then, 1e-6))))
        votes = torch.tensor([self._received or 0, -steps], device=trainer.strategy.root_device)
        signum, minus_steps = trainer.strategy.reduce(votes, reduce_op="max").tolist()
        self._agreed_at, self._next_agreement = (now, step), step - minus_steps
        return signum

    def _stop(self, trainer: L.Trainer, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._received != signum:
            name += " (to another rank)"
        if self.dirpath is None:
            raise RunInterrupted(f"interrupted by {name} at step {trainer.global_step}; nothing was saved "
                                 "(--trainer.enable_checkpointing false)", signum=signum,
                                 step=trainer.global_step, ckpt_path="")
        path = self.dirpath / "last.ckpt"
        trainer.save_checkpoint(path, weights_only=False)  # the full state: optimizer, loops, callbacks
        raise RunInterrupted(
            f"interrupted by {name} at step {trainer.global_step}; saved {path}; "
            "resume with `tinylm fit --config ... --ckpt_path last`",
            signum=signum,
            step=trainer.global_step,
            ckpt_path=str(path),
        )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        global _late
        late = self._received is not None  # the run completed first; what it leaves behind is whole
        if trainer.world_size > 1:  # the ranks agree (one may have missed it), or one stops a ladder the others go on
            late = trainer.strategy.reduce_boolean_decision(late, all=False)
        _late = (self._received or signal.SIGTERM) if late else None
        self._disarm()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._disarm()

    def _disarm(self) -> None:
        self._armed = False
        self._restore()
        handlers = dict(self._previous)
        if self._received == signal.SIGTERM and signal.SIGTERM in handlers:
            # the run stops (or ended) on it: a second SIGTERM is the same request (a scheduler's to the group,
            # repeated), not one to act on mid-teardown, where the outer handler's raise left the loader's workers
            # unjoined ("DataLoader worker is killed by signal: Alarm clock" a minute later)
            handlers[signal.SIGTERM] = signal.SIG_IGN
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
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
