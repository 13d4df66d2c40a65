"""What every tinylm training run gets from the Trainer: its checkpoint callbacks and its monitors, in one list.

The CLI adds these to whatever callbacks the user's config names; code that builds a Trainer by hand can call
`run_callbacks` to get the same behaviour.
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities.model_summary import get_human_readable_count

from tinylm.train.callbacks import (
    BestCheckpoint,
    FinalValidation,
    LoggedStep,
    PeriodicCheckpoint,
    RNGState,
    SpeedMonitor,
)
from tinylm.train.final_validation import ResumedFinalValidation
from tinylm.train.health import HealthMonitor
from tinylm.train.interrupt import InterruptCheckpoint, InterruptStop
from tinylm.train.progress_bar import ProgressBar

log = logging.getLogger("tinylm")


class FlopsSummary(ModelSummary):
    """Lightning's model summary (layers, parameters, size) with tinylm's training FLOPs per token
    (`GPT.flops_per_token`: 6N + attention, forward + backward) instead of Lightning's FLOPs column, which counts a
    forward over ``example_input_array``: tinylm has none, and the summary said "Total FLOPs: 0"."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        model = getattr(pl_module, "model", None)
        self._per_token = model.flops_per_token() if hasattr(model, "flops_per_token") else None
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int, **kwargs) -> None:
        cols = [(name, [str(v) for v in values]) for name, values in summary_data if name != "FLOPs"]
        widths = [max(len(name), *map(len, values)) for name, values in cols]
        lines = [" | ".join(f"{name:<{w}}" for (name, _), w in zip(cols, widths))]
        lines.append("-" * len(lines[0]))
        lines += [" | ".join(f"{values[i]:<{w}}" for (_, values), w in zip(cols, widths))
                  for i in range(len(cols[0][1]))]
        lines.append(f"{get_human_readable_count(trainable_parameters)} trainable parameters of "
                     f"{get_human_readable_count(total_parameters)} ({model_size:,.3f} MB); modules: "
                     f"{total_training_modes['train']} in train mode, {total_training_modes['eval']} in eval mode")
        if self._per_token:
            lines.append(f"{get_human_readable_count(int(self._per_token))} training FLOPs per token (6N + "
                         "attention, forward + backward: GPT.flops_per_token)")
        log.info("\n%s", "\n".join(lines))


def checkpoint_callbacks(ckpt_dir: str | Path, *, every_n_steps: int, keep: int,
                         continues: bool = False) -> list[L.Callback]:
    """``best.ckpt`` by ``val/loss``; ``step-N.ckpt`` every ``every_n_steps`` (keeping ``keep``) plus ``last.ckpt``;
    ``last.ckpt`` also when SIGTERM or Ctrl+C stops the run (see `tinylm.train.interrupt`). ``continues``: the run
    resumes a checkpoint of its own folder (which may have moved since: the saved best score and files follow it)."""
    callbacks = [
        BestCheckpoint(
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
    for cb in callbacks[:2]:
        cb.continues = continues
    return callbacks


def monitor_callbacks(*, progress_bar: bool, model_summary: bool = True) -> list[L.Callback]:
    """Throughput/MFU, RNG state and logged step for exact resume, the health monitor, and the progress bar and
    model summary when they are on."""
    callbacks: list[L.Callback] = [SpeedMonitor(), RNGState(), LoggedStep(), HealthMonitor()]
    if progress_bar:
        callbacks.append(ProgressBar())
    if model_summary:
        callbacks.append(FlopsSummary())
    return callbacks


def run_callbacks(ckpt_dir: str | Path | None, *, every_n_steps: int, keep: int,
                  progress_bar: bool, model_summary: bool = True, continues: bool = False,
                  finish_at: int | None = None) -> list[L.Callback]:
    """All of a run's callbacks (the last step's log row and validation among them); ``ckpt_dir=None`` leaves out the
    checkpoint callbacks (checkpointing off); ``finish_at``: a resume at the run's end, at that step, runs the final
    validation it never ran (tinylm.train.final_validation)."""
    # without checkpoints a signal still stops the run at a whole step, with a line and a non-zero exit
    ckpts = [InterruptStop(None)] if ckpt_dir is None else checkpoint_callbacks(ckpt_dir, every_n_steps=every_n_steps,
                                                                               keep=keep, continues=continues)
    finish = [ResumedFinalValidation(finish_at)] if finish_at is not None else []
    return [*ckpts, FinalValidation(), *finish, *monitor_callbacks(progress_bar=progress_bar,
                                                                   model_summary=model_summary)]
