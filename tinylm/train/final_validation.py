"""The final validation of a run cut at its end: a run whose last step is not a scheduled validation step saves
step-N.ckpt and last.ckpt before the validation Lightning adds at its end (`tinylm.train.callbacks.FinalValidation`:
a resume with a larger max_steps goes on exactly), so a run killed during that validation (or its final save, or
stopped there by SIGTERM) left a checkpoint at max_steps whose validation never ran. Its resume (`--ckpt_path last`,
the same max_steps) was refused as "nothing to train": the final val/loss row, best.ckpt's look at the final weights
and the end summary were lost for good. Now that resume runs the validation alone (no training step, no LR change),
logged at the step the run would have logged it, and ends as the run would have."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import lightning as L

log = logging.getLogger("tinylm")


def final_validation_pending(ckpt_path: str, step: int, cfg) -> bool:
    """Whether the checkpoint ``ckpt_path`` of a run folder is at the run's end (``step`` == --trainer.max_steps)
    without the run's final validation: the run's CSV (``csv/metrics.csv``, flushed by every save, the final
    validation's row written at its end) has no val/loss row of that step. False where that cannot be told (no CSV:
    `--trainer.logger false`), where validation is off, and for a checkpoint outside a run folder's checkpoints/."""
    path = Path(ckpt_path)
    metrics = path.parent.parent / "csv" / "metrics.csv"
    limit = cfg.trainer.get("limit_val_batches")
    if step <= 0 or step != cfg.trainer.get("max_steps") or path.parent.name != "checkpoints" or limit == 0 \
            or not metrics.is_file():
        return False
    try:
        with open(metrics, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    # (rows store a validation under step - 1: Lightning's logging counter while the step's batch ends)
    return not any(r.get("val/loss") and _step_of(r) == step - 1 for r in rows)


def _step_of(row: dict) -> int | None:
    try:
        return int(float(row.get("step") or ""))
    except ValueError:
        return None


class ResumedFinalValidation(L.Callback):
    """Run the final validation of a resumed run at its end (`final_validation_pending`): the fit loop has nothing to
    train and returns at once; the validation then runs as the training loop runs it after a step (the fit loop's
    own validation loop, in the fitting state: the module logs val/* under the same step, BestCheckpoint may save
    best.ckpt), and the fit ends with its usual summary."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fit_loop = trainer.fit_loop
        run = fit_loop.run

        def run_then_validate() -> None:
            run()
            if trainer.global_step == self.step == trainer.max_steps:  # (the loops restored: nothing was trained)
                self._validate(trainer)

        fit_loop.run = run_then_validate  # (an attribute of this fit's loop: the next fit's loop is its own)

    def _validate(self, trainer: L.Trainer) -> None:
        from tinylm.train.callbacks import BestCheckpoint
        from tinylm.train.eval_callback import EvalTasks

        log.info("step %d: the run's final validation never ran (cut short); running it now, with no training step",
                 self.step)
        # what their on_train_start (not called: nothing trains) does for a validation: best.ckpt's score, which
        # may beat the checkpoint's; the eval.tasks read, to run at this validation as at the run's
        for callback in trainer.callbacks:
            if isinstance(callback, BestCheckpoint) and callback.continues and callback.dirpath:
                callback._adopt_saved_best(self.step)
            elif isinstance(callback, EvalTasks):
                callback.on_train_start(trainer, trainer.lightning_module)
        epoch_loop = trainer.fit_loop.epoch_loop
        # the restored loops restart no more (as after a step): restarting, the validation loop took up the count of
        # the checkpoint's last validation and ended after a batch or two
        epoch_loop.val_loop.restarting = False
        epoch_loop._batches_that_stepped = self.step - 1  # the step a validation after the last batch logs under
        trainer.validating = True
        epoch_loop.val_loop.run()
        trainer.training = True
        epoch_loop._batches_that_stepped = self.step
