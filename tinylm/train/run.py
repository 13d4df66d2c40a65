"""What every tinylm training run gets from the Trainer: its checkpoint callbacks and its monitors, in one list.

The CLI adds these to whatever callbacks the user's config names; code that builds a Trainer by hand can call
`run_callbacks` to get the same behaviour.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from tinylm.train.callbacks import (
    FinalValidation,
    LoggedStep,
    PeriodicCheckpoint,
    ProgressBar,
    RNGState,
    SpeedMonitor,
)
from tinylm.train.health import HealthMonitor
from tinylm.train.interrupt import InterruptCheckpoint, InterruptStop


def checkpoint_callbacks(ckpt_dir: str | Path, *, every_n_steps: int, keep: int) -> list[L.Callback]:
    """``best.ckpt`` by ``val/loss``; ``step-N.ckpt`` every ``every_n_steps`` (keeping ``keep``) plus ``last.ckpt``;
    ``last.ckpt`` also when SIGTERM or Ctrl+C stops the run (see `tinylm.train.interrupt`)."""
    return [
        ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="best",
            monitor="val/loss",
            mode="min",
            save_top_k=1,
            auto_insert_metric_name=False,
            enable_version_counter=False,
        ),
        PeriodicCheckpoint(
            dirpath=ckpt_dir,
            filename="step-{step}",
            every_n_train_steps=every_n_steps,
            save_top_k=keep,
            monitor="step",
            mode="max",
            save_last=True,
            auto_insert_metric_name=False,
            enable_version_counter=False,
        ),
        InterruptCheckpoint(ckpt_dir),  # after the others: a validation's best.ckpt is saved before it stops a run
    ]


def monitor_callbacks(*, progress_bar: bool) -> list[L.Callback]:
    """Throughput/MFU, RNG state and logged step for exact resume, the health monitor, and the progress bar when it
    is on."""
    callbacks: list[L.Callback] = [SpeedMonitor(), RNGState(), LoggedStep(), HealthMonitor()]
    if progress_bar:
        callbacks.append(ProgressBar())
    return callbacks


def run_callbacks(ckpt_dir: str | Path | None, *, every_n_steps: int, keep: int,
                  progress_bar: bool) -> list[L.Callback]:
    """All of a run's callbacks (the last step's log row and validation among them); ``ckpt_dir=None`` leaves out the
    checkpoint callbacks (checkpointing off)."""
    # without checkpoints a signal still stops the run at a whole step, with a line and a non-zero exit
    ckpts = [InterruptStop(None)] if ckpt_dir is None else checkpoint_callbacks(ckpt_dir, every_n_steps=every_n_steps,
                                                                               keep=keep)
    return [*ckpts, FinalValidation(), *monitor_callbacks(progress_bar=progress_bar)]
